"""The checks every sparse matrix passes before a compiled kernel or a partitioner reads it:
numba kernels and scipy's C++ routines trust the index arrays, so :func:`check_csr` (a matrix)
and :func:`csr_from_arrays` (a file's raw arrays) check them first and raise ``ValueError``
naming the matrix.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["check_csr", "csr_from_arrays"]


def _check_shape(shape, name: str, expected: tuple[int | None, int | None] | None) -> tuple:
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name}: shape {shape!r} is not two integers") from None
    if len(dims) != 2 or min(dims) < 0:
        raise ValueError(f"{name}: shape {dims} is not two integers >= 0")
    if expected is not None:
        for axis, (got, want) in enumerate(zip(dims, expected, strict=True)):
            if want is not None and got != want:
                raise ValueError(
                    f"{name}: has {got} {('rows', 'columns')[axis]}, expected {want} "
                    f"(shape {dims})"
                )
    return dims


def _check_index_array(array, name: str, what: str) -> np.ndarray:
    array = np.asarray(array)
    if array.ndim != 1 or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
        raise ValueError(f"{name}: {what} must be a 1-D integer array, got {array.dtype} "
                         f"of shape {array.shape}")
    return array


def _check_values(data, name: str, nnz: int) -> np.ndarray:
    data = np.asarray(data)
    if data.ndim != 1 or data.shape[0] != nnz:
        raise ValueError(f"{name}: {nnz} indices but values of shape {data.shape}")
    if data.size and (
        not (np.issubdtype(data.dtype, np.number) or data.dtype == np.bool_)
        or np.iscomplexobj(data)
    ):
        raise ValueError(f"{name}: values must be real numbers, got dtype {data.dtype}")
    finite = np.isfinite(data) if data.size else np.ones(0, dtype=bool)
    if not finite.all():
        bad = int(np.flatnonzero(~finite)[0])
        raise ValueError(f"{name} contains NaN or infinite values (entry {bad} is {data[bad]})")
    return data


def _check_compressed(indptr, indices, data, major: int, minor: int, name: str) -> None:
    """Check compressed (CSR or CSC) arrays of ``major`` rows (or columns) of ``minor`` entries."""
    indptr = _check_index_array(indptr, name, "indptr")
    indices = _check_index_array(indices, name, "indices")
    if indptr.shape[0] != major + 1:
        raise ValueError(f"{name}: indptr has {indptr.shape[0]} entries, expected {major + 1}")
    if indptr[0] != 0:
        raise ValueError(f"{name}: indptr starts at {indptr[0]}, not 0")
    steps = np.diff(indptr)
    if steps.size and steps.min() < 0:
        at = int(np.flatnonzero(steps < 0)[0])
        raise ValueError(
            f"{name}: indptr decreases at {at + 1} ({indptr[at]} then {indptr[at + 1]})"
        )
    if indptr[-1] != indices.shape[0]:
        raise ValueError(
            f"{name}: indptr ends at {indptr[-1]} but there are {indices.shape[0]} indices"
        )
    _check_bounds(indices, minor, name, "index")
    _check_values(data, name, indices.shape[0])


def _check_bounds(indices: np.ndarray, bound: int, name: str, what: str) -> None:
    if indices.size:
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= bound:
            bad = low if low < 0 else high
            raise ValueError(f"{name}: {what} {bad} is out of range [0, {bound})")


def csr_from_arrays(
    data, indices, indptr, shape, name: str = "matrix",
    expected: tuple[int | None, int | None] | None = None,
) -> sp.csr_matrix:
    """Build a CSR matrix from raw arrays (read from a file) once they are checked.

    Parameters
    ----------
    data, indices, indptr : array-like
        The CSR arrays.
    shape : pair of int
        The matrix shape.
    name : str
        How errors name the matrix (a file and a layer, say).
    expected : (rows, columns), optional
        Required shape; ``None`` leaves a dimension free.

    Returns
    -------
    scipy.sparse.csr_matrix
        With sorted, duplicate-free indices.

    Raises
    ------
    ValueError
        On a bad shape, an index out of range, an ``indptr`` that is not monotonic or does not
        match the indices, or a value that is not a finite real number.
    """
    rows, cols = _check_shape(shape, name, expected)
    _check_compressed(indptr, indices, data, rows, cols, name)
    matrix = sp.csr_matrix(
        (np.asarray(data), np.asarray(indices), np.asarray(indptr)), shape=(rows, cols)
    )
    matrix.sum_duplicates()
    return matrix


def check_csr(
    matrix, shape: tuple[int | None, int | None] | None = None, name: str = "matrix"
) -> sp.csr_matrix:
    """Return ``matrix`` as a CSR matrix once its arrays are checked.

    Parameters
    ----------
    matrix : scipy.sparse matrix or array or 2-D array-like
        CSR, CSC and COO are checked on their raw arrays before conversion; other formats are
        converted first.
    shape : (rows, columns), optional
        Required shape; ``None`` leaves a dimension free.
    name : str
        How errors name the matrix.

    Returns
    -------
    scipy.sparse.csr_matrix
        ``matrix`` itself when it is already CSR, else a converted copy.

    Raises
    ------
    ValueError
        If ``matrix`` is not 2-D, or on a bad shape, index, ``indptr`` or value, as
        :func:`csr_from_arrays`.
    """
    if not sp.issparse(matrix):
        dense = np.asarray(matrix)
        if dense.ndim != 2:
            raise ValueError(f"{name}: must be a 2-D matrix, got shape {dense.shape}")
        _check_shape(dense.shape, name, shape)
        _check_values(dense.reshape(-1), name, dense.size)
        return sp.csr_matrix(dense)
    rows, cols = _check_shape(matrix.shape, name, shape)
    if matrix.format == "csr":
        _check_compressed(matrix.indptr, matrix.indices, matrix.data, rows, cols, name)
        return matrix
    if matrix.format == "csc":
        _check_compressed(matrix.indptr, matrix.indices, matrix.data, cols, rows, name)
    elif matrix.format == "coo":
        row, col = matrix.coords if hasattr(matrix, "coords") else (matrix.row, matrix.col)
        row = _check_index_array(row, name, "row indices")
        col = _check_index_array(col, name, "column indices")
        if row.shape != col.shape:
            raise ValueError(f"{name}: {row.size} row indices but {col.size} column indices")
        _check_bounds(row, rows, name, "row index")
        _check_bounds(col, cols, name, "column index")
        _check_values(matrix.data, name, row.shape[0])
    elif matrix.format == "bsr":
        block_rows, block_cols = matrix.blocksize
        if block_rows < 1 or block_cols < 1 or rows % block_rows or cols % block_cols:
            raise ValueError(f"{name}: blocks {matrix.blocksize} do not tile shape {(rows, cols)}")
        _check_compressed(
            matrix.indptr, matrix.indices, np.zeros(len(matrix.indices)),
            rows // block_rows, cols // block_cols, name,
        )
        _check_values(np.asarray(matrix.data).reshape(-1), name, np.asarray(matrix.data).size)
    csr = sp.csr_matrix(matrix)
    _check_compressed(csr.indptr, csr.indices, csr.data, rows, cols, name)
    return csr
