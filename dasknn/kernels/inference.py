"""Numba kernel of sparse-DNN inference on one batch of input rows (the Graph Challenge step):
each layer ``Y = min(max(Y @ W + b * (Y @ W != 0), 0), ymax)`` on the batch's live rows,
feature-major in tiles of ``LANES`` (``block[t, j, lane]``), all-zero sections skipped, layers as
one concatenated CSC structure (:class:`PackedLayers`) whose columns with equal inputs are
accumulated in groups (:mod:`dasknn.kernels.lane_vectors`). Results do not depend on the thread
count; docs/challenge.md ("The kernel").
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numba
import numpy as np
import scipy.sparse as sp
from numba import njit, prange

from dasknn.kernels.lane_vectors import (
    GROUP,
    LANES,
    VECTOR_BYTES,
    accumulate_column,
    accumulate_group,
    aligned_copy,
    aligned_empty,
    stack_group,
)
from dasknn.kernels.shared_inputs import group_columns
from graph.checks import check_csr

__all__ = [
    "PackedLayers",
    "BatchState",
    "pack_layers",
    "start_batch",
    "advance",
    "live_rows",
    "live_activations",
    "LANES",
]

MIN_CHUNK_COLUMNS = 256  # fewest output columns of a tile that one thread computes when split


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
    group_cols, group_ptr, n_groups : int32, int32 and int64 arrays, shapes (L, N), (L, N + 1), (L,)
        The columns of each layer in groups with equal inputs
        (:func:`dasknn.kernels.shared_inputs.group_columns`); ``None`` when packed with
        ``groups=False``.
    """

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    out_degree: np.ndarray
    group_cols: np.ndarray | None
    group_ptr: np.ndarray | None
    n_groups: np.ndarray | None

    @property
    def n_layers(self) -> int:
        return int(self.indptr.shape[0])

    @property
    def neurons(self) -> int:
        return int(self.indptr.shape[1] - 1)

    @property
    def nbytes(self) -> int:
        arrays = (self.indptr, self.indices, self.data, self.out_degree, self.group_cols,
                  self.group_ptr, self.n_groups)
        return int(sum(a.nbytes for a in arrays if a is not None))

    def __sizeof__(self) -> int:
        """Bytes of this object and its arrays (what Dask's ``sizeof`` counts)."""
        return object.__sizeof__(self) + self.nbytes


def pack_layers(
    layers: list[sp.spmatrix], dtype: np.dtype | type = np.float32, *, groups: bool = True
) -> PackedLayers:
    """Pack square sparse layers of shape ``(N, N)`` (challenge convention) for the kernel.

    Each layer is checked (:func:`graph.checks.check_csr`), duplicates summed, transposed
    to CSC, layers in parallel, and (``groups``, the default) its columns grouped by equal
    inputs, which :func:`advance` needs; the GPU's compact form
    (:func:`dasknn.kernels.cuda_inference.compact_layers`) does not, and ``groups=False`` saves
    that pass and its 8 bytes a neuron and layer.

    Raises
    ------
    ValueError
        If there are no layers, a layer is not square, widths differ or a weight is not finite.
    """
    if not layers:
        raise ValueError("the network has no layers")
    dtype = np.dtype(dtype)
    n = layers[0].shape[0]
    csrs = []
    for k, layer in enumerate(layers):
        if layer.shape != (n, n):
            raise ValueError(
                f"layer {k + 1} has shape {layer.shape}, expected ({n}, {n}) like layer 1"
            )
        csrs.append(check_csr(layer, name=f"layer {k + 1}"))
    csrs = [csr if csr.has_canonical_format else _canonical(csr) for csr in csrs]
    nnz = np.array([csr.nnz for csr in csrs], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(nnz)])
    indptr = np.empty((len(csrs), n + 1), dtype=np.int64)
    indices = np.empty(int(starts[-1]), dtype=np.int32)
    data = np.empty(int(starts[-1]), dtype=dtype)
    out_degree = np.empty((len(csrs), n), dtype=np.int64)

    def transpose(k: int) -> bool:
        lo, hi = starts[k], starts[k + 1]
        csr = csrs[k]
        return _csr_to_csc(csr.indptr, csr.indices, csr.data, lo, indptr[k], indices[lo:hi],
                           data[lo:hi], out_degree[k])

    with ThreadPoolExecutor(max_workers=min(len(csrs), os.cpu_count() or 1)) as pool:
        finite = list(pool.map(transpose, range(len(csrs))))
    if not all(finite):
        raise ValueError(f"layer {finite.index(False) + 1} has a weight that is not finite in "
                         f"{dtype} (NaN, infinite or out of range)")
    group_cols, group_ptr, n_groups = group_columns(indptr, indices) if groups else (None,) * 3
    return PackedLayers(indptr=indptr, indices=indices, data=data, out_degree=out_degree,
                        group_cols=group_cols, group_ptr=group_ptr, n_groups=n_groups)


