"""Exact phase solution when every part must take exactly one (merged) vertex: with equal weights
and as many free vertices as parts, connectivity-1 is linear in the placement, a linear assignment
(``scipy.optimize.linear_sum_assignment``) with profit ``M[v, p]`` = cost of the nets containing
``v`` with a fixed vertex in ``p`` (docs/partitioning.md, "Solving a phase").
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linear_sum_assignment

from graph.hypergraph import PhaseHypergraph

__all__ = ["assignment_applies", "solve_by_assignment"]


def assignment_applies(hypergraph: PhaseHypergraph, nparts: int) -> bool:
    """Whether balance forces exactly one free vertex per part (equal weights, one per part)."""
    weights = hypergraph.vertex_weights
    return (
        hypergraph.num_free == nparts
        and nparts > 1
        and len(weights) > 0
        and bool(np.all(weights == weights[0]))
    )


def solve_by_assignment(hypergraph: PhaseHypergraph, nparts: int) -> np.ndarray:
    """The placement (one part per free vertex) of least connectivity-1, by linear assignment."""
    num_free = hypergraph.num_free
    sizes = np.diff(hypergraph.net_offsets)
    net_of_pin = np.repeat(np.arange(hypergraph.num_nets), sizes)
    pins = hypergraph.net_pins
    free = pins < num_free
    shape = (hypergraph.num_nets, num_free)
    free_incidence = sp.csr_matrix(
        (hypergraph.net_weights[net_of_pin[free]], (net_of_pin[free], pins[free])), shape=shape
    )
    fixed_part = hypergraph.fixed_parts[pins[~free] - num_free]
    fixed_incidence = sp.csr_matrix(
        (np.ones(len(fixed_part), dtype=np.int64), (net_of_pin[~free], fixed_part)),
        shape=(hypergraph.num_nets, nparts),
    )
    profit = (free_incidence.T @ fixed_incidence).toarray()
    rows, cols = linear_sum_assignment(profit, maximize=True)
    placement = np.empty(num_free, dtype=np.int64)
    placement[rows] = cols
    return placement
