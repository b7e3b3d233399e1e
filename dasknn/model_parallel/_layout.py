"""Placement of a partitioned network on Dask workers, and snapshots of its current values.

Part ``m`` lives on worker ``m % W`` (workers sorted by address). Every layer is renumbered so every
part's rows and columns are contiguous (:func:`dasknn.model_parallel._plan.reorder`) and cut into
one chunk of shape ``(n_{k-1}, c_m)`` per part. The chunks and biases are handed to the model's
worker plugin (:class:`~dasknn.model_parallel._worker_state.ModelState`) on the part's worker, which
owns and trains them; every part's :class:`~dasknn.model_parallel._plan.LayerPartPlan` stays beside
them as Dask data (never changed). :func:`snapshot_network` turns the owned values into dask arrays
of fresh pydata-sparse ``GCXS`` chunks (biases: numpy chunks), each made by a task on its part's
worker. """

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import dask.array as da
import numpy as np
import scipy.sparse as sp
import sparse
from distributed import wait

from dasknn.model_parallel._plan import CommPlan
from dasknn.model_parallel._worker_state import install_parts, snapshot_bias, snapshot_weight
from dasknn.runtime.faults import POLL_SECONDS, run_watching_part_workers
from dasknn.runtime.model_span import held_in_span
from dasknn.runtime.scatter import scatter_released_if_given_up
from dasknn.runtime.waiting import run_watching

__all__ = [
    "PLACING",
    "Layout",
    "Snapshot",
    "chunk_entries",
    "gather_network",
    "place_network",
    "scatter_pinned",
    "snapshot_network",
    "worker_of_parts",
]

#: What is being done while a network is placed, for the error naming a lost part worker.
PLACING = "the model was placed on the workers"


def worker_of_parts(workers: Sequence[str], nparts: int) -> list[str]:
    """Address of the worker of every part: part ``m`` goes to ``workers[m % W]``."""
    if not workers:
        raise ValueError("the Dask cluster has no workers")
    return [workers[m % len(workers)] for m in range(nparts)]


def scatter_pinned(
    client,
    data: dict,
    part_workers: Sequence[str],
    part_of,
    timeout: float | None = None,
    watch: str | None = None,
) -> dict:
    """Scatter ``{key: value}`` so each value lands on the worker of its part; returns futures.

    ``part_of(key)`` names the part of a key. One scatter per worker (the keys are the given
    ones). Values not all taken within ``timeout`` seconds in all (a worker stopped, say) raise
    ``TimeoutError``; the keys of a scatter given up leave the cluster once the worker takes them
    (:func:`~dasknn.runtime.scatter.scatter_released_if_given_up`). With ``watch`` (what is
    being done, in words) the part workers are checked while the values travel, and a part
    worker that left the cluster is a :class:`~dasknn.exceptions.WorkerLostError` at
    once instead of an error after Dask's connect timeout.
    """
    by_worker: dict[str, dict] = {}
    for key, value in data.items():
        by_worker.setdefault(part_workers[part_of(key)], {})[key] = value
    futures = {}
    deadline = time.monotonic() + _limit(timeout)
    try:
        for address, chunk in by_worker.items():
            left = max(deadline - time.monotonic(), 0.0)
            scattering = scatter_released_if_given_up(client, chunk, workers=[address])
            if watch is not None:
                futures.update(
                    run_watching_part_workers(client, scattering, part_workers, left, watch)
                )
            else:
                futures.update(run_watching(client, scattering, left, lambda: None, POLL_SECONDS))
    except BaseException:
        # the values already scattered leave the cluster now, not when the error's traceback
        # (which refers to these futures) is collected
        client.cancel(list(futures.values()))
        futures.clear()
        raise
    return futures


@dataclass
class Layout:
    """Where the parts of a placed network are, and the keys of their plans.

    Attributes
    ----------
    token : str
        The model's token.
    part_workers : list of str
        Worker address of every part.
    shapes : list of tuple
        ``shapes[k-1]``: ``(n_{k-1}, (c_0, ..., c_{P-1}))``, rows and the columns of every part's
        chunk of layer ``k``.
    dtype : numpy.dtype
    plan_keys : list of list of key
        ``plan_keys[k-1][m]``: key of the :class:`LayerPartPlan` of part ``m`` in layer ``k``.
    futures : dict
        The futures of the plans by their scattered keys (holding them keeps the plans on the
        workers).
    """

    token: str
    part_workers: list[str]
    shapes: list[tuple[int, tuple[int, ...]]]
    dtype: np.dtype
    plan_keys: list[list]
    futures: dict


