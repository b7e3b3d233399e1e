"""Numba kernel of sparse-DNN inference on one batch of input rows (the Graph Challenge step).

Each layer computes ``Y = min(max(Y @ W + b * (Y @ W != 0), 0), ymax)``. A batch is kept as its
*live* rows only (rows that are all zero can never come back to life, so they are dropped as soon
as they die and never touched again), stored feature-major in tiles of ``tile`` rows::

    block[t, j, lane]  =  activation of neuron j for live row  t * tile + lane

so one neuron of one tile is a contiguous *section* of ``tile`` values. For output neuron ``c`` the
kernel accumulates ``y_j * W[j, c]`` over the inputs ``j`` of column ``c`` whose section holds a
nonzero value (all-zero sections are skipped through a per-tile flag), with unit-stride SIMD over
the lanes; bias (on nonzero entries only), ReLU and the clip are fused into the store; rows that
died are compacted away before the next layer. Two rolling buffers (``a``, ``b``) are reused across
layers. Tiles run in parallel (``prange``) on the numba threads.

The layers are given as one concatenated CSC structure (column ``c`` of layer ``k`` lists the input
neurons feeding output neuron ``c``), see :class:`PackedLayers`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from numba import njit, prange

__all__ = [
    "PackedLayers",
    "BatchState",
    "pack_layers",
    "start_batch",
    "advance",
    "live_rows",
    "live_activations",
    "default_tile",
]

_TILE_BYTES = 512 * 1024  # one tile of both buffers should stay in the per-core L2 cache


@dataclass
class PackedLayers:
    """Consecutive layers in CSC form, concatenated.

    Attributes
    ----------
    indptr : int64 array, shape (L, N + 1)
        ``indices[indptr[k, c]:indptr[k, c + 1]]`` are the inputs of output neuron ``c`` of layer
        ``k`` (offsets into the concatenated arrays).
    indices : int32 array
        Input neuron of each nonzero.
    data : float array
        Weight of each nonzero (float32 or float64).
    out_degree : int64 array, shape (L, N)
        Nonzeros in each row of each layer (used to count the necessary multiply-adds).
    """

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    out_degree: np.ndarray

    @property
    def n_layers(self) -> int:
        return int(self.indptr.shape[0])

    @property
    def neurons(self) -> int:
        return int(self.indptr.shape[1] - 1)

    @property
    def nbytes(self) -> int:
        return int(
            self.indptr.nbytes + self.indices.nbytes + self.data.nbytes + self.out_degree.nbytes
        )


def pack_layers(layers: list[sp.spmatrix], dtype: np.dtype | type = np.float32) -> PackedLayers:
    """Pack square sparse layers of shape ``(N, N)`` (challenge convention) for the kernel.

    Raises
    ------
    ValueError
        If there are no layers, a layer is not square, widths differ or a weight is not finite.
    """
    if not layers:
        raise ValueError("the network has no layers")
    n = layers[0].shape[0]
    indptrs, indices, data, degrees = [], [], [], []
    offset = 0
    for k, layer in enumerate(layers):
        if layer.shape != (n, n):
            raise ValueError(
                f"layer {k + 1} has shape {layer.shape}, expected ({n}, {n}) like layer 1"
            )
        csc = sp.csc_matrix(layer, dtype=dtype)
        csc.sum_duplicates()
        if not np.all(np.isfinite(csc.data)):
            raise ValueError(f"layer {k + 1} has a weight that is NaN or infinite")
        indptrs.append(csc.indptr.astype(np.int64) + offset)
        indices.append(csc.indices.astype(np.int32))
        data.append(csc.data)
        degrees.append(np.bincount(csc.indices, minlength=n).astype(np.int64))
        offset += csc.nnz
    return PackedLayers(
        indptr=np.stack(indptrs),
        indices=np.concatenate(indices),
        data=np.concatenate(data).astype(dtype, copy=False),
        out_degree=np.stack(degrees),
    )


@dataclass
class BatchState:
    """The live rows of a batch between layers.

    Attributes
    ----------
    rows : int64 array
        Batch-local ids of the live rows, in order (row ``i`` of the state is ``rows[i]``).
    block : float array, shape (n_tiles, N, tile)
        Activations of the live rows, feature-major by tile; lanes beyond ``len(rows)`` are zero.
    spare : float array, same shape
        The second rolling buffer.
    macs_done : int
        Multiply-adds executed so far (lanes of every accumulated section).
    macs_needed : int
        Multiply-adds a row-by-row sparse product would need: ``sum nnz(y) * nnz(W[j, :])``.
    """

    rows: np.ndarray
    block: np.ndarray
    spare: np.ndarray
    macs_done: int = 0
    macs_needed: int = 0

    @property
    def live(self) -> int:
        return int(self.rows.size)


def default_tile(neurons: int, dtype: np.dtype | type = np.float32) -> int:
    """Tile width: a power of two in [16, 64] with one ``N x tile`` buffer tile in ~512 KiB."""
    width = _TILE_BYTES // (int(neurons) * np.dtype(dtype).itemsize)
    tile = 16
    while tile * 2 <= min(width, 64):
        tile *= 2
    return tile


@njit(cache=True, parallel=True)
def _fill(indptr, indices, data, rows, block):
    tile = block.shape[2]
    for t in prange(block.shape[0]):
        block[t, :, :] = 0
        for lane in range(tile):
            i = t * tile + lane
            if i >= rows.size:
                break
            r = rows[i]
            for p in range(indptr[r], indptr[r + 1]):
                block[t, indices[p], lane] = data[p]


def start_batch(
    inputs: sp.spmatrix, dtype: np.dtype | type = np.float32, tile: int | None = None
) -> BatchState:
    """Load a batch of input rows (a sparse matrix of shape ``(rows, N)``) into a state.

    Rows that are all zero are dropped at once (they can never be categories).
    """
    csr = sp.csr_matrix(inputs)
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    n = csr.shape[1]
    if tile is None:
        tile = default_tile(n, dtype)
    csr = csr.astype(dtype)
    csr.eliminate_zeros()
    rows = np.flatnonzero(np.diff(csr.indptr)).astype(np.int64)
    n_tiles = max(1, -(-rows.size // tile))
    block = np.empty((n_tiles, n, tile), dtype=dtype)
    _fill(csr.indptr.astype(np.int64), csr.indices.astype(np.int64), csr.data, rows, block)
    return BatchState(rows=rows, block=block, spare=np.empty_like(block))


@njit(cache=True, parallel=True)
def _layer(src, dst, live, flags, next_flags, alive, counts, indptr, indices, data, degree,
           bias, ymax):
    """One layer: ``dst = f(src @ W)`` tile by tile; fills ``alive`` per lane and section flags."""
    n_tiles, n, tile = src.shape
    for t in prange(n_tiles):
        lanes = min(tile, live - t * tile)
        acc = np.zeros(tile, dtype=src.dtype)
        zero = ymax - ymax
        done = 0
        needed = 0
        for lane in range(tile):
            alive[t * tile + lane] = False
        for c in range(n):
            acc[:] = 0
            terms = 0
            for p in range(indptr[c], indptr[c + 1]):
                j = indices[p]
                if flags[t, j]:
                    w = data[p]
                    terms += 1
                    for lane in range(tile):
                        acc[lane] += w * src[t, j, lane]
            done += terms * lanes
            any_nonzero = False
            nonzeros = 0
            for lane in range(tile):
                z = acc[lane]
                if z != 0:
                    z = z + bias
                    if z < zero:
                        z = zero
                    elif z > ymax:
                        z = ymax
                dst[t, c, lane] = z
                if z != 0:
                    any_nonzero = True
                    alive[t * tile + lane] = True
                    nonzeros += 1
            next_flags[t, c] = any_nonzero
            needed += nonzeros * degree[c]
        counts[t, 0] = done
        counts[t, 1] = needed


@njit(cache=True, parallel=True)
def _compact(src, dst, source_of, flags, next_flags):
    """Move the live lanes listed in ``source_of`` to the front of ``dst`` (tile-parallel)."""
    n_tiles, n, tile = dst.shape
    live = source_of.size
    for t in prange(n_tiles):
        lanes = min(tile, live - t * tile)
        for j in range(n):
            any_nonzero = False
            for lane in range(tile):
                v = src[0, 0, 0] * 0
                if lane < lanes:
                    s = source_of[t * tile + lane]
                    v = src[s // tile, j, s % tile]
                dst[t, j, lane] = v
                if v != 0:
                    any_nonzero = True
            next_flags[t, j] = any_nonzero


@njit(cache=True, parallel=True)
def _section_flags(block, flags, degree):
    """Flag the sections of ``block`` that hold a nonzero; return the needed multiply-adds."""
    n_tiles, n, tile = block.shape
    needed = np.zeros(n_tiles, dtype=np.int64)
    for t in prange(n_tiles):
        count = 0
        for j in range(n):
            nz = 0
            for lane in range(tile):
                if block[t, j, lane] != 0:
                    nz += 1
            flags[t, j] = nz > 0
            count += nz * degree[j]
        needed[t] = count
    return needed.sum()


def advance(
    state: BatchState,
    layers: PackedLayers,
    bias: float,
    ymax: float = 32.0,
) -> BatchState:
    """Run the state through every layer of ``layers``; update it in place and return it.

    Parameters
    ----------
    state : BatchState
        The batch, as returned by :func:`start_batch` or a previous :func:`advance`.
    layers : PackedLayers
        Consecutive layers, same dtype as the state.
    bias : float
        Added to the nonzero entries of ``Y @ W``.
    ymax : float
        Upper clip of the activations (32 in the challenge).
    """
    n_tiles, n, tile = state.block.shape
    if layers.neurons != n:
        raise ValueError(f"the layers have {layers.neurons} neurons but the batch has {n}")
    if layers.data.dtype != state.block.dtype:
        raise ValueError(
            f"layers are {layers.data.dtype} but the batch is {state.block.dtype}; pack them alike"
        )
    dtype = state.block.dtype
    bias_value = dtype.type(bias)
    ymax_value = dtype.type(ymax)
    flags = np.empty((n_tiles, n), dtype=np.bool_)
    next_flags = np.empty_like(flags)
    if state.live:
        state.macs_needed += int(_section_flags(state.block, flags, layers.out_degree[0]))
    for k in range(layers.n_layers):
        live = state.live
        if live == 0:
            break
        n_tiles = state.block.shape[0]
        alive = np.empty(n_tiles * tile, dtype=np.bool_)
        counts = np.empty((n_tiles, 2), dtype=np.int64)
        degree = layers.out_degree[k + 1] if k + 1 < layers.n_layers else layers.out_degree[k]
        _layer(
            state.block, state.spare, live, flags[:n_tiles], next_flags[:n_tiles], alive, counts,
            layers.indptr[k], layers.indices, layers.data, degree, bias_value, ymax_value,
        )
        state.macs_done += int(counts[:, 0].sum())
        if k + 1 < layers.n_layers:
            state.macs_needed += int(counts[:, 1].sum())
        keep = np.flatnonzero(alive[:live])
        if keep.size == live:
            state.block, state.spare = state.spare, state.block
            flags, next_flags = next_flags, flags
            continue
        state.rows = state.rows[keep]
        used = max(1, -(-keep.size // tile))
        state.block = state.block[:used]
        _compact(state.spare, state.block, keep.astype(np.int64), flags[:used], next_flags[:used])
        flags, next_flags = next_flags, flags
        state.spare = state.spare[:used]
    return state


def live_rows(state: BatchState) -> np.ndarray:
    """Batch-local ids (0-based) of the rows that are not all zero."""
    return state.rows.copy()


def live_activations(state: BatchState) -> np.ndarray:
    """The activations of the live rows as a dense ``(live, N)`` array (row-major)."""
    n_tiles, n, tile = state.block.shape
    dense = state.block.transpose(0, 2, 1).reshape(n_tiles * tile, n)
    return np.ascontiguousarray(dense[: state.live])
