"""Calls into the phase solvers: KaHyPar, Mt-KaHyPar and the project's swap search
(:mod:`graph.swap`), on the CSR arrays of a :class:`~graph.hypergraph.PhaseHypergraph`; ``auto``
picks per phase. Fixed vertices weigh 1 and raise their part's limit by that; weightless free
vertices are placed after the others by the parts their nets touch (docs/partitioning.md,
"Solving a phase").
"""

from __future__ import annotations

import os
from functools import cache
from importlib import resources

import numpy as np
import scipy.sparse as sp

from graph.hypergraph import PhaseHypergraph
from graph.swap import solve_by_swaps

__all__ = [
    "BACKENDS",
    "KAHYPAR_CONFIG",
    "MTKAHYPAR_PRESETS",
    "SWAP_MIN_PARTS",
    "block_weight_limits",
    "choose_backend",
    "run_backend",
]

BACKENDS = ("auto", "kahypar", "mtkahypar", "swap")
#: ``auto`` solves a phase with fixed vertices by swaps from this many parts on: there KaHyPar's
#: k-way search costs about a second a phase whatever the size (docs/partitioning.md).
SWAP_MIN_PARTS = 256
MTKAHYPAR_PRESETS = ("DEFAULT", "DETERMINISTIC", "QUALITY")
KAHYPAR_CONFIG = "kahypar_km1.ini"


