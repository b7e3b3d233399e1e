"""Output columns that share their inputs, grouped for the CPU inference kernel.

Columns of a CSC layer whose input lists are equal (same inputs, same order) are cut into groups
of ``GROUP`` that the kernel accumulates together (:func:`dasknn.kernels.lane_vectors
.accumulate_group`); the columns left over form groups of one. RadiX-Net layers are made of such
columns (16 outputs share their 32 inputs), so every column of them lands in a full group.
docs/challenge.md ("The kernel").
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from dasknn.kernels.lane_vectors import GROUP
from dasknn.kernels.sorting import stable_argsort_into

__all__ = ["group_columns"]


@njit(cache=True)
def _same_inputs(indptr, indices, a, b):  # pragma: no cover - compiled
    """Whether columns ``a`` and ``b`` have equal input lists."""
    da = indptr[a + 1] - indptr[a]
    if indptr[b + 1] - indptr[b] != da:
        return False
    for i in range(da):
        if indices[indptr[a] + i] != indices[indptr[b] + i]:
            return False
    return True


@njit(cache=True)
def _group_layer(indptr, indices, cols, ptr):  # pragma: no cover - compiled
    """Group one layer's columns (``indptr``: its ``N + 1`` offsets); fill ``cols`` (the columns,
    group by group) and ``ptr`` (group ``g`` is ``cols[ptr[g]:ptr[g + 1]]``); return the groups."""
    n = indptr.size - 1
    keys = np.empty(n, dtype=np.int64)
    for c in range(n):
        h = np.uint64(14695981039346656037)  # FNV-1a over the degree and the inputs
        h = (h ^ np.uint64(indptr[c + 1] - indptr[c])) * np.uint64(1099511628211)
        for p in range(indptr[c], indptr[c + 1]):
            h = (h ^ np.uint64(indices[p])) * np.uint64(1099511628211)
        keys[c] = np.int64(h >> np.uint64(1))
    order = np.empty(n, dtype=np.int64)
    stable_argsort_into(keys, order)
    taken = np.zeros(n, dtype=np.bool_)
    members = np.empty(n, dtype=np.int64)
    filled = 0
    groups = 0
    start = 0
    while start < n:
        stop = start + 1
        while stop < n and keys[order[stop]] == keys[order[start]]:
            stop += 1
        for a in range(start, stop):  # equal hashes: compare the lists, a class at a time
            first = order[a]
            if taken[first]:
                continue
            size = 0
            for b in range(a, stop):
                c = order[b]
                if not taken[c] and _same_inputs(indptr, indices, first, c):
                    taken[c] = True
                    members[size] = c
                    size += 1
            full = size - size % GROUP
            for i in range(size):
                if i >= full or i % GROUP == 0:
                    ptr[groups] = filled
                    groups += 1
                cols[filled] = members[i]
                filled += 1
        start = stop
    ptr[groups:] = filled
    return groups


@njit(cache=True, parallel=True)
def _group_layers(indptr, indices, cols, ptr, counts):  # pragma: no cover - compiled
    for k in prange(indptr.shape[0]):
        counts[k] = _group_layer(indptr[k], indices, cols[k], ptr[k])


def group_columns(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, ...]:
    """Group the columns of packed CSC layers by equal input lists.

    Parameters
    ----------
    indptr : int64 array, shape (L, N + 1)
        Column offsets into ``indices`` (as in :class:`dasknn.kernels.inference.PackedLayers`).
    indices : int array
        Input neuron of each weight entry.

    Returns
    -------
    group_cols : int32 array, shape (L, N)
        Each layer's columns, group by group; a group of ``GROUP`` columns has equal input lists.
    group_ptr : int32 array, shape (L, N + 1)
        Group ``g`` of layer ``k`` is ``group_cols[k, group_ptr[k, g]:group_ptr[k, g + 1]]``
        (entries past the last group equal ``N``).
    n_groups : int64 array, shape (L,)
        Groups of each layer (``N / GROUP`` when every column is in a full group).

    Cost: one hash pass over the entries and a sort of the columns per layer, layers in parallel;
    columns with equal hashes are compared entry by entry, so a hash collision never merges
    columns whose inputs differ.
    """
    n_layers, n = indptr.shape[0], indptr.shape[1] - 1
    cols = np.empty((n_layers, n), dtype=np.int32)
    ptr = np.empty((n_layers, n + 1), dtype=np.int32)
    counts = np.empty(n_layers, dtype=np.int64)
    _group_layers(np.ascontiguousarray(indptr, dtype=np.int64), indices, cols, ptr, counts)
    return cols, ptr, counts
