"""The tasks of a data-parallel step and of an inference pass, as :mod:`._hybrid` wires them.

A task keeps what later tasks of its step read in the worker's scratch of the step; an inference
pass (a negative step) keeps its own until the next pass or the next step.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from dasknn.data_parallel._plan import WorkerBatch
from dasknn.data_parallel._worker_state import ReplicaState
from dasknn.kernels.training import add_rows
from dasknn.model.embedding_network import (
    EMBEDDING,
    SOFTMAX,
    EmbeddingSpec,
    batch_logits,
    gradients,
)
from dasknn.model.losses import softmax
from dasknn.optim import Optimizer

__all__ = ["DENSE", "OUTPUTS", "SPARSE", "StepContext"]

#: The fused buffer of every dense variable's gradient (allreduced at once).
DENSE = "dense"
#: The fused messages between a server and a chief: every sparse variable's rows of its shards.
SPARSE = "sparse"
#: What an inference pass returns (:func:`infer`).
OUTPUTS = ("logits", "proba", "labels", "loss", "correct")

#: The shards one server holds, ``[(variable, shard), ...]``: the parts of its fused messages.
Parts = list[tuple[str, int]]


@dataclass(frozen=True)
class StepContext:
    """What every task of one step needs to know: the model's ``token``, the ``step``, the
    ``spec``, the ``architecture`` (one of :data:`~._hybrid.ARCHITECTURES`), the ``optimizer``,
    the ``denominator`` (windows of the global batch), the ``shards`` (``{sparse variable:
    ShardMap}`` under ``hybrid`` and ``ps``, else ``None``) and whether the step runs as posted
    programs (``pooled``: its arrays come from the worker's
    :class:`~dasknn.runtime.buffers.StepBuffers`, else they are new)."""

    token: str
    step: int
    spec: EmbeddingSpec
    architecture: str
    optimizer: Optimizer
    denominator: int
    shards: dict | None
    pooled: bool = False


def _scratch(ctx: StepContext, variable: str | None = None) -> dict:
    scratch = ReplicaState.on_worker(ctx.token).scratch.setdefault(ctx.step, {})
    return scratch if variable is None else scratch.setdefault(variable, {})


def _array(ctx: StepContext, shape: tuple[int, ...], dtype=None) -> np.ndarray:
    """An uninitialized array of ``shape`` (and ``dtype``, default the model's) for the step:
    from the worker's :class:`~dasknn.runtime.buffers.StepBuffers` when ``ctx.pooled`` (given
    back once the step is over there and its posts were delivered), else new."""
    dtype = ctx.spec.dtype if dtype is None else dtype
    if ctx.pooled:
        return ReplicaState.on_worker(ctx.token).buffers.take(ctx.step, shape, dtype)
    return np.empty(shape, dtype=dtype)


def _forget(ctx: StepContext, ended) -> None:
    """Drop the scratch of the steps ``s`` for which ``ended(s)`` (every task of them ran)."""
    scratch = ReplicaState.on_worker(ctx.token).scratch
    for step in [s for s in scratch if ended(s)]:
        del scratch[step]


# ------------------------------------------------------------------ every worker
def _inputs(ctx: StepContext, batch: WorkerBatch, values: tuple) -> tuple[dict, list]:
    """``({sparse variable: the rows batch reads}, [dense values])`` from the ``values`` of
    :func:`compute` or :func:`infer`."""
    state = ReplicaState.on_worker(ctx.token)
    sparse = list(ctx.spec.sparse_shapes())
    rows = dict(zip(sparse, values[: len(sparse)], strict=True))
    for name in sparse:
        if rows[name] is None and ctx.architecture in ("ar", "ar-dense"):
            rows[name] = state.replicas[name].values[batch.ids[name]]
        elif rows[name] is None:
            rows[name] = _scratch(ctx, name)["rows"]
    if ctx.architecture == "ps":
        return rows, list(values[len(sparse) :])
    return rows, [state.replicas[name].values for name in ctx.spec.dense_names()]


def compute(ctx: StepContext, batch: WorkerBatch, *values) -> np.ndarray | None:
    """Forward and backward pass of this worker's part ``batch`` of the step.

    ``values``: per sparse variable the rows the batch reads (``None``: the local replica or this
    worker's scratch), then the dense values under ``ps``. Returns the dense gradients as one flat
    buffer (:data:`DENSE`), or ``None`` under ``ps`` or without dense variables.
    """
    _forget(ctx, lambda step: step < ctx.step)
    scratch = _scratch(ctx)
    scratch["batch"] = batch
    rows, dense = _inputs(ctx, batch, values)
    sizes = [int(np.prod(shape)) for shape in ctx.spec.dense_shapes()]
    scratch["dense_grad"] = flat = _array(ctx, (sum(sizes),))
    workspace = ReplicaState.on_worker(ctx.token).workspace
    grad_rows = _array(ctx, rows[EMBEDDING].shape)
    args = (batch.inverse, batch.labels, batch.output, dense, ctx.denominator, workspace, flat)
    args = (*args, grad_rows)
    scratch["loss"], grads, row_grads = gradients(ctx.spec, rows, *args)
    scratch["grads"] = dict(zip(ctx.spec.dense_names(), grads, strict=True))
    for name, grad in row_grads.items():
        _scratch(ctx, name)["grad_rows"] = grad
        if ctx.architecture == "ar-dense":
            full = np.zeros(ctx.spec.sparse_shapes()[name], dtype=grad.dtype)
            full[batch.ids[name]] = grad
            scratch["grads"][name] = full
    if ctx.architecture == "ps" or not ctx.spec.dense_names():
        return None
    return flat


def infer(ctx: StepContext, batch: WorkerBatch, output: str, *values):
    """This worker's part of an inference pass (``ctx.step`` negative; the earlier passes'
    scratch dropped first): the logits of its windows ``batch`` (``values`` as for
    :func:`compute`; under the sampled softmax the whole output table) reduced to ``output``:
    ``"logits"`` or ``"proba"`` (the softmax) ``(B_i, n_classes)``; ``"labels"``, the most
    probable class of each window, int64 ``(B_i,)``; ``"loss"``, the sum of the windows'
    cross-entropy (``batch.labels``), a float; ``"correct"``, how many windows' most probable
    class is their label, an int."""
    _forget(ctx, lambda step: step < 0 and step != ctx.step)
    if not batch.inverse.shape[0]:
        z = np.zeros((0, ctx.spec.n_classes), ctx.spec.dtype)
    else:
        rows, dense = _inputs(ctx, batch, values)
        weights, biases = list(dense[0::2]), list(dense[1::2])
        if ctx.spec.sampled:  # the rows of every class, in class order: [W_out^T | b_out]
            weights.append(rows[SOFTMAX][:, :-1].T)
            biases.append(rows[SOFTMAX][:, -1])
        z = batch_logits(ctx.spec, rows[EMBEDDING], batch.inverse, weights, biases)
    if output == "logits":
        return z
    if output == "proba":
        return softmax(z)
    if output == "labels":
        return np.argmax(z, axis=1).astype(np.int64)
    if output == "correct":
        return int(np.count_nonzero(np.argmax(z, axis=1) == batch.labels))
    shifted = z - z.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(shifted).sum(axis=1))
    return float(np.sum(log_norm - shifted[np.arange(len(z)), batch.labels]))


def kept(ctx: StepContext, variable: str, name: str, _after) -> np.ndarray:
    """What an earlier task of the step kept in this worker's scratch of ``variable``: its
    ``"grad_rows"`` (the gradient of the rows it read), its machine's ``"union_grad"`` or (``ar``)
    the ``"global_grad"``."""
    return _scratch(ctx, variable)[name]


def dense_gradient(ctx: StepContext, variable: str, _computed) -> np.ndarray:
    """This worker's gradient of a dense variable, or the flat buffer for :data:`DENSE`."""
    scratch = _scratch(ctx)
    return scratch["dense_grad"] if variable == DENSE else scratch["grads"][variable]


