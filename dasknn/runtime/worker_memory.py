"""Keep the workers' freed activation buffers for reuse instead of handing them back to the OS
(glibc's ``mallopt``; nothing without glibc). Process-wide and kept until the worker restarts, so
models install it only with ``reuse_memory=True``; the local clusters dasknn starts itself have
it from the start (:func:`dasknn.runtime.cluster.open_client`). See docs/training.md."""

from __future__ import annotations

import ctypes
import ctypes.util

from distributed.diagnostics.plugin import WorkerPlugin

__all__ = ["PLUGIN_NAME", "ReuseFreedMemory", "tune_malloc"]

PLUGIN_NAME = "dasknn-reuse-freed-memory"

# mallopt parameters of glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

#: Allocations below this come from the heap and are reused (glibc's 64-bit maximum).
MMAP_THRESHOLD = 32 * 2**20
#: Free memory at the top of a heap is returned to the kernel only beyond this much.
TRIM_THRESHOLD = 2**30
#: Extra memory requested from the kernel whenever a heap grows.
TOP_PAD = 64 * 2**20


def tune_malloc() -> bool:
    """Set this process's glibc malloc thresholds; ``False`` without glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    settings = (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        (_M_TOP_PAD, TOP_PAD),
    )
    return all(mallopt(param, value) == 1 for param, value in settings)


class ReuseFreedMemory(WorkerPlugin):
    """Worker plugin running :func:`tune_malloc` on every worker, present and future; the
    outcome is the worker attribute ``dasknn_malloc_tuned``. Models register it under
    ``f"{PLUGIN_NAME}-{token}"`` with ``reuse_memory=True``.
    """

    name = PLUGIN_NAME

    def setup(self, worker) -> None:
        worker.dasknn_malloc_tuned = tune_malloc()
