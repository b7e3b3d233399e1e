"""Footprint tiles of sparse layers: runs of at most ``tile_outputs`` output columns whose
*footprint* (sorted union of inputs) holds at most ``footprint`` entries, which the GPU's tiled
mode loads once into shared memory; ``local`` gives each weight entry its input's footprint
position. Host-only (no CUDA); docs/challenge.md ("On GPUs").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from dasknn.kernels.sorting import sort_prefix, stable_argsort_into

__all__ = ["FOOTPRINT", "TILE_OUTPUTS", "FootprintTiles", "check_tileable", "tile_layers"]

FOOTPRINT = 64  # most input neurons in one tile's footprint (one warp's shared activations)
TILE_OUTPUTS = 32  # most output columns in one tile
_LOCAL_LIMIT = 256  # footprint positions are stored as uint8
FOOTPRINT_MULTIPLE = 8  # the kernel loads the footprint 8 activations at a time


@dataclass
class FootprintTiles:
    """The footprint tiles of consecutive layers, flat, with per-layer offsets.

    Attributes
    ----------
    footprint : int
        The most inputs a tile's footprint may hold.
    layer_tiles : int64 array, shape (L + 1,)
        Tiles ``layer_tiles[k] .. layer_tiles[k + 1] - 1`` belong to layer ``k``.
    tile_ptr : int32 or int64 array, shape (T + 1,)
        Tile ``t``'s output columns are ``tile_cols[tile_ptr[t]:tile_ptr[t + 1]]``.
    tile_cols : uint16 or int32 array, shape (L * N,)
        Output column ids, tile by tile; each layer's ``N`` columns appear once.
    foot_ptr : int32 or int64 array, shape (T + 1,)
        Tile ``t``'s footprint is ``foot[foot_ptr[t]:foot_ptr[t + 1]]``.
    foot : uint16 or int32 array
        Input neuron ids, sorted within each tile.
    local : uint8 array, shape (nnz,)
        For weight entry ``p`` (CSC position), its input's position in its tile's footprint.
    """

    footprint: int
    layer_tiles: np.ndarray
    tile_ptr: np.ndarray
    tile_cols: np.ndarray
    foot_ptr: np.ndarray
    foot: np.ndarray
    local: np.ndarray

    @property
    def n_tiles(self) -> int:
        return int(self.tile_ptr.size - 1)

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in (self.layer_tiles, self.tile_ptr, self.tile_cols,
                                          self.foot_ptr, self.foot, self.local)))

    def window(self, first: int, last: int, lo: int, hi: int) -> FootprintTiles:
        """The tiles of layers ``first .. last - 1`` (entries ``lo .. hi - 1``), offsets rebased."""
        t0, t1 = int(self.layer_tiles[first]), int(self.layer_tiles[last])
        c0, c1 = int(self.tile_ptr[t0]), int(self.tile_ptr[t1])
        f0, f1 = int(self.foot_ptr[t0]), int(self.foot_ptr[t1])
        return FootprintTiles(
            footprint=self.footprint,
            layer_tiles=self.layer_tiles[first:last + 1] - t0,
            tile_ptr=self.tile_ptr[t0:t1 + 1] - self.tile_ptr.dtype.type(c0),
            tile_cols=self.tile_cols[c0:c1],
            foot_ptr=self.foot_ptr[t0:t1 + 1] - self.foot_ptr.dtype.type(f0),
            foot=self.foot[f0:f1],
            local=self.local[lo:hi],
        )


def check_tileable(degrees: Iterable[np.ndarray], footprint: int = FOOTPRINT) -> None:
    """Raise ``ValueError`` unless every column fits a footprint of ``footprint`` inputs.

    Parameters
    ----------
    degrees : iterable of int arrays, one per layer
        Inputs of each output column (an ``(L, N)`` array will do).
    footprint : int
        The footprint limit: a multiple of 8, at most 256.
    """
    if footprint < FOOTPRINT_MULTIPLE or footprint > _LOCAL_LIMIT or footprint % FOOTPRINT_MULTIPLE:
        raise ValueError(f"footprint must be a multiple of {FOOTPRINT_MULTIPLE} between "
                         f"{FOOTPRINT_MULTIPLE} and {_LOCAL_LIMIT}, got {footprint}")
    for layer, layer_degrees in enumerate(degrees):
        if layer_degrees.size and int(layer_degrees.max()) > footprint:
            column = int(np.argmax(layer_degrees))
            raise ValueError(
                f"layer {layer + 1}: output neuron {column} (0-based) has "
                f"{int(layer_degrees[column])} inputs, more than the footprint limit of "
                f"{footprint} of mode='tiled'; use mode='sectioned'"
            )


@njit(cache=True)
def _column_order(indptr, indices, k, n, scratch):
    """Layer ``k``'s columns ordered by smallest input, then a hash of their input set."""
    keys = np.empty(n, dtype=np.int64)
    for c in range(n):
        p0, p1 = indptr[k, c], indptr[k, c + 1]
        d = p1 - p0
        ordered = True
        for p in range(p0, p1):
            scratch[p - p0] = indices[p]
            ordered = ordered and (p == p0 or indices[p] > indices[p - 1])
        if not ordered:
            sort_prefix(scratch, d)
        h = np.uint64(14695981039346656037)  # FNV-1a over the sorted inputs
        for i in range(d):
            h = (h ^ np.uint64(scratch[i])) * np.uint64(1099511628211)
        first = np.int64(scratch[0]) if d > 0 else np.int64(n)
        keys[c] = (first << np.int64(31)) | np.int64(h >> np.uint64(33))
    order = np.empty(n, dtype=np.int64)
    stable_argsort_into(keys, order)
    return order


