"""Sparse inference on the GPUs of a Dask cluster (one worker per GPU) as a step of the batch
driver: each GPU worker gets the compact network once (or loads it, a :class:`HeldNetwork`) and
uploads it to its GPU; each batch runs on its slot's GPU and only its surviving row ids come back
(docs/challenge.md, "On GPUs").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from distributed import Client, Future

from dasknn.inference._batches import BatchResult
from dasknn.inference._broadcast import load_held, load_on_each, scatter_within
from dasknn.inference._workers import peak_rss, worker_name
from dasknn.kernels.cuda_inference import (
    CUDA_INSTALL_HINT,
    BitRows,
    CompactLayers,
    compact_layers,
    pack_bit_rows,
)
from dasknn.kernels.inference import pack_layers
from dasknn.runtime.step_timeout import run_on_workers

__all__ = [
    "CUDAInference",
    "HeldNetwork",
    "check_cuda_workers",
    "device_memory",
    "infer_batch_cuda",
    "plan_memory",
    "upload_network",
    "warm_cuda_kernel",
]

_WEIGHT_SHARE = 0.5  # of a GPU's free memory that the resident weights may take
_USABLE_SHARE = 0.9  # of a GPU's free memory that the run may take in all


@dataclass
class HeldNetwork:
    """A compact network that each GPU worker loaded itself and holds in host memory.

    Attributes
    ----------
    copies : dict of str to distributed.Future
        Each worker's copy (a :class:`~dasknn.kernels.cuda_inference.CompactLayers`), by address,
        pinned to that worker.
    neurons, layers, edges : int
        Width, depth and nonzero weights of the network.
    device_bytes, largest_layer : int
        Device bytes of the network and of its largest layer
        (:func:`dasknn.kernels.cuda_inference.weight_bytes`).
    """

    copies: dict[str, Future]
    neurons: int
    layers: int
    edges: int
    device_bytes: int
    largest_layer: int

    def release(self) -> None:
        """Release every worker's copy."""
        for future in self.copies.values():
            future.release()


def device_memory() -> dict:
    """On a worker: its GPU's name and free / total bytes, or why it has none, or why numba-cuda
    cannot compile (``"compiler"``); under the simulator, this host's available memory."""
    from dasknn.kernels.cuda_inference import check_cuda_compiler, cuda_runtime

    runtime = cuda_runtime()
    if runtime == "none":
        return {"runtime": runtime}
    try:
        check_cuda_compiler()
    except RuntimeError as error:
        return {"runtime": runtime, "compiler": str(error)}
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


