"""CUDA kernels of sparse-DNN inference (the Graph Challenge step) on one GPU, with numba-cuda.

The kernels follow SNIG (Lin & Huang, TPDS 2021): the whole batch stays on the device, the weights
are loaded once (or streamed a window of layers at a time when the network exceeds the device's
budget), rows that became all zero are dropped, bias / ReLU / clip are fused into the store, and
two rolling activation buffers are reused across layers.

Layout. The live rows of a batch are cut into *groups* of ``LANES = 32`` rows, stored
feature-major::

    y[buffer, group, j, lane]  =  activation of neuron j for live row  group * 32 + lane

Lane ``l`` of a warp computes row ``l`` of its group. For output neuron ``c`` the warp reads the
entries of column ``c`` 32 at a time, one per lane (index and the per-(group, neuron) flag telling
whether that input section holds a nonzero), keeps the entries whose section is nonzero in shared
memory, and then accumulates the kept ones in order: one coalesced 128-byte activation load per
kept entry. The order of the sums is the CSC order of the CPU kernel, so results agree bit for bit
in the same precision.

Two launch modes:

- *fused* (:func:`_window_kernel`): one block of 1024 threads owns one group for ``compact_every``
  layers; the loop over layers runs inside the kernel (``syncthreads`` between layers), and a block
  whose rows are all dead leaves at once;
- *sectioned* (:func:`_layer_kernel`): one launch per layer, one block per group and
  ``SECTION_OUTPUTS`` output neurons, blocks in group-major order, so that the groups in flight
  share the L2 cache when a group's activations are megabytes (wide networks).

Between windows of ``compact_every`` layers the host drops the dead rows and re-packs the live ones
into fewer groups (:func:`_gather_kernel`).

The kernels use only what numba's CUDA simulator also implements (no warp vote or shuffle), so
``NUMBA_ENABLE_CUDASIM=1`` runs the same kernel code on the CPU in the tests.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from numba import config, cuda

from dasknn.kernels.inference import PackedLayers
from graph.checks import check_csr

__all__ = [
    "CUDA_INSTALL_HINT",
    "CUDA_MODES",
    "LANES",
    "DeviceNetwork",
    "CudaBatchResult",
    "activation_bytes",
    "cuda_runtime",
    "infer_rows_cuda",
    "weight_bytes",
]

CUDA_INSTALL_HINT = (
    "install the optional GPU packages with: python3 -m pip install 'dasknn[cuda]' "
    "(dask-cuda and numba-cuda, for CUDA 12 drivers or newer)"
)
LANES = 32  # rows per group: one warp, one lane per row
SECTION_OUTPUTS = 1024  # output neurons per block in the sectioned (one launch per layer) mode
SECTIONED_FROM = 4096  # widths from which mode="auto" launches per layer (measured on an H200)
CUDA_MODES = ("auto", "fused", "sectioned")
_WARPS = 32  # warps per block on a GPU (1024 threads)


@cuda.jit
def _zero_kernel(array):
    """Set a flat device array to zero (grid-stride loop)."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, array.size, stride):
        array[i] = 0


@cuda.jit
def _scatter_kernel(indptr, indices, data, rows, y, flags):
    """Write the input rows ``rows`` (CSR) into group buffer ``y`` (zeroed) and set the flags."""
    g = cuda.blockIdx.x
    t = cuda.threadIdx.x
    lane = t % LANES
    sub = t // LANES
    subs = cuda.blockDim.x // LANES
    i = g * LANES + lane
    if i < rows.size:
        r = rows[i]
        for p in range(indptr[r] + sub, indptr[r + 1], subs):
            v = data[p]
            if v != 0:
                y[g, indices[p], lane] = v
                flags[g, indices[p]] = 1