@dataclass
class Snapshot:
    """The weights and biases of a distributed model after a given number of training steps.

    Attributes
    ----------
    version : int
        Training steps completed when the snapshot was taken.
    weights, biases : list of dask.array.Array
        ``weights[k-1]``: the renumbered ``W_k``, one GCXS chunk per part on the part's worker;
        ``biases[k-1]``: the renumbered ``b_k``, chunked like the columns.
    """

    version: int
    weights: list[da.Array]
    biases: list[da.Array]


def _gcxs(chunk: sp.csr_matrix) -> sparse.GCXS:
    return sparse.GCXS(
        (chunk.data, chunk.indices, chunk.indptr), shape=chunk.shape, compressed_axes=(0,)
    )


def place_network(
    client,
    token: str,
    plan: CommPlan,
    chunks: list[list[sp.csr_matrix]],
    biases: Sequence[np.ndarray],
    part_workers: list[str],
    dtype: np.dtype,
    states: dict | None = None,
    generation: int = 0,
    timeout: float | None = None,
    span: dict | None = None,
) -> Layout:
    """Hand the renumbered weight chunks and biases to the model's plugin on the workers of their
    parts, and scatter the plans beside them.

    The model's :class:`~dasknn.model_parallel._worker_state.ModelState` must be registered. The
    chunks travel with one ``Client.run`` call per worker (no task and no key: the plugin keeps
    them).

    Parameters
    ----------
    client : distributed.Client
    token : str
        Unique name of the distributed model (part of every key).
    plan, chunks : from :func:`dasknn.model_parallel._plan.build_comm_plan`
    biases : sequence of 1-D arrays in the original neuron order
    part_workers : from :func:`worker_of_parts`
    dtype : numpy dtype of the values
    states : dict, optional
        ``{(k, m): (optimizer, weight state, bias state)}`` to install beside the chunks (the
        state arrays in the chunk's order).
    generation : int
        Number of the placement of this model (part of the plans' keys, so a new placement never
        reuses a key whose release may still be under way).
    timeout : float, optional
        Seconds the workers may take to accept the values and the plans, in all
        (``TimeoutError`` after that).
    span : dict, optional
        The model's span (:func:`~dasknn.runtime.model_span.new_span`): the plans are then held
        by tasks of that span (:func:`~dasknn.runtime.model_span.held_in_span`) and
        ``plan_keys`` name those tasks, so the steps that read the plans touch no other span.
    """
    plans: dict = {}
    values: dict = {}  # worker -> {(k, m): (chunk, bias)}
    plan_keys, shapes = [], []
    for k, layer_chunks in enumerate(chunks, start=1):
        plan_name = f"dasknn-plan-{token}-{k}-g{generation}"
        bias = np.asarray(biases[k - 1], dtype=dtype)[plan.orders[k]]
        offsets = plan.offsets[k]
        for m, chunk in enumerate(layer_chunks):
            chunk = sp.csr_matrix(chunk, dtype=dtype, copy=True)
            bias_m = np.array(bias[offsets[m] : offsets[m + 1]], dtype=dtype)
            values.setdefault(part_workers[m], {})[(k, m)] = (_gcxs(chunk), bias_m)
            plans[(plan_name, m)] = plan.layers[k - 1][m]
        plan_keys.append([(plan_name, m) for m in range(plan.nparts)])
        shapes.append((int(plan.offsets[k - 1][-1]), tuple(int(c) for c in plan.part_sizes(k))))
    states = states or {}
    deadline = time.monotonic() + _limit(timeout)
    for address, chunks_here in values.items():
        states_here = {key: states[key] for key in chunks_here if key in states}
        installing = client.run(
            install_parts,
            token=token,
            chunks=chunks_here,
            states=states_here,
            workers=[address],
            asynchronous=True,
        )
        left = max(deadline - time.monotonic(), 0.0)
        run_watching_part_workers(client, installing, part_workers, left, PLACING)
    left = max(deadline - time.monotonic(), 0.0)
    futures = scatter_pinned(client, plans, part_workers, lambda key: key[-1], left, PLACING)
    if span is not None:
        workers = {key: part_workers[key[-1]] for key in futures}
        futures = held_in_span(client, futures, workers, span)
        plan_keys = [[futures[key].key for key in layer] for layer in plan_keys]
    return Layout(token, list(part_workers), shapes, np.dtype(dtype), plan_keys, futures)