def check_cuda_workers(client: Client, step_timeout: float) -> dict[str, dict]:
    """Ask every worker for its GPU (within ``step_timeout`` seconds, else
    :class:`~dasknn.exceptions.StepTimeoutError`); ``RuntimeError`` naming those without one or
    whose numba-cuda cannot compile, with each one's reason."""
    info = run_on_workers(client, "reporting their GPU", step_timeout, device_memory)
    if not info:
        raise ValueError("the Dask cluster has no workers")
    missing = sorted(addr for addr, gpu in info.items() if gpu["runtime"] == "none")
    if missing:
        raise RuntimeError(
            f"device='cuda' needs a CUDA GPU on every worker; {', '.join(missing)} "
            f"{'has' if len(missing) == 1 else 'have'} none (or numba cannot load the CUDA "
            f"driver there); {CUDA_INSTALL_HINT}"
        )
    broken: dict[str, list[str]] = {}
    for address in sorted(info):
        if "compiler" in info[address]:
            broken.setdefault(info[address]["compiler"], []).append(address)
    if broken:
        raise RuntimeError(
            "; ".join(f"worker {', '.join(names)}: {problem}" for problem, names in broken.items())
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


def upload_network(network: CompactLayers, budget: int | None, tiled: bool):
    """On a worker: put the network on its GPU (streamed when over ``budget``), with its
    footprint tiles, computed here on the worker's cores, when ``tiled``."""
    from dasknn.kernels.cuda_inference import DeviceNetwork

    return DeviceNetwork(network, budget, tiled=tiled)


def infer_batch_cuda(
    inputs: sp.csr_matrix | BitRows,
    network,
    bias: float,
    ymax: float,
    compact_every: int,
    mode: str,
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


def warm_cuda_kernel(dtype: str, mode: str) -> None:
    """On a worker: check the compiler, then compile the CUDA kernels of ``mode`` for ``dtype``
    so that timings exclude the JIT (only the check under the simulator)."""
    from dasknn.kernels.cuda_inference import (
        DeviceNetwork,
        check_cuda_compiler,
        cuda_runtime,
        infer_rows_cuda,
    )

    check_cuda_compiler()
    if cuda_runtime() == "simulator":
        return

    layer = sp.identity(64, dtype=np.float64, format="csr")
    compact = compact_layers(pack_layers([layer, layer], np.dtype(dtype), groups=False))
    tiled = mode == "tiled"
    network = DeviceNetwork(compact, tiled=tiled)
    rows = sp.csr_matrix(np.array([[1.0] * 64, [0.05] * 64]))  # the second row dies: compaction
    for warm in ("tiled",) if tiled else ("fused", "sectioned"):
        infer_rows_cuda(rows, network, -0.1, 32.0, compact_every=1, mode=warm)
        infer_rows_cuda(pack_bit_rows(rows[:1]), network, -0.1, 32.0, compact_every=1, mode=warm)


class CUDAInference:
    """The batch step on GPU workers: the whole network on every GPU, each batch pinned to the
    GPU of its slot.

    Parameters
    ----------
    addresses : sequence of str
        The GPU workers.
    bias, ymax : float
        As for :class:`dasknn.inference._cpu_inference.CPUInference`.
    dtype : numpy dtype
        Arithmetic of the kernels (CSR batches arrive in it).
    budget : int or None
        Bytes of weights a GPU may hold (``None``: the network stays resident whole).
    compact_every : int
        Layers run before dead rows are dropped and the live ones re-packed.
    mode : str
        ``"auto"``, ``"fused"``, ``"sectioned"`` or ``"tiled"`` (see
        :func:`dasknn.kernels.cuda_inference.infer_rows_cuda`).
    """

    def __init__(
        self,
        addresses: list[str],
        bias: float,
        ymax: float,
        dtype: np.dtype,
        budget: int | None,
        compact_every: int,
        mode: str,
    ) -> None:
        self.addresses = addresses
        self.bias = bias
        self.ymax = ymax
        self.dtype = dtype
        self.budget = budget
        self.compact_every = compact_every
        self.mode = mode

    def place(
        self, client: Client, weights: CompactLayers | HeldNetwork, timeout: float
    ) -> dict[str, Future]:
        """Upload the network to every GPU worker within ``timeout`` seconds; the device copies,
        by address."""
        if isinstance(weights, HeldNetwork):
            return load_held(client, weights.copies, upload_network, self.budget,
                             self.mode == "tiled")  # fmt: skip
        return load_on_each(
            client, weights, self.addresses, timeout, upload_network, self.budget,
            self.mode == "tiled",
        )

    def submit(
        self,
        client: Client,
        batch: sp.csr_matrix | BitRows,
        placed: dict[str, Future],
        worker: str | None,
        last: bool,
        timeout: float,
    ) -> Future:
        """Send a batch's rows to ``worker`` (within ``timeout`` seconds) and submit
        :func:`infer_batch_cuda` there (one window: ``last`` is always true)."""
        rows = scatter_within(client, batch, timeout, workers=[worker])
        return client.submit(
            infer_batch_cuda,
            rows,
            placed[worker],
            self.bias,
            self.ymax,
            self.compact_every,
            self.mode,
            workers=[worker],
            allow_other_workers=False,
            pure=False,
        )