if config.ENABLE_CUDASIM:

    @cuda.jit(device=True)
    def _warp_sync():
        """The simulator has no ``syncwarp``: a block barrier instead, which needs every warp of
        the block to run the same number of 32-entry column chunks (true for networks whose
        columns have equal degrees and whose width the warps divide, as in the tests)."""
        cuda.syncthreads()

else:

    @cuda.jit(device=True)
    def _warp_sync():
        cuda.syncwarp()


@cuda.jit
def _window_kernel(y, flags, parity, indptr, indices, data, first, count, bias, ymax, alive, work):
    """Run group ``blockIdx.x`` through layers ``first .. first + count - 1`` of the window.

    ``y[parity]`` holds the input activations and ``flags[parity]`` their section flags; the output
    of layer ``k`` goes to buffer ``(parity + k + 1) % 2``. ``alive[g * 32 + lane]`` is set to
    whether the row is nonzero after the last layer run; ``work[g]`` adds the multiply-adds done
    (32 per accumulated section).

    Lane ``l`` loads entry ``l`` of each 32-entry chunk of column ``c`` (index, section flag) in one
    coalesced round and leaves its position in shared memory when its input section is nonzero;
    the warp then accumulates the kept entries in order (the CSC order, as the CPU kernel does), so
    only they cost an activation load.
    """
    g = cuda.blockIdx.x
    t = cuda.threadIdx.x
    lane = t % LANES
    warp = t // LANES
    warps = cuda.blockDim.x // LANES
    n = y.shape[2]
    live = cuda.shared.array((2, LANES), dtype=np.int32)
    kept_p = cuda.shared.array((32, LANES), dtype=np.int64)
    kept_j = cuda.shared.array((32, LANES), dtype=np.int32)
    zero = ymax - ymax
    terms = 0
    src = parity
    cur = 0
    for k in range(count):
        dst = 1 - src
        cur = k % 2
        for j in range(t, n, cuda.blockDim.x):
            flags[dst, g, j] = 0
        if t < LANES:
            live[cur, t] = 0
        cuda.syncthreads()
        layer = first + k
        for c in range(warp, n, warps):
            acc = zero
            p1 = indptr[layer, c + 1]
            for base in range(indptr[layer, c], p1, LANES):
                p = base + lane
                kept = -1
                j = 0
                if p < p1:
                    j = indices[p]
                    if flags[src, g, j] != 0:
                        kept = p
                kept_p[warp, lane] = kept
                kept_j[warp, lane] = j
                _warp_sync()
                for e in range(min(LANES, p1 - base)):
                    q = kept_p[warp, e]
                    if q >= 0:
                        acc += data[q] * y[src, g, kept_j[warp, e], lane]
                        terms += 1
                _warp_sync()
            out = zero
            if acc != zero:
                out = min(max(acc + bias, zero), ymax)
            y[dst, g, c, lane] = out
            if out != zero:
                flags[dst, g, c] = 1
                live[cur, lane] = 1
        cuda.syncthreads()
        any_live = 0
        for i in range(LANES):
            any_live |= live[cur, i]
        src = dst
        if any_live == 0:
            break
    if warp == 0:
        alive[g * LANES + lane] = live[cur, lane]
    if lane == 0 and terms > 0:
        cuda.atomic.add(work, g, terms * LANES)


