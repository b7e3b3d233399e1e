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
from collections.abc import Callable

import numpy as np

from dasknn.kernels.lane_vectors import aligned_empty
from dasknn.runtime.alignment import CACHE_LINE

__all__ = ["BufferPool", "StepBuffers", "size_class"]


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
        #: How many arrays the pool made (none while the freed ones suffice).
        self.made = 0

    def take(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """A C-contiguous array of ``shape`` and ``dtype``, uninitialized, starting on a cache
        line (a freed one when the pool holds one, else new)."""
        key = (tuple(int(n) for n in shape), np.dtype(dtype).str)
        with self._lock:
            free = self._free.get(key)
            if free:
                return free.pop()
            self.made += 1
        return aligned_empty(key[0], dtype, CACHE_LINE)

    def taker(self, taken: list) -> Callable[..., np.ndarray]:
        """``take(shape, dtype)``: :meth:`take`, each array handed out also appended to
        ``taken`` (for a :meth:`give` once its user is done)."""

        def take(shape: tuple[int, ...], dtype) -> np.ndarray:
            array = self.take(shape, dtype)
            taken.append(array)
            return array

        return take

    def give(self, arrays) -> None:
        """Return ``arrays`` (each taken from this pool, no longer used) for later steps."""
        with self._lock:
            for array in arrays:
                self._free[(array.shape, array.dtype.str)].append(array)


def size_class(items: int) -> int:
    """The capacity :class:`StepBuffers` gives an array of ``items`` items: the least of
    ``2^e * {5, 6, 7, 8} / 8`` that holds them (at most 25 % more), so arrays of sizes that vary
    from step to step share a few capacities."""
    if items <= 8:
        return 8
    top = 1 << (items - 1).bit_length()
    return next(top * m // 8 for m in (5, 6, 7, 8) if top * m // 8 >= items)


class StepBuffers:
    """Arrays for the steps of posted programs (:func:`dasknn.runtime.posted.run_programs`),
    each belonging to the step that took it until that step is over on this worker.

    A step's tasks :meth:`take` arrays for their temporaries and for the values they post; once
    the worker's program of a step has run, :meth:`ended` records the futures of the posts it
    made. The arrays of step ``t`` are free again when the programs of every step up to ``t``
    have ended and all their posts were delivered (a value posted in an earlier program, such as
    the rows a step prefetches for the next, is then read by no one). An array is a view of a
    flat buffer of a :func:`size_class` capacity, so the sizes that change from step to step
    (the rows a batch reads) reuse the same few buffers: in steady state the buffers of about two
    steps are kept and no step allocates anew. :meth:`forget` drops every hold (the steps in
    flight failed; a post may still read them, so Python frees them). Thread-safe.
    """

    def __init__(self) -> None:
        self._free: defaultdict[tuple, list[np.ndarray]] = defaultdict(list)
        self._held: defaultdict[int, list[np.ndarray]] = defaultdict(list)
        self._ended: list[tuple[int, list]] = []  # (step, its posts), in the order they ended
        self._lock = threading.Lock()
        #: How many arrays were taken, and how many buffers were made for them (none while the
        #: free ones suffice).
        self.taken = 0
        self.made = 0

    def take(self, step: int, shape: tuple[int, ...], dtype) -> np.ndarray:
        """An uninitialized C-contiguous array of ``shape`` and ``dtype`` starting on a cache
        line, held by ``step``."""
        shape = tuple(int(n) for n in shape)
        dtype = np.dtype(dtype)
        items = int(np.prod(shape))
        key = (size_class(items), dtype.str)
        with self._lock:
            free = self._free.get(key)
            buffer = free.pop() if free else None
        made = buffer is None
        if made:
            buffer = aligned_empty(key[0], dtype, CACHE_LINE)
        with self._lock:
            self.taken += 1
            self.made += made
            self._held[step].append(buffer)
        return buffer[:items].reshape(shape)

    def ended(self, step: int, posts: list) -> None:
        """The program of ``step`` ran on this worker and made the posts ``posts`` (futures with
        ``done()``); the arrays of every step now over are free again (see the class
        docstring)."""
        with self._lock:
            self._ended.append((step, list(posts)))
            while self._ended and all(post.done() for post in self._ended[0][1]):
                over, _ = self._ended.pop(0)
                for buffer in self._held.pop(over, ()):
                    self._free[(buffer.size, buffer.dtype.str)].append(buffer)

    def forget(self) -> None:
        """Drop the holds of every step and the posts recorded (left to Python)."""
        with self._lock:
            self._held.clear()
            self._ended.clear()

    def held(self) -> int:
        """How many buffers steps hold now."""
        with self._lock:
            return sum(len(buffers) for buffers in self._held.values())
