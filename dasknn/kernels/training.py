"""Numba kernels for training on one weight chunk ``W`` (``(n_in, n_out)``) on feature-major
activations ``xt`` (``(n_features, B)``, ``x.T``), so every entry meets a contiguous run of
samples and nothing is transposed (docs/benchmarks.md, "Training kernels"). Inputs that are not
C-contiguous are copied first; outputs must be C-contiguous and of the result's shape
(``ValueError`` otherwise).

Every product is a gather into vector accumulators held in registers
(:mod:`dasknn.kernels.lane_vectors`): the forward pass walks ``W``'s columns (a
:func:`column_runs` view of its CSR pattern), the backward pass and the masked gradient its rows.
Single-threaded (the parallelism is across workers) and ``nogil``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dasknn.kernels.lane_vectors import ROW_VECTORS, VECTOR_BYTES, accumulate_rows, dot_rows

__all__ = ["add_rows", "column_runs", "masked_outer_grad", "spmm_backward", "spmm_forward"]


@njit(cache=True, nogil=True)
def column_runs(indptr, indices, n_out, groups):  # pragma: no cover - compiled
    """The entries of a CSR pattern by column, in row order, cut at row boundaries.

    Parameters
    ----------
    indptr, indices : CSR arrays of ``W`` (n_in, n_out)
    n_out : int
    groups : int array
        Increasing row offsets ``0 = groups[0] <= ... <= groups[G] = n_in``.

    Returns
    -------
    bounds : int64 array, shape (G + 1, n_out)
        The entries of column ``c`` from rows ``groups[g]:groups[g + 1]`` are
        ``bounds[g, c]:bounds[g + 1, c]`` (positions in ``rows`` and ``order``).
    rows : array of ``indices``' dtype
        The row of each entry.
    order : array of ``indptr``'s dtype
        The position of each entry in the CSR arrays (where its weight is).

    Cost: two passes over the entries (a counting sort), no comparison sort.

    Raises
    ------
    ValueError
        ``groups`` does not run from 0 to ``n_in`` without decreasing, or a column index is
        outside ``[0, n_out)`` (checked before anything is written).
    """
    n_groups = groups.shape[0] - 1
    if n_groups < 1 or groups[0] != 0 or groups[n_groups] != indptr.shape[0] - 1:
        raise ValueError("groups must run from 0 to the number of rows")
    for g in range(n_groups):
        if groups[g + 1] < groups[g]:
            raise ValueError("groups must not decrease")
    for p in range(indptr[-1]):
        if indices[p] < 0 or indices[p] >= n_out:
            raise ValueError("a column index is outside [0, n_out)")
    start = np.zeros(n_out + 1, dtype=np.int64)
    for p in range(indptr[-1]):
        start[indices[p] + 1] += 1
    for c in range(n_out):
        start[c + 1] += start[c]
    bounds = np.empty((n_groups + 1, n_out), dtype=np.int64)
    rows = np.empty(indptr[-1], dtype=indices.dtype)
    order = np.empty(indptr[-1], dtype=indptr.dtype)  # a position among the entries
    fill = start[:n_out].copy()
    for g in range(n_groups):
        bounds[g] = fill
        for i in range(groups[g], groups[g + 1]):
            for p in range(indptr[i], indptr[i + 1]):
                c = indices[p]
                rows[fill[c]] = i
                order[fill[c]] = p
                fill[c] += 1
    bounds[n_groups] = fill
    return bounds, rows, order


@njit(cache=True, nogil=True)
def _sum_runs(out, src, indices, data, order, starts, ends, add):  # pragma: no cover - compiled
    """Row ``c`` of ``out`` (+)= the sum over ``p`` in ``[starts[c], ends[c])`` of ``data[q] *
    src[indices[p]]`` (``q`` as in :func:`~dasknn.kernels.lane_vectors.accumulate_rows`), in
    chunks of vectors and a scalar tail; ``out``: C-contiguous ``(len(starts), B)``."""
    n_batch = src.shape[1]
    width = VECTOR_BYTES // src.itemsize
    tail = n_batch - n_batch % width  # B = 1 (plain SGD): the scalar loop alone
    for c in range(starts.shape[0]):
        lo, hi, at, t = starts[c], ends[c], c * n_batch, 0
        while t < tail:
            count = min(ROW_VECTORS, (tail - t) // width)
            accumulate_rows(out, at + t, src, t, indices, data, order, lo, hi, add, count)
            t += count * width
        for s in range(tail, n_batch):
            acc = out[c, s] if add else out.dtype.type(0)
            for p in range(lo, hi):
                acc += data[p if order is None else order[p]] * src[indices[p], s]
            out[c, s] = acc


def _inputs(*arrays: np.ndarray) -> list[np.ndarray]:
    return [np.ascontiguousarray(a) for a in arrays]


def _output(name: str, array: np.ndarray, shape: tuple) -> np.ndarray:
    """``array``, refused unless it is writeable, C-contiguous and of ``shape`` (the kernels
    write through raw pointers: a wrong shape would write past the array)."""
    if not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError(f"{name} must be a writeable C-contiguous array")
    if array.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {array.shape}")
    return array


def spmm_forward(xt, starts, ends, rows, order, data, outt, accumulate: bool = False) -> None:
    """``outt = W.T @ xt``: row ``c`` of ``outt`` gathers ``w * xt[i]`` over column ``c``'s
    entries ``starts[c]:ends[c]`` of a :func:`column_runs` view.

    Parameters
    ----------
    xt : array (n_in, B)
        Feature-major inputs (only the rows the entries name are read).
    starts, ends : int64 arrays (n_out,)
        Rows ``g`` and ``g + 1`` of the view's ``bounds``: the entries of rows ``groups[g]:
        groups[g + 1]`` (all of them: ``bounds[0]`` and ``bounds[-1]``).
    rows, order : the view's arrays
    data : float array
        ``W``'s values in CSR order.
    outt : array (n_out, B)
        Overwritten with the feature-major pre-activations (without bias), or added to with
        ``accumulate``.
    accumulate : bool
        Add the product to ``outt`` instead of overwriting it.
    """
    xt, starts, ends, rows, order, data = _inputs(xt, starts, ends, rows, order, data)
    if ends.shape != starts.shape:
        raise ValueError(f"starts and ends differ in shape: {starts.shape}, {ends.shape}")
    outt = _output("outt", outt, (starts.shape[0], xt.shape[1]))
    _sum_runs(outt, xt, rows, data, order, starts, ends, bool(accumulate))


def spmm_backward(deltat, indptr, indices, data, outt) -> None:
    """``outt = W @ deltat``: row ``i`` of ``outt`` gathers ``w * deltat[j]`` over its entries.

    Parameters
    ----------
    deltat : array (n_out, B)
        Feature-major deltas of the layer's outputs.
    indptr, indices, data : CSR arrays of ``W`` (n_in, n_out)
        ``indptr`` may be a slice ``indptr[lo : hi + 1]`` of a larger matrix's.
    outt : array (n_in, B)
        Overwritten with the feature-major partial sums for the inputs.
    """
    deltat, indptr, indices, data = _inputs(deltat, indptr, indices, data)
    outt = _output("outt", outt, (indptr.shape[0] - 1, deltat.shape[1]))
    _sum_runs(outt, deltat, indices, data, None, indptr[:-1], indptr[1:], False)


def add_rows(target, rows, values) -> None:
    """``target[rows[r]] += values[r]`` for every ``r``, in place, one pass, nothing allocated
    (numpy's fancy-index ``+=`` gathers the rows into a new array first).

    Parameters
    ----------
    target : array (n, B)
        Writeable, C-contiguous.
    rows : int array (r,)
        Rows of ``target``; a row named twice gets both values added.
    values : array (r, B)

    Raises
    ------
    ValueError
        ``target`` is not writeable and C-contiguous, ``values`` does not have one row per entry
        of ``rows`` and ``target``'s width, or a row is outside ``[0, n)`` (checked before
        anything is written).
    """
    rows, values = _inputs(rows, values)
    target = _output("target", target, target.shape)
    if values.shape != (rows.shape[0], target.shape[1]):
        raise ValueError(
            f"values must have shape {(rows.shape[0], target.shape[1])}, got {values.shape}"
        )
    _add_rows(target, rows, values)


@njit(cache=True, nogil=True)
def _add_rows(target, rows, values):  # pragma: no cover - compiled
    n = target.shape[0]
    for r in range(rows.shape[0]):
        if rows[r] < 0 or rows[r] >= n:
            raise ValueError("a row is outside the target")
    for r in range(rows.shape[0]):
        out = target[rows[r]]
        src = values[r]
        for s in range(out.shape[0]):
            out[s] += src[s]


def masked_outer_grad(xt, deltat, indptr, indices, scale, out) -> None:
    """Gradient of ``W`` restricted to its pattern: ``out[p] = scale * (xt[i] . deltat[j])``.

    ``(i, j)`` is the position of stored entry ``p``; ``xt[i]`` stays in registers while its
    row's dot products run over the batch. ``out`` has the length of ``indices``.
    """
    xt, deltat, indptr, indices = _inputs(xt, deltat, indptr, indices)
    if deltat.shape[1] != xt.shape[1]:
        raise ValueError(f"xt and deltat hold {xt.shape[1]} and {deltat.shape[1]} samples")
    _grad(xt, deltat, indptr, indices, scale, _output("out", out, indices.shape))


@njit(cache=True, nogil=True)
def _grad(xt, deltat, indptr, indices, scale, out):  # pragma: no cover - compiled
    n_in, n_batch = xt.shape
    width = VECTOR_BYTES // xt.itemsize
    tail = n_batch - n_batch % width  # B = 1 (plain SGD): the scalar loop alone
    out[:] = 0
    for i in range(n_in):
        lo, hi = indptr[i], indptr[i + 1]
        at = i * n_batch
        t = 0
        while t < tail:
            count = min(ROW_VECTORS, (tail - t) // width)
            dot_rows(out, xt, at + t, deltat, t, indices, lo, hi, count)
            t += count * width
        for p in range(lo, hi):
            j = indices[p]
            acc = out[p]
            for s in range(tail, n_batch):
                acc += xt[i, s] * deltat[j, s]
            out[p] = acc
    if scale != 1:
        out *= scale
