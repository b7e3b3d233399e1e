"""Sparse inference on the workers' cores: the numba kernel of :mod:`dasknn.kernels.inference`
as a step of the batch driver, each window of layers broadcast once to every worker."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numba
import numpy as np
import scipy.sparse as sp
from distributed import Client, Future

from dasknn.inference._batches import BatchResult
from dasknn.inference._broadcast import broadcast
from dasknn.inference._workers import peak_rss, worker_threads
from dasknn.kernels.inference import (
    BatchState,
    PackedLayers,
    advance,
    live_rows,
    pack_layers,
    start_batch,
)

__all__ = ["CPUInference", "StreamedBatch", "layer_bytes", "run_window", "warm_kernel"]

_KERNEL_LOCK = threading.Lock()


@dataclass
class StreamedBatch:
    """A batch between two windows of streamed layers."""

    state: BatchState
    kernel_seconds: float = 0.0
    peak_memory: dict[str, int] = field(default_factory=dict)

    def __sizeof__(self) -> int:
        """Bytes of this object and of its state's arrays (see ``BatchState.__sizeof__``)."""
        return object.__sizeof__(self) + sys.getsizeof(self.state)


def layer_bytes(matrices: Sequence[sp.csr_matrix], dtype: np.dtype) -> list[int]:
    """Bytes of each layer once packed for the kernel (values, row ids, column pointers)."""
    itemsize = np.dtype(dtype).itemsize
    return [m.nnz * (itemsize + 4) + 16 * (m.shape[1] + 1) for m in matrices]


def _run_kernel(state: BatchState, weights: PackedLayers, bias: float, ymax: float):
    """Advance ``state`` under the process-wide lock with the worker's threads; return the
    worker's name and the seconds taken."""
    name, threads = worker_threads()
    with _KERNEL_LOCK:
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        start = time.perf_counter()
        advance(state, weights, bias, ymax)
        return name, time.perf_counter() - start


def run_window(
    batch: sp.csr_matrix | StreamedBatch,
    weights: PackedLayers,
    bias: float,
    ymax: float,
    last: bool,
) -> StreamedBatch | BatchResult:
    """On a worker: run a batch (input rows, or the previous window's state) through the window
    ``weights``; return the next state, or the batch's result when ``last``."""
    if isinstance(batch, StreamedBatch):
        # Dask holds ``batch`` as the previous result: advance a copy.
        state = BatchState(
            rows=batch.state.rows,
            block=batch.state.block.copy(),
            macs_done=batch.state.macs_done,
            macs_needed=batch.state.macs_needed,
        )
        seconds, peaks = batch.kernel_seconds, dict(batch.peak_memory)
    else:
        start = time.perf_counter()
        state = start_batch(batch, weights.data.dtype)
        seconds, peaks = time.perf_counter() - start, {}
    name, kernel_seconds = _run_kernel(state, weights, bias, ymax)
    seconds += kernel_seconds
    peaks[name] = max(peaks.get(name, 0), peak_rss())
    if not last:
        return StreamedBatch(state=state, kernel_seconds=seconds, peak_memory=peaks)
    return BatchResult(
        rows=live_rows(state),
        macs_done=state.macs_done,
        macs_needed=state.macs_needed,
        kernel_seconds=seconds,
        peak_memory=peaks,
    )


def warm_kernel(dtype: str) -> None:
    """Load (or compile) the kernel for ``dtype`` in this process, so timings exclude the JIT."""
    layer = sp.identity(16, dtype=np.float64, format="csr")
    state = start_batch(sp.csr_matrix(np.ones((2, 16))), np.dtype(dtype))
    advance(state, pack_layers([layer], np.dtype(dtype)), -0.1, 32.0)


class CPUInference:
    """The batch step on CPU workers: ``Y = min(max(Y @ W + bias on the nonzeros, 0), ymax)``
    layer by layer, every window broadcast once to every worker.

    Parameters
    ----------
    bias : float
        Added to the nonzero entries of every layer's product.
    ymax : float
        Upper clip of the activations.
    """

    def __init__(self, bias: float, ymax: float) -> None:
        self.bias = bias
        self.ymax = ymax

    def place(self, client: Client, weights: PackedLayers, timeout: float) -> Future:
        """Broadcast a window of packed layers within ``timeout`` seconds."""
        return broadcast(client, weights, timeout)

    def submit(
        self,
        client: Client,
        batch,
        placed: Future,
        worker: str | None,
        last: bool,
        timeout: float,
    ) -> Future:
        """Submit :func:`run_window` for one batch (``timeout`` unused: nothing is waited for)."""
        return client.submit(
            run_window,
            batch,
            placed,
            self.bias,
            self.ymax,
            last,
            workers=None if worker is None else [worker],
            pure=False,
        )
