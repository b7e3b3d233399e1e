"""Arrays received from another worker, copied once into memory of the receiving process before
they are computed on.

A numpy array Dask deserialises from a message lies in the buffer its frames were read into,
where the frames put it, not in memory numpy allocated for it (aligned as numpy aligns, with
numpy's huge-page advice for large arrays). Measured (``benchmarks/samo.py received``): a pipeline
stage's backward pass took 123 ms on a delta as it was received from the other worker,
110 ms on a copy of such a delta made by the receiving task, and 111 ms on a delta made locally.
Which property of the received buffer costs (its alignment, its pages) was not separated; the
copy (about 1 ms for 8 MB) removes both. :func:`local_copy` makes it, on a 64-byte cache line.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CACHE_LINE", "local_copy"]

#: Bytes of a cache line.
CACHE_LINE = 64


def local_copy(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``array`` in memory numpy allocated here, starting on a cache
    line."""
    buffer = np.empty(array.nbytes + CACHE_LINE, dtype=np.uint8)
    start = -buffer.ctypes.data % CACHE_LINE
    out = buffer[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out
