"""Placing a network's parts (part ``m`` on worker ``m % W``) and snapshots of their values."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import dask.array as da
import numpy as np
import scipy.sparse as sp
import sparse

from dasknn.model_parallel._plan import CommPlan, LayerPartPlan, renumbered_chunks
from dasknn.model_parallel._worker_state import ModelState, snapshot_bias, snapshot_weight
from dasknn.runtime.background import OneAtATime
from dasknn.runtime.faults import POLL_SECONDS, run_watching_part_workers
from dasknn.runtime.model_plugin import call_plugin
from dasknn.runtime.model_span import held_in_span
from dasknn.runtime.scatter import scatter_released_if_given_up
from dasknn.runtime.waiting import run_watching

__all__ = [
    "PLACEMENT_BYTES", "PLACING", "Layout", "Snapshot", "chunk_entries", "gather_network",
    "original_pattern", "place_network", "scatter_pinned", "snapshot_network", "worker_of_parts",
]

#: What is being done while a network is placed, for the error naming a lost part worker.
PLACING = "the model was placed on the workers"


def worker_of_parts(workers: Sequence[str], nparts: int) -> list[str]:
    """Address of the worker of every part: part ``m`` goes to ``workers[m % W]``."""
    if not workers:
        raise ValueError("the Dask cluster has no workers")
    return [workers[m % len(workers)] for m in range(nparts)]


def scatter_pinned(
    client, data: dict, part_workers: Sequence[str], part_of, timeout: float | None = None,
    watch: str | None = None,
) -> dict:  # fmt: skip
    """Scatter ``{key: value}`` so each value lands on the worker of part ``part_of(key)``; returns
    futures. ``TimeoutError`` after ``timeout`` seconds in all; with ``watch`` (what is being done,
    in words) a part worker that leaves raises :class:`~dasknn.exceptions.WorkerLostError` at once.
    """
    by_worker: dict[str, dict] = {}
    for key, value in data.items():
        by_worker.setdefault(part_workers[part_of(key)], {})[key] = value
    futures = {}
    left = _clock(timeout)
    try:
        for address, chunk in by_worker.items():
            call = scatter_released_if_given_up(client, chunk, workers=[address])
            if watch is None:
                scattered = run_watching(client, call, left(), lambda: None, POLL_SECONDS)
            else:
                scattered = run_watching_part_workers(client, call, part_workers, left(), watch)
            futures.update(scattered)
    except BaseException:
        # release the values already scattered now, not when the traceback is collected
        client.cancel(list(futures.values()))
        futures.clear()
        raise
    return futures


def _clock(timeout: float | None):
    """A function returning the seconds left of ``timeout`` (``None``: no limit) from now."""
    deadline = time.monotonic() + (float("inf") if timeout is None else timeout)
    return lambda: max(deadline - time.monotonic(), 0.0)


@dataclass
class Layout:
    """Where the parts of a placed network are: ``part_workers[m]``, the worker of part ``m``;
    ``shapes[k-1] = (n_{k-1}, (c_0, ..., c_{P-1}))``, layer ``k``'s rows and every part's columns;
    ``plan_keys[k-1][m]``, the key of the :class:`LayerPartPlan` of part ``m`` in layer ``k``,
    whose future ``futures`` holds."""

    token: str
    part_workers: list[str]
    shapes: list[tuple[int, tuple[int, ...]]]
    dtype: np.dtype
    plan_keys: list[list]
    futures: dict


@dataclass
class Snapshot:
    """The weights (one GCXS chunk per part, on its worker) and biases of a distributed model,
    renumbered, per layer, after ``version`` training steps."""

    version: int
    weights: list[da.Array]
    biases: list[da.Array]


#: Bytes of chunk values, indices and biases the client holds for the workers before it hands
#: them over (a layer at least): placing a network larger than this holds this much of it.
PLACEMENT_BYTES = 16 * 2**20


def place_network(
    client, token: str, plan: CommPlan,
    layers: Iterable[tuple[list[LayerPartPlan], list[sp.csr_matrix]]],
    biases: Sequence[np.ndarray], part_workers: list[str], dtype: np.dtype,
    states: dict | None = None, generation: int = 0, timeout: float | None = None,
    span: dict | None = None,
) -> Layout:  # fmt: skip
    """Hand every layer's part plans and renumbered chunks (as
    :func:`~dasknn.model_parallel._plan.iter_layers` gives them, for ``plan``'s renumbering) and
    the ``biases`` (original neuron order) to the plugin of the model ``token`` on their workers
    (``part_workers``, :func:`worker_of_parts`) as ``dtype`` values, with the optimizer ``states``
    ``{(k, m): (optimizer, weight state, bias state)}`` given; scatter the plans.

    The chunks are handed over as they come, whenever :data:`PLACEMENT_BYTES` of them are
    waiting, in a thread of their own while the next layers are made, so the client holds about
    twice that much of the network beside the layer being made.
    ``generation`` numbers the placement (part of the plans' keys, so no key is reused); with a
    ``span`` (the model's), the plans are held by tasks of that span, named in ``plan_keys``.
    ``TimeoutError`` unless the workers accept everything within ``timeout`` seconds;
    :class:`~dasknn.exceptions.WorkerLostError` as soon as a part worker leaves.
    """
    plans: dict = {}
    waiting: dict = {}  # worker -> {(k, m): (chunk, bias)}
    waiting_bytes = 0
    plan_keys, shapes = [], []
    states = states or {}
    left = _clock(timeout)
    with OneAtATime("dasknn-placement") as installer:  # at most one batch on its way

        def hand_over() -> None:
            installer.wait()  # the batch before it, so that left() counts its time
            installer.submit(
                _install, client, token, generation, waiting, states, part_workers, left()
            )

        for k, (layer_plans, layer_chunks) in enumerate(layers, start=1):
            plan_name = f"dasknn-plan-{token}-{k}-g{generation}"
            bias = np.asarray(biases[k - 1], dtype=dtype)[plan.orders[k]]
            offsets = plan.offsets[k]
            for m, chunk in enumerate(layer_chunks):
                chunk = chunk.astype(dtype, copy=False)
                bias_m = np.array(bias[offsets[m] : offsets[m + 1]], dtype=dtype)
                waiting.setdefault(part_workers[m], {})[(k, m)] = (chunk, bias_m)
                waiting_bytes += chunk.data.nbytes + chunk.indices.nbytes + chunk.indptr.nbytes
                plans[(plan_name, m)] = layer_plans[m]
            del layer_chunks, chunk
            plan_keys.append([(plan_name, m) for m in range(plan.nparts)])
            sizes = tuple(int(c) for c in plan.part_sizes(k))
            shapes.append((int(plan.offsets[k - 1][-1]), sizes))
            if waiting_bytes >= PLACEMENT_BYTES:
                hand_over()
                waiting, waiting_bytes = {}, 0
        hand_over()
    futures = scatter_pinned(client, plans, part_workers, lambda key: key[-1], left(), PLACING)
    if span is not None:
        workers = {key: part_workers[key[-1]] for key in futures}
        futures = held_in_span(client, futures, workers, span)
        plan_keys = [[futures[key].key for key in layer] for layer in plan_keys]
    return Layout(token, list(part_workers), shapes, np.dtype(dtype), plan_keys, futures)


def _install(
    client, token: str, generation: int, waiting: dict, states: dict, part_workers: list[str],
    timeout: float,
) -> None:  # fmt: skip
    """Install the ``waiting`` chunks ``{worker: {(k, m): (csr chunk, bias)}}`` (with their
    ``states``) on their workers within ``timeout`` seconds, every worker's at once.

    Each worker's chunks and states travel as one scattered key (Dask's serialization: the
    arrays' buffers out of band, not copied into a pickle), then one call on the worker hands
    them to the model's plugin, and the key is released; a scatter given up is released when it
    ends (no chunk stays behind)."""
    plugin = ModelState.plugin_name(token)

    async def install_on(address: str, chunks_here: dict) -> None:
        first = min(chunks_here)  # names the batch: no two batches of a placement share it
        key = f"dasknn-chunks-{token}-{first[0]}-{first[1]}-g{generation}"
        here = (chunks_here, {part: states[part] for part in chunks_here if part in states})
        futures = await scatter_released_if_given_up(client, {key: here}, workers=[address])
        try:
            await client.run(_install_scattered, plugin, key, workers=[address], asynchronous=True)
        finally:
            futures[key].release()

    async def install_all() -> None:
        await asyncio.gather(*(install_on(*placed) for placed in waiting.items()))

    run_watching_part_workers(client, install_all(), part_workers, timeout, PLACING)


def _install_scattered(plugin: str, key: str, dask_worker=None) -> int:
    """``client.run`` body: :meth:`ModelState.install` of the chunks ``{(k, m): (chunk, bias)}``
    and their optimizer states scattered here as ``key``."""
    chunks, states = dask_worker.data[key]
    return call_plugin(plugin, "install", chunks, states, dask_worker=dask_worker)


def chunk_entries(weight: sp.csr_matrix, plan: CommPlan, k: int) -> list[np.ndarray]:
    """``entries[m][i]``: the index in the CSR values of ``weight`` (layer ``k``, original neuron
    order, sorted indices) of part ``m``'s ``i``-th chunk value."""
    # Entry ids (from 1, so none is a zero that scipy could drop) renumbered as the values.
    ids = sp.csr_matrix(
        (np.arange(1, weight.nnz + 1, dtype=np.float64), weight.indices, weight.indptr),
        shape=weight.shape,
    )
    chunks = renumbered_chunks(ids, plan.orders[k - 1], plan.orders[k], plan.offsets[k])
    return [chunk.data.astype(np.int64) - 1 for chunk in chunks]


def original_pattern(
    chunks: Sequence[tuple[np.ndarray, np.ndarray]], order_in: np.ndarray, order_out: np.ndarray,
    offsets_out: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """A layer's CSR pattern in the original neuron order from its parts' chunks.

    ``chunks[m]`` is the ``(indptr, indices)`` of part ``m``'s chunk (rows renumbered by
    ``order_in``, columns ``offsets_out[m]:offsets_out[m+1]`` of those renumbered by
    ``order_out``). Returns ``(indptr, indices, position)``, sorted indices, where
    ``position[i]`` is the place of the layer's ``i``-th entry in the chunks' values laid end to
    end. One sort of the ``nnz`` entries; a few arrays of ``nnz`` integers."""
    rows, columns = [], []
    for m, (indptr, indices) in enumerate(chunks):
        rows.append(order_in[np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))])
        columns.append(order_out[offsets_out[m] + np.asarray(indices, dtype=np.int64)])
    row, column = np.concatenate(rows), np.concatenate(columns)
    position = np.argsort(row * len(order_out) + column)  # no two entries share a key
    indptr = np.zeros(len(order_in) + 1, dtype=np.int64)
    np.cumsum(np.bincount(row, minlength=len(order_in)), out=indptr[1:])
    return indptr, column[position], position


def snapshot_network(client, layout: Layout, version: int) -> tuple[Snapshot, list]:
    """Dask arrays of fresh copies of the current weights and biases (call with no step running),
    and the futures of the copy tasks (the caller waits for them)."""
    token, dtype = layout.token, layout.dtype
    meta = sparse.GCXS.from_numpy(np.empty((0, 0), dtype=dtype), compressed_axes=(0,))
    weights, biases, copies = [], [], []
    for k, (n_in, columns) in enumerate(layout.shapes, start=1):
        weight_name = f"dasknn-weight-{token}-{k}-v{version}"
        bias_name = f"dasknn-bias-{token}-{k}-v{version}"
        weight_graph, bias_graph = {}, {}
        for m, address in enumerate(layout.part_workers):
            pinned = {"workers": [address], "allow_other_workers": False, "pure": False}
            w_key, b_key = (weight_name, 0, m), (bias_name, m)
            weight_graph[w_key] = client.submit(snapshot_weight, token, k, m, key=w_key, **pinned)
            bias_graph[b_key] = client.submit(snapshot_bias, token, k, m, key=b_key, **pinned)
        weights.append(da.Array(weight_graph, weight_name, ((n_in,), columns), dtype, meta=meta))
        biases.append(da.Array(bias_graph, bias_name, (columns,), dtype, meta=np.empty(0, dtype)))
        copies += [*weight_graph.values(), *bias_graph.values()]
    return Snapshot(version, weights, biases), copies


def gather_network(
    client, snapshot: Snapshot, plan: CommPlan
) -> tuple[list[sp.csr_matrix], list[np.ndarray]]:
    """Fetch the weights and biases of ``snapshot`` back in the original neuron order."""
    weights, biases = [], []
    for k in range(1, plan.n_layers + 1):
        weight_array, bias_array = snapshot.weights[k - 1], snapshot.biases[k - 1]
        graph = {**weight_array.dask, **bias_array.dask}
        keys = [(weight_array.name, 0, m) for m in range(plan.nparts)]
        keys += [(bias_array.name, m) for m in range(plan.nparts)]
        values = client.gather([graph[key] for key in keys])
        blocks, bias_blocks = values[: plan.nparts], values[plan.nparts :]
        renumbered = sp.hstack([block.to_scipy_sparse() for block in blocks], format="csr")
        inverse_in, inverse_out = np.argsort(plan.orders[k - 1]), np.argsort(plan.orders[k])
        weight = sp.csr_matrix(renumbered[inverse_in][:, inverse_out])
        weight.sort_indices()
        weights.append(weight)
        biases.append(np.concatenate(bias_blocks)[inverse_out])
    return weights, biases
