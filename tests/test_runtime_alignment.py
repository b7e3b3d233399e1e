"""Received arrays copied into local memory on a cache line (dasknn.runtime.alignment)."""

from __future__ import annotations

import numpy as np

from dasknn.runtime.alignment import CACHE_LINE, local_copy


def _off_the_line(shape, dtype, offset: int) -> np.ndarray:
    """An array with the values 0, 1, ... whose data starts ``offset`` bytes past a line."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(size + 2 * CACHE_LINE, dtype=np.uint8)
    start = -raw.ctypes.data % CACHE_LINE + offset
    out = raw[start : start + size].view(dtype).reshape(shape)
    out[...] = np.arange(out.size).reshape(shape)
    return out


def test_the_copy_starts_on_a_cache_line_wherever_the_array_did():
    for dtype, offset in [(np.float32, 0), (np.float32, 4), (np.float32, 48), (np.float64, 8)]:
        received = _off_the_line((7, 13), dtype, offset)
        assert received.ctypes.data % CACHE_LINE == offset
        copy = local_copy(received)
        assert copy.ctypes.data % CACHE_LINE == 0 and copy.flags.c_contiguous
        assert copy.dtype == received.dtype and copy.flags.writeable
        np.testing.assert_array_equal(copy, received)
        assert not np.shares_memory(copy, received)


def test_a_strided_array_is_copied_contiguous():
    array = _off_the_line((5, 6), np.float32, 0)
    copy = local_copy(array.T)
    assert copy.flags.c_contiguous and copy.ctypes.data % CACHE_LINE == 0
    np.testing.assert_array_equal(copy, array.T)