def identity(value):
    """A value passed on unchanged (a message of what its task depends on)."""
    return value


def apply_replica(ctx: StepContext, variable: str, grad: np.ndarray) -> None:
    """One optimizer step of this worker's replica of a dense variable (each of them for
    :data:`DENSE`; a sparse one under ``ar-dense``) from the summed gradient."""
    if variable == DENSE:
        start = 0
        for name, shape in zip(ctx.spec.dense_names(), ctx.spec.dense_shapes(), strict=True):
            stop = start + int(np.prod(shape))
            apply_replica(ctx, name, grad[start:stop].reshape(shape))
            start = stop
        return
    held = ReplicaState.on_worker(ctx.token).replicas[variable]
    if variable in ctx.spec.sparse_shapes():
        rows = _scratch(ctx)["batch"].global_ids[variable]
        held.step(ctx.optimizer, grad[rows], rows)
    else:
        held.step(ctx.optimizer, grad)


def apply_replica_rows(ctx: StepContext, variable: str, union, grad_rows) -> None:
    """``ar``: one row-sparse step of this worker's replica of a sparse variable."""
    ReplicaState.on_worker(ctx.token).replicas[variable].step(ctx.optimizer, grad_rows, union)


def finish(ctx: StepContext, variables: list[str], *grads_then_done) -> float:
    """:func:`apply_replica` of each of ``variables`` with the summed gradient that follows it;
    returns this worker's loss sum."""
    for variable, grad in zip(variables, grads_then_done, strict=False):
        apply_replica(ctx, variable, grad)
    return float(_scratch(ctx).get("loss", 0.0))


