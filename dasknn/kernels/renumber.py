"""Kernels that split a layer by neurons for the model-parallel placement: which inputs feed
another part, and every part's renumbered columns of a layer, in one pass over its entries."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["crossing_rows", "split_columns"]


@njit(cache=True, nogil=True)
def crossing_rows(indptr, indices, parts_in, parts_out, out):  # pragma: no cover - compiled
    """``out[i]``: whether row ``i`` of the CSR pattern ``(indptr, indices)`` has an entry in a
    column ``j`` with ``parts_out[j] != parts_in[i]``. ``O(nnz)``, nothing allocated."""
    for i in range(indptr.shape[0] - 1):
        part = parts_in[i]
        found = False
        for e in range(indptr[i], indptr[i + 1]):
            if parts_out[indices[e]] != part:
                found = True
                break
        out[i] = found


@njit(cache=True, nogil=True)
def split_columns(
    indptr, indices, values, order_in, part_out, column_out, out_indptr, out_indices, out_data
):  # pragma: no cover - compiled
    """Every part's renumbered columns of a CSR layer ``(indptr, indices, values)`` in one pass.

    Row ``r`` of every chunk is the layer's row ``order_in[r]``; the layer's column ``j`` goes
    to column ``column_out[j]`` of part ``part_out[j]``'s chunk. Writes part ``m``'s chunk as
    CSR: its row pointer ``out_indptr[m]`` (``(P, rows + 1)``, zeroed by the caller, offsets
    into part ``m``'s entries) and its entries at ``out_indices[s:e]``, ``out_data[s:e]`` (both
    of ``nnz``), ``s = out_indptr[:m, -1].sum()``, column indices ascending within each row.
    ``O(nnz + P rows)`` and the sort of each row's entries of a part (insertion sort: rows are
    short)."""
    nparts, n_rows = out_indptr.shape[0], out_indptr.shape[1] - 1
    for r in range(n_rows):
        i = order_in[r]
        for e in range(indptr[i], indptr[i + 1]):
            out_indptr[part_out[indices[e]], r + 1] += 1
    starts = np.zeros(nparts + 1, dtype=np.int64)
    for m in range(nparts):
        for r in range(n_rows):
            out_indptr[m, r + 1] += out_indptr[m, r]
        starts[m + 1] = starts[m] + out_indptr[m, n_rows]
    cursor = starts[:-1].copy()
    for r in range(n_rows):
        i = order_in[r]
        for e in range(indptr[i], indptr[i + 1]):
            m = part_out[indices[e]]
            at = cursor[m]
            column, value = column_out[indices[e]], values[e]
            while at > starts[m] + out_indptr[m, r] and out_indices[at - 1] > column:
                out_indices[at] = out_indices[at - 1]  # insertion into the row's sorted run
                out_data[at] = out_data[at - 1]
                at -= 1
            out_indices[at] = column
            out_data[at] = value
            cursor[m] += 1
