"""CUDA kernels of sparse-DNN inference (the Graph Challenge step) on one GPU, with numba-cuda:
live rows in groups of ``LANES = 32`` (a lane a row), feature-major, ``y[buffer, group, j * 32 +
lane]`` indexed with unsigned integers, sums in the CPU kernel's CSC order; modes *fused*
(:func:`_window_kernel`), *sectioned* (:func:`_layer_kernel`) and *tiled* (:func:`_tiled_kernel`).
Design, simulator and measurements: docs/challenge.md ("On GPUs").
"""

from __future__ import annotations

import functools
import importlib
import math
import time
from dataclasses import dataclass
from importlib import metadata

import numpy as np
import scipy.sparse as sp
from numba import config, cuda, njit

from dasknn.kernels.footprint_tiles import FOOTPRINT, FootprintTiles, tile_layers
from dasknn.kernels.inference import PackedLayers
from graph.checks import check_csr

__all__ = [
    "CUDA_INSTALL_HINT",
    "CUDA_MODES",
    "LANES",
    "BitRows",
    "CompactLayers",
    "DeviceNetwork",
    "CudaBatchResult",
    "activation_bytes",
    "check_cuda_compiler",
    "compact_layers",
    "cuda_runtime",
    "infer_rows_cuda",
    "pack_bit_rows",
    "weight_bytes",
]

CUDA_INSTALL_HINT = (
    "install the optional GPU packages with: python3 -m pip install 'dasknn[cuda]' "
    "(dask-cuda and numba-cuda, for CUDA 12 drivers or newer)"
)
LANES = 32  # rows per group: one warp, one lane per row
SECTION_OUTPUTS = 1024  # fewest output neurons per block in the sectioned (one launch per layer)
SECTIONS_PER_GROUP = 8  # blocks per group in the sectioned mode, within the bounds below
SECTIONED_FROM = 4096  # widths from which mode="auto" launches per layer (see docs/benchmarks.md)
MAX_NEURONS = 2**32 // LANES  # widths whose activation offsets (j * 32) fit the kernels' uint32
CUDA_MODES = ("auto", "fused", "sectioned", "tiled")
_WARPS = 32  # warps per block on a GPU (1024 threads)
BATCH = 8  # most entries whose activation loads are issued before any is added
_STATIC_SHARED = 48 * 1024  # bytes of static shared memory a block may take
# Blocks of 1024 threads need at most 64 registers a thread (the simulator takes no such option).
_BLOCK_KERNEL = {} if config.ENABLE_CUDASIM else {"max_registers": 64}


