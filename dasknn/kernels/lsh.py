"""Numba kernels of the hash families and the bucketed tables (one process, no Dask).

Hash codes are computed for a block of dense vectors, one row each, in parallel over the rows.
Tables are CSR-like: per table the sorted distinct codes, and per code the ids of its bucket.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from dasknn.kernels.random import rand_below, seed_stream
from dasknn.kernels.sorting import stable_argsort_into

__all__ = ["build_buckets", "dwta_codes", "mips_transform", "query_union", "simhash_codes"]

MIPS_CHUNKS = 64  # row chunks of the column sums in mips_transform


@njit(cache=True, parallel=True)
def simhash_codes(vectors, index, sign, k, n_tables):  # pragma: no cover - compiled
    """Signed random projection codes: bit ``j`` of table ``t`` is ``1`` when
    ``sum_s sign[f, s] * vectors[i, index[f, s]] >= 0`` for function ``f = t * k + j``.

    Returns an ``(n, n_tables)`` int64 array.
    """
    n = vectors.shape[0]
    out = np.zeros((n, n_tables), dtype=np.int64)
    for i in prange(n):
        row = vectors[i]
        for t in range(n_tables):
            code = 0
            for j in range(k):
                f = t * k + j
                acc = 0.0
                for s in range(index.shape[1]):
                    acc += sign[f, s] * row[index[f, s]]
                if acc >= 0:
                    code |= 1 << j
            out[i, t] = code
    return out


@njit(cache=True, parallel=True)
def pack_sign_bits(projections, k, n_tables):  # pragma: no cover - compiled
    """Table codes from projections: bit ``j`` of table ``t`` is ``1`` when
    ``projections[i, t * k + j] >= 0`` (the rule of :func:`simhash_codes`).

    Returns an ``(n, n_tables)`` int64 array.
    """
    n = projections.shape[0]
    out = np.zeros((n, n_tables), dtype=np.int64)
    for i in prange(n):
        for t in range(n_tables):
            code = 0
            for j in range(k):
                if projections[i, t * k + j] >= 0:
                    code |= 1 << j
            out[i, t] = code
    return out


@njit(cache=True, parallel=True)
def dwta_codes(vectors, bins, k, n_tables, bits):  # pragma: no cover - compiled
    """Densified winner-take-all codes.

    Bin ``f = t * k + j``'s code is the position of the largest of ``vectors[i, bins[f]]`` (first
    on ties); an all-zero bin takes the next non-empty bin's code (circularly); a zero vector has
    all codes 0. Table ``t``'s code packs its ``k`` bin codes, bin ``j`` at bit ``j * bits``.

    Returns an ``(n, n_tables)`` int64 array.
    """
    n = vectors.shape[0]
    n_bins = bins.shape[0]
    width = bins.shape[1]
    out = np.zeros((n, n_tables), dtype=np.int64)
    for i in prange(n):
        row = vectors[i]
        codes = np.full(n_bins, -1, dtype=np.int64)
        for f in range(n_bins):
            best = -1
            best_value = 0.0
            for s in range(width):
                value = row[bins[f, s]]
                if best < 0 or value > best_value:
                    best = s
                    best_value = value
            empty = True
            for s in range(width):
                if row[bins[f, s]] != 0:
                    empty = False
                    break
            if not empty:
                codes[f] = best
        for f in range(n_bins):
            if codes[f] >= 0:
                continue
            code = 0
            for step in range(1, n_bins):
                other = codes[(f + step) % n_bins]
                if other >= 0:
                    code = other
                    break
            codes[f] = -2 - code  # borrowed: decoded below, never lent again
        for t in range(n_tables):
            code = 0
            for j in range(k):
                c = codes[t * k + j]
                if c < -1:
                    c = -2 - c
                code |= c << (j * bits)
            out[i, t] = code
    return out


@njit(cache=True, parallel=True)
def mips_transform(weights, bias):  # pragma: no cover - compiled
    """Simple-LSH items of centred weights and bias (see :mod:`dasknn.lsh.mips`), rows in
    parallel: ``u_j = (w_j - mean w, b_j - mean b)`` (means and norms in float64), scaled by
    the largest ``|u_j|`` and completed by ``sqrt(1 - |u_j|^2 / M^2)``.

    Returns an ``(n, H + 2)`` array of ``weights``' dtype.
    """
    n, width = weights.shape
    partial = np.zeros((MIPS_CHUNKS, width + 1))
    for c in prange(MIPS_CHUNKS):
        for i in range(c * n // MIPS_CHUNKS, (c + 1) * n // MIPS_CHUNKS):
            for d in range(width):
                partial[c, d] += weights[i, d]
            partial[c, width] += bias[i]
    mean = np.zeros(width + 1)  # loops, not partial.sum(axis=0): half the compile time
    for c in range(MIPS_CHUNKS):
        for d in range(width + 1):
            mean[d] += partial[c, d]
    for d in range(width + 1):
        mean[d] /= max(n, 1)
    items = np.empty((n, width + 2), dtype=weights.dtype)
    norms = np.empty(n)
    for i in prange(n):
        total = 0.0
        for d in range(width):
            u = weights[i, d] - mean[d]
            items[i, d] = u
            total += u * u
        u = bias[i] - mean[width]
        items[i, width] = u
        norms[i] = np.sqrt(total + u * u)
    largest = 0.0
    for i in range(n):
        largest = max(largest, norms[i])
    scale = 1.0 / largest if largest > 0 else 1.0
    for i in prange(n):
        for d in range(width + 1):
            items[i, d] = items[i, d] * scale
        r = norms[i] * scale
        items[i, width + 1] = np.sqrt(max(0.0, 1.0 - r * r))
    return items


@njit(cache=True)
def _stable_order(column, order):  # pragma: no cover - compiled
    """Write the stable argsort of ``column`` into ``order`` (a counting sort for small
    non-negative values, else a merge sort)."""
    n = column.shape[0]
    if n == 0:
        return
    low = column[0]
    high = column[0]
    for i in range(n):
        low = min(low, column[i])
        high = max(high, column[i])
    span = high + 1
    if low < 0 or span > 4 * n + 1024:
        stable_argsort_into(column, order)
        return
    start = np.zeros(span + 1, dtype=np.int64)
    for i in range(n):
        start[column[i] + 1] += 1
    for v in range(span):
        start[v + 1] += start[v]
    for i in range(n):
        order[start[column[i]]] = i
        start[column[i]] += 1


@njit(cache=True)
def _run_end(column, order, start):  # pragma: no cover - compiled
    """The end of the run of equal codes from ``start`` (``column`` sorted by ``order``)."""
    code = column[order[start]]
    stop = start
    while stop < column.shape[0] and column[order[stop]] == code:
        stop += 1
    return stop


@njit(cache=True)
def _bucket_counts(column, order, cap):  # pragma: no cover - compiled
    """Distinct codes and kept items of one table (codes ``column`` sorted by ``order``)."""
    n = column.shape[0]
    n_keys = 0
    n_items = 0
    start = 0
    while start < n:
        stop = _run_end(column, order, start)
        n_keys += 1
        n_items += min(stop - start, cap)
        start = stop
    return n_keys, n_items


@njit(cache=True, parallel=True)
def build_buckets(codes, cap, seed):  # pragma: no cover - compiled
    """CSR-like tables from the codes of ``n`` items (``codes``: ``(n, n_tables)``).

    Per table, items grouped by sorted code, in id order; a bucket over ``cap`` keeps a uniform
    reservoir sample of ``cap`` (algorithm R, stream ``(seed, table, code)``). Tables in parallel.

    Returns
    -------
    keys : int64 array
        Every table's sorted distinct codes, table after table.
    key_ptr : int64 array (n_tables + 1)
        Table ``t``'s codes are ``keys[key_ptr[t]:key_ptr[t + 1]]``.
    bucket_ptr : int64 array (len(keys) + 1)
        Bucket ``b`` holds ``items[bucket_ptr[b]:bucket_ptr[b + 1]]``.
    items : int32 array
    """
    n, n_tables = codes.shape
    orders = np.empty((n_tables, n), dtype=np.int64)
    key_counts = np.zeros(n_tables, dtype=np.int64)
    item_counts = np.zeros(n_tables, dtype=np.int64)
    for t in prange(n_tables):
        column = np.ascontiguousarray(codes[:, t])
        _stable_order(column, orders[t])  # in place: no shape check to compile
        key_counts[t], item_counts[t] = _bucket_counts(column, orders[t], cap)
    key_ptr = np.zeros(n_tables + 1, dtype=np.int64)
    item_ptr = np.zeros(n_tables + 1, dtype=np.int64)
    for t in range(n_tables):
        key_ptr[t + 1] = key_ptr[t] + key_counts[t]
        item_ptr[t + 1] = item_ptr[t] + item_counts[t]
    keys = np.empty(key_ptr[n_tables], dtype=np.int64)
    bucket_ptr = np.zeros(key_ptr[n_tables] + 1, dtype=np.int64)
    items = np.empty(item_ptr[n_tables], dtype=np.int32)
    for t in prange(n_tables):
        column = codes[:, t]
        order = orders[t]
        n_keys = key_ptr[t]
        n_items = item_ptr[t]
        start = 0
        while start < n:
            code = column[order[start]]
            stop = _run_end(column, order, start)
            size = stop - start
            keys[n_keys] = code
            if size <= cap:
                for s in range(size):
                    items[n_items + s] = order[start + s]
                n_items += size
            else:
                state = seed_stream(seed, t, code & 0x7FFFFFFFFFFFFFFF, 0)
                for s in range(cap):
                    items[n_items + s] = order[start + s]
                for s in range(cap, size):
                    state, r = rand_below(state, s + 1)
                    if r < cap:
                        items[n_items + r] = order[start + s]
                n_items += cap
            n_keys += 1
            bucket_ptr[n_keys] = n_items
            start = stop
    return keys, key_ptr, bucket_ptr, items


@njit(cache=True, inline="always")
def bucket_of(keys, key_ptr, t, code):  # pragma: no cover - compiled
    """Index of ``code`` among table ``t``'s keys, ``-1`` when the bucket is absent."""
    lo = key_ptr[t]
    hi = key_ptr[t + 1]
    pos = lo + np.searchsorted(keys[lo:hi], code)
    if pos < hi and keys[pos] == code:
        return pos
    return -1


@njit(cache=True)
def query_union(keys, key_ptr, bucket_ptr, items, codes, n_items):  # pragma: no cover
    """The union of the buckets of ``codes`` (one a table), each id once, in the order met."""
    seen = np.zeros(n_items, dtype=np.bool_)
    out = np.empty(items.shape[0], dtype=np.int32)
    count = 0
    for t in range(key_ptr.shape[0] - 1):
        b = bucket_of(keys, key_ptr, t, codes[t])
        if b < 0:
            continue
        for p in range(bucket_ptr[b], bucket_ptr[b + 1]):
            item = items[p]
            if not seen[item]:
                seen[item] = True
                out[count] = item
                count += 1
    return out[:count].copy()
