"""Arrays a worker reuses from one step to the next instead of allocating them again.

Under Dask's nanny (``MALLOC_TRIM_THRESHOLD_``) glibc hands every freed block above its mmap
threshold (128 KiB) back to the system at once, so each new large array of a step is mapped and
faulted in page by page again (docs/benchmarks.md, Memory a step touches afresh). A
:class:`BufferPool` keeps the arrays of finished steps for the next ones: the same memory, no
page faults, whatever the process's malloc settings.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import numpy as np

__all__ = ["BufferPool"]


class BufferPool:
    """Free arrays by shape and dtype, shared by the threads of one worker.

    A step :meth:`take` s the arrays it needs and :meth:`give` s them back when its last task is
    done, so no array is written by two steps at once. The arrays of a step that is dropped
    before its end are never given back (one of its tasks may still write them); Python frees
    them. The pool holds at most the arrays of the steps that were in flight together, per
    distinct shape (a smaller last batch of an epoch adds its own shapes).
    """

    def __init__(self) -> None:
        self._free: defaultdict[tuple, list[np.ndarray]] = defaultdict(list)
        self._lock = threading.Lock()

    def take(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """A C-contiguous array of ``shape`` and ``dtype``, uninitialized (a freed one when the
        pool holds one, else new)."""
        key = (tuple(int(n) for n in shape), np.dtype(dtype).str)
        with self._lock:
            free = self._free.get(key)
            if free:
                return free.pop()
        return np.empty(key[0], dtype=dtype)

    def give(self, arrays) -> None:
        """Return ``arrays`` (each taken from this pool, no longer used) for later steps."""
        with self._lock:
            for array in arrays:
                self._free[(array.shape, array.dtype.str)].append(array)
