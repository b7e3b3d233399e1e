"""Arrays received from another worker, copied once into memory of the receiving process before
they are computed on (a pass on an array as received costs about 11 % more; docs/samo.md)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dasknn.kernels.lane_vectors import aligned_copy

__all__ = ["CACHE_LINE", "local_copy"]

#: Bytes of a cache line.
CACHE_LINE = 64


def local_copy(array: np.ndarray, take: Callable[..., np.ndarray] | None = None) -> np.ndarray:
    """A C-contiguous copy of ``array`` in memory allocated here, starting on a cache line: an
    array of ``take(shape, dtype)`` (a :class:`~dasknn.runtime.buffers.BufferPool`'s, which
    start on a cache line) when given, else new."""
    if take is None:
        return aligned_copy(array, CACHE_LINE)
    out = take(array.shape, array.dtype)
    out[...] = array
    return out
