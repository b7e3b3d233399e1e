"""Two-sided refinement: each layer re-split (:mod:`graph.resplit`) and re-placed with its inputs
and consumers fixed, kept when the words of layers ``k`` and ``k+1`` drop and the balance holds,
until a sweep gains nothing (docs/partitioning.md, "Two-sided refinement").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from graph.hypergraph import build_phase_hypergraph
from graph.metrics import layer_volume
from graph.multiphase import (
    PhaseSettings,
    assign_input_owners,
    consumer_part_matrix,
    solve_phase,
)
from graph.resplit import resplit_classes

__all__ = ["refine_parts"]


def _load_limit(layer: sp.spmatrix, nparts: int, epsilon: float) -> int:
    total = int(sp.csr_matrix(layer).nnz)
    return max(int(np.floor((1.0 + epsilon) * total / nparts)), -(-total // nparts))


def _max_load(layer: sp.spmatrix, parts: np.ndarray, nparts: int) -> int:
    column_nnz = np.diff(sp.csc_matrix(layer).indptr)
    return int(np.bincount(parts, weights=column_nnz, minlength=nparts).max())


def _pair_volume(
    layers: Sequence[sp.spmatrix],
    parts: list[np.ndarray],
    k: int,
    layer_parts: np.ndarray,
    nparts: int,
) -> int:
    """Words of layers ``k`` and ``k+1`` with layer ``k`` placed as ``layer_parts``."""
    return layer_volume(layers[k - 1], parts[k - 1], layer_parts, nparts) + layer_volume(
        layers[k], layer_parts, parts[k + 1], nparts
    )


def refine_parts(
    layers: Sequence[sp.spmatrix],
    parts: list[np.ndarray],
    settings: PhaseSettings,
    max_sweeps: int,
) -> tuple[list[np.ndarray], list[int]]:
    """Improve a multi-phase partition by two-sided re-placement of every layer.

    Returns
    -------
    parts : list of numpy.ndarray
        The refined partition (a new list; the input is not modified).
    gains : list of int
        Words removed by each sweep (the last is 0 unless ``max_sweeps`` stopped it).
    """
    parts = list(parts)
    nparts, epsilon = settings.nparts, settings.epsilon
    depth = len(layers)
    gains: list[int] = []
    for _ in range(max_sweeps):
        gain = 0
        for k in range(1, depth + 1):
            layer = layers[k - 1]
            inputs = parts[k - 1] if k > 1 else None
            consumers = None
            if k < depth:
                consumers = consumer_part_matrix(layers[k], parts[k + 1], nparts)
                resplit = resplit_classes(layer, parts[k], consumers)
                saved = _pair_volume(layers, parts, k, parts[k], nparts) - _pair_volume(
                    layers, parts, k, resplit, nparts
                )
                if saved > 0:
                    parts[k] = resplit
                    gain += saved
            hypergraph = build_phase_hypergraph(
                layer, nparts, inputs, consumers, settings.max_chunk, parts[k]
            )
            candidate = solve_phase(hypergraph, settings)
            new_inputs = assign_input_owners(layer, candidate, nparts) if k == 1 else parts[0]
            before = layer_volume(layer, parts[k - 1], parts[k], nparts)
            after = layer_volume(layer, new_inputs, candidate, nparts)
            if k < depth:
                before += layer_volume(layers[k], parts[k], parts[k + 1], nparts)
                after += layer_volume(layers[k], candidate, parts[k + 1], nparts)
            balanced = _max_load(layer, candidate, nparts) <= max(
                _load_limit(layer, nparts, epsilon), _max_load(layer, parts[k], nparts)
            )
            if after < before and balanced:
                parts[k] = candidate
                parts[0] = new_inputs
                gain += before - after
        gains.append(gain)
        if gain == 0:
            break
    return parts, gains
