"""The multi-phase forward sweep: one hypergraph partition per layer, in layer order."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from graph.backends import run_backend
from graph.hypergraph import build_phase_hypergraph

__all__ = ["assign_input_owners", "consumer_part_matrix", "multiphase_parts"]


def consumer_part_matrix(
    layer: sp.spmatrix, output_parts: np.ndarray, nparts: int
) -> sp.csr_matrix:
    """``(n_in, nparts)`` 0/1 matrix: entry ``(i, p)`` is 1 when part ``p`` consumes input ``i``."""
    coo = sp.coo_matrix(layer)
    matrix = sp.csr_matrix(
        (np.ones(coo.nnz, dtype=np.int8), (coo.row, np.asarray(output_parts)[coo.col])),
        shape=(layer.shape[0], nparts),
    )
    matrix.sum_duplicates()
    matrix.data[:] = 1
    return matrix


def assign_input_owners(
    layer: sp.spmatrix, output_parts: np.ndarray, nparts: int
) -> np.ndarray:
    """Give every input feature to one of the parts that consume it, balancing the counts.

    Owning an input costs no words when the owner is one of its consumers. Inputs with fewer
    candidate parts choose first; each takes its least loaded candidate. Inputs nobody consumes go
    to the least loaded part.
    """
    candidates = consumer_part_matrix(layer, output_parts, nparts)
    n_in = layer.shape[0]
    count = np.diff(candidates.indptr)
    owners = np.empty(n_in, dtype=np.int64)
    load = np.zeros(nparts, dtype=np.int64)
    indptr, indices = candidates.indptr, candidates.indices
    for i in np.argsort(np.where(count == 0, nparts + 1, count), kind="stable").tolist():
        if count[i]:
            options = indices[indptr[i] : indptr[i + 1]]
            part = int(options[np.argmin(load[options])])
        else:
            part = int(np.argmin(load))
        owners[i] = part
        load[part] += 1
    return owners


def multiphase_parts(
    layers: Sequence[sp.spmatrix],
    nparts: int,
    epsilon: float,
    seed: int,
    backend: str,
    preset: str,
    max_chunk: int,
) -> list[np.ndarray]:
    """Partition layer after layer, each phase fixing its inputs to the parts chosen before."""
    parts: list[np.ndarray] = []
    previous = None
    for layer in layers:
        hypergraph = build_phase_hypergraph(layer, nparts, previous, max_chunk=max_chunk)
        vertex_parts = run_backend(hypergraph, nparts, epsilon, seed, backend, preset)
        current = hypergraph.neuron_parts(vertex_parts)
        if previous is None:
            parts.append(assign_input_owners(layer, current, nparts))
        parts.append(current)
        previous = current
    return parts
