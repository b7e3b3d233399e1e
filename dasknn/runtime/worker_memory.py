"""Keep the workers' freed activation buffers for reuse instead of handing them back to the OS.

A training step allocates and frees arrays of megabytes per layer (activations, deltas, partial
sums, messages). Dask starts its worker processes with ``MALLOC_TRIM_THRESHOLD_=65536`` (to keep
their unmanaged memory low), and glibc then returns such buffers to the kernel as soon as they are
freed, so the next layer's buffers come back as fresh pages the kernel must fault in and zero.
That system time can be a large share of a step (``docs/benchmarks.md``, ``## Model-parallel
training``, gives the measured share and slowdown with the machine they are taken on).

:class:`ReuseFreedMemory` is a worker plugin that raises glibc's thresholds at run time
(``mallopt``), so freed buffers stay in the process and the next layer reuses them. The price is
that a worker keeps the peak of its step's buffers mapped between steps (which the next step
needs again anyway). On a C library other than glibc it does nothing.

The clusters dasknn starts itself start their workers with the same thresholds in the environment
(:func:`dasknn.runtime.cluster.worker_environ`). On a user's cluster the setting is process-wide,
so it is opt-in: :class:`~dasknn.model_parallel.DistributedSparseMLP`,
:class:`~dasknn.pipeline_parallel.DistributedCompressedMLP` and
:class:`~dasknn.data_parallel.DistributedEmbeddingMLP` install the plugin only with
``reuse_memory=True``, under a name of their own, and remove it on ``close()`` (workers already
tuned keep the setting until they restart: glibc has no way back to the environment's thresholds
short of setting them again). :class:`~dasknn.sampled_parallel.DistributedSampledMLP` does not
take the option: on its workers the setting halved the page faults but gained 1-3 % of a step
(``docs/benchmarks.md``, ``## LSH-sampled training``).
"""

from __future__ import annotations

import ctypes
import ctypes.util

from distributed.diagnostics.plugin import WorkerPlugin

__all__ = ["PLUGIN_NAME", "ReuseFreedMemory", "tune_malloc"]

PLUGIN_NAME = "dasknn-reuse-freed-memory"

# mallopt parameters of glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

#: Allocations below this come from the heap and are reused after ``free`` (glibc's maximum on
#: 64-bit systems; larger ones are mapped and unmapped each time).
MMAP_THRESHOLD = 32 * 2**20
#: Free memory at the top of a heap is returned to the kernel only beyond this much.
TRIM_THRESHOLD = 2**30
#: Extra memory requested from the kernel whenever a heap grows.
TOP_PAD = 64 * 2**20


def tune_malloc() -> bool:
    """Set this process's glibc thresholds (see the module docstring); ``False`` without glibc."""
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
    """Worker plugin running :func:`tune_malloc` on every worker, present and future.

    Installed by :class:`~dasknn.model_parallel.DistributedSparseMLP`,
    :class:`~dasknn.pipeline_parallel.DistributedCompressedMLP` and
    :class:`~dasknn.data_parallel.DistributedEmbeddingMLP` with ``reuse_memory=True`` (under
    the name ``f"{PLUGIN_NAME}-{token}"``). The outcome is kept as the worker attribute
    ``dasknn_malloc_tuned``.
    """

    name = PLUGIN_NAME

    def setup(self, worker) -> None:
        worker.dasknn_malloc_tuned = tune_malloc()