@cuda.jit
def _layer_kernel(
    y, flags, src, indptr, indices, data, layer, sections, bias, ymax, alive_in, alive_out, work
):
    """One layer, block ``b`` computing output section ``b % sections`` of group ``b // sections``.

    ``flags[1 - src]`` and ``alive_out`` must be zero before the launch; a group whose rows are
    all dead in ``alive_in`` is skipped. Blocks run group-major, so the groups in flight share the
    L2 cache even when one group's activations are megabytes.
    """
    b = cuda.blockIdx.x
    g = b // sections
    s = b % sections
    t = cuda.threadIdx.x
    lane = t % LANES
    warp = t // LANES
    warps = cuda.blockDim.x // LANES
    any_live = 0
    for i in range(LANES):
        any_live |= alive_in[g * LANES + i]
    if any_live == 0:
        return
    n = y.shape[2]
    dst = 1 - src
    chunk = (n + sections - 1) // sections
    lo = s * chunk
    hi = min(n, lo + chunk)
    kept_p = cuda.shared.array((32, LANES), dtype=np.int64)
    kept_j = cuda.shared.array((32, LANES), dtype=np.int32)
    zero = ymax - ymax
    terms = 0
    for c in range(lo + warp, hi, warps):
        acc = zero
        p1 = indptr[layer, c + 1]
        for base in range(indptr[layer, c], p1, LANES):
            p = base + lane
            kept = -1
            j = 0
            if p < p1:
                j = indices[p]
                if flags[src, g, j] != 0:
                    kept = p
            kept_p[warp, lane] = kept
            kept_j[warp, lane] = j
            _warp_sync()
            for e in range(min(LANES, p1 - base)):
                q = kept_p[warp, e]
                if q >= 0:
                    acc += data[q] * y[src, g, kept_j[warp, e], lane]
                    terms += 1
            _warp_sync()
        out = zero
        if acc != zero:
            out = min(max(acc + bias, zero), ymax)
        y[dst, g, c, lane] = out
        if out != zero:
            flags[dst, g, c] = 1
            alive_out[g * LANES + lane] = 1
    if lane == 0 and terms > 0:
        cuda.atomic.add(work, g, terms * LANES)


