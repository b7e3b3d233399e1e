"""What runs on a worker during a data-parallel step.

Every function here is the body of one task of the step graph built by
:mod:`dasknn.data_parallel.hybrid`. It reads and writes the model's
:class:`~dasknn.data_parallel.worker_state.ReplicaState` on its worker and returns either a
message (a plain numpy array, fetched by exactly one other worker, so the transfer monitor
measures its size exactly) or a local value. The step's intermediate values live in
``state.scratch[step]`` until the next step's :func:`prepare` drops them; what belongs to one
sparse variable (the embedding, or the output table of a sampled softmax) under
``state.scratch[step][variable]``.

Roles: every worker computes its share of the batch; the first worker of each machine is its
*chief* (it sums its machine's gradients and talks to the other machines); the owner of a shard
or of a served dense variable is its *server*.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dasknn.data_parallel.plan import WorkerBatch
from dasknn.data_parallel.worker_state import replica_state
from dasknn.model.embedding_network import (
    EMBEDDING,
    SOFTMAX,
    EmbeddingSpec,
    apply_dense,
    apply_rows,
    batch_gradients,
    sampled_batch_gradients,
)
from dasknn.optim import Optimizer

__all__ = ["DENSE", "EMBEDDING", "SOFTMAX", "StepContext"]

#: The fused buffer of every dense variable's gradient (allreduced at once).
DENSE = "dense"


@dataclass(frozen=True)
class StepContext:
    """What every task of one step needs to know.

    Attributes
    ----------
    token : str
        The model's token.
    step : int
    spec : EmbeddingSpec
    architecture : str
        ``"hybrid"``, ``"ps"``, ``"ar"`` or ``"ar-dense"``.
    optimizer : Optimizer
    denominator : int
        Windows of the global batch.
    shards : dict or None
        ``{sparse variable: ShardMap}`` (``hybrid`` and ``ps``).
    """

    token: str
    step: int
    spec: EmbeddingSpec
    architecture: str
    optimizer: Optimizer
    denominator: int
    shards: dict | None


def _scratch(ctx: StepContext, variable: str | None = None) -> dict:
    scratch = replica_state(ctx.token).scratch.setdefault(ctx.step, {})
    return scratch if variable is None else scratch.setdefault(variable, {})


# ------------------------------------------------------------------ every worker
def prepare(ctx: StepContext, batch: WorkerBatch) -> None:
    """Take this worker's part of the batch (and forget the scratch of earlier steps)."""
    scratch = replica_state(ctx.token).scratch
    for step in [s for s in scratch if s < ctx.step]:  # every task of earlier steps has run
        del scratch[step]
    _scratch(ctx)["batch"] = batch


def _dense_values(ctx: StepContext, pulled: tuple) -> list[np.ndarray]:
    if ctx.architecture == "ps":
        return list(pulled)
    state = replica_state(ctx.token)
    return [state.replicas[name].values for name in ctx.spec.dense_names()]


def compute(ctx: StepContext, _prepared, *values) -> None:
    """Forward and backward pass of this worker's windows (after :func:`prepare`).

    ``values`` are first, per sparse variable, the rows the batch reads (from the chief), or
    ``None`` to read them from the local replica (``ar``, ``ar-dense``) or, on the parameter
    servers, from this worker's scratch (the chief of a one-worker machine); then the dense
    variables' values under ``ps``. Keeps the gradients and the loss in the scratch.
    """
    scratch = _scratch(ctx)
    batch: WorkerBatch = scratch["batch"]
    sparse = list(ctx.spec.sparse_shapes())
    rows = dict(zip(sparse, values[: len(sparse)], strict=True))
    for name in sparse:
        if rows[name] is None and ctx.architecture in ("ar", "ar-dense"):
            rows[name] = replica_state(ctx.token).replicas[name].values[batch.ids[name]]
        elif rows[name] is None:
            rows[name] = _scratch(ctx, name)["rows"]
    dense = _dense_values(ctx, values[len(sparse) :])
    if ctx.spec.sampled:
        loss, grads, grad_rows, grad_output = sampled_batch_gradients(
            ctx.spec,
            rows[EMBEDDING],
            batch.inverse,
            dense[0::2],
            dense[1::2],
            rows[SOFTMAX],
            batch.output,
            ctx.denominator,
        )
        sparse_grads = {EMBEDDING: grad_rows, SOFTMAX: grad_output}
    else:
        loss, grads, grad_rows = batch_gradients(
            ctx.spec,
            rows[EMBEDDING],
            batch.inverse,
            batch.labels,
            dense[0::2],
            dense[1::2],
            ctx.denominator,
        )
        sparse_grads = {EMBEDDING: grad_rows}
    scratch["loss"] = loss
    scratch["grads"] = dict(zip(ctx.spec.dense_names(), grads, strict=True))
    for name, grad in sparse_grads.items():
        _scratch(ctx, name)["grad_rows"] = grad
        if ctx.architecture == "ar-dense":
            full = np.zeros(ctx.spec.sparse_shapes()[name], dtype=grad.dtype)
            full[batch.ids[name]] = grad
            scratch["grads"][name] = full


