"""Data-parallel Graph Challenge inference on the GPUs of a Dask cluster (``device="cuda"``).

Every GPU worker (one worker per GPU, as dask-cuda's ``LocalCUDACluster`` starts them) receives
the packed network once; a task pinned to the worker uploads it to its GPU, where it stays for the
whole run (or, when it exceeds the worker's weight budget, stays in host memory and is streamed to
the GPU a window of layers at a time during each batch). The input rows are cut into batches that
the workers pull as earlier ones finish; each batch runs through every layer on the GPU with
:func:`dasknn.kernels.cuda_inference.infer_rows_cuda` and only its surviving row ids come back.
"""

from __future__ import annotations

import math
import time

import numpy as np
import scipy.sparse as sp
from distributed import Client, as_completed

from dasknn.challenge.stats import ChallengeStats, merge_batches
from dasknn.challenge.tasks import BatchResult, peak_rss, worker_name
from dasknn.kernels.cuda_inference import CUDA_INSTALL_HINT, weight_bytes
from dasknn.kernels.inference import PackedLayers, pack_layers

__all__ = ["check_cuda_workers", "device_memory", "plan_memory", "run_cuda"]

_WEIGHT_SHARE = 0.5  # of a GPU's free memory that the resident weights may take
_USABLE_SHARE = 0.9  # of a GPU's free memory that the run may take in all


def device_memory() -> dict:
    """On a worker: its GPU's name and free / total bytes, or why it has none.

    Under numba's CUDA simulator the "device" is this host's available memory.
    """
    from dasknn.kernels.cuda_inference import cuda_runtime

    runtime = cuda_runtime()
    if runtime == "none":
        return {"runtime": runtime}
    if runtime == "simulator":
        import psutil

        available = int(psutil.virtual_memory().available)
        return {
            "runtime": runtime,
            "name": "numba CUDA simulator",
            "free": available,
            "total": available,
        }
    from numba import cuda

    free, total = cuda.current_context().get_memory_info()
    name = cuda.get_current_device().name
    return {
        "runtime": runtime,
        "name": name.decode() if isinstance(name, bytes) else str(name),
        "free": int(free),
        "total": int(total),
    }


def check_cuda_workers(client: Client) -> dict[str, dict]:
    """Ask every worker for its GPU; raise ``RuntimeError`` naming those without one."""
    info = client.run(device_memory)
    if not info:
        raise ValueError("the Dask cluster has no workers")
    missing = sorted(addr for addr, gpu in info.items() if gpu["runtime"] == "none")
    if missing:
        raise RuntimeError(
            f"device='cuda' needs a CUDA GPU on every worker; {', '.join(missing)} "
            f"{'has' if len(missing) == 1 else 'have'} none (or numba cannot load the CUDA "
            f"driver there); {CUDA_INSTALL_HINT}"
        )
    return info