def _limit(timeout: float | None) -> float:
    return float("inf") if timeout is None else timeout


def chunk_entries(pattern, plan: CommPlan) -> list[list[np.ndarray]]:
    """Where every part's chunk values sit in the original layers' CSR values.

    Parameters
    ----------
    pattern : sequence of ``(shape, indptr, indices)``
        Every layer's CSR structure in the original neuron order (sorted indices).
    plan : CommPlan

    Returns
    -------
    list of list of numpy.ndarray
        ``entries[k-1][m][i]`` is the position, in the values of the original ``W_k``, of the
        ``i``-th stored value of part ``m``'s chunk (the chunks of
        :func:`~dasknn.model_parallel._plan.build_comm_plan`, cut the same way).
    """
    entries = []
    for k, (shape, indptr, indices) in enumerate(pattern, start=1):
        # Entry ids (from 1, so none is a zero that scipy could drop) renumbered as the values.
        ids = sp.csr_matrix(
            (np.arange(1, len(indices) + 1, dtype=np.float64), indices, indptr), shape=shape
        )
        renumbered = ids[plan.orders[k - 1]][:, plan.orders[k]]
        renumbered.sort_indices()
        offsets = plan.offsets[k]
        layer = []
        for m in range(plan.nparts):
            chunk = sp.csr_matrix(renumbered[:, offsets[m] : offsets[m + 1]])
            chunk.sort_indices()
            layer.append(chunk.data.astype(np.int64) - 1)
        entries.append(layer)
    return entries


def snapshot_network(client, layout: Layout, version: int) -> Snapshot:
    """Dask arrays of fresh copies of the current weights and biases, made on the parts' workers.

    The caller makes sure no training step is running; the copies are made before this returns,
    so they show the last completed step whatever runs next. Every call makes new keys, so nothing
    Dask holds is ever changed.
    """
    token, dtype = layout.token, layout.dtype
    meta = sparse.GCXS.from_numpy(np.empty((0, 0), dtype=dtype), compressed_axes=(0,))
    weights, biases, copies = [], [], []
    for k, (n_in, columns) in enumerate(layout.shapes, start=1):
        weight_name = f"dasknn-weight-{token}-{k}-v{version}"
        bias_name = f"dasknn-bias-{token}-{k}-v{version}"
        weight_graph, bias_graph = {}, {}
        for m, address in enumerate(layout.part_workers):
            pinned = {"workers": [address], "allow_other_workers": False, "pure": False}
            weight_graph[(weight_name, 0, m)] = client.submit(
                snapshot_weight, token, k, m, key=(weight_name, 0, m), **pinned
            )
            bias_graph[(bias_name, m)] = client.submit(
                snapshot_bias, token, k, m, key=(bias_name, m), **pinned
            )
        weights.append(
            da.Array(weight_graph, weight_name, chunks=((n_in,), columns), dtype=dtype, meta=meta)
        )
        biases.append(
            da.Array(bias_graph, bias_name, chunks=(columns,), dtype=dtype, meta=np.empty(0, dtype))
        )
        copies.extend(weight_graph.values())
        copies.extend(bias_graph.values())
    wait(copies)
    return Snapshot(version, weights, biases)


def gather_network(
    client, snapshot: Snapshot, plan: CommPlan
) -> tuple[list[sp.csr_matrix], list[np.ndarray]]:
    """Fetch the weights and biases of ``snapshot`` back in the original neuron order."""
    weights, biases = [], []
    for k in range(1, plan.n_layers + 1):
        weight_array, bias_array = snapshot.weights[k - 1], snapshot.biases[k - 1]
        keys = [(weight_array.name, 0, m) for m in range(plan.nparts)]
        keys += [(bias_array.name, m) for m in range(plan.nparts)]
        graph = {**weight_array.dask, **bias_array.dask}
        values = client.gather([graph[key] for key in keys])
        blocks, bias_blocks = values[: plan.nparts], values[plan.nparts :]
        renumbered = sp.hstack([block.to_scipy_sparse() for block in blocks], format="csr")
        inverse_in = np.argsort(plan.orders[k - 1])
        inverse_out = np.argsort(plan.orders[k])
        weight = sp.csr_matrix(renumbered[inverse_in][:, inverse_out])
        weight.sort_indices()
        weights.append(weight)
        biases.append(np.concatenate(bias_blocks)[inverse_out])
    return weights, biases