def block_weight_limits(hypergraph: PhaseHypergraph, nparts: int, epsilon: float) -> np.ndarray:
    """Largest weight each part may reach, fixed vertices (weight 1) included: free vertices
    ``floor((1 + epsilon) * W / nparts)``, never below ``ceil(W / nparts)``."""
    total = int(hypergraph.vertex_weights.sum())
    limit = max(int(np.floor((1.0 + epsilon) * total / nparts)), -(-total // nparts))
    limits = np.full(nparts, limit, dtype=np.int64)
    limits[hypergraph.fixed_parts] += 1
    return limits


def choose_backend(hypergraph: PhaseHypergraph, nparts: int) -> str:
    """What ``auto`` runs on ``hypergraph``: ``swap`` when it has fixed vertices and at least
    :data:`SWAP_MIN_PARTS` parts, else ``kahypar``."""
    if len(hypergraph.fixed_parts) and nparts >= SWAP_MIN_PARTS:
        return "swap"
    return "kahypar"


def run_backend(
    hypergraph: PhaseHypergraph,
    nparts: int,
    epsilon: float,
    seed: int,
    backend: str = "auto",
    preset: str = "DEFAULT",
) -> np.ndarray:
    """Partition ``hypergraph`` into ``nparts`` parts minimising connectivity-1.

    Parameters
    ----------
    hypergraph : PhaseHypergraph
    nparts : int
    epsilon : float
        Allowed imbalance of the free vertices.
    seed : int
        Random seed of the partitioner.
    backend : {"auto", "kahypar", "mtkahypar", "swap"}
        Which solver to call (``auto``: :func:`choose_backend`).
    preset : str
        Mt-KaHyPar preset (ignored by KaHyPar, which reads the project's configuration file).

    Returns
    -------
    numpy.ndarray
        The part of every free vertex.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown partitioning backend {backend!r}; choose one of {BACKENDS}")
    if backend == "auto":
        backend = choose_backend(hypergraph, nparts)
    if hypergraph.num_free == 0:
        return np.zeros(0, dtype=np.int64)
    if nparts == 1:
        return np.zeros(hypergraph.num_free, dtype=np.int64)
    weighted = hypergraph.vertex_weights > 0
    if weighted.all():
        return _run_weighted(hypergraph, nparts, epsilon, seed, backend, preset)
    parts = np.full(hypergraph.num_free, -1, dtype=np.int64)
    if weighted.any():
        parts[weighted] = _run_weighted(
            _weighted_part(hypergraph, weighted), nparts, epsilon, seed, backend, preset
        )
    _place_weightless(hypergraph, parts, np.flatnonzero(~weighted), nparts)
    return parts


def _run_weighted(
    hypergraph: PhaseHypergraph, nparts: int, epsilon: float, seed: int, backend: str, preset: str
) -> np.ndarray:
    """The backend's part of every free vertex of ``hypergraph``, all of positive weight."""
    limits = block_weight_limits(hypergraph, nparts, epsilon)
    if backend == "swap":
        fixed_weight = np.bincount(hypergraph.fixed_parts, minlength=nparts)
        return solve_by_swaps(hypergraph, nparts, limits - fixed_weight, seed)
    if backend == "mtkahypar":
        parts = _run_mtkahypar(hypergraph, nparts, epsilon, seed, preset, limits)
    else:
        parts = _run_kahypar(hypergraph, nparts, epsilon, seed, limits)
    return parts[: hypergraph.num_free]


def _weighted_part(hypergraph: PhaseHypergraph, weighted: np.ndarray) -> PhaseHypergraph:
    """``hypergraph`` restricted to the free vertices flagged in ``weighted`` and the fixed ones
    (nets left with fewer than two pins dropped)."""
    num_kept = int(weighted.sum())
    new_id = np.full(hypergraph.num_vertices, -1, dtype=np.int64)
    new_id[: hypergraph.num_free][weighted] = np.arange(num_kept)
    new_id[hypergraph.num_free :] = num_kept + np.arange(len(hypergraph.fixed_parts))
    sizes = np.diff(hypergraph.net_offsets)
    net_of_pin = np.repeat(np.arange(hypergraph.num_nets), sizes)
    pins = new_id[hypergraph.net_pins]
    keep_pin = pins >= 0
    new_sizes = np.bincount(net_of_pin[keep_pin], minlength=hypergraph.num_nets)
    keep_net = new_sizes >= 2
    keep_pin &= keep_net[net_of_pin]
    return PhaseHypergraph(
        num_free=num_kept,
        vertex_weights=hypergraph.vertex_weights[weighted],
        fixed_parts=hypergraph.fixed_parts,
        net_offsets=np.concatenate([[0], np.cumsum(new_sizes[keep_net])]).astype(np.int64),
        net_pins=pins[keep_pin],
        net_weights=hypergraph.net_weights[keep_net],
        vertex_of_neuron=np.zeros(0, dtype=np.int64),
    )


def _place_weightless(
    hypergraph: PhaseHypergraph, parts: np.ndarray, weightless: np.ndarray, nparts: int
) -> None:
    """Give each vertex in ``weightless`` (in order) the part most of its nets touch, in place;
    ties, and vertices in no net, to the part with the fewest neurons so far."""
    neurons = np.bincount(hypergraph.vertex_of_neuron, minlength=hypergraph.num_free)
    load = np.bincount(parts[parts >= 0], weights=neurons[parts >= 0], minlength=nparts)
    sizes = np.diff(hypergraph.net_offsets)
    net_of_pin = np.repeat(np.arange(hypergraph.num_nets), sizes)
    by_vertex = sp.csr_matrix(
        (hypergraph.net_weights[net_of_pin], (hypergraph.net_pins, net_of_pin)),
        shape=(hypergraph.num_vertices, hypergraph.num_nets),
    )
    all_parts = np.concatenate([parts, hypergraph.fixed_parts])
    for v in weightless.tolist():
        affinity = np.zeros(nparts)
        for net in by_vertex.indices[by_vertex.indptr[v] : by_vertex.indptr[v + 1]].tolist():
            first, last = hypergraph.net_offsets[net], hypergraph.net_offsets[net + 1]
            pins = hypergraph.net_pins[first:last]
            touched = np.unique(all_parts[pins])
            affinity[touched[touched >= 0]] += hypergraph.net_weights[net]
        best = np.flatnonzero(affinity == affinity.max())
        part = int(best[np.argmin(load[best])])
        parts[v] = all_parts[v] = part
        load[part] += neurons[v]


@cache
def _mtkahypar_initializer():
    import mtkahypar

    return mtkahypar.initialize(min(2, os.cpu_count() or 1), False)


@cache
def _mtkahypar_context(preset: str, nparts: int, epsilon: float):
    import mtkahypar

    if preset not in MTKAHYPAR_PRESETS:
        raise ValueError(f"unknown Mt-KaHyPar preset {preset!r}; choose one of {MTKAHYPAR_PRESETS}")
    context = _mtkahypar_initializer().context_from_preset(getattr(mtkahypar.PresetType, preset))
    context.set_partitioning_parameters(nparts, epsilon, mtkahypar.Objective.KM1)
    context.logging = False
    return context


def _vertex_weights(hypergraph: PhaseHypergraph) -> np.ndarray:
    fixed = np.ones(len(hypergraph.fixed_parts), dtype=np.int64)
    return np.concatenate([hypergraph.vertex_weights, fixed])


def _run_mtkahypar(
    hypergraph: PhaseHypergraph,
    nparts: int,
    epsilon: float,
    seed: int,
    preset: str,
    limits: np.ndarray,
) -> np.ndarray:
    import mtkahypar

    initializer = _mtkahypar_initializer()
    context = _mtkahypar_context(preset, nparts, epsilon)
    context.set_individual_target_block_weights(limits.tolist())
    mtkahypar.set_seed(int(seed))
    nets = []
    if hypergraph.num_nets:
        nets = np.split(hypergraph.net_pins, hypergraph.net_offsets[1:-1])
    mt_hypergraph = initializer.create_hypergraph(
        context,
        hypergraph.num_vertices,
        hypergraph.num_nets,
        nets,
        _vertex_weights(hypergraph),
        hypergraph.net_weights,
    )
    if len(hypergraph.fixed_parts):
        fixed = np.full(hypergraph.num_vertices, -1, dtype=np.int64)
        fixed[hypergraph.num_free :] = hypergraph.fixed_parts
        mt_hypergraph.add_fixed_vertices(fixed, nparts)
    return np.asarray(mt_hypergraph.partition(context).get_partition(), dtype=np.int64)


def _kahypar_config_path() -> str:
    return str(resources.files("graph").joinpath(KAHYPAR_CONFIG))


def _run_kahypar(
    hypergraph: PhaseHypergraph, nparts: int, epsilon: float, seed: int, limits: np.ndarray
) -> np.ndarray:
    import kahypar

    context = kahypar.Context()
    context.loadINIconfiguration(_kahypar_config_path())
    context.setK(nparts)
    context.setEpsilon(epsilon)
    context.setCustomTargetBlockWeights(limits.tolist())
    context.setSeed(int(seed))
    context.suppressOutput(True)
    ka_hypergraph = kahypar.Hypergraph(
        hypergraph.num_vertices,
        hypergraph.num_nets,
        hypergraph.net_offsets.tolist(),
        hypergraph.net_pins.tolist(),
        nparts,
        hypergraph.net_weights.tolist(),
        _vertex_weights(hypergraph).tolist(),
    )
    for offset, part in enumerate(hypergraph.fixed_parts.tolist()):
        ka_hypergraph.fixNodeToBlock(hypergraph.num_free + offset, part)
    kahypar.partition(ka_hypergraph, context)
    return np.fromiter(
        (ka_hypergraph.blockID(v) for v in range(hypergraph.num_vertices)),
        dtype=np.int64,
        count=hypergraph.num_vertices,
    )