def plan_memory(
    packed_bytes: int,
    layer_bytes: int,
    neurons: int,
    itemsize: int,
    free: int,
    weight_budget: int | None,
) -> tuple[int | None, int]:
    """Weight budget (``None``: resident whole) and the most live rows a batch may hold.

    Raises ``MemoryError`` naming the bytes needed and available when not even one layer and one
    group of rows fit.
    """
    from dasknn.kernels.cuda_inference import LANES, activation_bytes

    usable = int(free * _USABLE_SHARE)
    budget = weight_budget if weight_budget is not None else int(usable * _WEIGHT_SHARE)
    minimum = layer_bytes + activation_bytes(LANES, neurons, itemsize)
    if layer_bytes > budget or minimum > usable:
        raise MemoryError(
            f"the network cannot run on this GPU even streamed: one layer and one group of "
            f"{LANES} rows need {minimum} bytes, {usable} bytes are available "
            f"(weight budget {budget} bytes)"
        )
    resident = packed_bytes <= budget
    weights = packed_bytes if resident else budget
    per_row = activation_bytes(LANES, neurons, itemsize) // LANES
    rows = max(LANES, (usable - weights) // per_row)
    return (None if resident else budget), int(rows)


def upload_network(packed: PackedLayers, budget: int | None):
    """On a worker: put the packed network on its GPU (streamed when over ``budget``)."""
    from dasknn.kernels.cuda_inference import DeviceNetwork

    return DeviceNetwork(packed, budget)


def infer_batch_cuda(
    inputs: sp.csr_matrix, network, bias: float, ymax: float, compact_every: int, mode: str
) -> BatchResult:
    """On a worker: run one batch on its GPU; return its live rows (batch-local)."""
    from dasknn.kernels.cuda_inference import infer_rows_cuda

    result = infer_rows_cuda(inputs, network, bias, ymax, compact_every, mode)
    return BatchResult(
        rows=result.rows,
        macs_done=result.macs_done,
        macs_needed=0,
        kernel_seconds=result.kernel_seconds,
        peak_memory={worker_name(): peak_rss()},
    )


def warm_cuda_kernel(dtype: str) -> None:
    """On a worker: compile the CUDA kernels for ``dtype`` so that timings exclude the JIT."""
    from dasknn.kernels.cuda_inference import DeviceNetwork, infer_rows_cuda

    layer = sp.identity(64, dtype=np.float64, format="csr")
    network = DeviceNetwork(pack_layers([layer, layer], np.dtype(dtype)))
    rows = sp.csr_matrix(np.array([[1.0] * 64, [0.05] * 64]))  # the second row dies: compaction
    for mode in ("fused", "sectioned"):
        infer_rows_cuda(rows, network, -0.1, 32.0, compact_every=1, mode=mode)


def run_cuda(
    client: Client,
    matrices: list[sp.csr_matrix],
    matrix: sp.csr_matrix,
    bias: float,
    ymax: float,
    dtype: np.dtype,
    batch_size: int | None,
    weight_budget: int | None,
    compact_every: int,
    mode: str,
    progress: bool,
) -> tuple[np.ndarray, ChallengeStats]:
    """Run the challenge on the GPU workers of ``client``; see :func:`run_challenge`."""
    from tqdm.auto import tqdm

    gpus = check_cuda_workers(client)
    n_inputs, width = matrix.shape
    n_layers = len(matrices)
    edges = int(sum(m.nnz for m in matrices))
    packed = pack_layers(matrices, dtype)
    device_bytes, layer_bytes = weight_bytes(packed)
    free = min(gpu["free"] for gpu in gpus.values())
    budget, max_rows = plan_memory(
        device_bytes, layer_bytes, width, dtype.itemsize, free, weight_budget
    )
    addresses = sorted(gpus)
    if batch_size is None:
        batch_size = math.ceil(n_inputs / len(addresses))
    batch_size = max(1, min(batch_size, max_rows))
    starts = list(range(0, n_inputs, batch_size))
    client.run(warm_cuda_kernel, dtype.name)

    start = time.perf_counter()
    networks = {}
    for address in addresses:
        host = client.scatter(packed, workers=[address], hash=False)
        networks[address] = client.submit(
            upload_network, host, budget, workers=[address], allow_other_workers=False, pure=False
        )
    pending = iter(starts)
    offsets: dict[str, tuple[int, str]] = {}
    results = []
    queue = as_completed()

    def submit_next(address: str) -> None:
        s = next(pending, None)
        if s is None:
            return
        batch = matrix[s : s + batch_size].astype(dtype)
        rows = client.scatter(batch, workers=[address], hash=False)
        future = client.submit(
            infer_batch_cuda,
            rows,
            networks[address],
            bias,
            ymax,
            compact_every,
            mode,
            workers=[address],
            allow_other_workers=False,
            pure=False,
        )
        offsets[future.key] = (s, address)
        queue.add(future)

    for address in addresses:
        for _ in range(2):  # one batch running and one queued per GPU
            submit_next(address)
    with tqdm(total=len(starts), disable=not progress, unit="batch", desc="challenge") as bar:
        for future in queue:
            s, address = offsets.pop(future.key)
            results.append((s, future.result()))
            future.release()
            bar.update(1)
            submit_next(address)
    seconds = time.perf_counter() - start
    networks.clear()

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
        macs_needed=0,
        batches=len(starts),
        batch_size=batch_size,
        dtype=dtype.name,
        workers=len(addresses),
        mode="broadcast" if budget is None else "streamed",
        resident_layers=n_layers if budget is None else max(1, budget // layer_bytes),
        weight_buffers=1,
        weight_bytes=int(device_bytes),
        peak_memory=peaks,
        device="cuda",
        gpus=sorted({gpu["name"] for gpu in gpus.values()}),
    )
    return categories, stats