# ------------------------------------------------------------------ chiefs
def _combine(
    ctx: StepContext, ids: list[np.ndarray], values: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct ids of all ``ids`` and the sum of the rows given for each."""
    union = np.unique(np.concatenate(ids)) if ids else np.zeros(0, np.int64)
    total = _array(ctx, (len(union), *values[0].shape[1:]), values[0].dtype)
    total.fill(0)
    for part_ids, part_values in zip(ids, values, strict=True):
        add_rows(total, np.searchsorted(union, part_ids), part_values)
    return union.astype(np.int64), total


def _rows_of(ctx: StepContext, values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``values[rows]`` (``rows`` valid) in an array of the step (:func:`_array`)."""
    out = _array(ctx, (len(rows), *values.shape[1:]), values.dtype)
    return np.take(values, rows, axis=0, out=out, mode="clip")  # "clip": unbuffered


def _gathered(ctx: StepContext, sources: list[tuple], tail: np.ndarray | None) -> np.ndarray:
    """The rows ``rows`` of each ``(values, rows)``, then ``tail``, as one flat array of the
    step (:func:`_array`)."""
    sizes = [len(rows) * values.shape[1] for values, rows in sources]
    out = _array(ctx, (sum(sizes) + (0 if tail is None else tail.size),))
    start = 0
    for (values, rows), size in zip(sources, sizes, strict=True):
        piece = out[start : start + size].reshape(len(rows), values.shape[1])
        np.take(values, rows, axis=0, out=piece, mode="clip")  # "clip": unbuffered, rows valid
        start += size
    if tail is not None:
        out[start:] = tail
    return out


def _split(ctx: StepContext, flat: np.ndarray, variables: list[str], counts: list[int]) -> list:
    """A flat message cut into ``counts[i]`` rows of ``variables[i]`` each."""
    shapes = ctx.spec.sparse_shapes()
    out, start = [], 0
    for variable, count in zip(variables, counts, strict=True):
        width = shapes[variable][1]
        out.append(flat[start : start + count * width].reshape(count, width))
        start += count * width
    return out


def assemble_rows(
    ctx: StepContext, chief: int, sizes: dict, local, remote, dense, *replies_then_after
) -> np.ndarray | None:
    """The chief puts its machine's rows of every sparse variable together, in the machine's order.

    ``local``: ``(parts, offsets, positions)`` of its own shards, or ``None``; ``remote[i]``:
    ``(parts, positions)`` of reply ``i`` (the fused replies, then those sent ahead). With
    ``dense`` (``(own chunk's position, chunk sizes)``) the fused replies end with the other
    chiefs' reduced dense chunks, and the reduced dense buffer is returned (after the replies
    comes this chief's own chunk).
    """
    shapes = ctx.spec.sparse_shapes()
    rows = {v: _array(ctx, (n, shapes[v][1])) for v, n in sizes.items()}
    if local is not None:
        parts, offsets, positions = local
        held = _shard_rows(ctx, parts, chief, offsets)
        for (variable, _), pos, (values, offset) in zip(parts, positions, held, strict=True):
            rows[variable][pos] = _rows_of(ctx, values, offset)
    for (parts, positions), reply in zip(remote, replies_then_after, strict=False):
        variables = [variable for variable, _ in parts]
        pieces = _split(ctx, reply, variables, [len(pos) for pos in positions])
        for variable, pos, values in zip(variables, positions, pieces, strict=True):
            rows[variable][pos] = values
    for variable, values in rows.items():
        _scratch(ctx, variable)["rows"] = values
    if dense is None:
        return None
    own, tails = dense  # the fused replies, one a tail, come first
    replies = replies_then_after[: len(tails)]
    chunks = [reply[reply.size - tail :] for reply, tail in zip(replies, tails, strict=True)]
    chunks.insert(own, replies_then_after[len(remote)])
    return np.concatenate(chunks, out=_array(ctx, (sum(chunk.size for chunk in chunks),)))


def rows_for(ctx: StepContext, variable: str, positions: np.ndarray, _assembled) -> np.ndarray:
    """The chief's rows for one worker of its machine (``positions`` in the machine's rows)."""
    return _rows_of(ctx, _scratch(ctx, variable)["rows"], positions)


def chief_rows_sum(ctx: StepContext, variable: str, union, member_pos: list, *grads) -> np.ndarray:
    """The machine's row gradients summed in the order of its rows ``union``; returns ``union``."""
    width = ctx.spec.sparse_shapes()[variable][1]
    total = _array(ctx, (len(union), width))
    total.fill(0)
    for positions, grad in zip(member_pos, grads, strict=True):
        add_rows(total, positions, grad)
    _scratch(ctx, variable)["union_grad"] = total
    return union


def own_rows_sum(ctx: StepContext, variable: str, _computed) -> np.ndarray:
    """A one-worker machine's sum: its chief's own row gradient; returns its rows."""
    scratch = _scratch(ctx, variable)
    scratch["union_grad"] = scratch["grad_rows"]
    return _scratch(ctx)["batch"].ids[variable]


def _machine_grad(ctx: StepContext, variable: str, alone: bool) -> np.ndarray:
    """The machine's summed row gradient of ``variable`` on its chief, in the order of its rows."""
    return _scratch(ctx, variable)["grad_rows" if alone else "union_grad"]


def push_rows(ctx: StepContext, alone: bool, parts: list, chunk, dense_sum, *_summed) -> np.ndarray:
    """The machine's summed gradient of the rows ``parts`` (``[(variable, positions), ...]``)
    pulled from one server, as one flat array, then the items ``chunk`` of ``dense_sum`` when
    the dense gradient is reduced there."""
    sources = [(_machine_grad(ctx, v, alone), pos) for v, pos in parts]
    tail = None if chunk is None else dense_sum[chunk[0] : chunk[1]]
    return _gathered(ctx, sources, tail)


def chief_sum(ctx: StepContext, *member_grads: np.ndarray) -> np.ndarray:
    """The sum of the machine's gradients of one dense variable, in worker order."""
    total = _array(ctx, member_grads[0].shape, member_grads[0].dtype)
    np.copyto(total, member_grads[0])
    for grad in member_grads[1:]:
        total += grad
    return total


def combine_gathered(ctx: StepContext, variable: str, ids, rows, *sizes) -> np.ndarray:
    """``ar``: every machine's ids and rows combined into the distinct ids and summed gradient."""
    cuts = np.cumsum([0, *sizes])
    bounds = list(zip(cuts[:-1], cuts[1:], strict=True))
    union, _scratch(ctx, variable)["global_grad"] = _combine(
        ctx, [ids[a:b] for a, b in bounds], [rows[a:b] for a, b in bounds]
    )
    return union


# ------------------------------------------------------------------ servers
def _shard_rows(ctx: StepContext, parts: Parts, chief: int, offsets: list) -> list[tuple]:
    """``(values, rows)`` of each shard ``parts[i]`` at ``offsets[i]``, kept as ``chief``'s
    request."""
    requests = _scratch(ctx).setdefault("requests", {})
    shards = ReplicaState.on_worker(ctx.token).shards
    out = []
    for (variable, shard), rows in zip(parts, offsets, strict=True):
        requests[(variable, shard, chief)] = rows
        out.append((shards[(variable, shard)].values, rows))
    return out


def serve_rows(
    ctx: StepContext, parts: Parts, chief: int, offsets: list, picks, carried, *_after
) -> np.ndarray:
    """The server's reply to ``chief``'s pull of the rows ``offsets[i]`` of each shard
    ``parts[i]`` (kept as its request): those rows (with ``picks``: the rows at the positions
    ``picks[i]`` of ``offsets[i]``), then ``carried`` (its reduced dense chunk, or ``None``);
    ``_after``: its previous update."""
    held = _shard_rows(ctx, parts, chief, offsets)
    if picks is not None:
        held = [(values, rows[i]) for (values, rows), i in zip(held, picks, strict=True)]
    return _gathered(ctx, held, carried)


def serve_unchanged_rows(ctx: StepContext, parts: Parts, offsets: list) -> np.ndarray:
    """The rows ``offsets[i]`` of each shard ``parts[i]`` that the update under way leaves as
    they are, as one flat array, sent ahead of the rest of the pull (:func:`serve_rows`)."""
    shards = ReplicaState.on_worker(ctx.token).shards
    pairs = zip(parts, offsets, strict=True)
    return _gathered(ctx, [(shards[part].values, rows) for part, rows in pairs], None)


def update_rows(
    ctx: StepContext, server: int, parts: Parts, chiefs: list[int], local, chunk, own_dense, *pushes
) -> np.ndarray | None:
    """The server sums the chiefs' pushed gradients of each shard ``parts[i]`` and steps its rows.

    ``pushes``: the other chiefs' pushes, then what its own machine's sum waits for; ``local``:
    ``(alone, positions)``. With ``chunk`` each push ends with that chunk of the machine's dense
    sum; they and ``own_dense`` are summed in chief order and returned.
    """
    requests = _scratch(ctx)["requests"]
    variables = [variable for variable, _ in parts]
    width = 0 if chunk is None else chunk[1] - chunk[0]
    contributions, dense, pushed = {}, [], iter(pushes)
    for chief in chiefs:
        if chief == server:
            alone, positions = local
            mine = zip(variables, positions, strict=True)
            contributions[chief] = [_rows_of(ctx, _machine_grad(ctx, v, alone), p) for v, p in mine]
            if chunk is not None:
                dense.append(own_dense[chunk[0] : chunk[1]])
            continue
        push = next(pushed)
        counts = [len(requests[(v, p, chief)]) for v, p in parts]
        contributions[chief] = _split(ctx, push[: push.size - width], variables, counts)
        dense.append(push[push.size - width :])
    state = ReplicaState.on_worker(ctx.token)
    for i, (variable, shard) in enumerate(parts):
        offsets = [requests[(variable, shard, chief)] for chief in chiefs]
        union, total = _combine(ctx, offsets, [contributions[chief][i] for chief in chiefs])
        take = partial(_array, ctx)
        state.shards[(variable, shard)].step(ctx.optimizer, total, union, take)
    return None if chunk is None else chief_sum(ctx, *dense)


def serve_dense(ctx: StepContext, variable: str) -> np.ndarray:
    """``ps``: a copy of the server's current value of a dense variable."""
    return ReplicaState.on_worker(ctx.token).served[variable].values.copy()


def update_served(ctx: StepContext, variable: str, *grads: np.ndarray) -> None:
    """``ps``: the server sums the machines' gradients of a dense variable and applies them."""
    ReplicaState.on_worker(ctx.token).served[variable].step(ctx.optimizer, chief_sum(ctx, *grads))
