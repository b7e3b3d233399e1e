"""Data-parallel sparse inference on CPUs or GPUs: :func:`infer_on_cpus` (weights broadcast, or
streamed in windows of layers, at most ``weight_buffers`` at once) and :func:`infer_on_gpus`."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
from distributed import Client

from dasknn.inference._batches import BatchResult, default_batch_size
from dasknn.inference._cpu_inference import CPUInference, layer_bytes, warm_kernel
from dasknn.inference._driver import (
    per_worker_slots,
    run_batches,
    shared_slots,
)
from dasknn.inference._windows import layer_windows, window_layers, worker_memory_limit
from dasknn.kernels.inference import pack_layers
from dasknn.runtime.cluster import scheduler_workers
from dasknn.runtime.step_timeout import DEFAULT_STEP_TIMEOUT, run_on_workers

if TYPE_CHECKING:
    from dasknn.inference._gpu_inference import HeldNetwork

__all__ = ["InferenceRun", "infer_on_cpus", "infer_on_gpus"]


@dataclass
class InferenceRun:
    """The batches of a run and how they were run.

    Attributes
    ----------
    results : list of (int, BatchResult)
        ``(first row, result)`` of every batch.
    seconds : float
        Wall time from placing the weights to the last result (packing broadcast weights,
        warming the kernels and planning excluded).
    batch_size, workers : int
        Rows per batch and workers that ran them.
    mode : str
        ``"broadcast"`` (the whole network held by every worker) or ``"streamed"``.
    resident_layers, weight_buffers : int
        Layers per window and windows held at once.
    weight_bytes : int
        Bytes of the packed network.
    device : str
        ``"cpu"`` or ``"cuda"``.
    gpus : list of str
        Names of the GPUs (``device="cuda"``).
    """

    results: list[tuple[int, BatchResult]]
    seconds: float
    batch_size: int
    workers: int
    mode: str
    resident_layers: int
    weight_buffers: int
    weight_bytes: int
    device: str = "cpu"
    gpus: list[str] = field(default_factory=list)


def infer_on_cpus(
    client: Client,
    matrices: list[sp.csr_matrix],
    rows: sp.csr_matrix,
    bias: float,
    ymax: float,
    *,
    dtype: np.dtype,
    batch_size: int | None = None,
    resident_layers: int | None = None,
    weight_buffers: int = 2,
    weight_budget: int | None = None,
    step_timeout: float = DEFAULT_STEP_TIMEOUT,
    progress: bool = True,
    desc: str = "inference",
) -> InferenceRun:
    """Run ``rows`` through the layers ``matrices`` with the numba kernel on the workers' cores.

    Parameters
    ----------
    client : distributed.Client
    matrices : list of scipy.sparse.csr_matrix
        The layers, checked, shape ``(N, N)`` each.
    rows : scipy.sparse.csr_matrix
        The input rows ``(n, N)``.
    bias, ymax : float
        Added to the nonzero entries of each layer's product; upper clip of the activations.
    dtype : numpy dtype
        float32 or float64, the kernel's arithmetic.
    batch_size : int, optional
        Rows per batch (default :func:`dasknn.inference.default_batch_size`).
    resident_layers : int, optional
        Stream the weights in windows of this many layers; by default they are broadcast whole
        when they fit ``weight_budget``, else streamed in windows that fit it.
    weight_buffers : int
        Windows held by a worker at once when streaming (2 = double buffering).
    weight_budget : int, optional
        Bytes of weights a worker may hold; default half the smallest worker memory limit.
    step_timeout : float
        Seconds the run may go without progress (:func:`dasknn.inference._driver.run_batches`).
    progress : bool
    desc : str

    Raises
    ------
    ValueError
        If the cluster has no workers.
    StepTimeoutError
        If nothing finished within ``step_timeout``, naming the workers waited for.
    WorkerLostError, Exception
        As :func:`dasknn.inference._driver.run_batches` raises them.
    """
    n_workers = len(scheduler_workers(client))
    if n_workers == 0:
        raise ValueError("the Dask cluster has no workers")
    batch_size = batch_size or default_batch_size(rows.shape[0], n_workers)
    sizes = layer_bytes(matrices, dtype)
    budget = weight_budget or worker_memory_limit(client) // 2
    per_window = window_layers(sizes, budget, weight_buffers, resident_layers)
    run_on_workers(client, "warming the kernel", step_timeout, warm_kernel, dtype.name)
    if per_window is None:
        packed = pack_layers(matrices, dtype)
        windows = [lambda: packed]
    else:
        windows = [
            lambda part=part: pack_layers(matrices[part], dtype)
            for part in layer_windows(len(matrices), per_window)
        ]
    buffers = 1 if per_window is None else weight_buffers
    step = CPUInference(bias, ymax)
    start = time.perf_counter()
    results = run_batches(
        client,
        rows,
        batch_size,
        step,
        windows,
        shared_slots(client),
        weight_buffers=buffers,
        step_timeout=step_timeout,
        progress=progress,
        desc=desc,
    )
    return InferenceRun(
        results=results,
        seconds=time.perf_counter() - start,
        batch_size=batch_size,
        workers=n_workers,
        mode="broadcast" if per_window is None else "streamed",
        resident_layers=len(matrices) if per_window is None else per_window,
        weight_buffers=buffers,
        weight_bytes=int(sum(sizes)),
    )


def infer_on_gpus(
    client: Client,
    network: list[sp.csr_matrix] | HeldNetwork,
    rows: sp.csr_matrix,
    bias: float,
    ymax: float,
    *,
    dtype: np.dtype,
    batch_size: int | None = None,
    weight_budget: int | None = None,
    compact_every: int = 8,
    cuda_mode: str = "auto",
    step_timeout: float = DEFAULT_STEP_TIMEOUT,
    progress: bool = True,
    desc: str = "inference",
) -> InferenceRun:
    """Run ``rows`` through the layers of ``network`` with the CUDA kernels on the workers' GPUs
    (one GPU per worker).

    Parameters
    ----------
    client, rows, bias, ymax, dtype, step_timeout, progress, desc
        As for :func:`infer_on_cpus`.
    network : list of scipy.sparse.csr_matrix or HeldNetwork
        The layers, packed here and sent to every GPU worker, or the compact network that each
        GPU worker already holds (:class:`~dasknn.inference.HeldNetwork`, the caller's to release).
    batch_size : int, optional
        Rows per batch; by default an equal share of the rows per GPU. Capped by what the GPU's
        free memory holds.
    weight_budget : int, optional
        Bytes of weights a GPU may hold; default half the smallest free GPU memory. A network
        over it is streamed to the GPU a window of layers at a time.
    compact_every : int
        Layers run before dead rows are dropped and the live ones re-packed.
    cuda_mode : ``"auto"``, ``"fused"``, ``"sectioned"`` or ``"tiled"``
        See :func:`dasknn.kernels.cuda_inference.infer_rows_cuda`.

    Raises
    ------
    ValueError
        If the cluster has no workers.
    RuntimeError
        If a worker has no GPU (or numba cannot load the CUDA driver there), or a worker holding
        ``network`` is no GPU worker of the cluster any more.
    StepTimeoutError, WorkerLostError
        As for :func:`infer_on_cpus` (a lost worker is always an error here).
    MemoryError
        If the network does not fit a GPU even streamed.
    """
    from dasknn.inference._gpu_inference import (
        CUDAInference,
        HeldNetwork,
        check_cuda_workers,
        plan_memory,
        warm_cuda_kernel,
    )
    from dasknn.kernels.cuda_inference import compact_layers, pack_bit_rows, weight_bytes

    gpus = check_cuda_workers(client, step_timeout)
    n_rows, width = rows.shape
    if isinstance(network, HeldNetwork):
        gone = sorted(set(network.copies) - set(gpus))
        if gone:
            raise RuntimeError(
                f"worker {', '.join(gone)} loaded the network and is no GPU worker of the "
                "cluster any more"
            )
        gpus = {address: gpus[address] for address in network.copies}
        weights = network
        device_bytes, largest_layer, n_layers = (
            network.device_bytes, network.largest_layer, network.layers,
        )  # fmt: skip
    else:
        weights = compact_layers(pack_layers(network, dtype, groups=False))
        device_bytes, largest_layer = weight_bytes(weights, tiled=cuda_mode == "tiled")
        n_layers = len(network)
    bit_rows = pack_bit_rows(rows)  # binary inputs travel as bits; others as CSR of ``dtype``
    rows = bit_rows if bit_rows is not None else sp.csr_matrix(rows, dtype=dtype)
    free = min(gpu["free"] for gpu in gpus.values())
    budget, max_rows = plan_memory(
        device_bytes, largest_layer, width, dtype.itemsize, free, weight_budget
    )
    addresses = sorted(gpus)
    if batch_size is None:
        batch_size = math.ceil(n_rows / len(addresses))
    batch_size = max(1, min(batch_size, max_rows))
    run_on_workers(
        client, "compiling the CUDA kernels", step_timeout, warm_cuda_kernel, dtype.name,
        cuda_mode,
    )
    step = CUDAInference(addresses, bias, ymax, dtype, budget, compact_every, cuda_mode)
    start = time.perf_counter()
    results = run_batches(
        client,
        rows,
        batch_size,
        step,
        [lambda: weights],
        per_worker_slots(addresses),
        step_timeout=step_timeout,
        progress=progress,
        desc=desc,
    )
    return InferenceRun(
        results=results,
        seconds=time.perf_counter() - start,
        batch_size=batch_size,
        workers=len(addresses),
        mode="broadcast" if budget is None else "streamed",
        resident_layers=n_layers if budget is None else max(1, budget // largest_layer),
        weight_buffers=1,
        weight_bytes=int(device_bytes),
        device="cuda",
        gpus=sorted({gpu["name"] for gpu in gpus.values()}),
    )
