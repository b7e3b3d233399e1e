"""The flat index of a pruned layer (its kept entries' sorted row-major positions
``i * n_out + j``, int32), and checked compress / expand of its states
(:mod:`dasknn.kernels.compressed`); a compressed state holds one value per index entry."""

from __future__ import annotations

import numpy as np

from dasknn.kernels import compressed as kernels

__all__ = [
    "INDEX_DTYPE",
    "MAX_ENTRIES",
    "bits_view",
    "check_index",
    "compress",
    "expand",
    "flat_index",
    "row_pointers",
]

INDEX_DTYPE = np.dtype(np.int32)
#: A layer's flat positions must fit an int32: at most ``2**31 - 1`` entries.
MAX_ENTRIES = 2**31 - 1


def _check_shape(shape, name: str) -> tuple[int, int]:
    shape = tuple(int(s) for s in shape)
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"{name}: a layer's shape must be two positive sizes, got {shape}")
    if shape[0] * shape[1] > MAX_ENTRIES:
        raise ValueError(
            f"{name}: a layer of shape {shape} has {shape[0] * shape[1]} entries; the int32 flat "
            f"index allows at most 2**31 - 1"
        )
    return shape


def flat_index(mask, name: str = "mask") -> np.ndarray:
    """The sorted int32 flat index of the ``True`` entries of a 2-D boolean ``mask``.

    Raises
    ------
    ValueError
        If ``mask`` is not a 2-D boolean array, has ``2**31`` or more entries, or keeps nothing
        (a fully pruned layer).
    """
    mask = np.asarray(mask)
    if mask.ndim != 2 or mask.dtype != np.bool_:
        raise ValueError(f"{name} must be a 2-D boolean array, got {mask.dtype} {mask.shape}")
    _check_shape(mask.shape, name)
    index = np.flatnonzero(mask).astype(INDEX_DTYPE)
    if index.size == 0:
        raise ValueError(f"{name} prunes every weight of its layer (a fully pruned layer)")
    return index


def check_index(index, shape, name: str = "index") -> np.ndarray:
    """``index`` as an int32 array after checking it is a flat index of a layer of ``shape``.

    Raises
    ------
    ValueError
        If ``index`` is not a 1-D integer array, is empty, not strictly increasing, or outside
        ``[0, n_in * n_out)``; or if the layer has ``2**31`` or more entries.
    """
    n_in, n_out = _check_shape(shape, name)
    index = np.asarray(index)
    if index.ndim != 1 or index.dtype.kind not in "iu":
        raise ValueError(f"{name} must be a 1-D integer array, got {index.dtype} {index.shape}")
    if index.size == 0:
        raise ValueError(f"{name} is empty (a fully pruned layer)")
    if int(index.min()) < 0 or int(index.max()) >= n_in * n_out:
        raise ValueError(
            f"{name} has positions outside [0, {n_in * n_out}) of a layer of shape {(n_in, n_out)}"
        )
    steps = np.diff(index.astype(np.int64))
    if (steps <= 0).any():
        first = int(np.argmax(steps <= 0))
        what = "a duplicate" if steps[first] == 0 else "unsorted positions"
        raise ValueError(f"{name} must be strictly increasing: {what} at entry {first + 1}")
    return np.ascontiguousarray(index, dtype=INDEX_DTYPE)


def row_pointers(index: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Where each row's entries start in ``index`` (int64, length ``n_in + 1``)."""
    out = np.empty(shape[0] + 1, dtype=np.int64)
    kernels.row_pointers(index, shape[0], shape[1], out)
    return out


def bits_view(array: np.ndarray) -> np.ndarray:
    """16-bit floats (bfloat16 has no numba type) as ``uint16`` views; others unchanged."""
    if array.dtype.itemsize == 2 and array.dtype.kind != "i":
        return array.view(np.uint16)
    return array


def compress(dense, index, out: np.ndarray | None = None) -> np.ndarray:
    """The values of ``dense`` (2-D) at the flat ``index``, in ``dense``'s dtype (or into
    ``out``, of that dtype and the index's length).

    Raises
    ------
    ValueError
        If ``index`` is not a flat index of ``dense``'s shape, or ``out`` does not fit.
    """
    dense = np.ascontiguousarray(dense)
    if dense.ndim != 2:
        raise ValueError(f"compress needs a 2-D array, got shape {dense.shape}")
    index = check_index(index, dense.shape)
    if out is None:
        out = np.empty(index.size, dtype=dense.dtype)
    elif out.shape != index.shape or out.dtype != dense.dtype:
        raise ValueError(
            f"out must be {dense.dtype} of shape {index.shape}, got {out.dtype} {out.shape}"
        )
    kernels.compress(bits_view(dense), index, bits_view(out))
    return out


def expand(values, index, shape, out: np.ndarray | None = None) -> np.ndarray:
    """The dense ``shape`` array holding ``values`` at the flat ``index`` and zeros elsewhere
    (written into ``out`` when given).

    Raises
    ------
    ValueError
        If ``index`` is not a flat index of ``shape`` or ``values`` does not have its length.
    """
    values = np.ascontiguousarray(values)
    index = check_index(index, shape)
    if values.ndim != 1 or values.size != index.size:
        raise ValueError(
            f"values must be 1-D with one value per index entry ({index.size}), got shape "
            f"{values.shape}"
        )
    shape = (int(shape[0]), int(shape[1]))
    if out is None:
        out = np.empty(shape, dtype=values.dtype)
    elif out.shape != shape or out.dtype != values.dtype or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous {values.dtype} of shape {shape}")
    kernels.expand(bits_view(values), index, bits_view(out))
    return out
