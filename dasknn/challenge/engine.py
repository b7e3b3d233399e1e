"""Graph Challenge inference over the workers of a Dask cluster, on :mod:`dasknn.inference`:
:func:`prepare_run` checks the network, inputs and options before any cluster is touched,
:func:`run_challenge` runs the batches (``load_on_workers=True``: the GPU workers load the
network, :mod:`dasknn.challenge.worker_network`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from distributed import Client, Security

from dasknn.challenge.inputs import load_inputs
from dasknn.challenge.network_checks import check_network
from dasknn.challenge.stats import ChallengeStats, merge_batches
from dasknn.datasets import challenge_bias, iter_network
from dasknn.inference import InferenceRun, infer_on_cpus, infer_on_gpus
from dasknn.model.validation import check_float_dtype
from dasknn.runtime.cluster import open_client
from dasknn.runtime.step_timeout import DEFAULT_STEP_TIMEOUT, check_step_timeout
from graph.checks import check_csr

__all__ = [
    "network_source", "prepare_inputs", "prepare_run", "prepare_worker_run", "run_challenge",
]


def _resolve_network(network, neurons, layers, seed) -> list[sp.csr_matrix]:
    return list(network_source(network, neurons, layers, seed)())


def network_source(
    network: str | os.PathLike | Sequence[sp.spmatrix],
    neurons: int | None = None,
    layers: int | None = None,
    seed: int = 0,
    dtype: np.dtype | type = np.float64,
) -> Callable[[], Iterator[sp.csr_matrix]]:
    """A function making the network's layers anew at every call, one at a time: read from a
    challenge directory or generated from ``radixnet:N:L`` as ``dtype`` values
    (:func:`dasknn.datasets.iter_network`; a bad spec or a missing directory raises here), or the
    matrices given, as they are (checked here, the first ``layers`` of them)."""
    if isinstance(network, str | os.PathLike):
        options = {"neurons": neurons, "layers": layers, "seed": seed, "dtype": dtype}
        iter_network(network, **options)  # checks the spec
        return lambda: iter_network(network, **options)
    matrices = [check_csr(m, name=f"layer {k + 1}") for k, m in enumerate(network)]
    if layers is not None:
        matrices = matrices[:layers]
    return lambda: iter(matrices)


def _resolve_inputs(inputs, neurons: int) -> sp.csr_matrix:
    if isinstance(inputs, str | os.PathLike):
        return load_inputs(inputs, neurons)
    return sp.csr_matrix(check_csr(inputs, name="inputs"), dtype=np.float64)


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
    """Load and check everything a run needs before any cluster is touched: (layers, input rows
    (CSR, float64), bias). ``ValueError`` / ``FileNotFoundError`` naming the problem; parameters
    as :func:`run_challenge`'s."""
    dtype = _check_options(
        dtype, weight_buffers, device, compact_every, cuda_mode, batch_size, resident_layers
    )
    matrices = _resolve_network(network, neurons, layers, seed)
    width = check_network(matrices, dtype, tiled=device == "cuda" and cuda_mode == "tiled").width
    matrix, bias = prepare_inputs(inputs, bias, width)
    return matrices, matrix, bias


