"""Partitions that ignore the connectivity: balanced uniform random (the paper's baseline) and
contiguous blocks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

__all__ = ["block_parts", "layer_sizes", "random_parts"]


def layer_sizes(layers: Sequence[sp.spmatrix]) -> list[int]:
    """``[n_0, n_1, ..., n_L]``: the inputs of the first layer and every layer's outputs."""
    return [layers[0].shape[0]] + [layer.shape[1] for layer in layers]


def random_parts(sizes: Sequence[int], nparts: int, seed: int = 0) -> list[np.ndarray]:
    """Every layer of ``sizes`` neurons (inputs included) dealt out uniformly at random in equal
    shares.

    Each layer's neurons are shuffled and dealt round-robin, so part sizes differ by at most one.
    """
    rng = np.random.default_rng(seed)
    return [(rng.permutation(n) % nparts).astype(np.int64) for n in sizes]


def block_parts(sizes: Sequence[int], nparts: int) -> list[np.ndarray]:
    """Every layer of ``sizes`` neurons cut into ``nparts`` contiguous ranges of (nearly) equal
    size."""
    return [(np.arange(n) * nparts // n).astype(np.int64) for n in sizes]
