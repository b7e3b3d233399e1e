"""Calls into the hypergraph partitioners: Mt-KaHyPar and KaHyPar.

Both receive the CSR arrays of a :class:`~graph.hypergraph.PhaseHypergraph` directly. Fixed vertices
get weight 1 (Mt-KaHyPar rejects weight 0) and every part's weight limit is raised by the weight of
the fixed vertex it holds, so the balance of the free vertices is exactly what ``epsilon`` allows.
"""

from __future__ import annotations

import os
from functools import cache
from importlib import resources

import numpy as np

from graph.hypergraph import PhaseHypergraph

__all__ = ["BACKENDS", "KAHYPAR_CONFIG", "MTKAHYPAR_PRESETS", "block_weight_limits", "run_backend"]

BACKENDS = ("mtkahypar", "kahypar")
MTKAHYPAR_PRESETS = ("DEFAULT", "DETERMINISTIC", "QUALITY")
KAHYPAR_CONFIG = "kahypar_km1.ini"


def block_weight_limits(hypergraph: PhaseHypergraph, nparts: int, epsilon: float) -> np.ndarray:
    """Largest weight each part may reach, fixed vertices (weight 1) included.

    The free vertices of a part may weigh ``floor((1 + epsilon) * W / nparts)``, where ``W`` is
    their total weight, but never less than ``ceil(W / nparts)`` so that a perfectly balanced
    partition is always admissible.
    """
    total = int(hypergraph.vertex_weights.sum())
    limit = max(int(np.floor((1.0 + epsilon) * total / nparts)), -(-total // nparts))
    limits = np.full(nparts, limit, dtype=np.int64)
    limits[hypergraph.fixed_parts] += 1
    return limits


def run_backend(
    hypergraph: PhaseHypergraph,
    nparts: int,
    epsilon: float,
    seed: int,
    backend: str = "mtkahypar",
    preset: str = "DEFAULT",
) -> np.ndarray:
    """Partition ``hypergraph`` into ``nparts`` parts minimising connectivity-1.

    Parameters
    ----------
    hypergraph : PhaseHypergraph
        The phase hypergraph.
    nparts : int
        Number of parts.
    epsilon : float
        Allowed imbalance of the free vertices.
    seed : int
        Random seed of the partitioner.
    backend : {"mtkahypar", "kahypar"}
        Which partitioner to call.
    preset : str
        Mt-KaHyPar preset (ignored by KaHyPar, which reads the project's configuration file).

    Returns
    -------
    numpy.ndarray
        The part of every free vertex.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown partitioning backend {backend!r}; choose one of {BACKENDS}")
    if hypergraph.num_free == 0:
        return np.zeros(0, dtype=np.int64)
    if nparts == 1:
        return np.zeros(hypergraph.num_free, dtype=np.int64)
    limits = block_weight_limits(hypergraph, nparts, epsilon)
    if backend == "mtkahypar":
        parts = _run_mtkahypar(hypergraph, nparts, epsilon, seed, preset, limits)
    else:
        parts = _run_kahypar(hypergraph, nparts, epsilon, seed, limits)
    return parts[: hypergraph.num_free]


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
