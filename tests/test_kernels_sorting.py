"""The sorts of ``dasknn.kernels.sorting`` against numpy's."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.kernels.sorting import sort_prefix, stable_argsort_into

SIZES = [0, 1, 2, 3, 8, 33, 1000]


def _columns(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [
        rng.integers(-3, 3, n),  # many ties, negative values
        rng.integers(0, 1 << 62, n),  # distinct, wide
        np.sort(rng.integers(0, 9, n))[::-1].copy(),  # descending
        rng.standard_normal(n),
    ]


@pytest.mark.parametrize("n", SIZES)
def test_stable_argsort_into_is_numpys_stable_argsort(n):
    for values in _columns(n, np.random.default_rng(n)):
        order = np.full(n, -1, dtype=np.int64)
        stable_argsort_into(values, order)
        np.testing.assert_array_equal(order, np.argsort(values, kind="stable"))


@pytest.mark.parametrize("n", SIZES)
def test_sort_prefix_sorts_the_prefix_and_leaves_the_rest(n):
    for values in _columns(n, np.random.default_rng(n + 1)):
        for k in (0, n // 2, n):
            out = values.copy()
            sort_prefix(out, k)
            np.testing.assert_array_equal(out[:k], np.sort(values[:k]))
            np.testing.assert_array_equal(out[k:], values[k:])