def _canonical(csr: sp.csr_matrix) -> sp.csr_matrix:
    """A copy of ``csr`` with sorted indices and duplicates summed."""
    csr = csr.copy()
    csr.sum_duplicates()
    return csr


@njit(cache=True, nogil=True)
def _csr_to_csc(csr_indptr, csr_indices, csr_data, offset, indptr, indices, data, degree):
    """Transpose one canonical CSR layer into its slice of the packed CSC arrays (offsets from
    ``offset``, rows ascending in a column; ``degree``: each row's nonzeros); return whether every
    weight is finite in the type of ``data``."""
    n = degree.size
    counts = np.zeros(n + 1, dtype=np.int64)
    for p in range(csr_indptr[n]):
        counts[csr_indices[p] + 1] += 1
    for c in range(n):
        counts[c + 1] += counts[c]
    for c in range(n + 1):
        indptr[c] = offset + counts[c]
    finite = True
    for r in range(n):
        degree[r] = csr_indptr[r + 1] - csr_indptr[r]
        for p in range(csr_indptr[r], csr_indptr[r + 1]):
            c = csr_indices[p]
            q = counts[c]
            counts[c] = q + 1
            indices[q] = r
            data[q] = csr_data[p]
            if not np.isfinite(data[q]):
                finite = False
    return finite


@dataclass
class BatchState:
    """The live rows of a batch between layers.

    Attributes
    ----------
    rows : int64 array
        Batch-local ids of the live rows, in order (row ``i`` of the state is ``rows[i]``).
    block : float array, shape (ceil(live / LANES), N, LANES)
        Activations of the live rows, feature-major by tile; lanes beyond ``len(rows)`` are zero.
    macs_done : int
        Multiply-adds executed so far (``LANES`` per accumulated section, padding included).
    macs_needed : int
        Multiply-adds a row-by-row sparse product would need: ``sum nnz(y) * nnz(W[j, :])``.
    """

    rows: np.ndarray
    block: np.ndarray
    macs_done: int = 0
    macs_needed: int = 0

    @property
    def live(self) -> int:
        return int(self.rows.size)

    def __sizeof__(self) -> int:
        """Bytes of this object and its arrays (what Dask's ``sizeof`` counts)."""
        return object.__sizeof__(self) + self.rows.nbytes + self.block.nbytes


@njit(cache=True, parallel=True)
def _fill(indptr, indices, data, rows, block):
    for t in prange(block.shape[0]):
        block[t, :, :] = 0
        for lane in range(LANES):
            i = t * LANES + lane
            if i >= rows.size:
                break
            r = rows[i]
            for p in range(indptr[r], indptr[r + 1]):
                block[t, indices[p], lane] = data[p]