@cuda.jit
def _gather_kernel(src, dst, source_of, flags_dst):
    """Pack the live rows ``source_of`` (indices into the old groups) into new groups of ``dst``.

    ``flags_dst`` (zeroed) receives the section flags of the new groups.
    """
    g = cuda.blockIdx.x
    t = cuda.threadIdx.x
    lane = t % LANES
    sub = t // LANES
    subs = cuda.blockDim.x // LANES
    n = src.shape[1]
    i = g * LANES + lane
    valid = i < source_of.size
    s = source_of[i] if valid else 0
    for j in range(sub, n, subs):
        v = src[s // LANES, j, s % LANES] if valid else src[0, 0, 0] * 0
        dst[g, j, lane] = v
        if v != 0:
            flags_dst[g, j] = 1


def cuda_runtime() -> str:
    """``"gpu"`` when numba sees a CUDA GPU, ``"simulator"`` under ``NUMBA_ENABLE_CUDASIM=1``,
    else ``"none"``."""
    if config.ENABLE_CUDASIM:
        return "simulator"
    try:
        return "gpu" if cuda.is_available() else "none"
    except Exception:  # noqa: BLE001 - a missing driver library raises many kinds of error
        return "none"


def _threads_per_block() -> int:
    """1024 threads on a GPU; 64 under the simulator (one Python thread each)."""
    return 64 if cuda_runtime() == "simulator" else _WARPS * LANES


def activation_bytes(rows: int, neurons: int, itemsize: int = 4) -> int:
    """Device bytes of the two activation buffers and their flags for ``rows`` live rows."""
    groups = max(1, -(-rows // LANES))
    return 2 * groups * neurons * (LANES * itemsize + 1)


@dataclass
class _Window:
    """Consecutive layers as device (or host) arrays: ``indptr`` rows are per layer."""

    indptr: object
    indices: object
    data: object
    n_layers: int
    nbytes: int


def _host_windows(packed: PackedLayers, layers_per_window: int) -> list[_Window]:
    """Cut packed layers into windows whose ``indptr`` are offsets into their own arrays."""
    windows = []
    for first in range(0, packed.n_layers, layers_per_window):
        last = min(packed.n_layers, first + layers_per_window)
        lo = int(packed.indptr[first, 0])
        hi = int(packed.indptr[last - 1, -1])
        indptr = np.ascontiguousarray(packed.indptr[first:last] - lo)
        indices = packed.indices[lo:hi]
        data = packed.data[lo:hi]
        windows.append(
            _Window(
                indptr, indices, data, last - first, indptr.nbytes + indices.nbytes + data.nbytes
            )
        )
    return windows


def weight_bytes(packed: PackedLayers) -> tuple[int, int]:
    """Device bytes of the packed network (``indptr``, ``indices``, ``data``) and of its largest
    layer."""
    layers = [w.nbytes for w in _host_windows(packed, 1)]
    return sum(layers), max(layers)


class DeviceNetwork:
    """A packed network on one GPU: resident whole, or streamed a window of layers at a time.

    Parameters
    ----------
    packed : PackedLayers
        The layers (float32 or float64), as made by :func:`dasknn.kernels.inference.pack_layers`.
    budget : int, optional
        Device bytes the weights may take. When the network is larger it stays in host memory
        and is uploaded one window of ``budget`` bytes at a time during each batch.

    Raises
    ------
    MemoryError
        When even one layer does not fit ``budget``.
    """

    def __init__(self, packed: PackedLayers, budget: int | None = None) -> None:
        self.neurons = packed.neurons
        self.n_layers = packed.n_layers
        self.dtype = packed.data.dtype
        self.nbytes, layer_bytes = weight_bytes(packed)
        if budget is not None and layer_bytes > budget:
            raise MemoryError(
                f"one layer needs {layer_bytes} bytes of device memory but only {budget} bytes "
                "are available for the weights"
            )
        self.streamed = budget is not None and self.nbytes > budget
        if self.streamed:
            per_window = max(1, int(budget // layer_bytes))
            self._windows = _host_windows(packed, per_window)
        else:
            self._windows = [self._upload(w) for w in _host_windows(packed, packed.n_layers)]
        self.layers_per_window = self._windows[0].n_layers

    @staticmethod
    def _upload(window: _Window) -> _Window:
        return _Window(
            cuda.to_device(window.indptr),
            cuda.to_device(window.indices),
            cuda.to_device(window.data),
            window.n_layers,
            window.nbytes,
        )

    def windows(self):
        """The windows in order, on the device (uploaded now when streamed)."""
        for window in self._windows:
            yield self._upload(window) if self.streamed else window

    def __reduce__(self):
        raise TypeError("a DeviceNetwork lives on its GPU and cannot be serialized")


@dataclass
class CudaBatchResult:
    """What one batch on the GPU gives back."""

    rows: np.ndarray
    macs_done: int
    kernel_seconds: float


def infer_rows_cuda(
    inputs: sp.csr_matrix,
    network: DeviceNetwork,
    bias: float,
    ymax: float = 32.0,
    compact_every: int = 8,
    mode: str = "auto",
) -> CudaBatchResult:
    """Run the input rows through every layer on the GPU; return the rows still nonzero.

    Parameters
    ----------
    inputs : scipy.sparse.csr_matrix, shape (rows, N)
        The batch.
    network : DeviceNetwork
        The layers on this GPU.
    bias, ymax : float
        Bias added to the nonzero entries of ``Y @ W`` and upper clip of the activations.
    compact_every : int
        Layers run before the dead rows are dropped and the live ones re-packed.
    mode : ``"auto"``, ``"fused"`` or ``"sectioned"``
        ``fused``: one launch runs ``compact_every`` layers, one block per group of 32 rows.
        ``sectioned``: one launch per layer, one block per group and ``SECTION_OUTPUTS`` output
        neurons, so the groups in flight fit the L2 cache when a group's activations are large.
        ``auto``: sectioned from ``SECTIONED_FROM`` neurons on.

    Returns
    -------
    CudaBatchResult
        ``rows``: batch-local 0-based ids of the rows that are not all zero after the last layer.

    Raises
    ------
    ValueError
        On a width mismatch, an input index out of range, a bad ``compact_every`` or ``mode``.
    """
    if inputs.shape[1] != network.neurons:
        raise ValueError(
            f"the inputs have {inputs.shape[1]} features but the network has {network.neurons}"
        )
    if compact_every < 1:
        raise ValueError(f"compact_every must be >= 1, got {compact_every}")
    if mode not in CUDA_MODES:
        raise ValueError(f"mode must be one of {CUDA_MODES}, got {mode!r}")
    start = time.perf_counter()
    dtype = network.dtype
    csr = sp.csr_matrix(check_csr(inputs, name="inputs"), dtype=dtype)
    csr.eliminate_zeros()
    rows = np.flatnonzero(np.diff(csr.indptr)).astype(np.int64)
    if rows.size == 0:
        return CudaBatchResult(rows, 0, time.perf_counter() - start)
    n = network.neurons
    threads = _threads_per_block()
    groups = -(-rows.size // LANES)
    y = cuda.device_array((2, groups, n, LANES), dtype=dtype)
    flags = cuda.device_array((2, groups, n), dtype=np.uint8)
    _zero(y[0].reshape(y[0].size))  # buffer 1 is written whole by the first layer
    _zero(flags[0].reshape(flags[0].size))  # flags of buffer 1 are cleared by each layer
    _scatter_kernel[groups, threads](
        cuda.to_device(csr.indptr.astype(np.int64)),
        cuda.to_device(csr.indices.astype(np.int32)),
        cuda.to_device(csr.data),
        cuda.to_device(rows),
        y[0],
        flags[0],
    )
    work = cuda.to_device(np.zeros(groups, dtype=np.int64))
    alive = cuda.device_array(groups * LANES, dtype=np.uint8)
    parity = 0
    live = rows.size
    typed_bias, typed_ymax = dtype.type(bias), dtype.type(ymax)
    if mode == "auto":
        mode = "sectioned" if n >= SECTIONED_FROM else "fused"
    alive_in = cuda.device_array(groups * LANES, dtype=np.uint8)
    for window in network.windows():
        for first in range(0, window.n_layers, compact_every):
            count = min(compact_every, window.n_layers - first)
            groups = -(-live // LANES)
            if mode == "fused":
                _window_kernel[groups, threads](
                    y,
                    flags,
                    parity,
                    window.indptr,
                    window.indices,
                    window.data,
                    first,
                    count,
                    typed_bias,
                    typed_ymax,
                    alive,
                    work,
                )
            else:
                lanes = np.zeros(groups * LANES, dtype=np.uint8)
                lanes[:live] = 1
                alive_in[: lanes.size].copy_to_device(lanes)
                sections = max(1, -(-n // SECTION_OUTPUTS))
                a, b = alive_in, alive
                for k in range(first, first + count):
                    dst = (parity + k - first + 1) % 2
                    _zero(flags[dst].reshape(flags[dst].size))
                    _zero(b)
                    _layer_kernel[groups * sections, threads](
                        y,
                        flags,
                        (parity + k - first) % 2,
                        window.indptr,
                        window.indices,
                        window.data,
                        k,
                        sections,
                        typed_bias,
                        typed_ymax,
                        a,
                        b,
                        work,
                    )
                    a, b = b, a
                if a is not alive:
                    alive.copy_to_device(a)
            parity = (parity + count) % 2
            keep = np.flatnonzero(alive.copy_to_host()[:live])
            if keep.size < live:
                rows = rows[keep]
                live = keep.size
                if live == 0:
                    break
                other = 1 - parity
                _zero(flags[other].reshape(flags[other].size))
                _gather_kernel[-(-live // LANES), threads](
                    y[parity], y[other], cuda.to_device(keep), flags[other]
                )
                parity = other
        if live == 0:
            break
    done = int(work.copy_to_host().sum())
    cuda.synchronize()
    return CudaBatchResult(rows, done, time.perf_counter() - start)


def _zero(flat) -> None:
    blocks = max(1, min(4096, math.ceil(flat.size / 256)))
    _zero_kernel[blocks, 256](flat)
