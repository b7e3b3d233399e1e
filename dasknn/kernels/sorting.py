"""Sorts for numba code that compile in a fraction of the time of numba's ``np.sort`` and
``np.argsort`` (each of those costs 1.5-2 s of compile per caller and dtype)."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["sort_prefix", "stable_argsort_into"]


@njit(cache=True)
def stable_argsort_into(values, order):  # pragma: no cover - compiled
    """Write the stable argsort of ``values`` into ``order`` (bottom-up merge sort,
    ``O(n log n)``, one scratch array of ``n`` int64)."""
    n = values.shape[0]
    source = np.arange(n)
    target = np.empty(n, dtype=np.int64)
    width = 1
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j = lo, mid
            for out in range(lo, hi):
                if j >= hi or (i < mid and values[source[i]] <= values[source[j]]):
                    target[out] = source[i]
                    i += 1
                else:
                    target[out] = source[j]
                    j += 1
        source, target = target, source
        width *= 2
    for i in range(n):
        order[i] = source[i]


@njit(cache=True)
def _sift_down(values, root, end):  # pragma: no cover - compiled
    while True:
        child = 2 * root + 1
        if child >= end:
            return
        if child + 1 < end and values[child] < values[child + 1]:
            child += 1
        if values[root] >= values[child]:
            return
        values[root], values[child] = values[child], values[root]
        root = child


@njit(cache=True)
def sort_prefix(values, n):  # pragma: no cover - compiled
    """Sort ``values[:n]`` ascending in place (heapsort: ``O(n log n)``, no allocation)."""
    for root in range(n // 2 - 1, -1, -1):
        _sift_down(values, root, n)
    for end in range(n - 1, 0, -1):
        values[0], values[end] = values[end], values[0]
        _sift_down(values, 0, end)
