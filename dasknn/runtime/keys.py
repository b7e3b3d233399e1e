"""Names of the keys the runtime moves between workers: every key is built and parsed here.

Five families of keys exist.

**Step keys** (the model-parallel trainer, :mod:`dasknn.model_parallel._taskgraph`) are tuples
``(f"dasknn-{kind}-{token}", step, layer, part, receiver, microbatch)`` with ``kind`` ``fwd``,
``bwd``, ``lse`` or ``run`` (a worker's whole step, ``messages="posted"``; see
:func:`phase_names`); ``receiver`` is a worker number (a part number for the messages posted
between workers in ``messages="posted"`` mode), negative for a value that is not a layer message;
``microbatch`` numbers the row block of the step's batch.

**Pipeline keys** (:mod:`dasknn.pipeline_parallel`) are tuples
``(f"dasknn-pipe-{token}", kind, step, stage, replica, microbatch)``: ``kind`` is one of
:data:`PIPELINE_KINDS`; a ``fwd`` (``bwd``) key is a forward (backward) pass of stage ``stage``
of replica ``replica``, whose value, the activations sent to stage ``stage + 1`` (the partial
sums sent to ``stage - 1``), is read by the receiving pass; a ``fwd-done`` (``bwd-done``) key of
the same numbers is the local mark that the pass ended, which the sender's own later tasks wait
for (see :func:`dasknn.pipeline_parallel._taskgraph.local_keys`); ``finite`` and ``verdict``
carry fp16's overflow flags (a stage's, and whether the step is applied) to and from stage 0 of
replica 0; with ``messages="posted"``, a ``run`` key is a stage replica's task that runs all its
passes of the step, a ``postbox`` key (step 0) the stage replica's postbox actor, and the ``fwd``
/ ``bwd`` keys name the messages posted to it (a ``failed`` key: the error a neighbouring stage
posts when it fails); an ``infer`` key is a stage's forward pass of a prediction's row block
``microbatch`` (``step`` numbers the model's predictions), whose value the next stage reads, an
``infer-x`` key that block's samples on stage 0; every other kind is local work.

**Collective keys** (:mod:`dasknn.runtime.collectives`) are tuples
``(f"dasknn-{op}-{token}", phase, sender, receiver)``: ``op`` is the collective (one of
:data:`COLLECTIVES`), ``phase`` the step of it the key belongs to, ``sender`` and ``receiver`` the
positions of the two workers in the collective's worker list. A *message* (a value made on
``sender`` for ``receiver``) has ``sender != receiver``; a key with ``sender == receiver`` is the
local work of that worker and is never sent.

**Sampled-step keys** (the LSH-sampled trainer, :mod:`dasknn.sampled_parallel._taskgraph`) are
tuples ``(f"dasknn-slide-{token}", call, phase, sender, receiver)``: ``call`` numbers the
model's submissions, ``phase`` names the kind of message, and ``sender != receiver`` marks a
message between those worker positions (as for collective keys); ``receiver == -1`` marks a
value of ``sender`` that every worker reads (each read by another worker is one message).

**Data-parallel step keys** (:mod:`dasknn.data_parallel`) are tuples
``(f"dasknn-dp-{token}", step, variable, phase, sender, receiver, part)``: ``variable`` names the
model variable the message belongs to (``"embedding"``, ``"softmax"``, ``"dense"``, ...),
``phase`` one of :data:`DP_PHASES` (or a local step), ``sender`` and ``receiver`` are worker
numbers (a message when they differ, local work when equal) and ``part`` the shard of a sharded
variable (``-1`` otherwise). With ``messages="posted"``, a ``run`` key (variable ``"step"``) is a
worker's task that runs its whole part of the step and posts the messages, still named by their
keys, to the receivers' postbox actors (:func:`dp_postbox_key`, a string key outside the family);
a ``failed`` key names the error a failing worker posts to the others.

**Held keys** (:func:`dasknn.runtime.model_span.held_in_span`) name a task that returns a
scattered value on its own worker, so a model's graphs read it from a task of the model's span:
``held_key(key)`` is the scattered tuple key with ``-held`` appended to its name. They never move
between workers.

:func:`describe` turns any key into ``(token, phase, layer)`` for the transfer monitor (the
variable takes the place of the layer for data-parallel keys).
"""

from __future__ import annotations

import uuid
from typing import NamedTuple

__all__ = [
    "COLLECTIVES",
    "CollectiveKey",
    "PIPELINE_KINDS",
    "PipelineKey",
    "DP_PHASES",
    "DataParallelKey",
    "collective_key",
    "describe",
    "dp_key",
    "dp_postbox_key",
    "held_key",
    "parse_dp_key",
    "message_phase",
    "new_token",
    "parse_collective_key",
    "parse_pipeline_key",
    "parse_sampled_key",
    "phase_names",
    "pipeline_key",
    "sampled_key",
    "step_key",
]