def _check_options(
    dtype, weight_buffers: int, device: str, compact_every: int, cuda_mode: str,
    batch_size: int | None, resident_layers: int | None,
) -> np.dtype:  # fmt: skip
    """The checked ``dtype``; ``ValueError`` naming the first bad option."""
    dtype = check_float_dtype(dtype)
    if weight_buffers < 1:
        raise ValueError(f"weight_buffers must be >= 1, got {weight_buffers}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if compact_every < 1:
        raise ValueError(f"compact_every must be >= 1, got {compact_every}")
    if cuda_mode not in ("auto", "fused", "sectioned", "tiled"):
        raise ValueError(
            f"cuda_mode must be 'auto', 'fused', 'sectioned' or 'tiled', got {cuda_mode!r}"
        )
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if resident_layers is not None and resident_layers < 1:
        raise ValueError(f"resident_layers must be >= 1, got {resident_layers}")
    return dtype


def prepare_inputs(inputs, bias: float | None, width: int) -> tuple[sp.csr_matrix, float]:
    """The input rows for a network of ``width`` neurons, checked, and the bias (by default the
    challenge's for ``width``)."""
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
    return matrix, float(bias)


def prepare_worker_run(
    network: str | os.PathLike | Sequence[sp.spmatrix],
    inputs: str | os.PathLike | sp.spmatrix | np.ndarray,
    bias: float | None = None,
    *,
    batch_size: int | None = None,
    dtype: str | np.dtype | type = "float32",
    device: str = "cuda",
    compact_every: int = 8,
    cuda_mode: str = "auto",
) -> str:
    """Check the options, the network's form, the inputs file and the bias before any cluster is
    touched (``load_on_workers=True``); return the spec the workers load. Raises ``ValueError``
    (or ``FileNotFoundError``) naming the problem."""
    from dasknn.challenge.worker_network import worker_network_spec

    _check_options(dtype, 1, device, compact_every, cuda_mode, batch_size, None)
    if device != "cuda":
        raise ValueError(f"load_on_workers=True needs device='cuda', got device={device!r}")
    spec = worker_network_spec(network)
    if isinstance(inputs, str | os.PathLike) and not Path(inputs).exists():
        raise FileNotFoundError(f"input file {inputs} does not exist")
    if bias is not None and not math.isfinite(bias):
        raise ValueError(f"bias must be finite, got {bias}")
    return spec


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
    security: Security | bool | None = None,
    step_timeout: float = DEFAULT_STEP_TIMEOUT,
    load_on_workers: bool = False,
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
        A client or scheduler address; by default a LocalCluster of one single-threaded worker
        per core (``device="cuda"``: ``LocalCUDACluster``, one per GPU), closed afterwards.
    neurons, layers, seed : int, optional
        Passed to :func:`dasknn.datasets.load_network` (``layers`` also truncates a sequence).
    batch_size : int, optional
        Rows per batch (default :func:`dasknn.inference.default_batch_size`).
    dtype : ``"float32"`` or ``"float64"``
        Arithmetic of the kernel.
    ymax : float
        Upper clip of the activations (32).
    resident_layers : int, optional
        Stream the weights in windows of this many layers (CPU); by default broadcast whole
        when within ``weight_budget``, else streamed.
    weight_buffers : int
        Windows of layers resident on a worker at once when streaming (2 = double buffering).
    weight_budget : int, optional
        Bytes of weights a worker may hold; default half the smallest worker memory limit (CPU)
        or half the smallest free GPU memory (``device="cuda"``).
    progress : bool
        Show a progress bar over batches.
    device : ``"cpu"`` or ``"cuda"``
        The numba CPU kernel on the workers' cores, or the CUDA kernels on one GPU per worker
        (the ``cuda`` extra; a batch is by default an equal share of the inputs per GPU).
    compact_every : int
        ``device="cuda"``: layers run before dead rows are dropped and the live ones re-packed.
    cuda_mode : ``"auto"``, ``"fused"``, ``"sectioned"`` or ``"tiled"``
        ``device="cuda"``: see :func:`dasknn.kernels.cuda_inference.infer_rows_cuda` (tiled: at
        most ``dasknn.kernels.footprint_tiles.FOOTPRINT`` inputs a column).
    security : distributed.Security or bool, optional
        TLS for the client opened here (:mod:`dasknn.runtime.cluster`); ``True``: a local cluster
        on temporary certificates; ``None``: dask's configuration, no TLS for a local cluster.
    step_timeout : float
        Seconds the run may go without progress (a batch, a warm-up, weights, rows or a result)
        before :class:`~dasknn.exceptions.StepTimeoutError`; with ``load_on_workers`` it also
        bounds the workers' load of the network.
    load_on_workers : bool
        ``device="cuda"``: each GPU worker loads ``network`` (a directory at the same path, or a
        ``radixnet:N:L`` spec) itself and keeps the compact copy; only a summary reaches the
        client, which checks that every worker loaded the same network (docs/challenge.md).

    Returns
    -------
    categories : int64 array
        Sorted 1-based ids of the input rows that are not all zero at the end.
    stats : ChallengeStats
        Time, rate, work and peak memory per worker.

    Raises
    ------
    ValueError
        On inconsistent layers, inputs or options, a ``tls://`` address without certificates;
        ``load_on_workers``: a sequence of matrices, a bad spec, a worker's bad file (naming
        it) or workers that loaded different networks.
    FileNotFoundError
        A missing file or directory (``load_on_workers``: on a worker, naming it).
    RuntimeError
        ``device="cuda"`` without the packages or a GPU on every worker; an unreachable or
        refusing scheduler.
    MemoryError
        ``device="cuda"`` and the network does not fit a GPU even streamed.
    StepTimeoutError
        When the run made no progress within ``step_timeout`` seconds.
    WorkerLostError
        ``device="cuda"``: a GPU worker left the cluster while a batch was pinned to it.
    """
    dtype = np.dtype(dtype)
    step_timeout = check_step_timeout(step_timeout)
    if load_on_workers:
        return _run_loading_on_workers(
            network, inputs, bias, client, neurons=neurons, layers=layers, seed=seed,
            batch_size=batch_size, dtype=dtype, ymax=ymax, weight_budget=weight_budget,
            progress=progress, device=device, compact_every=compact_every, cuda_mode=cuda_mode,
            security=security, step_timeout=step_timeout,
        )  # fmt: skip
    matrices, matrix, bias = prepare_run(
        network, inputs, bias, neurons=neurons, layers=layers, seed=seed, batch_size=batch_size,
        dtype=dtype, resident_layers=resident_layers, weight_buffers=weight_buffers,
        device=device, compact_every=compact_every, cuda_mode=cuda_mode,
    )
    with ExitStack() as stack:
        if device == "cuda":
            run = infer_on_gpus(
                open_client(stack, client, device="cuda", security=security),
                matrices,
                matrix,
                bias,
                float(ymax),
                dtype=dtype,
                batch_size=batch_size,
                weight_budget=weight_budget,
                compact_every=compact_every,
                cuda_mode=cuda_mode,
                step_timeout=step_timeout,
                progress=progress,
                desc="challenge",
            )
        else:
            run = infer_on_cpus(
                open_client(stack, client, security=security),
                matrices,
                matrix,
                bias,
                float(ymax),
                dtype=dtype,
                batch_size=batch_size,
                resident_layers=resident_layers,
                weight_buffers=weight_buffers,
                weight_budget=weight_budget,
                step_timeout=step_timeout,
                progress=progress,
                desc="challenge",
            )
    edges = int(sum(m.nnz for m in matrices))
    return _statistics(run, matrices[0].shape[0], len(matrices), edges, matrix.shape[0], dtype)


def _run_loading_on_workers(
    network: str | os.PathLike | Sequence[sp.spmatrix],
    inputs: str | os.PathLike | sp.spmatrix | np.ndarray,
    bias: float | None,
    client: Client | str | None,
    *,
    neurons: int | None,
    layers: int | None,
    seed: int,
    batch_size: int | None,
    dtype: np.dtype,
    ymax: float,
    weight_budget: int | None,
    progress: bool,
    device: str,
    compact_every: int,
    cuda_mode: str,
    security: Security | bool | None,
    step_timeout: float,
) -> tuple[np.ndarray, ChallengeStats]:
    """:func:`run_challenge` with ``load_on_workers=True`` (the copies released however it
    ends)."""
    from dasknn.challenge.worker_network import load_on_gpu_workers
    from dasknn.inference import check_cuda_workers

    spec = prepare_worker_run(
        network, inputs, bias, batch_size=batch_size, dtype=dtype, device=device,
        compact_every=compact_every, cuda_mode=cuda_mode,
    )  # fmt: skip
    tiled = cuda_mode == "tiled"
    with ExitStack() as stack:
        cuda_client = open_client(stack, client, device="cuda", security=security)
        gpus = check_cuda_workers(cuda_client, step_timeout)
        held = load_on_gpu_workers(
            cuda_client, sorted(gpus), spec, neurons=neurons, layers=layers, seed=seed, dtype=dtype,
            tiled=tiled, step_timeout=step_timeout,
        )  # fmt: skip
        try:
            try:
                matrix, bias = prepare_inputs(inputs, bias, held.neurons)
            except ValueError as error:
                raise ValueError(
                    f"{error} (the network {spec!r} as loaded by worker "
                    f"{', '.join(sorted(held.copies))})"
                ) from None
            run = infer_on_gpus(
                cuda_client, held, matrix, bias, float(ymax), dtype=dtype, batch_size=batch_size,
                weight_budget=weight_budget, compact_every=compact_every, cuda_mode=cuda_mode,
                step_timeout=step_timeout, progress=progress, desc="challenge",
            )  # fmt: skip
        finally:
            held.release()
    return _statistics(run, held.neurons, held.layers, held.edges, matrix.shape[0], dtype)


def _statistics(
    run: InferenceRun, neurons: int, layers: int, edges: int, n_inputs: int, dtype: np.dtype
) -> tuple[np.ndarray, ChallengeStats]:
    """The categories and statistics of a run's batches through a network of ``neurons`` x
    ``layers`` with ``edges`` weights."""
    categories, peaks = merge_batches(run.results)
    seconds = run.seconds
    stats = ChallengeStats(
        inputs=n_inputs,
        neurons=neurons,
        layers=layers,
        edges=edges,
        categories=int(categories.size),
        seconds=seconds,
        rate=n_inputs * edges / seconds if seconds > 0 else float("inf"),
        kernel_seconds=float(sum(r.kernel_seconds for _, r in run.results)),
        macs_done=int(sum(r.macs_done for _, r in run.results)),
        macs_needed=int(sum(r.macs_needed for _, r in run.results)),
        batches=len(run.results),
        batch_size=run.batch_size,
        dtype=dtype.name,
        workers=run.workers,
        mode=run.mode,
        resident_layers=run.resident_layers,
        weight_buffers=run.weight_buffers,
        weight_bytes=run.weight_bytes,
        peak_memory=peaks,
        device=run.device,
        gpus=run.gpus,
    )
    return categories, stats
