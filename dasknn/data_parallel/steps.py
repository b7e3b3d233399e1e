"""What runs on a worker during a data-parallel step.

Every function here is the body of one task of the step graph built by
:mod:`dasknn.data_parallel.hybrid`. It reads and writes the model's
:class:`~dasknn.data_parallel.worker_state.ReplicaState` on its worker and returns either a
message (a plain numpy array, fetched by exactly one other worker, so the transfer monitor
measures its size exactly) or a local value. The step's intermediate values live in
``state.scratch[step]`` until :func:`finish` drops them.

Roles: every worker computes its share of the batch; the first worker of each machine is its
*chief* (it sums its machine's gradients and talks to the other machines); the owner of a shard
or of a served dense variable is its *server*.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dasknn.data_parallel.shards import ShardMap
from dasknn.data_parallel.worker_state import replica_state
from dasknn.model.embedding_network import (
    EmbeddingSpec,
    apply_dense,
    apply_rows,
    batch_gradients,
    unique_rows,
)
from dasknn.optim import Optimizer

__all__ = ["StepContext"]

EMBEDDING = "embedding"
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
    shards : ShardMap or None
        The embedding's shards (``hybrid`` and ``ps``).
    """

    token: str
    step: int
    spec: EmbeddingSpec
    architecture: str
    optimizer: Optimizer
    denominator: int
    shards: ShardMap | None


def _scratch(ctx: StepContext) -> dict:
    state = replica_state(ctx.token)
    return state.scratch.setdefault(ctx.step, {})


# ------------------------------------------------------------------ every worker
def prepare(ctx: StepContext, batch: tuple) -> np.ndarray:
    """Take this worker's windows and labels (and forget the scratch of earlier steps); return
    its sorted distinct ids."""
    ids, labels, batch_union = batch
    unique, inverse = unique_rows(ids)
    scratch = replica_state(ctx.token).scratch
    for step in [s for s in scratch if s < ctx.step]:  # every task of earlier steps has run
        del scratch[step]
    _scratch(ctx).update(unique=unique, inverse=inverse, labels=labels, batch_union=batch_union)
    return unique


def _dense_values(ctx: StepContext, pulled: tuple) -> list[np.ndarray]:
    if ctx.architecture == "ps":
        return list(pulled)
    state = replica_state(ctx.token)
    return [state.replicas[name].values for name in ctx.spec.dense_names()]


def compute(ctx: StepContext, _prepared, rows, *pulled: np.ndarray) -> np.ndarray:
    """Forward and backward pass of this worker's windows (after :func:`prepare`).

    ``rows`` are the batch's distinct embedding rows (pulled from the servers), or ``None`` to
    read them from the local replica (``ar``, ``ar-dense``); ``pulled`` are the dense variables'
    values under ``ps``. Keeps the dense gradients and the loss in the scratch and returns the
    gradient of the distinct rows (sent to the chief, or kept by a chief).
    """
    scratch = _scratch(ctx)
    if rows is None:
        rows = replica_state(ctx.token).replicas[EMBEDDING].values[scratch["unique"]]
    values = _dense_values(ctx, pulled)
    loss, grads, grad_rows = batch_gradients(
        ctx.spec,
        rows,
        scratch["inverse"],
        scratch["labels"],
        values[0::2],
        values[1::2],
        ctx.denominator,
    )
    scratch["loss"] = loss
    scratch["grads"] = dict(zip(ctx.spec.dense_names(), grads, strict=True))
    if ctx.architecture == "ar-dense":
        dense = np.zeros((ctx.spec.vocab_size, ctx.spec.embed_dim), dtype=grad_rows.dtype)
        dense[scratch["unique"]] = grad_rows
        scratch["grads"][EMBEDDING] = dense
    return grad_rows


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
    fused :data:`DENSE` buffer; under ``ar-dense``, of the embedding, on the global batch's rows)
    from the summed gradient."""
    if variable == DENSE:
        start = 0
        for name, shape in zip(ctx.spec.dense_names(), ctx.spec.dense_shapes(), strict=True):
            stop = start + int(np.prod(shape))
            apply_replica(ctx, name, grad[start:stop].reshape(shape))
            start = stop
        return
    held = replica_state(ctx.token).replicas[variable]
    if variable == EMBEDDING:
        rows = _scratch(ctx)["batch_union"]
        state = held.state_for(ctx.optimizer, flat=False)
        apply_rows(ctx.optimizer, held.values, state, rows, grad[rows])
    else:
        apply_dense(ctx.optimizer, held.values, grad, held.state_for(ctx.optimizer, flat=True))


def apply_replica_rows(ctx: StepContext, union: np.ndarray, grad_rows: np.ndarray) -> None:
    """One row-sparse step of this worker's embedding replica (``ar``)."""
    held = replica_state(ctx.token).replicas[EMBEDDING]
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


