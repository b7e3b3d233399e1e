"""Data-parallel Graph Challenge inference over the workers of a Dask cluster.

The input rows are cut into batches. With *broadcast* weights, every worker receives the packed
network once (``client.scatter(broadcast=True)``) and batches are submitted as tasks with a bounded
number in flight, a new one each time one finishes, so faster workers take more batches. When the
network does not fit the weight budget of a worker, the weights are *streamed*: the layers are cut
into windows of ``resident_layers`` layers, at most ``weight_buffers`` windows are on the workers at
once, and every batch state advances window by window (the state stays on its worker).
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Sequence
from contextlib import ExitStack

import numpy as np
import scipy.sparse as sp
from distributed import Client, as_completed, wait
from tqdm.auto import tqdm

from dasknn.challenge import tasks
from dasknn.challenge.inputs import load_inputs
from dasknn.challenge.stats import ChallengeStats, merge_batches
from dasknn.datasets import challenge_bias, load_network
from dasknn.kernels.inference import pack_layers
from dasknn.runtime.cluster import open_client
from graph.checks import check_csr

__all__ = ["run_challenge", "prepare_run", "default_batch_size"]

_BATCHES_IN_FLIGHT_PER_THREAD = 2


def default_batch_size(n_inputs: int, workers: int) -> int:
    """Rows per batch: about 4 batches per worker, between 256 and 2048 rows."""
    return int(min(2048, max(256, math.ceil(n_inputs / (4 * max(1, workers))))))


def _resolve_network(network, neurons, layers, seed) -> list[sp.csr_matrix]:
    if isinstance(network, str | os.PathLike):
        return load_network(network, neurons=neurons, layers=layers, seed=seed)
    matrices = [check_csr(m, name=f"layer {k + 1}") for k, m in enumerate(network)]
    if layers is not None:
        matrices = matrices[:layers]
    return matrices


def _resolve_inputs(inputs, neurons: int) -> sp.csr_matrix:
    if isinstance(inputs, str | os.PathLike):
        return load_inputs(inputs, neurons)
    return sp.csr_matrix(check_csr(inputs, name="inputs"), dtype=np.float64)


def _worker_memory_limit(client: Client) -> int:
    import psutil

    limits = [w.get("memory_limit") or 0 for w in client.scheduler_info()["workers"].values()]
    limits = [x for x in limits if x > 0]
    return min(limits) if limits else int(psutil.virtual_memory().total)


def prepare_run(
    network: str | os.PathLike | Sequence[sp.spmatrix],
    inputs: str | os.PathLike | sp.spmatrix | np.ndarray,
    bias: float | None = None,
    *,
    neurons: int | None = None,
    layers: int | None = None,
    seed: int = 0,
    batch_size: int | None = None,
    dtype: str | np.dtype | type = "float32",
    resident_layers: int | None = None,
    weight_buffers: int = 2,
    device: str = "cpu",
    compact_every: int = 8,
    cuda_mode: str = "auto",
) -> tuple[list[sp.csr_matrix], sp.csr_matrix, float]:
    """Load and check everything a run needs before any cluster is touched.

    Returns the layers, the input rows (CSR, float64) and the bias. Raises ``ValueError`` (or
    ``FileNotFoundError``) naming the problem; see :func:`run_challenge` for the parameters.
    """
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    if weight_buffers < 1:
        raise ValueError(f"weight_buffers must be >= 1, got {weight_buffers}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if compact_every < 1:
        raise ValueError(f"compact_every must be >= 1, got {compact_every}")
    if cuda_mode not in ("auto", "fused", "sectioned"):
        raise ValueError(f"cuda_mode must be 'auto', 'fused' or 'sectioned', got {cuda_mode!r}")
    matrices = _resolve_network(network, neurons, layers, seed)
    if not matrices:
        raise ValueError("the network has no layers")
    width = matrices[0].shape[0]
    for k, m in enumerate(matrices):
        if m.shape != (width, width):
            raise ValueError(f"layer {k + 1} has shape {m.shape}, expected ({width}, {width})")
        if not np.all(np.isfinite(m.data)):
            raise ValueError(f"layer {k + 1} has a weight that is NaN or infinite")
        if m.nnz and np.abs(m.data).max() > np.finfo(dtype).max:
            raise ValueError(f"layer {k + 1} has a weight that does not fit {dtype.name}")
    matrix = _resolve_inputs(inputs, width)
    if matrix.shape[1] != width:
        raise ValueError(
            f"the inputs have {matrix.shape[1]} features but the network has {width} neurons "
            "(width mismatch)"
        )
    if not np.all(np.isfinite(matrix.data)):
        raise ValueError("the inputs contain NaN or infinite values")
    if matrix.shape[0] == 0:
        raise ValueError("there are no inputs (0 rows)")
    if bias is None:
        bias = challenge_bias(width)
    if not math.isfinite(bias):
        raise ValueError(f"bias must be finite, got {bias}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if resident_layers is not None and resident_layers < 1:
        raise ValueError(f"resident_layers must be >= 1, got {resident_layers}")
    return matrices, matrix, float(bias)


def run_challenge(
    network: str | os.PathLike | Sequence[sp.spmatrix],
    inputs: str | os.PathLike | sp.spmatrix | np.ndarray,
    bias: float | None = None,
    client: Client | str | None = None,
    *,
    neurons: int | None = None,
    layers: int | None = None,
    seed: int = 0,
    batch_size: int | None = None,
    dtype: str | np.dtype | type = "float32",
    ymax: float = 32.0,
    resident_layers: int | None = None,
    weight_buffers: int = 2,
    weight_budget: int | None = None,
    progress: bool = True,
    device: str = "cpu",
    compact_every: int = 8,
    cuda_mode: str = "auto",
) -> tuple[np.ndarray, ChallengeStats]:
    """Run Graph Challenge inference and return the categories and the run's statistics.

    Each layer computes ``Y = min(max(Y @ W + b on the nonzeros, 0), ymax)``; the categories are
    the 1-based ids of the input rows that are not all zero after the last layer.

    Parameters
    ----------
    network : path, ``radixnet:N:L`` or sequence of sparse matrices
        A challenge layer directory, a generator spec, or the layers (shape ``(N, N)`` each).
    inputs : path, sparse matrix or array
        Input rows ``(n, N)``: a challenge sparse-input ``.tsv[.gz]`` or MNIST IDX image file
        (see :func:`dasknn.challenge.load_inputs`), or a matrix.
    bias : float, optional
        Bias added to the nonzero entries; by default the challenge's bias for ``N``.
    client : distributed.Client or str, optional
        The cluster (a client or a scheduler address). By default a LocalCluster with one
        single-threaded worker process per core (``device="cuda"``: dask-cuda's
        ``LocalCUDACluster``, one worker per GPU) is started and closed afterwards.
    neurons, layers, seed : int, optional
        Passed to :func:`dasknn.datasets.load_network` (``layers`` also truncates a sequence).
    batch_size : int, optional
        Rows per batch (default :func:`default_batch_size`).
    dtype : ``"float32"`` or ``"float64"``
        Arithmetic of the kernel.
    ymax : float
        Upper clip of the activations (32).
    resident_layers : int, optional
        Stream the weights in windows of this many layers (CPU). By default the weights are
        broadcast whole when they fit ``weight_budget``, else streamed in windows that fit it.
    weight_buffers : int
        Windows of layers resident on a worker at once when streaming (2 = double buffering).
    weight_budget : int, optional
        Bytes of weights a worker may hold; default half the smallest worker memory limit (CPU)
        or half the smallest free GPU memory (``device="cuda"``).
    progress : bool
        Show a progress bar over batches.
    device : ``"cpu"`` or ``"cuda"``
        Run the numba CPU kernel on the workers' cores, or the CUDA kernels of
        :mod:`dasknn.kernels.cuda_inference` on the workers' GPUs (one GPU per worker; needs the
        ``cuda`` extra). With ``"cuda"`` a batch is by default an equal share of the inputs per
        GPU, capped by the GPU's free memory.
    compact_every : int
        ``device="cuda"``: layers run before dead rows are dropped and the live ones re-packed.
    cuda_mode : ``"auto"``, ``"fused"`` or ``"sectioned"``
        ``device="cuda"``: one launch per ``compact_every`` layers with a block per 32 rows
        (fused), or one launch per layer with a block per 32 rows and 1024 output neurons
        (sectioned); ``auto`` picks by width, see :func:`dasknn.kernels.cuda_inference.
        infer_rows_cuda`.

    Returns
    -------
    categories : int64 array
        Sorted 1-based ids of the input rows that are not all zero at the end.
    stats : ChallengeStats
        Time, rate, work and peak memory per worker.

    Raises
    ------
    ValueError
        On inconsistent layers or inputs (width mismatch, NaN, a bad dtype, device or batch size).
    RuntimeError
        ``device="cuda"`` without the optional packages or without a GPU on every worker.
    MemoryError
        ``device="cuda"`` and the network does not fit a GPU even streamed.
    """
    dtype = np.dtype(dtype)
    matrices, matrix, bias = prepare_run(
        network,
        inputs,
        bias,
        neurons=neurons,
        layers=layers,
        seed=seed,
        batch_size=batch_size,
        dtype=dtype,
        resident_layers=resident_layers,
        weight_buffers=weight_buffers,
        device=device,
        compact_every=compact_every,
        cuda_mode=cuda_mode,
    )
    with ExitStack() as stack:
        if device == "cuda":
            from dasknn.challenge.gpu import run_cuda

            return run_cuda(
                open_client(stack, client, device="cuda"),
                matrices,
                matrix,
                float(bias),
                float(ymax),
                dtype,
                batch_size,
                weight_budget,
                compact_every,
                cuda_mode,
                progress,
            )
        return _run(
            open_client(stack, client),
            matrices,
            matrix,
            float(bias),
            float(ymax),
            dtype,
            batch_size,
            resident_layers,
            weight_buffers,
            weight_budget,
            progress,
        )


def _run(
    client,
    matrices,
    matrix,
    bias,
    ymax,
    dtype,
    batch_size,
    resident_layers,
    weight_buffers,
    weight_budget,
    progress,
) -> tuple[np.ndarray, ChallengeStats]:
    n_inputs, width = matrix.shape
    n_layers = len(matrices)
    edges = int(sum(m.nnz for m in matrices))
    workers = client.scheduler_info()["workers"]
    n_workers = len(workers)
    if n_workers == 0:
        raise ValueError("the Dask cluster has no workers")
    threads = sum(int(w.get("nthreads", 1)) for w in workers.values())
    batch_size = batch_size or default_batch_size(n_inputs, n_workers)
    starts = list(range(0, n_inputs, batch_size))
    itemsize = dtype.itemsize
    layer_bytes = [m.nnz * (itemsize + 4) + 16 * (width + 1) for m in matrices]
    weight_bytes = int(sum(layer_bytes))
    budget = weight_budget or _worker_memory_limit(client) // 2
    if resident_layers is None and weight_bytes > budget:
        resident_layers = max(1, int(budget // (weight_buffers * max(layer_bytes))))
    streamed = resident_layers is not None and resident_layers < n_layers
    resident = resident_layers if streamed else n_layers

    client.run(tasks.warm_kernel, dtype.name)
    packed = None if streamed else pack_layers(matrices, dtype)
    bar = tqdm(
        total=len(starts) * (math.ceil(n_layers / resident) if streamed else 1),
        disable=not progress,
        unit="batch",
        desc="challenge",
    )
    start = time.perf_counter()
    with bar:
        if streamed:
            results = _streamed(
                client,
                matrices,
                matrix,
                starts,
                batch_size,
                bias,
                ymax,
                dtype,
                resident,
                weight_buffers,
                bar,
            )
        else:
            results = _broadcast(
                client, packed, matrix, starts, batch_size, bias, ymax, threads, bar
            )
    seconds = time.perf_counter() - start

    categories, peaks = merge_batches(results)
    stats = ChallengeStats(
        inputs=n_inputs,
        neurons=width,
        layers=n_layers,
        edges=edges,
        categories=int(categories.size),
        seconds=seconds,
        rate=n_inputs * edges / seconds if seconds > 0 else float("inf"),
        kernel_seconds=float(sum(r.kernel_seconds for _, r in results)),
        macs_done=int(sum(r.macs_done for _, r in results)),
        macs_needed=int(sum(r.macs_needed for _, r in results)),
        batches=len(starts),
        batch_size=batch_size,
        dtype=dtype.name,
        workers=n_workers,
        mode="streamed" if streamed else "broadcast",
        resident_layers=resident,
        weight_buffers=weight_buffers if streamed else 1,
        weight_bytes=weight_bytes,
        peak_memory=peaks,
    )
    return categories, stats


def _broadcast(client, packed, matrix, starts, batch_size, bias, ymax, threads, bar):
    """Every worker holds all layers; batches are pulled as earlier ones finish."""
    weights = client.scatter(packed, broadcast=True, hash=False)
    pending = iter(starts)
    offsets = {}
    results = []

    def submit_next(queue) -> None:
        s = next(pending, None)
        if s is None:
            return
        future = client.submit(
            tasks.infer_batch, matrix[s : s + batch_size], weights, bias, ymax, pure=False
        )
        offsets[future.key] = s
        queue.add(future)

    queue = as_completed()
    for _ in range(_BATCHES_IN_FLIGHT_PER_THREAD * threads):
        submit_next(queue)
    for future in queue:
        results.append((offsets.pop(future.key), future.result()))
        future.release()
        bar.update(1)
        submit_next(queue)
    return results


def _streamed(
    client, matrices, matrix, starts, batch_size, bias, ymax, dtype, resident, weight_buffers, bar
):
    """Layers go to the workers a window at a time, at most ``weight_buffers`` windows at once."""
    states = [
        client.submit(tasks.begin_streamed, matrix[s : s + batch_size], dtype.name, pure=False)
        for s in starts
    ]
    windows: deque = deque()
    for first in range(0, len(matrices), resident):
        if len(windows) >= weight_buffers:
            old_weights, old_states = windows.popleft()
            wait(old_states)
            del old_weights
        packed = pack_layers(matrices[first : first + resident], dtype)
        weights = client.scatter(packed, broadcast=True, hash=False)
        states = [
            client.submit(tasks.advance_streamed, st, weights, bias, ymax, pure=False)
            for st in states
        ]
        for future in states:
            future.add_done_callback(lambda _: bar.update(1))
        windows.append((weights, states))
    finals = client.gather([client.submit(tasks.finish_streamed, st, pure=False) for st in states])
    windows.clear()
    return list(zip(starts, finals, strict=True))