def sparse_gradient(ctx: StepContext, variable: str, _computed) -> np.ndarray:
    """This worker's gradient of the rows of a sparse variable it read (after :func:`compute`)."""
    return _scratch(ctx, variable)["grad_rows"]


def dense_gradient(ctx: StepContext, variable: str, _computed) -> np.ndarray:
    """This worker's gradient of a dense variable, or of all of them flattened into one buffer
    for :data:`DENSE` (after :func:`compute`)."""
    grads = _scratch(ctx)["grads"]
    if variable == DENSE:
        return np.concatenate([grads[name].reshape(-1) for name in ctx.spec.dense_names()])
    return grads[variable]


def identity(value):
    """A value passed on unchanged (a message that forwards what its task depends on)."""
    return value


def apply_replica(ctx: StepContext, variable: str, grad: np.ndarray) -> None:
    """One optimizer step of this worker's replica of a dense variable (of each of them for the
    fused :data:`DENSE` buffer; under ``ar-dense``, of a sparse variable, on the global batch's
    rows) from the summed gradient."""
    if variable == DENSE:
        start = 0
        for name, shape in zip(ctx.spec.dense_names(), ctx.spec.dense_shapes(), strict=True):
            stop = start + int(np.prod(shape))
            apply_replica(ctx, name, grad[start:stop].reshape(shape))
            start = stop
        return
    held = replica_state(ctx.token).replicas[variable]
    if variable in ctx.spec.sparse_shapes():
        rows = _scratch(ctx)["batch"].global_ids[variable]
        state = held.state_for(ctx.optimizer, flat=False)
        apply_rows(ctx.optimizer, held.values, state, rows, grad[rows])
    else:
        apply_dense(ctx.optimizer, held.values, grad, held.state_for(ctx.optimizer, flat=True))


def apply_replica_rows(
    ctx: StepContext, variable: str, union: np.ndarray, grad_rows: np.ndarray
) -> None:
    """One row-sparse step of this worker's replica of a sparse variable (``ar``)."""
    held = replica_state(ctx.token).replicas[variable]
    state = held.state_for(ctx.optimizer, flat=False)
    apply_rows(ctx.optimizer, held.values, state, union, grad_rows)


def finish(ctx: StepContext, *_done) -> float:
    """End of this worker's part of the step: its loss sum. (Its scratch stays until the next
    step's :func:`prepare`: tasks of other workers' parts may still read it.)"""
    return float(_scratch(ctx).get("loss", 0.0))


