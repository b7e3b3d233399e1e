"""Keep the workers' freed activation buffers for reuse instead of handing them back to the OS
(glibc's ``mallopt``; nothing without glibc), for as long as something holds the setting: every
model while it is placed (``reuse_memory=True``, the default), and the local clusters dasknn
starts itself for their lifetime (:func:`dasknn.runtime.cluster.open_client`). When the last
holder leaves, the worker's thresholds go back to those it started with. See docs/training.md."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import uuid

from distributed.diagnostics.plugin import WorkerPlugin

__all__ = ["PLUGIN_NAME", "ReuseFreedMemory", "restore_malloc", "tune_malloc"]

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


#: glibc's documented default of each threshold (``mallopt(3)``).
GLIBC_DEFAULT = 128 * 2**10


def _set(settings: tuple[tuple[int, int], ...]) -> bool:
    """Apply ``(parameter, value)`` pairs with glibc's ``mallopt``; ``False`` without glibc or if
    one is refused."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    return all(mallopt(param, value) == 1 for param, value in settings)


def tune_malloc() -> bool:
    """Set this process's glibc malloc thresholds; ``False`` without glibc."""
    return _set(
        (
            (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
            (_M_TOP_PAD, TOP_PAD),
        )
    )


def restore_malloc() -> bool:
    """Set the thresholds back to what the process started with: the ``MALLOC_*_`` environment
    variables where set (Dask's nanny sets ``MALLOC_TRIM_THRESHOLD_``), else glibc's defaults;
    ``False`` without glibc."""

    def start_value(variable: str) -> int:
        try:
            return int(os.environ[variable])
        except (KeyError, ValueError):
            return GLIBC_DEFAULT

    return _set(
        (
            (_M_MMAP_THRESHOLD, start_value("MALLOC_MMAP_THRESHOLD_")),
            (_M_TRIM_THRESHOLD, start_value("MALLOC_TRIM_THRESHOLD_")),
            (_M_TOP_PAD, start_value("MALLOC_TOP_PAD_")),
        )
    )


class ReuseFreedMemory(WorkerPlugin):
    """Worker plugin holding the :func:`tune_malloc` setting on every worker, present and future,
    until it is removed. Each instance is one holder; the first to arrive tunes, the last to leave
    restores (:func:`restore_malloc`). Worker attributes: ``dasknn_malloc_tuned`` (whether the
    setting is on) and ``dasknn_malloc_holders`` (the holders' ids).
    """

    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.holder = uuid.uuid4().hex

    def setup(self, worker) -> None:
        holders = worker.__dict__.setdefault("dasknn_malloc_holders", set())
        if not holders:
            worker.dasknn_malloc_tuned = tune_malloc()
        holders.add(self.holder)

    def teardown(self, worker) -> None:
        holders = worker.__dict__.get("dasknn_malloc_holders", set())
        holders.discard(self.holder)
        if not holders and worker.__dict__.get("dasknn_malloc_tuned"):
            restore_malloc()
            worker.dasknn_malloc_tuned = False