def chief_union(ctx: StepContext, *member_ids: np.ndarray) -> np.ndarray:
    """The machine's distinct ids (its workers' ids, in worker order); kept in the scratch with
    each shard's positions among them."""
    union = np.unique(np.concatenate(member_ids)).astype(np.int64)
    scratch = _scratch(ctx)
    scratch["union"] = union
    scratch["member_ids"] = member_ids
    if ctx.shards is not None:
        scratch["positions"] = ctx.shards.split(union)
    return union


def pull_indices(ctx: StepContext, shard: int, _union) -> np.ndarray:
    """The offsets in ``shard`` of the machine's rows it holds (the chief's request)."""
    scratch = _scratch(ctx)
    positions = scratch["positions"][shard]
    return ctx.shards.offset_of(scratch["union"][positions])


def serve_rows(ctx: StepContext, shard: int, chief: int, offsets: np.ndarray) -> np.ndarray:
    """The server's reply to ``chief``: the rows ``offsets`` of its shard (the offsets are kept
    for the push of the same rows)."""
    _scratch(ctx).setdefault("requests", {})[(shard, chief)] = offsets
    return replica_state(ctx.token).shards[shard].values[offsets]


def assemble_rows(ctx: StepContext, _union, *replies: np.ndarray) -> None:
    """The chief puts the shards' replies (shard order) in the order of the machine's ids."""
    scratch = _scratch(ctx)
    union, positions = scratch["union"], scratch["positions"]
    rows = np.empty((len(union), ctx.spec.embed_dim), dtype=ctx.spec.dtype)
    for shard, reply in enumerate(replies):
        rows[positions[shard]] = reply
    scratch["rows"] = rows


def rows_for(ctx: StepContext, member: int, _assembled) -> np.ndarray:
    """The chief's rows for the ``member``-th worker of its machine, in that worker's id order."""
    scratch = _scratch(ctx)
    ids = scratch["member_ids"][member]
    return scratch["rows"][np.searchsorted(scratch["union"], ids)]


def chief_rows_sum(ctx: StepContext, _union, *member_grads: np.ndarray) -> np.ndarray:
    """The machine's row gradients summed (worker order) in the order of the machine's ids
    (after :func:`chief_union`); returns those ids."""
    scratch = _scratch(ctx)
    union, total = _combine(list(scratch["member_ids"]), list(member_grads))
    scratch["union_grad"] = total
    return union


def push_rows(ctx: StepContext, shard: int, _summed) -> np.ndarray:
    """The machine's summed gradient of the rows it pulled from ``shard``, in the pull's order
    (the server kept the ids)."""
    scratch = _scratch(ctx)
    return scratch["union_grad"][scratch["positions"][shard]]


def chief_sum(ctx: StepContext, *member_grads: np.ndarray) -> np.ndarray:
    """The sum of the machine's gradients of one dense variable, in worker order."""
    total = np.array(member_grads[0], copy=True)
    for grad in member_grads[1:]:
        total += grad
    return total


def chief_union_grad(ctx: StepContext, _summed) -> np.ndarray:
    """The machine's summed row gradient (``ar``: the values allgathered beside the ids)."""
    return _scratch(ctx)["union_grad"]


def combine_gathered(ctx: StepContext, ids: np.ndarray, rows: np.ndarray, *sizes) -> tuple:
    """``ar``: the concatenated ids and rows of every machine combined into the global batch's
    distinct ids and summed gradient (machines in order)."""
    cuts = np.cumsum([0, *sizes])
    parts = [(ids[a:b], rows[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    union, total = _combine([p[0] for p in parts], [p[1] for p in parts])
    scratch = _scratch(ctx)
    scratch["global_union"], scratch["global_grad"] = union, total
    return union


def global_grad(ctx: StepContext, _combined) -> np.ndarray:
    """``ar``: the global summed row gradient (after :func:`combine_gathered`)."""
    return _scratch(ctx)["global_grad"]


# ------------------------------------------------------------------ servers
def update_shard(ctx: StepContext, shard: int, chiefs: list[int], *grads: np.ndarray) -> None:
    """The server sums the gradients the ``chiefs`` pushed to ``shard`` (in order; each in the
    order of its pull's offsets) and applies the optimizer to those rows."""
    requests = _scratch(ctx)["requests"]
    offsets = [requests[(shard, chief)] for chief in chiefs]
    union, total = _combine(offsets, list(grads))
    held = replica_state(ctx.token).shards[shard]
    apply_rows(ctx.optimizer, held.values, held.state_for(ctx.optimizer, flat=False), union, total)


def serve_dense(ctx: StepContext, variable: str) -> np.ndarray:
    """``ps``: a copy of the server's current value of a dense variable."""
    return replica_state(ctx.token).served[variable].values.copy()


def update_served(ctx: StepContext, variable: str, *grads: np.ndarray) -> None:
    """``ps``: the server sums the machines' gradients of a dense variable and applies them."""
    held = replica_state(ctx.token).served[variable]
    total = chief_sum(ctx, *grads)
    apply_dense(ctx.optimizer, held.values, total, held.state_for(ctx.optimizer, flat=True))