# ------------------------------------------------------------------ chiefs
def _combine(ids: list[np.ndarray], values: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct ids of all ``ids`` and the sum of the rows given for each."""
    union = np.unique(np.concatenate(ids)) if ids else np.zeros(0, np.int64)
    total = np.zeros((len(union), *values[0].shape[1:]), dtype=values[0].dtype)
    for part_ids, part_values in zip(ids, values, strict=True):
        total[np.searchsorted(union, part_ids)] += part_values
    return union.astype(np.int64), total


def assemble_rows(
    ctx: StepContext, variable: str, shard_pos: list, size: int, *replies: np.ndarray
) -> None:
    """The chief puts the shards' replies (shard order) in the order of its machine's rows."""
    width = ctx.spec.sparse_shapes()[variable][1]
    rows = np.empty((size, width), dtype=ctx.spec.dtype)
    for positions, reply in zip(shard_pos, replies, strict=True):
        rows[positions] = reply
    _scratch(ctx, variable)["rows"] = rows


def rows_for(ctx: StepContext, variable: str, positions: np.ndarray, _assembled) -> np.ndarray:
    """The chief's rows for one worker of its machine (``positions`` in the machine's rows)."""
    return _scratch(ctx, variable)["rows"][positions]


def chief_rows_sum(
    ctx: StepContext, variable: str, union: np.ndarray, member_pos: list, *grads: np.ndarray
) -> np.ndarray:
    """The machine's row gradients summed (worker order) in the order of its rows ``union``;
    returns ``union``."""
    width = ctx.spec.sparse_shapes()[variable][1]
    total = np.zeros((len(union), width), dtype=ctx.spec.dtype)
    for positions, grad in zip(member_pos, grads, strict=True):
        total[positions] += grad
    _scratch(ctx, variable)["union_grad"] = total
    return union


def own_rows_sum(ctx: StepContext, variable: str, _computed) -> np.ndarray:
    """The sum of a one-worker machine: its chief's own row gradient (after :func:`compute`);
    returns its rows."""
    scratch = _scratch(ctx, variable)
    scratch["union_grad"] = scratch["grad_rows"]
    return _scratch(ctx)["batch"].ids[variable]


def push_rows(ctx: StepContext, variable: str, positions: np.ndarray, _summed) -> np.ndarray:
    """The machine's summed gradient of the rows it pulled from a shard, in the pull's order
    (the server kept the offsets)."""
    return _scratch(ctx, variable)["union_grad"][positions]


def chief_sum(ctx: StepContext, *member_grads: np.ndarray) -> np.ndarray:
    """The sum of the machine's gradients of one dense variable, in worker order."""
    total = np.array(member_grads[0], copy=True)
    for grad in member_grads[1:]:
        total += grad
    return total


def chief_union_grad(ctx: StepContext, variable: str, _summed) -> np.ndarray:
    """The machine's summed row gradient (``ar``: the values allgathered beside the ids)."""
    return _scratch(ctx, variable)["union_grad"]


def combine_gathered(
    ctx: StepContext, variable: str, ids: np.ndarray, rows: np.ndarray, *sizes
) -> np.ndarray:
    """``ar``: the concatenated ids and rows of every machine combined into the global batch's
    distinct ids and summed gradient (machines in order)."""
    cuts = np.cumsum([0, *sizes])
    parts = [(ids[a:b], rows[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    union, total = _combine([p[0] for p in parts], [p[1] for p in parts])
    scratch = _scratch(ctx, variable)
    scratch["global_union"], scratch["global_grad"] = union, total
    return union


def global_grad(ctx: StepContext, variable: str, _combined) -> np.ndarray:
    """``ar``: the global summed row gradient (after :func:`combine_gathered`)."""
    return _scratch(ctx, variable)["global_grad"]


# ------------------------------------------------------------------ servers
def serve_rows(
    ctx: StepContext, variable: str, shard: int, chief: int, offsets: np.ndarray, *_after
) -> np.ndarray:
    """The server's reply to ``chief`` in step ``ctx.step``: the rows ``offsets`` of its shard
    (the client's plan of the chief's rows; kept for the push of the same rows). ``_after``:
    the update of the previous step, when this is its prefetch."""
    _scratch(ctx, variable).setdefault("requests", {})[(shard, chief)] = offsets
    return replica_state(ctx.token).shards[(variable, shard)].values[offsets]


def update_shard(
    ctx: StepContext, variable: str, shard: int, chiefs: list[int], *grads: np.ndarray
) -> None:
    """The server sums the gradients the ``chiefs`` pushed to ``shard`` (in order; each in the
    order of its pull's offsets) and applies the optimizer to those rows."""
    requests = _scratch(ctx, variable)["requests"]
    offsets = [requests[(shard, chief)] for chief in chiefs]
    union, total = _combine(offsets, list(grads))
    held = replica_state(ctx.token).shards[(variable, shard)]
    apply_rows(ctx.optimizer, held.values, held.state_for(ctx.optimizer, flat=False), union, total)


def serve_dense(ctx: StepContext, variable: str) -> np.ndarray:
    """``ps``: a copy of the server's current value of a dense variable."""
    return replica_state(ctx.token).served[variable].values.copy()


def update_served(ctx: StepContext, variable: str, *grads: np.ndarray) -> None:
    """``ps``: the server sums the machines' gradients of a dense variable and applies them."""
    held = replica_state(ctx.token).served[variable]
    total = chief_sum(ctx, *grads)
    apply_dense(ctx.optimizer, held.values, total, held.state_for(ctx.optimizer, flat=True))
