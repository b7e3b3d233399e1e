"""A phase solver for phases of many parts: every free vertex goes to the part its placed pins
(fixed, or free and placed before it) pull it to most (greedy, within the weight limits), then
swaps and moves that lower connectivity-1 are applied in sweeps until one gains less than
:data:`MIN_SWEEP_GAIN` (docs/partitioning.md, "The swap search"). The kernels are in
:mod:`graph._kernels`; no partitioner library.
"""

from __future__ import annotations

import numpy as np

from graph._kernels import greedy_placement, improve_by_swaps
from graph.hypergraph import PhaseHypergraph

__all__ = ["MAX_SWAP_SWEEPS", "MIN_SWEEP_GAIN", "SWAP_TARGETS", "solve_by_swaps"]

#: Sweeps over all free vertices at most.
MAX_SWAP_SWEEPS = 20
#: The sweeps stop once one lowers connectivity-1 by less than this fraction of it.
MIN_SWEEP_GAIN = 0.01
#: A vertex tries swaps with the vertices of the parts its move would gain most on, this many.
SWAP_TARGETS = 2


def solve_by_swaps(
    hypergraph: PhaseHypergraph,
    nparts: int,
    limits: np.ndarray,
    seed: int = 0,
    initial: np.ndarray | None = None,
) -> np.ndarray:
    """Place the free vertices of ``hypergraph`` (with fixed vertices) under ``limits``.

    Parameters
    ----------
    hypergraph : PhaseHypergraph
        Free vertices of positive weight.
    nparts : int
    limits : numpy.ndarray
        Largest weight of free vertices on every part (their sum must hold all free vertices).
    seed : int
        Order of the sweeps.
    initial : numpy.ndarray, optional
        A placement within ``limits`` (a part per free vertex) to improve instead of the greedy
        one.

    Returns
    -------
    numpy.ndarray
        The part of every free vertex.

    Raises
    ------
    ValueError
        If ``initial`` is not a part per free vertex or exceeds ``limits``.

    Notes
    -----
    Cost: the greedy placement reads each vertex's pins once per placed neighbour; a sweep tries,
    for every free vertex, a move to each part its nets touch and a swap with every vertex of
    the :data:`SWAP_TARGETS` parts it gains most on, so a sweep costs about ``SWAP_TARGETS x
    num_free / nparts`` swap evaluations a vertex (``auto`` runs it from 256 parts on).
    """
    num_free = hypergraph.num_free
    offsets = hypergraph.net_offsets.astype(np.int64)
    pins = hypergraph.net_pins.astype(np.int64)
    sizes = np.diff(offsets)
    net_of_pin = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    free = pins < num_free
    vertex_nets = net_of_pin[free][np.argsort(pins[free], kind="stable")]
    vertex_offsets = np.zeros(num_free + 1, dtype=np.int64)
    np.cumsum(np.bincount(pins[free], minlength=num_free), out=vertex_offsets[1:])
    nets = (offsets, pins, vertex_offsets, vertex_nets, hypergraph.net_weights.astype(np.int64))
    parts = np.full(hypergraph.num_vertices, -1, dtype=np.int64)
    parts[num_free:] = hypergraph.fixed_parts
    weights = hypergraph.vertex_weights.astype(np.int64)
    limits = np.asarray(limits, dtype=np.int64)
    if initial is None:
        greedy_placement(nets, weights, limits, num_free, nparts, parts)
    else:
        start = np.asarray(initial)
        if start.shape != (num_free,) or ((start < 0) | (start >= nparts)).any():
            raise ValueError(f"initial must give each of the {num_free} free vertices a part")
        if (np.bincount(start, weights=weights, minlength=nparts) > limits).any():
            raise ValueError("initial puts more weight on a part than its limit")
        parts[:num_free] = start
    sweep_order = np.random.default_rng(seed).permutation(num_free).astype(np.int64)
    improve_by_swaps(
        nets, weights, limits, num_free, nparts, parts, sweep_order,
        MAX_SWAP_SWEEPS, MIN_SWEEP_GAIN, SWAP_TARGETS,
    )  # fmt: skip
    return parts[:num_free]
