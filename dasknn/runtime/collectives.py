"""Collectives as task graphs: allreduce and allgather(v). See docs/runtime.md, "Collectives".

In the byte formulas (the payload the monitor measures) ``N`` is the number of workers and ``s``
the item size; every pair of workers exchanges one message per phase, empty ones included."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import dask
import numpy as np
from dask.task_spec import Task, TaskRef
from distributed import wait

from dasknn.runtime.cluster import scheduler_workers
from dasknn.runtime.keys import collective_key, new_token, parse_collective_key
from dasknn.runtime.placement import KeyPlacement, by_sender

__all__ = [
    "Collective",
    "Graph",
    "allgather",
    "allgatherv",
    "allreduce",
    "build_allgather",
    "build_allreduce",
    "chunk_bounds",
    "messages_to",
]


#: ``key(phase, sender, receiver)``: the key of one task of a collective.
KeyFunction = Callable[[str, int, int], tuple]


@dataclass(frozen=True)
class Graph:
    """The task graph of one collective.

    Attributes
    ----------
    op, token : str
    tasks : dict
        ``{key: dask.task_spec.Task}``; the inputs are :class:`~dask.task_spec.TaskRef`.
    outputs : list
        The key of each worker's result, by position.
    """

    op: str
    token: str
    tasks: dict
    outputs: list


@dataclass
class Collective:
    """A submitted collective.

    Attributes
    ----------
    op, token : str
        The token is what :func:`dasknn.runtime.measure.read_transfers` reads by.
    workers : list of str
    outputs : list of distributed.Future
        ``outputs[i]`` is the result on ``workers[i]``.
    """

    op: str
    token: str
    workers: list
    outputs: list


def chunk_bounds(n: int, parts: int) -> list[int]:
    """Bounds of ``parts`` consecutive chunks of ``n`` items, as :func:`numpy.array_split`."""
    base, extra = divmod(n, parts)
    bounds = [0]
    for j in range(parts):
        bounds.append(bounds[-1] + base + (1 if j < extra else 0))
    return bounds


def messages_to(key: KeyFunction, phase: str, receiver: int, count: int) -> list[TaskRef]:
    """References to ``key(phase, sender, receiver)`` of every other ``sender`` < ``count``."""
    return [TaskRef(key(phase, sender, receiver)) for sender in range(count) if sender != receiver]


def _identity(x):
    return x


def _flat_slice(x: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return np.ascontiguousarray(x).reshape(-1)[lo:hi]


def _with_own(position: int, own, received: tuple) -> list:
    """``received`` with ``own`` inserted at ``position``."""
    items = list(received)
    items.insert(position, own)
    return items


def _reduce_chunk(
    position: int, lo: int, hi: int, accumulate, x: np.ndarray, *received: np.ndarray
):
    """Sum of chunk ``lo:hi`` of every contribution in worker order, in ``accumulate`` if given."""
    parts = _with_own(position, _flat_slice(x, lo, hi), received)
    total = parts[0].astype(accumulate or parts[0].dtype, copy=True)
    for part in parts[1:]:
        total += part
    return total.astype(x.dtype, copy=False)


def _concatenate_flat(position: int, shape: tuple, own: np.ndarray, *received: np.ndarray):
    return np.concatenate(_with_own(position, own, received)).reshape(shape)


def _gather(position: int, stack: bool, own: np.ndarray, *received: np.ndarray) -> np.ndarray:
    parts = _with_own(position, own, received)
    return np.stack(parts) if stack else np.concatenate(parts, axis=0)


def build_allreduce(
    token: str,
    inputs: Sequence,
    shape: tuple,
    accumulate=None,
    key: KeyFunction | None = None,
) -> Graph:
    """Allreduce (sum) of one array of ``shape`` (``n`` items) per worker: reduce-scatter of
    ``N`` chunks (``c_j`` items in chunk ``j``), then allgather.

    Bytes: worker ``i`` receives, and sends, ``s ((N - 1) c_i + n - c_i)``; in all
    ``2 (N - 1) n s`` in ``2 N (N - 1)`` messages (phases ``reduce-scatter``, ``allgather``).

    Parameters
    ----------
    token : str
        Carried by every key (what the transfers are read by).
    inputs : sequence of keys
        ``inputs[i]``: the key of worker ``i``'s contribution.
    shape : tuple
        Shape of every contribution and of the result.
    accumulate : numpy dtype, optional
        Dtype the chunks are summed in; messages and result keep the contributions' dtype.
    key : callable, optional
        ``key(phase, sender, receiver)`` names the keys (default :func:`collective_key` of
        ``"allreduce"`` and ``token``).
    """
    count = len(inputs)
    bounds = chunk_bounds(int(np.prod(shape, dtype=np.int64)), count)
    key = key or partial(collective_key, "allreduce", token)

    tasks = {}
    for i in range(count):
        for j in range(count):
            if i != j:
                k = key("reduce-scatter", i, j)
                tasks[k] = Task(k, _flat_slice, TaskRef(inputs[i]), bounds[j], bounds[j + 1])
    for j in range(count):
        received = messages_to(key, "reduce-scatter", j, count)
        k = key("reduced", j, j)
        tasks[k] = Task(
            k, _reduce_chunk, j, bounds[j], bounds[j + 1], accumulate, TaskRef(inputs[j]), *received
        )
        for i in range(count):
            if i != j:
                m = key("allgather", j, i)
                tasks[m] = Task(m, _identity, TaskRef(k))
    outputs = []
    for i in range(count):
        received = messages_to(key, "allgather", i, count)
        k = key("result", i, i)
        tasks[k] = Task(
            k, _concatenate_flat, i, tuple(shape), TaskRef(key("reduced", i, i)), *received
        )
        outputs.append(k)
    return Graph("allreduce", token, tasks, outputs)


def build_allgather(
    token: str, inputs: Sequence, stack: bool, key: KeyFunction | None = None
) -> Graph:
    """Allgather: every worker receives every other worker's contribution.

    Bytes: worker ``j`` receives ``sum(b_i for i != j)`` (``b_i``: contribution ``i``'s bytes);
    in all ``(N - 1) sum(b_i)`` in ``N (N - 1)`` messages of phase ``allgather``.

    Parameters
    ----------
    token, inputs, key
        As for :func:`build_allreduce`.
    stack : bool
        ``np.stack`` the contributions (allgather), else ``np.concatenate`` (allgatherv).
    """
    op = "allgather" if stack else "allgatherv"
    key = key or partial(collective_key, op, token)
    count = len(inputs)
    tasks = {}
    for i in range(count):
        for j in range(count):
            if i != j:
                k = key("allgather", i, j)
                tasks[k] = Task(k, _identity, TaskRef(inputs[i]))
    outputs = []
    for j in range(count):
        received = messages_to(key, "allgather", j, count)
        k = key("result", j, j)
        tasks[k] = Task(k, _gather, j, stack, TaskRef(inputs[j]), *received)
        outputs.append(k)
    return Graph(op, token, tasks, outputs)


def _describe(dask_worker, keys: dict) -> dict:
    """``{position: (shape, dtype, min, max)}`` of the inputs here (``None``: not an array)."""
    out = {}
    for position, key in keys.get(dask_worker.address, {}).items():
        value = dask_worker.data.get(key)
        if not isinstance(value, np.ndarray):
            out[position] = None
            continue
        low = high = None
        if value.dtype.kind in "iu" and value.size:
            low, high = int(value.min()), int(value.max())
        out[position] = (value.shape, value.dtype.str, low, high)
    return out


def _check_workers(client, workers: Sequence[str], *inputs: Sequence) -> list[str]:
    workers = list(workers)
    if not workers:
        raise ValueError("a collective needs at least one worker")
    if len(set(workers)) != len(workers):
        raise ValueError(f"the workers of a collective must be distinct: {workers}")
    for values in inputs:
        if len(values) != len(workers):
            raise ValueError(
                f"one input per worker is needed: {len(values)} inputs for {len(workers)} workers"
            )
    known = set(scheduler_workers(client))
    unknown = [w for w in workers if w not in known]
    if unknown:
        raise ValueError(f"not workers of this cluster: {unknown}")
    return workers


def _inspect(client, workers: list[str], futures: Sequence, what: str) -> list[tuple]:
    """``(shape, dtype, min, max)`` of each input; ``ValueError`` if not an array in memory."""
    wait(list(futures))
    keys: dict = {}
    for position, (worker, future) in enumerate(zip(workers, futures, strict=True)):
        keys.setdefault(worker, {})[position] = future.key
    found = {}
    for described in client.run(_describe, keys=keys, workers=sorted(keys)).values():
        found.update(described)
    metas = []
    for position, worker in enumerate(workers):
        meta = found.get(position)
        if meta is None:
            raise ValueError(
                f"{what} {position} ({futures[position].key!r}) is not a numpy array in memory "
                f"on its worker {worker}"
            )
        metas.append((tuple(meta[0]), np.dtype(meta[1]), meta[2], meta[3]))
    return metas


def _same(what: str, field: str, values: list) -> None:
    if len(set(values)) > 1:
        raise ValueError(f"the {what} differ in {field}: {values}")


def _same_rows(what: str, field: str, metas: list[tuple], no_rows: str) -> None:
    """Check that ``metas`` share dtype and shape beyond axis 0 and have an axis 0."""
    _same(what, "dtype", [str(m[1]) for m in metas])
    if any(len(m[0]) == 0 for m in metas):
        raise ValueError(no_rows)
    _same(what, field, [m[0][1:] for m in metas])


def _submit(client, graph: Graph, workers: list[str]) -> Collective:
    placement = KeyPlacement(workers, by_sender(parse_collective_key))
    with dask.annotate(workers=placement, allow_other_workers=False):
        futures = client.get(graph.tasks, graph.outputs, sync=False)
    return Collective(graph.op, graph.token, workers, list(futures))


def allreduce(client, inputs: Sequence, workers: Sequence[str]) -> Collective:
    """Sum the arrays ``inputs[i]`` (held by ``workers[i]``); every worker gets the sum. Bytes:
    :func:`build_allreduce`.

    Parameters
    ----------
    client : distributed.Client
    inputs : sequence of distributed.Future
        ``inputs[i]``: a numpy array in memory on ``workers[i]``.
    workers : sequence of str
        Distinct worker addresses; results come back in this order.

    Returns
    -------
    Collective
        ``outputs[i]`` is the result on ``workers[i]``.

    Raises
    ------
    ValueError
        Before anything is scheduled, for an empty or repeating worker list, or contributions
        not matching the workers or differing in dtype or shape.
    """
    workers = _check_workers(client, workers, inputs)
    metas = _contributions(client, workers, inputs, "allreduce", ragged=False)
    graph = build_allreduce(new_token(), [f.key for f in inputs], metas[0][0])
    return _submit(client, graph, workers)


def _contributions(
    client, workers: list[str], inputs: Sequence, op: str, ragged: bool
) -> list[tuple]:
    """``(shape, dtype, min, max)`` of each contribution, checked to share dtype and shape
    (beyond axis 0 if ``ragged``)."""
    metas = _inspect(client, workers, inputs, "input")
    if ragged:
        no_rows = f"{op} contributions must have at least one dimension"
        _same_rows("contributions", "shape beyond axis 0", metas, no_rows)
    else:
        _same("contributions", "dtype", [str(m[1]) for m in metas])
        _same("contributions", "shape", [m[0] for m in metas])
    return metas


def _gathered(client, inputs: Sequence, workers: Sequence[str], stack: bool) -> Collective:
    workers = _check_workers(client, workers, inputs)
    _contributions(
        client, workers, inputs, "allgather" if stack else "allgatherv", ragged=not stack
    )
    graph = build_allgather(new_token(), [f.key for f in inputs], stack)
    return _submit(client, graph, workers)


def allgather(client, inputs: Sequence, workers: Sequence[str]) -> Collective:
    """Every worker gets ``np.stack`` of all contributions (same shape and dtype), in worker
    order. Bytes: :func:`build_allgather`.

    Parameters
    ----------
    client, inputs, workers
        As for :func:`allreduce`.

    Returns
    -------
    Collective

    Raises
    ------
    ValueError
        Before anything is scheduled, on an empty worker list or mismatched contributions.
    """
    return _gathered(client, inputs, workers, stack=True)


def allgatherv(client, inputs: Sequence, workers: Sequence[str]) -> Collective:
    """Every worker gets ``np.concatenate`` of all contributions along axis 0 (same dtype and
    shape beyond axis 0, any length). Bytes: :func:`build_allgather`.

    Parameters
    ----------
    client, inputs, workers
        As for :func:`allreduce`.

    Returns
    -------
    Collective

    Raises
    ------
    ValueError
        Before anything is scheduled, on an empty worker list or mismatched contributions.
    """
    return _gathered(client, inputs, workers, stack=False)
