"""Names of the keys the runtime moves between workers: every key is built and parsed here.
The families are described in docs/runtime.md, "Keys"."""

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
    "postbox_key",
    "sampled_key",
    "step_key",
]

PREFIX = "dasknn-"
STEP_KINDS = ("fwd", "bwd", "lse", "run", "failed")
COLLECTIVES = ("allreduce", "allgather", "allgatherv")
PIPELINE_KINDS = (
    "fwd", "bwd", "fwd-done", "bwd-done", "x", "y", "grad", "update", "finite", "verdict", "run",
    "postbox", "failed", "infer", "infer-x", "data-x", "data-y",
)
PIPELINE = "pipe"
DP_KIND = "dp"
#: The messages of a data-parallel step: parameter-server pull and push, the two allreduce hops,
#: allgather(v) of values and row ids, and the hops to and from a machine's chief.
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
    """A fresh token for the keys of one model or collective: 16 random hex digits (no ``-``)."""
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


def phase_names(token: str) -> dict[str, str]:
    """Key names of the step tasks of a model: ``{"fwd": ..., "bwd": ..., "lse": ...}``."""
    return {kind: f"{PREFIX}{kind}-{token}" for kind in STEP_KINDS}


def step_key(name: str, step: int, layer: int, part: int, receiver: int, microbatch: int) -> tuple:
    """A step key; ``name`` is one of :func:`phase_names`' values, ``receiver`` a worker (a part
    when posted) or negative for a value that is not a layer message."""
    return (name, step, layer, part, receiver, microbatch)


def message_phase(key) -> tuple[str, str, int] | None:
    """``(token, phase, layer)`` of a step key (``None`` for any other key): ``"forward"``
    (activations consumed by ``layer``), ``"backward"`` (partial sums of ``layer``), ``"other"``."""
    if not (isinstance(key, tuple) and len(key) == 6):
        return None
    parsed = _split_name(key)
    if parsed is None or parsed[0] not in STEP_KINDS:
        return None
    kind, token = parsed
    if kind in ("lse", "failed") or key[4] < 0:  # statistics, output blocks, errors: no layers
        return token, "other", int(key[2])
    if kind == "fwd":
        return token, "forward", int(key[2]) + 1
    return token, "backward", int(key[2])


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
    """The key of ``phase`` of ``variable`` in ``step`` from ``sender`` to ``receiver``
    (``part``: the shard, ``-1`` if unsharded)."""
    return (
        f"{PREFIX}{DP_KIND}-{token}",
        int(step),
        str(variable),
        str(phase),
        int(sender),
        int(receiver),
        int(part),
    )


def dp_postbox_key(token: str, worker: int) -> str:
    """The key of the postbox actor of the data-parallel model ``token`` on its worker number
    ``worker`` (:func:`postbox_key` of the family ``"dp"``)."""
    return postbox_key(DP_KIND, token, int(worker))


# ------------------------------------------------------------------ postbox keys
def postbox_key(family: str, token: str, worker, generation: int | None = None):
    """The key of the postbox actor (:mod:`dasknn.runtime.postbox`) of the model ``token`` of
    the key family ``family`` (``"model"``, ``"dp"``, ``"pipe"``; ``"anchor"`` for an actor
    that only keeps Dask from retiring the worker) on its worker ``worker``, in
    the model's placement number ``generation`` (a placement after a lost worker makes new
    postboxes, so no key whose release may still be under way is used again; ``None``: a mode
    that places its postboxes once).

    A pipeline's postbox is the pipeline key ``(token, "postbox", generation or 0, stage,
    replica)`` of the stage replica ``worker = (stage, replica)``, so the moves of its handle
    count among the model's own (phase ``"other"``); every other family's is the string
    ``dasknn-postbox-{family}-{token}[-g{generation}]-{worker}``, outside the key families
    (the monitor counts its handle's moves as ``"other"`` of no model).
    """
    if family == PIPELINE:
        stage, replica = worker
        return pipeline_key(token, "postbox", generation or 0, stage, replica)
    placement = "" if generation is None else f"-g{int(generation)}"
    return f"{PREFIX}postbox-{family}-{token}{placement}-{worker}"


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


def held_key(key: tuple) -> tuple:
    """The key of the task holding the scattered value ``key``: ``-held`` added to its name."""
    return (f"{key[0]}-held", *key[1:])


def describe(key) -> tuple[str | None, str, int | None]:
    """``(token, phase, layer)`` of any key, as the transfer monitor counts it (``layer``:
    ``None`` for collective and sampled keys, the sending stage for pipeline keys, the variable
    for data-parallel keys; ``(None, "other", None)`` for a foreign key)."""
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