@cuda.jit
def _fill_kernel(array, value):
    """Set every entry of a flat device array to ``value`` (grid-stride loop)."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, array.size, stride):
        array[i] = value


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


@cuda.jit
def _scatter_bits_kernel(bits, rows, value, y, flags):
    """Write the input rows ``rows`` of ``bits`` (one bit a feature) into ``y`` (zeroed) and set
    the flags."""
    g = cuda.blockIdx.x
    t = cuda.threadIdx.x
    lane = t % LANES
    sub = t // LANES
    subs = cuda.blockDim.x // LANES
    i = g * LANES + lane
    if i < rows.size:
        r = rows[i]
        for w in range(sub, bits.shape[1], subs):
            byte = bits[r, w]
            for b in range(8):
                if (byte >> b) & 1:
                    y[g, 8 * w + b, lane] = value
                    flags[g, 8 * w + b] = 1


if config.ENABLE_CUDASIM:

    @cuda.jit(device=True)
    def _warp_sync():
        """A block barrier (the simulator has no ``syncwarp``): every warp must run as many
        32-entry column chunks (equal column degrees, a width the warps divide: the tests')."""
        cuda.syncthreads()

    @cuda.jit(device=True)
    def _warp_rank(keep, lane, scratch):
        """(lanes with ``keep`` set, those before ``lane``), through shared ``scratch`` and a
        barrier (the simulator has no warp vote)."""
        scratch[lane] = 1 if keep else 0
        cuda.syncthreads()
        count = 0
        rank = 0
        for i in range(LANES):
            count += scratch[i]
            if i < lane:
                rank += scratch[i]
        return count, rank

else:

    @cuda.jit(device=True)
    def _warp_sync():
        cuda.syncwarp()

    @cuda.jit(device=True)
    def _warp_rank(keep, lane, scratch):
        """(lanes with ``keep`` set, those before ``lane``), by a warp vote."""
        cuda.syncwarp()
        mask = cuda.ballot_sync(0xFFFFFFFF, keep)
        return cuda.popc(mask), cuda.popc(mask & cuda.lanemask_lt())


@cuda.jit(device=True)
def _column(ys, fs, p0, p1, indices, data, per_layer, weight, kept_off, kept_q, votes, lane,
            zero):
    """(lane ``lane``'s sum over entries ``p0 .. p1 - 1`` of a column, entries added): entries
    with a nonzero section in ``fs`` are packed in order by a warp vote into ``kept_off``
    (``j * 32``, the offset in ``ys``) / ``kept_q`` and added by :func:`_add_kept`."""
    acc = zero
    terms = 0
    first = np.uint64(p0)
    count = np.uint64(p1 - p0)
    base = np.uint64(0)
    while base < count:
        q = base + lane
        keep = False
        off = np.uint32(0)
        if q < count:
            j = np.uint64(indices[first + q])
            keep = fs[j] != 0
            off = np.uint32(j * LANES)
        kept, rank = _warp_rank(keep, lane, votes)
        if keep:
            kept_off[rank] = off
            kept_q[rank] = np.uint32(q)
        _warp_sync()
        acc = _add_kept(acc, ys, kept_off, kept_q, np.uint64(kept), first, data, per_layer,
                        weight)
        terms += kept
        base += np.uint64(LANES)
    return acc, terms


@cuda.jit(device=True)
def _add_kept(acc, ys, kept_off, kept_q, kept, first, data, per_layer, weight):
    """``acc`` plus the ``kept`` (<= 32) packed entries, in order, in batches of 8, 4, 2, 1 (no
    padding; up to eight loads issued before any add)."""
    e = np.uint64(0)
    acc, e = _add8_within(acc, ys, kept_off, kept_q, e, kept, first, data, per_layer, weight)
    acc, e = _add8_within(acc, ys, kept_off, kept_q, e, kept, first, data, per_layer, weight)
    acc, e = _add8_within(acc, ys, kept_off, kept_q, e, kept, first, data, per_layer, weight)
    acc, e = _add8_within(acc, ys, kept_off, kept_q, e, kept, first, data, per_layer, weight)
    if e + np.uint64(4) <= kept:
        acc = _add4(acc, ys, kept_off, kept_q, e, first, data, per_layer, weight)
        e += np.uint64(4)
    if e + np.uint64(2) <= kept:
        acc = _add2(acc, ys, kept_off, kept_q, e, first, data, per_layer, weight)
        e += np.uint64(2)
    if e < kept:
        acc = _add1(acc, ys, kept_off, kept_q, e, first, data, per_layer, weight)
    return acc


@cuda.jit(device=True)
def _add8_within(acc, ys, kept_off, kept_q, e, kept, first, data, per_layer, weight):
    """``(acc + entries e .. e + 7, e + 8)`` when ``e + 8 <= kept``, else ``(acc, e)``."""
    if e + np.uint64(8) <= kept:
        acc = _add4(_add4(acc, ys, kept_off, kept_q, e, first, data, per_layer, weight),
                    ys, kept_off, kept_q, e + np.uint64(4), first, data, per_layer, weight)
        e += np.uint64(8)
    return acc, e


@cuda.jit(device=True)
def _add4(acc, ys, kept_off, kept_q, e, first, data, per_layer, weight):
    """``acc`` plus kept entries ``e .. e + 3``, in order."""
    acc = _add2(acc, ys, kept_off, kept_q, e, first, data, per_layer, weight)
    return _add2(acc, ys, kept_off, kept_q, e + np.uint64(2), first, data, per_layer, weight)


@cuda.jit(device=True)
def _add2(acc, ys, kept_off, kept_q, e, first, data, per_layer, weight):
    """``acc`` plus kept entries ``e`` and ``e + 1``, in order."""
    acc = _add1(acc, ys, kept_off, kept_q, e, first, data, per_layer, weight)
    return _add1(acc, ys, kept_off, kept_q, e + np.uint64(1), first, data, per_layer, weight)


@cuda.jit(device=True)
def _add1(acc, ys, kept_off, kept_q, e, first, data, per_layer, weight):
    """``acc`` plus kept entry ``e``'s weight times the row's activation of its input."""
    w = weight if per_layer else data[first + kept_q[e]]
    return acc + w * ys[kept_off[e]]


@cuda.jit(device=True)
def _weight(data, q, per_layer, weight, zero):
    """Entry ``q``'s weight (``weight`` when ``per_layer``, else ``data[q]``); 0 if ``q == -1``."""
    w = weight if per_layer else data[max(q, 0)]
    return w if q >= 0 else zero


@cuda.jit(device=True)
def _store(yd, fd, c, acc, bias, ymax, zero):
    """Store neuron ``c`` (at ``yd[c * 32]``): bias on a nonzero sum, ReLU, clip at ``ymax``; set
    its flag in ``fd`` and return ``True`` when nonzero."""
    out = zero
    if acc != zero:
        out = min(max(acc + bias, zero), ymax)
    col = np.uint64(c)
    yd[col * np.uint64(LANES)] = out
    if out != zero:
        fd[col] = 1
        return True
    return False


@cuda.jit(device=True)
def _section_block(sections):
    """(group ``b // sections``, section ``b % sections``, lane (unsigned), warp, warps a block)."""
    b = cuda.blockIdx.x
    t = cuda.threadIdx.x
    return (b // sections, b % sections, np.uint32(t % LANES), t // LANES,
            cuda.blockDim.x // LANES)


@cuda.jit(device=True)
def _group_live(alive, g):
    """Whether any of the 32 rows of group ``g`` is set in ``alive``."""
    live = 0
    for i in range(LANES):
        live |= alive[g * LANES + i]
    return live != 0


@functools.cache
def _window_kernel(per_layer: bool):
    """The fused kernel, compiled for one weight a layer (``per_layer``) or one a nonzero."""

    @cuda.jit(**_BLOCK_KERNEL)
    def window_kernel(y, flags, parity, indptr, indices, data, first, count, bias, ymax, alive,
                      work):
        """Run group ``blockIdx.x`` through layers ``first .. first + count - 1`` from buffer
        ``parity`` (layer ``k`` writes ``(parity + k + 1) % 2``); set ``alive``, add to ``work``."""
        g = cuda.blockIdx.x
        t = cuda.threadIdx.x
        lane = np.uint32(t % LANES)
        warp = t // LANES
        warps = cuda.blockDim.x // LANES
        n = flags.shape[2]
        live = cuda.shared.array((2, LANES), dtype=np.int32)
        kept_off = cuda.shared.array((_WARPS, LANES), dtype=np.uint32)
        kept_q = cuda.shared.array((_WARPS, LANES), dtype=np.uint32)
        votes = cuda.shared.array((_WARPS, LANES), dtype=np.int32)
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
            weight = data[layer] if per_layer else zero
            ys, fs, yd, fd = y[src, g][lane:], flags[src, g], y[dst, g][lane:], flags[dst, g]
            offsets = indptr[layer]
            c = np.uint64(warp)
            while c < np.uint64(n):
                acc, added = _column(ys, fs, offsets[c], offsets[c + np.uint64(1)], indices,
                                     data, per_layer, weight, kept_off[warp], kept_q[warp],
                                     votes[warp], lane, zero)
                terms += added
                if _store(yd, fd, c, acc, bias, ymax, zero):
                    live[cur, lane] = 1
                c += np.uint64(warps)
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

    return window_kernel


@functools.cache
def _layer_kernel(per_layer: bool):
    """The sectioned kernel, compiled for one weight a layer (``per_layer``) or one a nonzero."""

    @cuda.jit(**_BLOCK_KERNEL)
    def layer_kernel(y, flags, src, indptr, indices, data, layer, sections, bias, ymax, alive_in,
                     alive_out, work):
        """One layer, block ``b`` computing section ``b % sections`` of group ``b // sections``;
        ``flags[1 - src]`` and ``alive_out`` zero before, groups dead in ``alive_in`` skipped."""
        g, s, lane, warp, warps = _section_block(sections)
        if not _group_live(alive_in, g):
            return
        n = flags.shape[2]
        dst = 1 - src
        chunk = (n + sections - 1) // sections
        lo = s * chunk
        hi = min(n, lo + chunk)
        kept_off = cuda.shared.array((_WARPS, LANES), dtype=np.uint32)
        kept_q = cuda.shared.array((_WARPS, LANES), dtype=np.uint32)
        votes = cuda.shared.array((_WARPS, LANES), dtype=np.int32)
        zero = ymax - ymax
        weight = data[layer] if per_layer else zero
        ys, fs, yd, fd = y[src, g][lane:], flags[src, g], y[dst, g][lane:], flags[dst, g]
        mine = g * LANES + lane
        terms = 0
        offsets = indptr[layer]
        c = np.uint64(lo + warp)
        while c < np.uint64(hi):
            acc, added = _column(ys, fs, offsets[c], offsets[c + np.uint64(1)], indices, data,
                                 per_layer, weight, kept_off[warp], kept_q[warp], votes[warp],
                                 lane, zero)
            terms += added
            if _store(yd, fd, c, acc, bias, ymax, zero):
                alive_out[mine] = 1
            c += np.uint64(warps)
        if lane == 0 and terms > 0:
            cuda.atomic.add(work, g, terms * LANES)

    return layer_kernel


def _tile_warps(footprint: int, itemsize: int) -> int:
    """Warps per tiled block: footprints of ``footprint x 32`` activations in 48 KB, at most 32."""
    return max(1, min(_WARPS, _STATIC_SHARED // (footprint * LANES * itemsize)))


@functools.cache
def _tiled_kernel(dtype_name: str, footprint: int, warps: int):
    """The tiled kernel for ``dtype_name``, ``footprint`` and ``warps`` (compiled per triple)."""
    item = np.dtype(dtype_name).type

    @cuda.jit(**_BLOCK_KERNEL)
    def tiled_kernel(y, flags, src, indptr, data, per_layer, layer_tiles, tile_ptr, tile_cols,
                     foot_ptr, foot, local, layer, sections, bias, ymax, alive_in, alive_out, work):
        """One layer, block ``b`` computing tile range ``b % sections`` of group
        ``b // sections``; a warp loads a tile's footprint into shared memory (a lane reads back
        only its own row: no barrier). ``alive_out`` zero before; dead groups skipped."""
        g, s, lane, warp, active = _section_block(sections)
        if not _group_live(alive_in, g):
            return
        dst = 1 - src
        ys, yd, fd = y[src, g][lane:], y[dst, g][lane:], flags[dst, g]
        t0 = layer_tiles[layer]
        t1 = layer_tiles[layer + 1]
        chunk = (t1 - t0 + sections - 1) // sections
        lo = t0 + s * chunk
        hi = min(t1, lo + chunk)
        acts = cuda.shared.array((warps, footprint, LANES), dtype=item)
        mine = acts[warp]
        zero = ymax - ymax
        weight = data[layer] if per_layer else zero
        terms = 0
        for tile in range(lo + warp, hi, active):
            f0 = foot_ptr[tile]
            f1 = foot_ptr[tile + 1]
            last = f1 - 1
            for f in range(f0, f1, BATCH):
                v0 = _input(ys, foot, f)
                v1 = _input(ys, foot, min(f + 1, last))
                v2 = _input(ys, foot, min(f + 2, last))
                v3 = _input(ys, foot, min(f + 3, last))
                v4 = _input(ys, foot, min(f + 4, last))
                v5 = _input(ys, foot, min(f + 5, last))
                v6 = _input(ys, foot, min(f + 6, last))
                v7 = _input(ys, foot, min(f + 7, last))
                r = f - f0  # slots past the footprint are never read (footprint % 8 == 0)
                mine[r, lane] = v0
                mine[r + 1, lane] = v1
                mine[r + 2, lane] = v2
                mine[r + 3, lane] = v3
                mine[r + 4, lane] = v4
                mine[r + 5, lane] = v5
                mine[r + 6, lane] = v6
                mine[r + 7, lane] = v7
            for q in range(tile_ptr[tile], tile_ptr[tile + 1]):
                c = tile_cols[q]
                acc, added = _tile_column(mine, data, per_layer, weight, local, indptr[layer, c],
                                          indptr[layer, c + 1], lane, zero)
                terms += added
                if _store(yd, fd, c, acc, bias, ymax, zero):
                    alive_out[g * LANES + lane] = 1
        if lane == 0 and terms > 0:
            cuda.atomic.add(work, g, terms * LANES)

    return tiled_kernel


@cuda.jit(device=True)
def _input(ys, foot, f):
    """The row's activation of input ``foot[f]`` (``ys`` as in :func:`_column`)."""
    return ys[np.uint64(foot[f]) * LANES]


@cuda.jit(device=True)
def _tile_column(mine, data, per_layer, weight, local, p0, p1, lane, zero):
    """(lane ``lane``'s sum over entries ``p0 .. p1 - 1`` from shared ``mine``, entries added);
    ``BATCH`` weights read before any add, zero past the column's end."""
    acc = zero
    last = p1 - 1
    for p in range(p0, p1, BATCH):
        w0 = _weight(data, p, per_layer, weight, zero)
        w1 = _weight(data, p + 1 if p + 1 < p1 else -1, per_layer, weight, zero)
        w2 = _weight(data, p + 2 if p + 2 < p1 else -1, per_layer, weight, zero)
        w3 = _weight(data, p + 3 if p + 3 < p1 else -1, per_layer, weight, zero)
        w4 = _weight(data, p + 4 if p + 4 < p1 else -1, per_layer, weight, zero)
        w5 = _weight(data, p + 5 if p + 5 < p1 else -1, per_layer, weight, zero)
        w6 = _weight(data, p + 6 if p + 6 < p1 else -1, per_layer, weight, zero)
        w7 = _weight(data, p + 7 if p + 7 < p1 else -1, per_layer, weight, zero)
        acc += w0 * mine[local[p], lane]
        acc += w1 * mine[local[min(p + 1, last)], lane]
        acc += w2 * mine[local[min(p + 2, last)], lane]
        acc += w3 * mine[local[min(p + 3, last)], lane]
        acc += w4 * mine[local[min(p + 4, last)], lane]
        acc += w5 * mine[local[min(p + 5, last)], lane]
        acc += w6 * mine[local[min(p + 6, last)], lane]
        acc += w7 * mine[local[min(p + 7, last)], lane]
    return acc, p1 - p0


@cuda.jit
def _gather_kernel(src, dst, source_of, flags_dst):
    """Pack live rows ``source_of`` into new groups of ``dst``; set their flags in ``flags_dst``
    (zeroed)."""
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


def check_cuda_compiler() -> None:
    """Raise ``RuntimeError`` when the installed numba-cuda cannot compile kernels with the
    installed numpy (by importing its numpy lowering; once per process, under the simulator too).

    Raises
    ------
    RuntimeError
        Naming numba-cuda's (or numba's) version, numpy's, the underlying error in one line and
        what to install.
    """
    problem = _cuda_compiler_problem()
    if problem is not None:
        raise RuntimeError(problem)


@functools.cache
def _cuda_compiler_problem() -> str | None:
    """Why the CUDA target's numpy lowering does not load (one line), or ``None`` when it does."""
    nvidia = getattr(cuda, "implementation", "") == "NVIDIA"
    lowering = "numba.cuda.np.arrayobj" if nvidia else "numba.np.arrayobj"
    try:
        importlib.import_module(lowering)
    except Exception as error:  # noqa: BLE001 - an unsupported numpy breaks the import many ways
        cause = " ".join(f"{type(error).__name__}: {error}".split())
    else:
        return None
    numba = metadata.version("numba")
    compiler = (
        f"numba-cuda {metadata.version('numba-cuda')} (numba {numba})"
        if nvidia
        else f"numba {numba} (its built-in numba.cuda)"
    )
    major, minor = np.__version__.split(".")[:2]
    return (
        f"{compiler} cannot compile CUDA kernels with numpy {np.__version__}: loading {lowering} "
        f"failed with {cause}; install a numpy that it supports (python3 -m pip install "
        f"'numpy<{major}.{minor}') or a numba-cuda release that supports numpy {np.__version__}"
    )


def _section_outputs(n: int) -> int:
    """Sectioned-mode outputs a block: ``n / SECTIONS_PER_GROUP`` within ``SECTION_OUTPUTS`` ..
    ``4 * SECTION_OUTPUTS`` (the fastest measured, docs/benchmarks.md)."""
    return min(4 * SECTION_OUTPUTS, max(SECTION_OUTPUTS, n // SECTIONS_PER_GROUP))


def _threads_per_block() -> int:
    """1024 threads on a GPU; 64 under the simulator (one Python thread each)."""
    return 64 if cuda_runtime() == "simulator" else _WARPS * LANES


def activation_bytes(rows: int, neurons: int, itemsize: int = 4) -> int:
    """Device bytes of the two activation buffers and their flags for ``rows`` live rows."""
    groups = max(1, -(-rows // LANES))
    return 2 * groups * neurons * (LANES * itemsize + 1)


@dataclass
class CompactLayers:
    """Packed layers in the compact form sent to a GPU worker.

    Attributes
    ----------
    indptr : int32 or int64 array, shape (L, N + 1)
        As in :class:`dasknn.kernels.inference.PackedLayers` (int32 when the offsets fit).
    indices : uint16 or int32 array
        Input neuron of each nonzero: uint16 when ``N <= 65536`` (every challenge width).
    values : float array
        The weight of each nonzero, or one weight a layer when ``per_layer`` (the challenge's).
    per_layer : bool
        Whether ``values`` holds one weight per layer.
    """

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    per_layer: bool

    @property
    def n_layers(self) -> int:
        return int(self.indptr.shape[0])

    @property
    def neurons(self) -> int:
        return int(self.indptr.shape[1] - 1)

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of the compact form (what travels to a worker)."""
        return int(self.indptr.nbytes + self.indices.nbytes + self.values.nbytes)

    def per_entry(self) -> CompactLayers:
        """These layers with one weight per nonzero (``self`` unless ``per_layer``)."""
        if not self.per_layer:
            return self
        counts = np.diff(self.indptr[:, [0, -1]], axis=1).ravel()
        return CompactLayers(self.indptr, self.indices, np.repeat(self.values, counts),
                             per_layer=False)


def compact_layers(packed: PackedLayers) -> CompactLayers:
    """The compact transfer form of ``packed``: narrow indices, one weight per layer when a
    layer's weights are all equal."""
    n_layers, n = packed.n_layers, packed.neurons
    nnz = int(packed.indptr[-1, -1])
    index_type = np.uint16 if n <= np.iinfo(np.uint16).max + 1 else np.int32
    offset_type = np.int32 if nnz <= np.iinfo(np.int32).max else np.int64
    firsts = np.zeros(n_layers, dtype=packed.data.dtype)
    per_layer = True
    for k in range(n_layers):
        lo, hi = int(packed.indptr[k, 0]), int(packed.indptr[k, -1])
        if hi > lo:
            firsts[k] = packed.data[lo]
            per_layer = per_layer and bool(np.all(packed.data[lo:hi] == firsts[k]))
    return CompactLayers(
        indptr=packed.indptr.astype(offset_type),
        indices=packed.indices.astype(index_type),
        values=firsts if per_layer else packed.data,
        per_layer=per_layer,
    )


@dataclass
class _Window:
    """Consecutive layers (host or device): ``indptr`` offsets into the window's own arrays; a
    tiled window holds ``tiles`` and no ``indices``."""

    indptr: object
    indices: object
    values: object
    per_layer: bool
    n_layers: int
    nbytes: int  # on the device
    tiles: FootprintTiles | None = None


def _host_windows(network: CompactLayers, layers_per_window: int,
                  tiles: FootprintTiles | None = None) -> list[_Window]:
    """Cut the layers into windows of ``layers_per_window`` (with their share of ``tiles``)."""
    windows = []
    for first in range(0, network.n_layers, layers_per_window):
        last = min(network.n_layers, first + layers_per_window)
        lo = int(network.indptr[first, 0])
        hi = int(network.indptr[last - 1, -1])
        indptr = np.ascontiguousarray(network.indptr[first:last] - network.indptr.dtype.type(lo))
        values = network.values[first:last] if network.per_layer else network.values[lo:hi]
        if tiles is None:
            indices, part = network.indices[lo:hi], None
            index_bytes = indices.nbytes
        else:
            indices, part = None, tiles.window(first, last, lo, hi)
            index_bytes = part.nbytes
        windows.append(_Window(indptr, indices, values, network.per_layer, last - first,
                               indptr.nbytes + index_bytes + values.nbytes, part))
    return windows


def weight_bytes(network: PackedLayers | CompactLayers, tiled: bool = False) -> tuple[int, int]:
    """Device bytes of the network (``indptr``, ``indices``, weights: one a nonzero, or one a
    layer when ``per_layer``) and of its largest layer.

    With ``tiled``, an upper bound with footprint tiles in place of the indices."""
    if isinstance(network, PackedLayers):
        network = compact_layers(network)
    layers = [w.nbytes for w in _host_windows(network, 1)]
    if tiled:
        n = network.neurons
        per_layer_tiles = n * network.indices.itemsize + (n + 1) * 2 * 8 + 2 * 8
        nnz = np.diff(network.indptr[:, [0, -1]], axis=1).ravel()
        layers = [size + int(entries) + per_layer_tiles
                  for size, entries in zip(layers, nnz, strict=True)]
    return sum(layers), max(layers)


class DeviceNetwork:
    """A packed network on one GPU: resident whole, or streamed a window of layers at a time.

    Parameters
    ----------
    network : CompactLayers or PackedLayers
        The layers (float32 or float64), from :func:`compact_layers` or
        :func:`dasknn.kernels.inference.pack_layers`.
    budget : int, optional
        Device bytes the weights may take; a larger network is streamed a window at a time.
    tiled : bool
        Hold footprint tiles (:func:`dasknn.kernels.footprint_tiles.tile_layers`) in place of the
        indices; such a network runs ``mode="tiled"`` only, the others every mode but it.
    footprint : int
        The most inputs of a tile's footprint when ``tiled``.
    tile_warps : int, optional
        Warps a tiled block; by default as many as 48 KB of shared memory hold, at most 32.

    Raises
    ------
    MemoryError
        When even one layer does not fit ``budget``.
    ValueError
        Over ``MAX_NEURONS`` (134,217,728) neurons; ``tiled`` and a column over ``footprint``
        inputs; ``tile_warps`` out of range.
    RuntimeError
        When numba-cuda cannot compile kernels with this numpy (:func:`check_cuda_compiler`).
    """

    def __init__(self, network: CompactLayers | PackedLayers, budget: int | None = None,
                 tiled: bool = False, footprint: int = FOOTPRINT,
                 tile_warps: int | None = None) -> None:
        check_cuda_compiler()
        if network.neurons > MAX_NEURONS:
            raise ValueError(
                f"the CUDA kernels take layers of at most {MAX_NEURONS:,} neurons (they index a "
                f"group's activations with 32-bit offsets), got {network.neurons:,}"
            )
        if isinstance(network, PackedLayers):
            network = compact_layers(network)
        self.neurons = network.neurons
        self.n_layers = network.n_layers
        self.dtype = network.dtype
        self.tiled = tiled
        self.footprint = footprint
        most = _tile_warps(footprint, self.dtype.itemsize)
        self.tile_warps = most if tile_warps is None else tile_warps
        if tiled and not 1 <= self.tile_warps <= most:
            raise ValueError(f"tile_warps must be between 1 and {most} (48 KB of shared memory "
                             f"for footprints of {footprint}), got {tile_warps}")
        tiles = tile_layers(network.indptr, network.indices, footprint) if tiled else None
        layers = [w.nbytes for w in _host_windows(network, 1, tiles)]
        self.nbytes, layer_bytes = sum(layers), max(layers)
        if budget is not None and layer_bytes > budget:
            raise MemoryError(
                f"one layer needs {layer_bytes} bytes of device memory but only {budget} bytes "
                "are available for the weights"
            )
        self.streamed = budget is not None and self.nbytes > budget
        if self.streamed:
            per_window = max(1, int(budget // layer_bytes))
            self._windows = _host_windows(network, per_window, tiles)
        else:
            self._windows = [self._upload(w)
                             for w in _host_windows(network, network.n_layers, tiles)]
        self.layers_per_window = self._windows[0].n_layers

    @staticmethod
    def _upload(window: _Window) -> _Window:
        """The window on the device."""
        indptr = cuda.to_device(window.indptr)
        data = cuda.to_device(window.values)
        indices = None if window.indices is None else cuda.to_device(window.indices)
        tiles = None
        if window.tiles is not None:
            host = window.tiles
            tiles = FootprintTiles(host.footprint, *(
                cuda.to_device(a) for a in (host.layer_tiles, host.tile_ptr, host.tile_cols,
                                            host.foot_ptr, host.foot, host.local)))
        return _Window(indptr, indices, data, window.per_layer, window.n_layers, window.nbytes,
                       tiles)

    def windows(self):
        """The windows in order, on the device (uploaded now when streamed)."""
        for window in self._windows:
            yield self._upload(window) if self.streamed else window

    def __reduce__(self):
        raise TypeError("a DeviceNetwork lives on its GPU and cannot be serialized")


@dataclass
class BitRows:
    """Input rows whose nonzeros all equal one value, one bit a feature (the challenge's inputs).

    Attributes
    ----------
    bits : uint8 array, shape (rows, ceil(N / 8))
        Bit ``b`` of byte ``w`` of a row is feature ``8 w + b``.
    value : float
        The value of every set feature.
    n_features : int
        ``N``.
    """

    bits: np.ndarray
    value: float
    n_features: int

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.bits.shape[0]), self.n_features

    def __getitem__(self, rows: slice) -> BitRows:
        """A slice of the rows (a view of the bits)."""
        if not isinstance(rows, slice):
            raise TypeError("BitRows take a slice of rows")
        return BitRows(self.bits[rows], self.value, self.n_features)


@njit(cache=True)
def _pack_bits(indptr, indices, bits):
    for r in range(indptr.size - 1):
        for p in range(indptr[r], indptr[r + 1]):
            j = indices[p]
            bits[r, j >> 3] |= np.uint8(1 << (j & 7))


def pack_bit_rows(inputs: sp.csr_matrix) -> BitRows | None:
    """``inputs`` as :class:`BitRows`, or ``None`` when its nonzeros are not all one value.

    Raises
    ------
    ValueError
        When ``inputs`` is not a valid sparse matrix (see :func:`graph.checks.check_csr`).
    """
    csr = sp.csr_matrix(check_csr(inputs, name="inputs"))
    csr.sum_duplicates()
    csr.eliminate_zeros()
    if csr.nnz and not np.all(csr.data == csr.data[0]):
        return None
    n_rows, n = csr.shape
    bits = np.zeros((n_rows, -(-n // 8)), dtype=np.uint8)
    _pack_bits(csr.indptr, csr.indices, bits)
    return BitRows(bits, float(csr.data[0]) if csr.nnz else 1.0, n)


def _check_bit_rows(rows: BitRows, n: int) -> None:
    """Raise ``ValueError`` unless ``rows`` is a well-formed :class:`BitRows` of width ``n``."""
    bits = rows.bits
    if bits.dtype != np.uint8 or bits.ndim != 2 or bits.shape[1] != -(-n // 8):
        raise ValueError(
            f"BitRows for {n} features need a uint8 array of shape (rows, {-(-n // 8)}), "
            f"got {bits.dtype} {bits.shape}"
        )
    if rows.n_features != n:
        raise ValueError(f"the inputs have {rows.n_features} features but the network has {n}")
    if not np.isfinite(rows.value) or rows.value == 0:
        raise ValueError(f"the value of the set input bits must be finite and nonzero, "
                         f"got {rows.value}")
    if n % 8 and bits.shape[0] and np.any(bits[:, -1] >> (n % 8)):
        raise ValueError(f"BitRows set a bit past feature {n - 1}")


@dataclass
class CudaBatchResult:
    """What one batch on the GPU gives back."""

    rows: np.ndarray
    macs_done: int
    kernel_seconds: float
    activations: np.ndarray | None = None  # (rows, N) after the last layer, when asked for


def infer_rows_cuda(
    inputs: sp.csr_matrix | BitRows,
    network: DeviceNetwork,
    bias: float,
    ymax: float = 32.0,
    compact_every: int = 8,
    mode: str = "auto",
    activations: bool = False,
) -> CudaBatchResult:
    """Run the input rows through every layer on the GPU; return the rows still nonzero.

    Parameters
    ----------
    inputs : scipy.sparse.csr_matrix or BitRows, shape (rows, N)
        The batch; :class:`BitRows` (:func:`pack_bit_rows`, 1/32 of the float32 CSR bytes) when
        every nonzero input has one value.
    network : DeviceNetwork
        The layers on this GPU.
    bias, ymax : float
        Bias added to the nonzero entries of ``Y @ W`` and upper clip of the activations.
    compact_every : int
        Layers run before the dead rows are dropped and the live ones re-packed.
    mode : ``"auto"``, ``"fused"``, ``"sectioned"`` or ``"tiled"``
        ``fused``: one launch runs ``compact_every`` layers, one block per group of 32 rows.
        ``sectioned``: one launch per layer, a block per group and eighth of the outputs.
        ``tiled`` (network built with ``tiled=True`` only): one launch per layer, a block per
        group and range of footprint tiles. ``auto``: sectioned from ``SECTIONED_FROM`` neurons
        on, fused below; never ``tiled`` (slower, docs/benchmarks.md).
    activations : bool
        Also copy back the activations of the returned rows after the last layer.

    Returns
    -------
    CudaBatchResult
        ``rows``: batch-local 0-based ids of the rows that are not all zero after the last layer.

    Raises
    ------
    ValueError
        On a width mismatch, an index out of range, a bad ``compact_every`` or ``mode``.
    """
    if inputs.shape[1] != network.neurons:
        raise ValueError(
            f"the inputs have {inputs.shape[1]} features but the network has {network.neurons}"
        )
    if compact_every < 1:
        raise ValueError(f"compact_every must be >= 1, got {compact_every}")
    if mode not in CUDA_MODES:
        raise ValueError(f"mode must be one of {CUDA_MODES}, got {mode!r}")
    if network.tiled != (mode == "tiled"):
        raise ValueError(
            f"mode={mode!r} needs a DeviceNetwork built with tiled={mode == 'tiled'} (a tiled "
            "network holds footprint tiles in place of the indices and runs mode='tiled' only)"
        )
    start = time.perf_counter()
    dtype = network.dtype
    n = network.neurons
    if isinstance(inputs, BitRows):
        _check_bit_rows(inputs, n)
        rows = np.flatnonzero(inputs.bits.any(axis=1)).astype(np.int64)
    else:
        csr = sp.csr_matrix(check_csr(inputs, name="inputs"), dtype=dtype)
        csr.eliminate_zeros()
        rows = np.flatnonzero(np.diff(csr.indptr)).astype(np.int64)
    if rows.size == 0:
        empty = np.zeros((0, n), dtype=dtype) if activations else None
        return CudaBatchResult(rows, 0, time.perf_counter() - start, empty)
    threads = _threads_per_block()
    groups = -(-rows.size // LANES)
    y = cuda.device_array((2, groups, n, LANES), dtype=dtype)
    flags = cuda.device_array((2, groups, n), dtype=np.uint8)
    _zero(y[0].reshape(y[0].size))  # buffer 1 is written whole by the first layer
    _zero(flags[0].reshape(flags[0].size))  # flags of buffer 1 are cleared by each layer
    if isinstance(inputs, BitRows):
        _scatter_bits_kernel[groups, threads](
            cuda.to_device(inputs.bits), cuda.to_device(rows), dtype.type(inputs.value), y[0],
            flags[0],
        )
    else:
        _scatter_kernel[groups, threads](
            cuda.to_device(csr.indptr.astype(np.int64)),
            cuda.to_device(csr.indices.astype(np.int32)), cuda.to_device(csr.data),
            cuda.to_device(rows), y[0], flags[0],
        )
    work = cuda.to_device(np.zeros(groups, dtype=np.int64))
    alive = cuda.device_array(groups * LANES, dtype=np.uint8)
    parity = 0
    live = rows.size
    typed_bias, typed_ymax = dtype.type(bias), dtype.type(ymax)
    if mode == "auto":
        mode = "sectioned" if n >= SECTIONED_FROM else "fused"
    alive_in = cuda.device_array(groups * LANES, dtype=np.uint8)
    flat = y.reshape(2, y.shape[1], n * LANES)  # what the layer kernels index: j * 32 + lane
    for window in network.windows():
        for first in range(0, window.n_layers, compact_every):
            count = min(compact_every, window.n_layers - first)
            groups = -(-live // LANES)
            if mode == "fused":
                _window_kernel(window.per_layer)[groups, threads](
                    flat, flags, parity, window.indptr, window.indices, window.values, first,
                    count, typed_bias, typed_ymax, alive, work,
                )
            else:
                lanes = np.zeros(groups * LANES, dtype=np.uint8)
                lanes[:live] = 1
                alive_in[: lanes.size].copy_to_device(lanes)
                sections = max(1, -(-n // _section_outputs(n)))
                a, b = alive_in, alive
                for k in range(first, first + count):
                    src = (parity + k - first) % 2
                    _zero(b)
                    if mode == "tiled":
                        _launch_tiled(window, network.tile_warps, flat, flags, src, k,
                                      groups * sections, sections, typed_bias, typed_ymax, a, b,
                                      work)
                    else:
                        _zero(flags[1 - src].reshape(flags[1 - src].size))
                        _layer_kernel(window.per_layer)[groups * sections, threads](
                            flat, flags, src, window.indptr, window.indices, window.values, k,
                            sections, typed_bias, typed_ymax, a, b, work,
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
    final = None
    if activations:  # the live rows are packed in order into the first groups of y[parity]
        used = -(-live // LANES)
        final = np.zeros((0, n), dtype=dtype) if live == 0 else np.ascontiguousarray(
            y[parity][:used].copy_to_host().transpose(0, 2, 1).reshape(used * LANES, n)[:live])
    cuda.synchronize()
    return CudaBatchResult(rows, done, time.perf_counter() - start, final)


def _launch_tiled(window: _Window, warps: int, y, flags, src: int, layer: int, blocks: int,
                  sections: int, bias, ymax, alive_in, alive_out, work) -> None:
    """Launch the tiled kernel for layer ``layer`` of ``window`` (flags unread, not cleared)."""
    tiles = window.tiles
    kernel = _tiled_kernel(y.dtype.name, tiles.footprint, warps)
    threads = min(warps * LANES, _threads_per_block())
    kernel[blocks, threads](
        y, flags, src, window.indptr, window.values, window.per_layer, tiles.layer_tiles,
        tiles.tile_ptr,
        tiles.tile_cols, tiles.foot_ptr, tiles.foot, tiles.local, layer, sections, bias, ymax,
        alive_in, alive_out, work,
    )


def _fill(flat, value) -> None:
    """Set every entry of ``flat`` (256-thread blocks on a GPU, one warp under the simulator)."""
    if config.ENABLE_CUDASIM:
        _fill_kernel[1, LANES](flat, value)
        return
    blocks = max(1, min(4096, math.ceil(flat.size / 256)))
    _fill_kernel[blocks, 256](flat, value)


def _zero(flat) -> None:
    _fill(flat, 0)
