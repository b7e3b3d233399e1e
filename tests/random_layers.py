"""Random sparse layers for the model tests: a pattern of the given density, values and biases
drawn from one seeded stream (the same draws in the same order for every test that uses them)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def random_layers(
    sizes: list[int], density: float, seed: int = 0
) -> tuple[list[sp.csr_matrix], list[np.ndarray]]:
    """Layers ``sizes[k] x sizes[k + 1]`` with random patterns and values in [-1, 1), and biases
    in [-0.2, 0.2), float64."""
    rng = np.random.default_rng(seed)
    weights = []
    for k in range(len(sizes) - 1):
        w = sp.random(sizes[k], sizes[k + 1], density=density, format="csr", random_state=rng)
        w.data = rng.uniform(-1, 1, size=w.nnz)
        weights.append(w)
    biases = [rng.uniform(-0.2, 0.2, size=n) for n in sizes[1:]]
    return weights, biases