PREFIX = "dasknn-"
STEP_KINDS = ("fwd", "bwd", "lse", "run")
COLLECTIVES = ("allreduce", "allgather", "allgatherv")
PIPELINE_KINDS = (
    "fwd", "bwd", "fwd-done", "bwd-done", "x", "y", "grad", "update", "finite", "verdict", "run",
    "postbox", "failed", "infer", "infer-x",
)
PIPELINE = "pipe"
DP_KIND = "dp"
#: The messages of a data-parallel step: rows pulled from a parameter server (the client's plan
#: gives the server the offsets), gradients pushed to it (values only: the server kept the
#: offsets of the pull), the two hops of an allreduce, allgather(v) of row ids and of values, and
#: the hops inside a machine between a worker and its machine's chief (local aggregation:
#: ``to-chief`` and ``from-chief*``).
DP_PHASES = (
    "pull",
    "push",
    "reduce-scatter",
    "allgather",
    "allgather-indices",
    "to-chief",
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


def new_token() -> str:
    """A fresh token for the keys of one model or collective: 16 random hex digits (no ``-``,
    so :func:`_split_name` splits ``dasknn-{kind}-{token}`` at the first ``-`` after the kind)."""
    return uuid.uuid4().hex[:16]


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


# ------------------------------------------------------------------ pipeline keys
class PipelineKey(NamedTuple):
    """The parts of a pipeline key."""

    token: str
    kind: str
    step: int
    stage: int
    replica: int
    microbatch: int


def pipeline_key(
    token: str, kind: str, step: int, stage: int, replica: int, microbatch: int = -1
) -> tuple:
    """The key of a pipeline task or message (``microbatch`` -1 for per-step work)."""
    if kind not in PIPELINE_KINDS:
        raise ValueError(f"unknown pipeline key kind {kind!r}; expected one of {PIPELINE_KINDS}")
    return (
        f"{PREFIX}{PIPELINE}-{token}",
        kind,
        int(step),
        int(stage),
        int(replica),
        int(microbatch),
    )


def parse_pipeline_key(key) -> PipelineKey | None:
    """The parts of a key built by :func:`pipeline_key`; ``None`` for any other key."""
    if not (isinstance(key, tuple) and len(key) == 6):
        return None
    parsed = _split_name(key)
    if parsed is None or parsed[0] != PIPELINE or key[1] not in PIPELINE_KINDS:
        return None
    return PipelineKey(parsed[1], key[1], int(key[2]), int(key[3]), int(key[4]), int(key[5]))


# ------------------------------------------------------------------ sampled-step keys
SAMPLED_KIND = "slide"


class SampledKey(NamedTuple):
    """The parts of a sampled-step key."""

    token: str
    call: int
    phase: str
    sender: int
    receiver: int


def sampled_key(token: str, call: int, phase: str, sender: int, receiver: int) -> tuple:
    """The key of the sampled trainer's ``phase`` value made on ``sender`` for ``receiver``."""
    return (f"{PREFIX}{SAMPLED_KIND}-{token}", int(call), phase, int(sender), int(receiver))


def parse_sampled_key(key) -> SampledKey | None:
    """The parts of a key built by :func:`sampled_key`; ``None`` for any other key."""
    if not (isinstance(key, tuple) and len(key) == 5):
        return None
    parsed = _split_name(key)
    if parsed is None or parsed[0] != SAMPLED_KIND:
        return None
    return SampledKey(parsed[1], int(key[1]), key[2], int(key[3]), int(key[4]))


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


def dp_postbox_key(token: str, worker: int, generation: int = 0) -> str:
    """The key of the postbox actor of the data-parallel model ``token`` on its worker number
    ``worker`` (not a step key: the monitor counts the actor's handle as ``"other"``), of the
    model's ``generation``-th placement after the first (a restored checkpoint)."""
    if generation:
        return f"{PREFIX}postbox-{DP_KIND}-{token}-g{int(generation)}-{int(worker)}"
    return f"{PREFIX}postbox-{DP_KIND}-{token}-{int(worker)}"


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


# ------------------------------------------------------------------ held keys
def held_key(key: tuple) -> tuple:
    """The key of the task that holds the scattered value of the tuple key ``key``: its name
    with ``-held`` appended, the rest unchanged."""
    return (f"{key[0]}-held", *key[1:])


# ------------------------------------------------------------------ all families
def describe(key) -> tuple[str | None, str, int | None]:
    """``(token, phase, layer)`` of any key, as the transfer monitor counts it.

    Step keys give their model's token, phase and layer (:func:`message_phase`); collective and
    sampled-step keys their token and phase, with layer ``None``; pipeline keys their token,
    ``"forward"`` / ``"backward"`` / ``"predict"`` (``"other"`` for local work) and the sending
    stage as the layer; data-parallel keys their token, phase and variable; every other key
    ``(None, "other", None)``.
    """
    step = message_phase(key)
    if step is not None:
        return step
    sampled = parse_sampled_key(key)
    if sampled is not None:
        return sampled.token, sampled.phase, None
    collective = parse_collective_key(key)
    if collective is not None:
        return collective.token, collective.phase, None
    pipeline = parse_pipeline_key(key)
    if pipeline is not None:
        phase = {"fwd": "forward", "bwd": "backward", "infer": "predict"}.get(
            pipeline.kind, "other"
        )
        return pipeline.token, phase, pipeline.stage
    data_parallel = parse_dp_key(key)
    if data_parallel is not None:
        return data_parallel.token, data_parallel.phase, data_parallel.variable
    return None, "other", None
