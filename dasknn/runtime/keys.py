"""Names of the keys the runtime moves between workers: every key is built and parsed here.

Two families of keys exist.

**Step keys** (the model-parallel trainer, :mod:`dasknn.model_parallel.taskgraph`) are tuples
``(f"dasknn-{kind}-{token}", step, layer, part, receiver)`` with ``kind`` ``fwd``, ``bwd`` or
``lse`` (see :func:`phase_names`); ``receiver`` is a worker number, negative for a task whose value
is not a layer message.

**Collective keys** (:mod:`dasknn.runtime.collectives`) are tuples
``(f"dasknn-{op}-{token}", phase, sender, receiver)``: ``op`` is the collective (one of
:data:`COLLECTIVES`), ``phase`` the step of it the key belongs to, ``sender`` and ``receiver`` the
positions of the two workers in the collective's worker list. A *message* (a value made on
``sender`` for ``receiver``) has ``sender != receiver``; a key with ``sender == receiver`` is the
local work of that worker and is never sent.

**Data-parallel step keys** (:mod:`dasknn.data_parallel`) are tuples
``(f"dasknn-dp-{token}", step, variable, phase, sender, receiver, part)``: ``variable`` names the
model variable the message belongs to (``"embedding"``, ``"output.weight"``, ...), ``phase`` one
of :data:`DP_PHASES` (or a local step), ``sender`` and ``receiver`` are worker numbers (a message
when they differ, local work when equal) and ``part`` the shard of a sharded variable (``-1``
otherwise).

:func:`describe` turns any key into ``(token, phase, layer)`` for the transfer monitor (the
variable takes the place of the layer for data-parallel keys).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "COLLECTIVES",
    "CollectiveKey",
    "DP_PHASES",
    "DataParallelKey",
    "collective_key",
    "describe",
    "dp_key",
    "parse_dp_key",
    "message_phase",
    "parse_collective_key",
    "phase_names",
]

PREFIX = "dasknn-"
STEP_KINDS = ("fwd", "bwd", "lse")
COLLECTIVES = ("allreduce", "allgather", "allgatherv", "pull", "push", "alltoallv")
DP_KIND = "dp"
#: The messages of a data-parallel step: row ids and values pulled from a parameter server,
#: gradients pushed to it (values only: the server kept the ids of the pull), the two hops of
#: an allreduce, allgather(v) of row ids and of values, and the hops inside a machine between a
#: worker and its machine's chief (local aggregation: ``to-chief*`` and ``from-chief*``).
DP_PHASES = (
    "pull-indices",
    "pull",
    "push",
    "reduce-scatter",
    "allgather",
    "allgather-indices",
    "to-chief",
    "to-chief-indices",
    "from-chief",
    "from-chief-indices",
)


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


def message_phase(key) -> tuple[str, str, int] | None:
    """``(token, phase, layer)`` of a step key, ``None`` for any other key.

    ``phase`` is ``"forward"`` (activations; ``layer`` is the layer that consumes them),
    ``"backward"`` (partial sums of ``layer``) or ``"other"`` (softmax statistics and anything
    else that is not a layer message).
    """
    if not (isinstance(key, tuple) and len(key) == 5):
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


# ------------------------------------------------------------------ data-parallel keys
class DataParallelKey(NamedTuple):
    """The parts of a data-parallel step key."""

    token: str
    step: int
    variable: str
    phase: str
    sender: int
    receiver: int
    part: int


def dp_key(
    token: str, step: int, variable: str, phase: str, sender: int, receiver: int, part: int = -1
) -> tuple:
    """The key of ``phase`` of ``variable`` in ``step``, made on worker ``sender`` for
    ``receiver`` (``part``: the shard, ``-1`` for an unsharded variable)."""
    return (
        f"{PREFIX}{DP_KIND}-{token}",
        int(step),
        str(variable),
        str(phase),
        int(sender),
        int(receiver),
        int(part),
    )


def parse_dp_key(key) -> DataParallelKey | None:
    """The parts of a key built by :func:`dp_key`; ``None`` for any other key."""
    if not (isinstance(key, tuple) and len(key) == 7):
        return None
    parsed = _split_name(key)
    if parsed is None or parsed[0] != DP_KIND:
        return None
    return DataParallelKey(
        parsed[1], int(key[1]), key[2], key[3], int(key[4]), int(key[5]), int(key[6])
    )


# ------------------------------------------------------------------ both
def describe(key) -> tuple[str | None, str, int | None]:
    """``(token, phase, layer)`` of any key, as the transfer monitor counts it.

    Step keys give their model's token, phase and layer (:func:`message_phase`); collective keys
    their token and phase, with layer ``None``; data-parallel keys their token, phase and
    variable; every other key ``(None, "other", None)``.
    """
    step = message_phase(key)
    if step is not None:
        return step
    collective = parse_collective_key(key)
    if collective is not None:
        return collective.token, collective.phase, None
    data_parallel = parse_dp_key(key)
    if data_parallel is not None:
        return data_parallel.token, data_parallel.phase, data_parallel.variable
    return None, "other", None
