"""Partitions that ignore the connectivity: balanced uniform random (the paper's baseline) and
contiguous blocks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

__all__ = ["block_parts", "random_parts"]


def _layer_sizes(layers: Sequence[sp.spmatrix]) -> list[int]:
    return [layers[0].shape[0]] + [layer.shape[1] for layer in layers]


def random_parts(
    layers: Sequence[sp.spmatrix], nparts: int, seed: int = 0
) -> list[np.ndarray]:
    """Every layer (inputs included) dealt out uniformly at random in equal shares.

    Each layer's neurons are shuffled and dealt round-robin, so part sizes differ by at most one.
    """
    rng = np.random.default_rng(seed)
    return [
        (rng.permutation(n) % nparts).astype(np.int64) for n in _layer_sizes(layers)
    ]


def block_parts(layers: Sequence[sp.spmatrix], nparts: int) -> list[np.ndarray]:
    """Every layer cut into ``nparts`` contiguous ranges of (nearly) equal size."""
    return [(np.arange(n) * nparts // n).astype(np.int64) for n in _layer_sizes(layers)]
