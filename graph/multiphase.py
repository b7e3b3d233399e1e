"""The multi-phase forward sweep: one hypergraph partition per layer, in layer order."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from graph.assignment import assignment_applies, solve_by_assignment
from graph.backends import run_backend
from graph.hypergraph import PhaseHypergraph, build_phase_hypergraph

__all__ = [
    "PhaseSettings",
    "assign_input_owners",
    "consumer_part_matrix",
    "iter_phase_parts",
    "multiphase_parts",
    "solve_phase",
]


@dataclass(frozen=True)
class PhaseSettings:
    """How every phase is built and solved.

    Attributes
    ----------
    nparts : int
    epsilon : float
        Allowed imbalance.
    seed : int
        Partitioner seed.
    backend : str
        ``auto``, ``kahypar``, ``mtkahypar`` or ``swap`` (:func:`graph.backends.run_backend`).
    preset : str
        Mt-KaHyPar preset.
    max_chunk : int
        Largest chunk of merged identical neurons.
    exact_assignment : bool
        Solve phases that must put exactly one merged vertex on every part by linear assignment.
    """

    nparts: int
    epsilon: float = 0.01
    seed: int = 0
    backend: str = "auto"
    preset: str = "DEFAULT"
    max_chunk: int = 16
    exact_assignment: bool = True


def solve_phase(hypergraph: PhaseHypergraph, settings: PhaseSettings) -> np.ndarray:
    """Place the neurons of one phase: exact assignment when it applies, else the backend."""
    if settings.exact_assignment and assignment_applies(hypergraph, settings.nparts):
        vertex_parts = solve_by_assignment(hypergraph, settings.nparts)
    else:
        vertex_parts = run_backend(
            hypergraph,
            settings.nparts,
            settings.epsilon,
            settings.seed,
            settings.backend,
            settings.preset,
        )
    return hypergraph.neuron_parts(vertex_parts)


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
    """Give every input feature to its least loaded consuming part (fewest candidates first;
    unconsumed inputs to the least loaded part)."""
    candidates = consumer_part_matrix(layer, output_parts, nparts)
    count = np.diff(candidates.indptr)
    owners = np.empty(layer.shape[0], dtype=np.int64)
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


def iter_phase_parts(
    layers: Iterable[sp.spmatrix], settings: PhaseSettings
) -> Iterator[tuple[int, sp.spmatrix | None, np.ndarray]]:
    """The forward sweep as a generator: partition layer after layer, holding one layer at a time.

    Yields ``(0, None, input_parts)`` after the first phase, then ``(k, layer, parts)`` for every
    layer ``k = 1 .. L``; ``layers`` may be an iterator (only the previous parts are kept).

    Raises
    ------
    ValueError
        Before layer ``k``'s phase runs, if its inputs do not match the outputs of layer ``k-1``.
    """
    previous = None
    for k, layer in enumerate(layers, start=1):
        if previous is not None and layer.shape[0] != len(previous):
            raise ValueError(
                f"layer {k} has {layer.shape[0]} inputs but layer {k - 1} has "
                f"{len(previous)} outputs"
            )
        hypergraph = build_phase_hypergraph(
            layer, settings.nparts, previous, max_chunk=settings.max_chunk
        )
        current = solve_phase(hypergraph, settings)
        del hypergraph
        if previous is None:
            yield 0, None, assign_input_owners(layer, current, settings.nparts)
        yield k, layer, current
        previous = current


def multiphase_parts(layers: Sequence[sp.spmatrix], settings: PhaseSettings) -> list[np.ndarray]:
    """Partition layer after layer, each phase fixing its inputs to the parts chosen before."""
    return [parts for _, _, parts in iter_phase_parts(layers, settings)]
