"""Arrays received from another worker, copied once into memory of the receiving process before
they are computed on.

A numpy array Dask deserialises from a message lies in the buffer its frames were read into,
where the frames put it, not in memory numpy allocated for it (aligned as numpy aligns, with
numpy's huge-page advice for large arrays). A pipeline stage's pass on an 8 MB delta as received
costs about 11 % more than on a local copy (``benchmarks/samo.py received``, ``docs/benchmarks.md``,
``## SAMO: pruned networks on compressed states``); the copy costs about 1 ms for 8 MB and removes
whichever property of the received buffer (its alignment, its pages) costs. :func:`local_copy`
makes it, on a 64-byte cache line.
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
