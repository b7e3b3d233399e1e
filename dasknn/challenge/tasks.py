"""Functions that run on the Dask workers: one batch through the kernel, or a state through a
window of streamed layers."""

from __future__ import annotations

import resource
import threading
import time
from dataclasses import dataclass, field

import numba
import numpy as np
import scipy.sparse as sp

from dasknn.kernels.inference import BatchState, PackedLayers, advance, live_rows, start_batch

__all__ = [
    "BatchResult",
    "StreamedBatch",
    "infer_batch",
    "begin_streamed",
    "advance_streamed",
    "finish_streamed",
    "peak_rss",
    "warm_kernel",
    "worker_name",
]

_KERNEL_LOCK = threading.Lock()


@dataclass
class BatchResult:
    """What a batch sends back: its live rows and what it cost."""

    rows: np.ndarray
    macs_done: int
    macs_needed: int
    kernel_seconds: float
    peak_memory: dict[str, int] = field(default_factory=dict)


@dataclass
class StreamedBatch:
    """A batch between two windows of streamed layers."""

    state: BatchState
    kernel_seconds: float = 0.0
    peak_memory: dict[str, int] = field(default_factory=dict)


def _worker_name_and_threads() -> tuple[str, int]:
    from distributed import get_worker

    try:
        worker = get_worker()
    except ValueError:
        return "local", numba.get_num_threads()
    return worker.address, max(1, int(worker.state.nthreads))


def worker_name() -> str:
    """The address of the Dask worker running the caller, ``"local"`` outside a worker."""
    return _worker_name_and_threads()[0]


def peak_rss() -> int:
    """Peak resident memory of this process in bytes.

    Linux: ``VmHWM`` of ``/proc/self/status``, the high-water mark of this process image
    (``ru_maxrss`` would also count the parent's memory at fork time, because the kernel keeps it
    across ``execve``). Elsewhere: ``ru_maxrss``.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _run_kernel(state: BatchState, weights: PackedLayers, bias: float, ymax: float):
    """Advance ``state`` under the process-wide lock with the worker's threads; return seconds."""
    name, threads = _worker_name_and_threads()
    with _KERNEL_LOCK:
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        start = time.perf_counter()
        advance(state, weights, bias, ymax)
        return name, time.perf_counter() - start


def infer_batch(
    inputs: sp.csr_matrix, weights: PackedLayers, bias: float, ymax: float
) -> BatchResult:
    """Run one batch of input rows through every layer; return its live rows (batch-local)."""
    start = time.perf_counter()
    state = start_batch(inputs, weights.data.dtype)
    load_seconds = time.perf_counter() - start
    name, seconds = _run_kernel(state, weights, bias, ymax)
    return BatchResult(
        rows=live_rows(state),
        macs_done=state.macs_done,
        macs_needed=state.macs_needed,
        kernel_seconds=load_seconds + seconds,
        peak_memory={name: peak_rss()},
    )


def begin_streamed(inputs: sp.csr_matrix, dtype: str) -> StreamedBatch:
    """Load a batch of input rows for a streamed run."""
    start = time.perf_counter()
    state = start_batch(inputs, np.dtype(dtype))
    return StreamedBatch(state=state, kernel_seconds=time.perf_counter() - start)


def advance_streamed(
    batch: StreamedBatch, weights: PackedLayers, bias: float, ymax: float
) -> StreamedBatch:
    """Advance a streamed batch through the window of layers ``weights``."""
    name, seconds = _run_kernel(batch.state, weights, bias, ymax)
    peaks = dict(batch.peak_memory)
    peaks[name] = max(peaks.get(name, 0), peak_rss())
    return StreamedBatch(
        state=batch.state, kernel_seconds=batch.kernel_seconds + seconds, peak_memory=peaks
    )


def finish_streamed(batch: StreamedBatch) -> BatchResult:
    """The result of a streamed batch after its last window."""
    return BatchResult(
        rows=live_rows(batch.state),
        macs_done=batch.state.macs_done,
        macs_needed=batch.state.macs_needed,
        kernel_seconds=batch.kernel_seconds,
        peak_memory=batch.peak_memory,
    )


def warm_kernel(dtype: str) -> None:
    """Load (or compile) the kernel for ``dtype`` in this process, so timings exclude the JIT."""
    from dasknn.kernels.inference import pack_layers

    layer = sp.identity(16, dtype=np.float64, format="csr")
    state = start_batch(sp.csr_matrix(np.ones((2, 16))), np.dtype(dtype))
    advance(state, pack_layers([layer], np.dtype(dtype)), -0.1, 32.0)
