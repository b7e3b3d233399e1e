"""Placement of a partitioned network on Dask workers.

Part ``m`` lives on worker ``m % W`` (workers sorted by address). Every layer's weights become a
dask array of pydata-sparse ``GCXS`` chunks of shape ``(n_{k-1}, c_m)`` (rows and columns renumbered
so every part is contiguous: :func:`dasknn.parallel.plan.reorder`), one chunk per part, scattered
to and kept on the part's worker; biases are dask arrays with the same column chunks, and every
part's :class:`~dasknn.parallel.plan.LayerPartPlan` sits beside its chunk. The chunks are updated in
place by the training steps, so the dask arrays always show the current weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import dask.array as da
import numpy as np
import scipy.sparse as sp
import sparse

from dasknn.parallel.plan import CommPlan

__all__ = ["Layout", "gather_network", "place_network", "scatter_pinned", "worker_of_parts"]


def worker_of_parts(workers: Sequence[str], nparts: int) -> list[str]:
    """Address of the worker of every part: part ``m`` goes to ``workers[m % W]``."""
    if not workers:
        raise ValueError("the Dask cluster has no workers")
    return [workers[m % len(workers)] for m in range(nparts)]


def scatter_pinned(client, data: dict, part_workers: Sequence[str], part_of) -> dict:
    """Scatter ``{key: value}`` so each value lands on the worker of its part; returns futures.

    ``part_of(key)`` names the part of a key. One scatter per worker (values are not hashed: the
    keys are the given ones).
    """
    by_worker: dict[str, dict] = {}
    for key, value in data.items():
        by_worker.setdefault(part_workers[part_of(key)], {})[key] = value
    futures = {}
    for address, chunk in by_worker.items():
        futures.update(client.scatter(chunk, workers=[address], hash=False, broadcast=False))
    return futures


@dataclass
class Layout:
    """Keys, futures and dask arrays of a placed network.

    Attributes
    ----------
    part_workers : list of str
        Worker address of every part.
    weights : list of dask.array.Array
        ``weights[k-1]``: the renumbered ``W_k`` as GCXS chunks, one per part of layer ``k``.
    biases : list of dask.array.Array
        ``biases[k-1]``: the renumbered ``b_k``, chunked like the columns of ``weights[k-1]``.
    plan_keys : list of list of key
        ``plan_keys[k-1][m]``: key of the :class:`LayerPartPlan` of part ``m`` in layer ``k``.
    futures : dict
        Every future of the layout (holding them keeps the data on the workers).
    """

    part_workers: list[str]
    weights: list[da.Array]
    biases: list[da.Array]
    plan_keys: list[list]
    futures: dict

    def weight_key(self, k: int, m: int):
        """Key of the weight chunk of part ``m`` in layer ``k``."""
        return (self.weights[k - 1].name, 0, m)

    def bias_key(self, k: int, m: int):
        """Key of the bias chunk of part ``m`` in layer ``k``."""
        return (self.biases[k - 1].name, m)


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
) -> Layout:
    """Scatter the renumbered weight chunks, biases and plans to the workers of their parts.

    Parameters
    ----------
    client : distributed.Client
    token : str
        Unique name of the distributed model (part of every key).
    plan, chunks : from :func:`dasknn.parallel.plan.build_comm_plan`
    biases : sequence of 1-D arrays in the original neuron order
    part_workers : from :func:`worker_of_parts`
    dtype : numpy dtype of the values
    """
    data: dict = {}
    weight_names, bias_names, plan_keys = [], [], []
    for k, layer_chunks in enumerate(chunks, start=1):
        weight_name = f"dasknn-weight-{token}-{k}"
        bias_name = f"dasknn-bias-{token}-{k}"
        plan_name = f"dasknn-plan-{token}-{k}"
        bias = np.asarray(biases[k - 1], dtype=dtype)[plan.orders[k]]
        offsets = plan.offsets[k]
        for m, chunk in enumerate(layer_chunks):
            chunk = sp.csr_matrix(chunk, dtype=dtype, copy=True)
            data[(weight_name, 0, m)] = _gcxs(chunk)
            data[(bias_name, m)] = np.array(bias[offsets[m] : offsets[m + 1]], dtype=dtype)
            data[(plan_name, m)] = plan.layers[k - 1][m]
        weight_names.append(weight_name)
        bias_names.append(bias_name)
        plan_keys.append([(plan_name, m) for m in range(plan.nparts)])
    futures = scatter_pinned(client, data, part_workers, lambda key: key[-1])
    meta = sparse.GCXS.from_numpy(np.empty((0, 0), dtype=dtype), compressed_axes=(0,))
    weights, bias_arrays = [], []
    for k, (weight_name, bias_name) in enumerate(zip(weight_names, bias_names, strict=True), 1):
        columns = tuple(int(c) for c in plan.part_sizes(k))
        n_in = int(plan.offsets[k - 1][-1])
        parts = range(plan.nparts)
        weight_graph = {(weight_name, 0, m): futures[(weight_name, 0, m)] for m in parts}
        bias_graph = {(bias_name, m): futures[(bias_name, m)] for m in parts}
        weights.append(
            da.Array(weight_graph, weight_name, chunks=((n_in,), columns), dtype=dtype, meta=meta)
        )
        bias_arrays.append(
            da.Array(bias_graph, bias_name, chunks=(columns,), dtype=dtype, meta=np.empty(0, dtype))
        )
    return Layout(part_workers, weights, bias_arrays, plan_keys, futures)


def gather_network(
    client, layout: Layout, plan: CommPlan
) -> tuple[list[sp.csr_matrix], list[np.ndarray]]:
    """Fetch the current weights and biases back in the original neuron order."""
    keys = []
    for k in range(1, plan.n_layers + 1):
        for m in range(plan.nparts):
            keys.append(layout.weight_key(k, m))
            keys.append(layout.bias_key(k, m))
    values = dict(zip(keys, client.gather([layout.futures[key] for key in keys]), strict=True))
    weights, biases = [], []
    for k in range(1, plan.n_layers + 1):
        blocks = [values[layout.weight_key(k, m)] for m in range(plan.nparts)]
        renumbered = sp.hstack([block.to_scipy_sparse() for block in blocks], format="csr")
        inverse_in = np.argsort(plan.orders[k - 1])
        inverse_out = np.argsort(plan.orders[k])
        weight = sp.csr_matrix(renumbered[inverse_in][:, inverse_out])
        weight.sort_indices()
        weights.append(weight)
        bias = np.concatenate([values[layout.bias_key(k, m)] for m in range(plan.nparts)])
        biases.append(bias[inverse_out])
    return weights, biases
