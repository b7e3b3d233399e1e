"""``partition_network``: the public entry point of the partitioners."""

from __future__ import annotations

import time
from collections.abc import Sequence

import scipy.sparse as sp

from graph.backends import BACKENDS, MTKAHYPAR_PRESETS
from graph.baselines import block_parts, layer_sizes, random_parts
from graph.checks import check_csr
from graph.multiphase import PhaseSettings, multiphase_parts
from graph.network_partition import NetworkPartition
from graph.refine import refine_parts

__all__ = ["METHODS", "DEFAULT_BACKEND", "partition_network", "check_network"]

METHODS = ("hypergraph", "random", "block")
DEFAULT_BACKEND = "auto"


def check_network(layers: Sequence[sp.spmatrix]) -> None:
    """Check that ``layers`` is a network that can be partitioned.

    Parameters
    ----------
    layers : sequence of scipy.sparse matrices
        The network's layers, ``(n_in, n_out)`` each.

    Raises
    ------
    ValueError
        Naming the layer, unless ``layers`` is a non-empty chain of 2-d sparse matrices whose
        arrays pass :func:`graph.checks.check_csr`.
    """
    if len(layers) == 0:
        raise ValueError("the network has no layers")
    for k, layer in enumerate(layers, start=1):
        if not sp.issparse(layer) or layer.ndim != 2:
            raise ValueError(f"layer {k} is not a 2-d scipy sparse matrix")
        check_csr(layer, name=f"layer {k}")
        if k > 1 and layers[k - 2].shape[1] != layer.shape[0]:
            raise ValueError(
                f"layer {k} has {layer.shape[0]} inputs but layer {k - 1} has "
                f"{layers[k - 2].shape[1]} outputs"
            )


def partition_network(
    layers: Sequence[sp.spmatrix],
    nparts: int,
    method: str = "hypergraph",
    epsilon: float = 0.01,
    backend: str = DEFAULT_BACKEND,
    seed: int = 0,
    preset: str = "DEFAULT",
    max_chunk: int = 16,
    refine: bool = False,
    max_sweeps: int = 8,
    exact_assignment: bool = True,
) -> NetworkPartition:
    """Partition every layer of a sparse network into ``nparts`` parts.

    Parameters
    ----------
    layers : sequence of scipy.sparse matrices
        Layer ``k`` (1-based) is ``layers[k-1]``, ``(n_in, n_out)``; its neurons are the columns.
    nparts : int
        Number of parts, at least 1 and at most the neurons of the narrowest layer.
    method : {"hypergraph", "random", "block"}
        ``hypergraph``: the multi-phase hypergraph model; ``random``: balanced uniform random;
        ``block``: contiguous ranges.
    epsilon : float
        Allowed load imbalance of every phase (hypergraph method).
    backend : {"auto", "kahypar", "mtkahypar", "swap"}
        Phase solver (:mod:`graph.backends`); ``auto`` runs KaHyPar, or the swap search on
        phases with fixed vertices from :data:`graph.backends.SWAP_MIN_PARTS` parts on.
    seed : int
        Seed of the partitioner or of the random baseline.
    preset : str
        Mt-KaHyPar preset.
    max_chunk : int
        Neurons with identical inputs are merged into chunks of at most this many (1: no merging).
    refine : bool
        Follow the forward sweep with two-sided refinement sweeps (hypergraph method).
    max_sweeps : int
        Most refinement sweeps; they stop earlier when a sweep gains nothing.
    exact_assignment : bool
        Solve a phase by linear assignment when balance forces one merged vertex per part
        (:mod:`graph.assignment`).

    Returns
    -------
    NetworkPartition
    """
    check_network(layers)
    if method not in METHODS:
        raise ValueError(f"unknown partitioning method {method!r}; choose one of {METHODS}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown partitioning backend {backend!r}; choose one of {BACKENDS}")
    if preset not in MTKAHYPAR_PRESETS:
        raise ValueError(f"unknown Mt-KaHyPar preset {preset!r}; choose one of {MTKAHYPAR_PRESETS}")
    smallest = min([layers[0].shape[0]] + [layer.shape[1] for layer in layers])
    if not 1 <= int(nparts) <= smallest:
        raise ValueError(
            f"cannot split into {nparts} parts: need 1 <= parts <= {smallest} "
            "(the neurons of the narrowest layer)"
        )
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon must lie in [0, 1), not {epsilon}")
    if max_chunk < 1:
        raise ValueError(f"max_chunk must be at least 1, not {max_chunk}")
    if max_sweeps < 1:
        raise ValueError(f"max_sweeps must be at least 1, not {max_sweeps}")
    nparts = int(nparts)
    start = time.perf_counter()
    info: dict = {}
    if method == "random":
        parts = random_parts(layer_sizes(layers), nparts, seed)
    elif method == "block":
        parts = block_parts(layer_sizes(layers), nparts)
    else:
        settings = PhaseSettings(
            nparts, epsilon, seed, backend, preset, max_chunk, exact_assignment
        )
        parts = multiphase_parts(layers, settings)
        info = {
            "backend": backend,
            "preset": preset,
            "epsilon": epsilon,
            "seed": seed,
            "max_chunk": max_chunk,
            "exact_assignment": exact_assignment,
        }
        info["sweep_seconds"] = time.perf_counter() - start
        if refine:
            parts, gains = refine_parts(layers, parts, settings, max_sweeps)
            info["refinement_gains"] = gains
    seconds = time.perf_counter() - start
    return NetworkPartition(parts, nparts, method, seconds, info, layers=list(layers))