@njit(cache=True)
def _close_tile(indptr, indices, k, order, start, stop, members, size, marker, local):
    """Sort footprint ``members[:size]``, write ``local`` for columns ``order[start:stop]``, clear
    ``marker``."""
    sort_prefix(members, size)
    for r in range(size):
        marker[members[r]] = r
    for i in range(start, stop):
        c = order[i]
        for p in range(indptr[k, c], indptr[k, c + 1]):
            local[p] = marker[indices[p]]
    for r in range(size):
        marker[members[r]] = -1


@njit(parallel=True, cache=True)
def _cut_tiles(indptr, indices, footprint, tile_outputs, tile_cols, starts, local, counts):
    """Pass 1, layers in parallel: ``tile_cols``, tile ``starts``, ``local``; ``counts[k]`` =
    (tiles, footprint entries)."""
    n_layers = indptr.shape[0]
    n = indptr.shape[1] - 1
    for k in prange(n_layers):
        members = np.empty(footprint, dtype=np.int64)
        order = _column_order(indptr, indices, k, n, members)
        marker = np.full(n, -1, dtype=np.int64)
        size = 0
        start = 0
        tiles = 0
        foot_total = 0
        for i in range(n):
            c = order[i]
            p0, p1 = indptr[k, c], indptr[k, c + 1]
            new = 0
            for p in range(p0, p1):
                if marker[indices[p]] == -1:
                    new += 1
            if i > start and (i - start == tile_outputs or size + new > footprint):
                _close_tile(indptr, indices, k, order, start, i, members, size, marker, local)
                starts[k * n + start] = 1
                tiles += 1
                foot_total += size
                size = 0
                start = i
            for p in range(p0, p1):
                j = indices[p]
                if marker[j] == -1:
                    marker[j] = size
                    members[size] = j
                    size += 1
            tile_cols[k * n + i] = c
        if n > 0:
            _close_tile(indptr, indices, k, order, start, n, members, size, marker, local)
            starts[k * n + start] = 1
            tiles += 1
            foot_total += size
        counts[k, 0] = tiles
        counts[k, 1] = foot_total