def start_batch(inputs: sp.spmatrix, dtype: np.dtype | type = np.float32) -> BatchState:
    """Load a batch of input rows (a sparse matrix of shape ``(rows, N)``) into a state.

    Rows that are all zero are dropped at once (they can never be categories).
    """
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    csr = sp.csr_matrix(check_csr(inputs, name="inputs")).astype(dtype)
    csr.eliminate_zeros()
    rows = np.flatnonzero(np.diff(csr.indptr)).astype(np.int64)
    block = aligned_empty((max(1, -(-rows.size // LANES)), csr.shape[1], LANES), dtype)
    _fill(csr.indptr.astype(np.int64), csr.indices.astype(np.int64), csr.data, rows, block)
    return BatchState(rows=rows, block=block)


@njit(cache=True)
def _tile_section_flags(tile, tile_flags, degree):
    # Out of the prange loop: numba's parfor reduction analysis fails on these accumulators there.
    count = 0
    for j in range(tile.shape[0]):
        nz = 0
        for lane in range(LANES):
            if tile[j, lane] != 0:
                nz += 1
        tile_flags[j] = nz > 0
        count += nz * degree[j]
    return count


@njit(cache=True, parallel=True)
def _section_flags(block, live, flags, degree):
    """Flag the sections of ``block`` that hold a nonzero; return the needed multiply-adds."""
    n_tiles = (live + LANES - 1) // LANES
    needed = np.zeros(n_tiles, dtype=np.int64)
    for t in prange(n_tiles):
        needed[t] = _tile_section_flags(block[t], flags[t], degree)
    return needed.sum()


@njit(cache=True)
def _column_chunks(n_tiles, n, threads):
    """Into how many chunks each of ``n_tiles`` tiles' ``n`` output columns is split for
    ``threads``: 1 when the tiles keep every thread busy, else the fewest chunks of at least
    ``MIN_CHUNK_COLUMNS`` that balance the (tile, chunk) items over the threads. A chunk is a
    range of column groups (``n_groups / chunks`` of them)."""
    if n_tiles >= threads:
        return 1
    most = max(1, n // MIN_CHUNK_COLUMNS)
    a, b = n_tiles, threads
    while b:
        a, b = b, a % b
    balanced = threads // a
    if balanced <= most:
        return balanced
    return min(most, (threads + n_tiles - 1) // n_tiles)


@njit(cache=True, parallel=True)
def _layer(
    src,
    dst,
    live,
    chunks,
    flags,
    next_flags,
    alive,
    counts,
    indptr,
    group_cols,
    group_ptr,
    n_groups,
    indices,
    data,
    degree,
    bias,
    ymax,
):
    """One layer: ``dst = f(src @ W)``; fills ``alive``, ``counts`` and the section flags; the
    parallel items are (tile, chunk of column groups)."""
    n = src.shape[1]
    n_tiles = (live + LANES - 1) // LANES
    items = n_tiles * chunks
    hits = np.zeros((items, LANES), dtype=np.int64)
    item_counts = np.empty((items, 2), dtype=np.int64)
    zero = ymax - ymax
    for i in prange(items):
        t = i // chunks
        part = i - t * chunks
        item_hits = hits[i]
        done = 0
        needed = 0
        for g in range(part * n_groups // chunks, (part + 1) * n_groups // chunks):
            first = group_ptr[g]
            size = group_ptr[g + 1] - first
            c = group_cols[first]
            sums = stack_group(src.dtype)
            if size == GROUP:
                lo = indptr[c]
                done += GROUP * accumulate_group(
                    sums, src, t * n * LANES, indices, data, flags, t * n, lo, indptr[c + 1],
                    indptr[group_cols[first + 1]] - lo,
                    indptr[group_cols[first + 2]] - lo,
                    indptr[group_cols[first + 3]] - lo,
                )
            else:
                done += accumulate_column(
                    sums, src, t * n * LANES, indices, data, flags, t * n, indptr[c], indptr[c + 1]
                )
            acc = numba.carray(sums, (GROUP, LANES))
            for m in range(size):
                c = group_cols[first + m]
                nonzeros = 0
                for lane in range(LANES):  # branch-free so that it vectorizes
                    z = acc[m, lane]
                    y = min(max(z + bias, zero), ymax)
                    y = y if z != zero else zero
                    dst[t, c, lane] = y
                    positive = y != zero
                    item_hits[lane] += positive
                    nonzeros += positive
                next_flags[t, c] = nonzeros > 0
                needed += nonzeros * degree[c]
        item_counts[i, 0] = done
        item_counts[i, 1] = needed
    for t in range(n_tiles):
        done = 0
        needed = 0
        for lane in range(LANES):
            alive[t * LANES + lane] = False
        for i in range(t * chunks, (t + 1) * chunks):
            done += item_counts[i, 0]
            needed += item_counts[i, 1]
            for lane in range(LANES):
                alive[t * LANES + lane] |= hits[i, lane] > 0
        counts[t, 0] = done * LANES
        counts[t, 1] = needed
    return n_tiles


@njit(cache=True, parallel=True)
def _compact(src, dst, source_of, next_flags):
    """Move the lanes listed in ``source_of`` to the front of ``dst`` and flag its sections."""
    live = source_of.size
    n = src.shape[1]
    n_tiles = (live + LANES - 1) // LANES
    for t in prange(n_tiles):
        lanes = min(LANES, live - t * LANES)
        for j in range(n):
            any_nonzero = False
            for lane in range(LANES):
                v = src[0, 0, 0] * 0
                if lane < lanes:
                    s = source_of[t * LANES + lane]
                    v = src[s // LANES, j, s % LANES]
                dst[t, j, lane] = v
                if v != 0:
                    any_nonzero = True
            next_flags[t, j] = any_nonzero


@njit(cache=True)
def _run_layers(
    block,
    spare,
    rows,
    live,
    flags,
    next_flags,
    indptr,
    group_cols,
    group_ptr,
    n_groups,
    indices,
    data,
    degrees,
    bias,
    ymax,
    threads,
):
    """All layers of a window in one call; returns (live, result in spare?, done, needed);
    columns split per :func:`_column_chunks` (never with ``threads=1``)."""
    n_layers = indptr.shape[0]
    n = block.shape[1]
    src, dst = block, spare
    in_spare = False
    alive = np.empty(block.shape[0] * LANES, dtype=np.bool_)
    counts = np.empty((block.shape[0], 2), dtype=np.int64)
    done = 0
    needed = 0
    for k in range(n_layers):
        if live == 0:
            break
        degree = degrees[k + 1] if k + 1 < n_layers else degrees[k]
        chunks = _column_chunks((live + LANES - 1) // LANES, n, threads)
        n_tiles = _layer(
            src,
            dst,
            live,
            chunks,
            flags,
            next_flags,
            alive,
            counts,
            indptr[k],
            group_cols[k],
            group_ptr[k],
            n_groups[k],
            indices,
            data,
            degree,
            bias,
            ymax,
        )
        done += counts[:n_tiles, 0].sum()
        if k + 1 < n_layers:
            needed += counts[:n_tiles, 1].sum()
        survivors = 0
        for i in range(live):
            if alive[i]:
                survivors += 1
        if survivors == live:
            src, dst = dst, src
            in_spare = not in_spare
        else:
            source_of = np.empty(survivors, dtype=np.int64)
            m = 0
            for i in range(live):
                if alive[i]:
                    source_of[m] = i
                    rows[m] = rows[i]
                    m += 1
            _compact(dst, src, source_of, next_flags)
            live = survivors
        flags, next_flags = next_flags, flags
    return live, in_spare, done, needed


def advance(
    state: BatchState,
    layers: PackedLayers,
    bias: float,
    ymax: float = 32.0,
    *,
    split_columns: bool = True,
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
    split_columns : bool
        When the live tiles are fewer than the numba threads, split each tile's output columns
        among the threads (same results bit for bit); ``False`` runs a tile on one thread.
    """
    n_tiles, n, _ = state.block.shape
    if layers.neurons != n:
        raise ValueError(f"the layers have {layers.neurons} neurons but the batch has {n}")
    if layers.group_cols is None:
        raise ValueError("the layers were packed with groups=False; pack them with groups=True")
    if layers.data.dtype != state.block.dtype:
        raise ValueError(
            f"layers are {layers.data.dtype} but the batch is {state.block.dtype}; pack them alike"
        )
    if state.live == 0:
        return state
    dtype = state.block.dtype
    flags = np.empty((n_tiles, n), dtype=np.bool_)
    state.macs_needed += int(_section_flags(state.block, state.live, flags, layers.out_degree[0]))
    if state.block.ctypes.data % VECTOR_BYTES:  # e.g. a state that was pickled
        state.block = aligned_copy(state.block)
    spare = aligned_empty(state.block.shape, dtype)
    rows = state.rows.copy()
    live, in_spare, done, needed = _run_layers(
        state.block,
        spare,
        rows,
        state.live,
        flags,
        np.empty_like(flags),
        layers.indptr,
        layers.group_cols,
        layers.group_ptr,
        layers.n_groups,
        layers.indices,
        layers.data,
        layers.out_degree,
        dtype.type(bias),
        dtype.type(ymax),
        numba.get_num_threads() if split_columns else 1,
    )
    block = spare if in_spare else state.block
    used = max(1, -(-live // LANES))
    state.block = aligned_copy(block[:used]) if used < n_tiles else block
    state.rows = rows[:live]
    state.macs_done += int(done)
    state.macs_needed += int(needed)
    return state


def live_rows(state: BatchState) -> np.ndarray:
    """Batch-local ids (0-based) of the rows that are not all zero."""
    return state.rows.copy()


def live_activations(state: BatchState) -> np.ndarray:
    """The activations of the live rows as a dense ``(live, N)`` array (row-major)."""
    n_tiles, n, lanes = state.block.shape
    dense = state.block.transpose(0, 2, 1).reshape(n_tiles * lanes, n)
    return np.ascontiguousarray(dense[: state.live])
