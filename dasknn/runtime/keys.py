"""Names of the keys the runtime moves between workers: every key is built and parsed here.

Two families of keys exist.

**Step keys** (the model-parallel trainer, :mod:`dasknn.model_parallel.taskgraph`) are tuples
``(f"dasknn-{kind}-{token}", step, layer, part, receiver, microbatch)`` with ``kind`` ``fwd``,
``bwd``, ``lse`` or ``run`` (a worker's whole step, ``messages="actors"``; see
:func:`phase_names`); ``receiver`` is a worker number (a part number for the messages posted
between workers in ``messages="actors"`` mode), negative for a value that is not a layer message;
``microbatch`` numbers the row block of the step's batch.

**Collective keys** (:mod:`dasknn.runtime.collectives`) are tuples
``(f"dasknn-{op}-{token}", phase, sender, receiver)``: ``op`` is the collective (one of
:data:`COLLECTIVES`), ``phase`` the step of it the key belongs to, ``sender`` and ``receiver`` the
positions of the two workers in the collective's worker list. A *message* (a value made on
``sender`` for ``receiver``) has ``sender != receiver``; a key with ``sender == receiver`` is the
local work of that worker and is never sent.

:func:`describe` turns any key into ``(token, phase, layer)`` for the transfer monitor.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "COLLECTIVES",
    "CollectiveKey",
    "collective_key",
    "describe",
    "message_phase",
    "parse_collective_key",
    "phase_names",
    "step_key",
]

PREFIX = "dasknn-"
STEP_KINDS = ("fwd", "bwd", "lse", "run")
COLLECTIVES = ("allreduce", "allgather", "allgatherv", "pull", "push", "alltoallv")


class CollectiveKey(NamedTuple):
    """The parts of a collective key."""

    op: str
    token: str
    phase: str
    sender: int
    receiver: int


def _split_name(key) -> tuple[str, str] | None:
    """``(kind, token)`` of a key named ``dasknn-{kind}-{token}``, else ``None``."""
    if not (isinstance(key, tuple) and key and isinstance(key[0], str)):
        return None
    name = key[0]
    if not name.startswith(PREFIX):
        return None
    kind, _, token = name[len(PREFIX) :].partition("-")
    return kind, token


# ------------------------------------------------------------------ step keys
def phase_names(token: str) -> dict[str, str]:
    """Key names of the step tasks of a model: ``{"fwd": ..., "bwd": ..., "lse": ...}``."""
    return {kind: f"{PREFIX}{kind}-{token}" for kind in STEP_KINDS}


def step_key(name: str, step: int, layer: int, part: int, receiver: int, microbatch: int) -> tuple:
    """A step key; ``name`` is one of :func:`phase_names`' values."""
    return (name, step, layer, part, receiver, microbatch)


def message_phase(key) -> tuple[str, str, int] | None:
    """``(token, phase, layer)`` of a step key, ``None`` for any other key.

    ``phase`` is ``"forward"`` (activations; ``layer`` is the layer that consumes them),
    ``"backward"`` (partial sums of ``layer``) or ``"other"`` (softmax statistics and anything
    else that is not a layer message).
    """
    if not (isinstance(key, tuple) and len(key) == 6):
        return None
    parsed = _split_name(key)
    if parsed is None or parsed[0] not in STEP_KINDS:
        return None
    kind, token = parsed
    if kind == "lse" or key[4] < 0:  # softmax statistics, output blocks: not layer messages
        return token, "other", int(key[2])
    if kind == "fwd":
        return token, "forward", int(key[2]) + 1
    return token, "backward", int(key[2])


# ------------------------------------------------------------------ collective keys
def collective_key(op: str, token: str, phase: str, sender: int, receiver: int) -> tuple:
    """The key of ``phase`` of collective ``op`` made on worker ``sender`` for ``receiver``."""
    if op not in COLLECTIVES:
        raise ValueError(f"unknown collective {op!r}; expected one of {COLLECTIVES}")
    return (f"{PREFIX}{op}-{token}", phase, int(sender), int(receiver))


def parse_collective_key(key) -> CollectiveKey | None:
    """The parts of a key built by :func:`collective_key`; ``None`` for any other key."""
    if not (isinstance(key, tuple) and len(key) == 4):
        return None
    parsed = _split_name(key)
    if parsed is None or parsed[0] not in COLLECTIVES:
        return None
    return CollectiveKey(parsed[0], parsed[1], key[1], int(key[2]), int(key[3]))


# ------------------------------------------------------------------ both
def describe(key) -> tuple[str | None, str, int | None]:
    """``(token, phase, layer)`` of any key, as the transfer monitor counts it.

    Step keys give their model's token, phase and layer (:func:`message_phase`); collective keys
    their token and phase, with layer ``None``; every other key ``(None, "other", None)``.
    """
    step = message_phase(key)
    if step is not None:
        return step
    collective = parse_collective_key(key)
    if collective is not None:
        return collective.token, collective.phase, None
    return None, "other", None