@njit(parallel=True, cache=True)
def _fill_tiles(indptr, indices, tile_cols, starts, local, layer_tiles, layer_foot, tile_ptr,
                foot_ptr, foot):
    """Pass 2, layers in parallel: tile and footprint offsets, and the footprints."""
    n_layers = indptr.shape[0]
    n = indptr.shape[1] - 1
    for k in prange(n_layers):
        t = layer_tiles[k]
        f = layer_foot[k]
        i = 0
        while i < n:
            stop = i + 1
            while stop < n and starts[k * n + stop] == 0:
                stop += 1
            tile_ptr[t] = k * n + i
            foot_ptr[t] = f
            size = 0
            for q in range(i, stop):
                c = tile_cols[k * n + q]
                for p in range(indptr[k, c], indptr[k, c + 1]):
                    foot[f + local[p]] = indices[p]
                    size = max(size, np.int64(local[p]) + 1)
            f += size
            t += 1
            i = stop
    if n_layers > 0:
        tile_ptr[layer_tiles[n_layers]] = n_layers * n
        foot_ptr[layer_tiles[n_layers]] = layer_foot[n_layers]


def _offset_type(largest: int) -> type:
    return np.int32 if largest <= np.iinfo(np.int32).max else np.int64


def tile_layers(
    indptr: np.ndarray,
    indices: np.ndarray,
    footprint: int = FOOTPRINT,
    tile_outputs: int = TILE_OUTPUTS,
) -> FootprintTiles:
    """Cut every layer's output columns into footprint tiles.

    Parameters
    ----------
    indptr : int array, shape (L, N + 1)
        Column offsets into ``indices`` (CSC, as in
        :class:`dasknn.kernels.inference.PackedLayers`).
    indices : uint16 or int32 array
        Input neuron of each weight entry.
    footprint : int
        The most inputs of a tile (a multiple of 8, at most 256).
    tile_outputs : int
        The most columns of a tile.

    Returns
    -------
    FootprintTiles
        Index arrays of the dtype of ``indices``; ``local`` aligned with ``indices``.

    Raises
    ------
    ValueError
        When a column has more than ``footprint`` inputs, or on a bad ``footprint`` or
        ``tile_outputs``.
    """
    if tile_outputs < 1:
        raise ValueError(f"tile_outputs must be >= 1, got {tile_outputs}")
    check_tileable((np.diff(indptr[k]) for k in range(indptr.shape[0])), footprint)
    n_layers, n = indptr.shape[0], indptr.shape[1] - 1
    tile_cols = np.empty(n_layers * n, dtype=indices.dtype)
    starts = np.zeros(n_layers * n, dtype=np.uint8)
    local = np.zeros(indices.size, dtype=np.uint8)
    counts = np.zeros((n_layers, 2), dtype=np.int64)
    _cut_tiles(indptr, indices, footprint, tile_outputs, tile_cols, starts, local, counts)
    layer_tiles = np.zeros(n_layers + 1, dtype=np.int64)
    layer_foot = np.zeros(n_layers + 1, dtype=np.int64)
    np.cumsum(counts[:, 0], out=layer_tiles[1:])
    np.cumsum(counts[:, 1], out=layer_foot[1:])
    tile_ptr = np.zeros(int(layer_tiles[-1]) + 1, dtype=_offset_type(n_layers * n))
    foot_ptr = np.zeros(int(layer_tiles[-1]) + 1, dtype=_offset_type(int(layer_foot[-1])))
    foot = np.empty(int(layer_foot[-1]), dtype=indices.dtype)
    _fill_tiles(indptr, indices, tile_cols, starts, local, layer_tiles, layer_foot, tile_ptr,
                foot_ptr, foot)
    return FootprintTiles(footprint, layer_tiles, tile_ptr, tile_cols, foot_ptr, foot, local)
