"""Arrays received from another worker, copied once into memory of the receiving process before
they are computed on (a pass on an array as received costs about 11 % more; docs/samo.md)."""

from __future__ import annotations

import numpy as np

__all__ = ["CACHE_LINE", "local_copy"]

#: Bytes of a cache line.
CACHE_LINE = 64


def local_copy(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``array`` in memory allocated here, starting on a cache line."""
    buffer = np.empty(array.nbytes + CACHE_LINE, dtype=np.uint8)
    start = -buffer.ctypes.data % CACHE_LINE
    out = buffer[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out
