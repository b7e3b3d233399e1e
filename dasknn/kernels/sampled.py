"""Numba kernels of the sampled network: the dense hidden layer on sparse inputs, active-set
selection, and the output layer restricted to the active neurons. A batch runs in ``n_chunks``
parallel chunks; ``n_chunks == 1`` is deterministic, more race on the gradients (HOGWILD, as in
SLIDE); kernels writing per-sample results only give the same result for any ``n_chunks``.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from dasknn.kernels.lsh import bucket_of
from dasknn.kernels.random import rand_below, seed_stream

__all__ = [
    "hidden_backward",
    "hidden_forward",
    "output_backward",
    "output_logits",
    "select_active",
    "zero_rows",
]


@njit(cache=True, inline="always")
def _chunk(c, n_chunks, n):  # pragma: no cover - compiled
    return c * n // n_chunks, (c + 1) * n // n_chunks


@njit(cache=True, parallel=True, nogil=True)
def zero_rows(array, rows):  # pragma: no cover - compiled
    """Set the rows ``rows`` of the 2-D ``array`` to zero, the rows in parallel."""
    for r in prange(rows.shape[0]):
        array[rows[r]] = 0


@njit(cache=True, parallel=True, nogil=True)
def hidden_forward(indptr, indices, data, weights, bias, n_chunks):  # pragma: no cover
    """``relu(X @ weights + bias)`` for a CSR batch ``X``; ``weights`` is ``(n_features, H)``."""
    n = indptr.shape[0] - 1
    width = weights.shape[1]
    out = np.empty((n, width), dtype=weights.dtype)
    for c in prange(n_chunks):
        lo, hi = _chunk(c, n_chunks, n)
        for b in range(lo, hi):
            for d in range(width):
                out[b, d] = bias[d]
            for p in range(indptr[b], indptr[b + 1]):
                f = indices[p]
                x = data[p]
                for d in range(width):
                    out[b, d] += x * weights[f, d]
            for d in range(width):
                if out[b, d] < 0:
                    out[b, d] = 0
    return out


@njit(cache=True, parallel=True, nogil=True)
def hidden_backward(
    indptr, indices, data, hidden, grad_hidden, grad_w, grad_b, touched, n_chunks
):  # pragma: no cover - compiled
    """Accumulate the gradients of the hidden layer from ``grad_hidden = dJ/d relu(z)``.

    ``dz = grad_hidden * (hidden > 0)``; ``grad_w[f] += x_f * dz`` for every stored feature ``f``
    of the sample (``touched[f] = True``) and ``grad_b += dz``.
    """
    n = indptr.shape[0] - 1
    width = hidden.shape[1]
    for c in prange(n_chunks):
        lo, hi = _chunk(c, n_chunks, n)
        dz = np.empty(width, dtype=hidden.dtype)
        for b in range(lo, hi):
            for d in range(width):
                dz[d] = grad_hidden[b, d] if hidden[b, d] > 0 else 0
                grad_b[d] += dz[d]
            for p in range(indptr[b], indptr[b + 1]):
                f = indices[p]
                x = data[p]
                touched[f] = True
                for d in range(width):
                    grad_w[f, d] += x * dz[d]


@njit(cache=True, nogil=True)
def _select_rows(
    lo, hi, codes, keys, key_ptr, bucket_ptr, items, n_items, budget, reserve, label_ptr,
    label_ids, fill, seed, step, row0, shard, active, count, forced, log_q, mark,
):  # pragma: no cover - compiled
    """:func:`select_active` of the samples ``lo:hi``, into its outputs (a function of its
    own: the parallel loop then compiles in about 60 % of the time); ``mark`` is the chunk's
    ``n_items`` int64 marks, zeroed here."""
    n_tables = codes.shape[1]
    # mark[i] == stamp: neuron i met in this sample; == -stamp: active in this sample
    mark[:] = 0
    for b in range(lo, hi):
        stamp = b + 1
        state = seed_stream(seed, step, row0 + b, shard)
        used = 0
        for p in range(label_ptr[b], label_ptr[b + 1]):
            label = label_ids[p]
            if mark[label] != stamp:
                mark[label] = stamp
                active[b, used] = label
                used += 1
        forced[b] = used
        room = max(0, budget - used - reserve)
        seen = 0
        for t in range(n_tables):
            pos = bucket_of(keys, key_ptr, t, codes[b, t])
            if pos < 0:
                continue
            for q in range(bucket_ptr[pos], bucket_ptr[pos + 1]):
                item = items[q]
                if mark[item] == stamp:
                    continue
                mark[item] = stamp
                if seen < room:
                    active[b, used + seen] = item
                else:
                    state, r = rand_below(state, seen + 1)
                    if r < room:
                        active[b, used + r] = item
                seen += 1
        kept = min(seen, room)
        used += kept
        for a in range(used):
            mark[active[b, a]] = -stamp
        need = budget - used if fill else 0
        free = n_items - used
        fill_q = need / free if need > 0 else 0.0
        candidate_log_q = 0.0
        if seen > kept:
            candidate_log_q = np.log(kept / seen + (1 - kept / seen) * fill_q)
        for a in range(forced[b], used):
            log_q[b, a] = candidate_log_q
        if need > 0:
            fill_log_q = np.log(fill_q)
            if 2 * need > free:
                for item in range(n_items):
                    if need == 0:
                        break
                    if mark[item] == -stamp:
                        continue
                    state, r = rand_below(state, free)
                    free -= 1
                    if r < need:
                        log_q[b, used] = candidate_log_q if mark[item] == stamp else fill_log_q
                        active[b, used] = item
                        used += 1
                        need -= 1
            else:
                while need > 0:
                    state, item = rand_below(state, n_items)
                    if mark[item] != -stamp:
                        log_q[b, used] = candidate_log_q if mark[item] == stamp else fill_log_q
                        mark[item] = -stamp
                        active[b, used] = item
                        used += 1
                        need -= 1
        count[b] = used


@njit(cache=True, parallel=True, nogil=True)
def select_active(
    codes,
    keys,
    key_ptr,
    bucket_ptr,
    items,
    n_items,
    budget,
    reserve,
    label_ptr,
    label_ids,
    fill,
    seed,
    step,
    row0,
    shard,
    n_chunks,
    active,
    count,
    forced,
    log_q,
    marks,
):  # pragma: no cover - compiled
    """Each sample's active neurons of one shard: its labels, then a sample of its candidates,
    written into the outputs given (their values before do not matter).

    Sample ``b``'s labels ``label_ids[label_ptr[b]:label_ptr[b + 1]]`` come first (forced), then
    the union of its buckets (``codes[b]``) less the labels, a reservoir sample of at most
    ``room = max(0, budget - labels - reserve)``; with ``fill``, free slots take uniform draws
    from the inactive neurons. Stream ``(seed, step, row0 + b, shard)``. Inclusion probability
    ``q``: 1 for a label or when all ``C`` candidates fit; else, with ``r`` kept and ``need``
    slots filled from ``free`` neurons, ``r / C + (1 - r / C) need / free`` for a candidate and
    ``need / free`` for any other.

    Outputs
    -------
    active : int32 (n, budget)
        The active ids, the first ``count[b]`` of each row valid (-1 past it).
    count, forced : int32 (n,)
        Active neurons and forced labels of each sample.
    log_q : float64 (n, budget)
        ``log q`` of each active neuron (zero past ``count``).
    marks : int64 (n_chunks, n_items)
        Scratch: one row of marks a chunk of samples.
    """
    n = codes.shape[0]
    active[:] = -1
    count[:] = 0
    forced[:] = 0
    log_q[:] = 0.0
    for c in prange(n_chunks):
        lo, hi = _chunk(c, n_chunks, n)
        _select_rows(
            lo, hi, codes, keys, key_ptr, bucket_ptr, items, n_items, budget, reserve, label_ptr,
            label_ids, fill, seed, step, row0, shard, active, count, forced, log_q, marks[c],
        )  # fmt: skip


@njit(cache=True, parallel=True, nogil=True)
def output_logits(
    hidden, weights, bias, active, count, shift, n_chunks, z, stats
):  # pragma: no cover - compiled
    """Logits of the active neurons less ``shift``, and each sample's softmax statistics,
    written into ``z`` and ``stats`` (their values before do not matter).

    ``weights`` is ``(n_items, H)``; ``shift`` is ``(n, budget)`` (``log q``, or zeros) or
    ``(0, 0)``. ``z`` (``(n, budget)``): ``h . w_j + b_j - shift``, zero past ``count``;
    ``stats`` (``(n, 2)``): ``max z`` (``-inf`` with none) and ``sum exp(z - max)``.
    """
    shifted = shift.shape[0] > 0
    n = active.shape[0]
    width = hidden.shape[1]
    z[:] = 0.0
    for c in prange(n_chunks):
        lo, hi = _chunk(c, n_chunks, n)
        for b in range(lo, hi):
            top = -np.inf
            for a in range(count[b]):
                j = active[b, a]
                acc = bias[j]
                for d in range(width):
                    acc += hidden[b, d] * weights[j, d]
                if shifted:
                    acc -= shift[b, a]
                z[b, a] = acc
                if acc > top:
                    top = acc
            total = 0.0
            for a in range(count[b]):
                total += np.exp(z[b, a] - top)
            stats[b, 0] = top
            stats[b, 1] = total


@njit(cache=True, parallel=True, nogil=True)
def output_backward(
    hidden,
    weights,
    active,
    count,
    forced,
    z,
    lse,
    target,
    scale,
    grad_w,
    grad_b,
    touched,
    n_chunks,
):  # pragma: no cover - compiled
    """Backward pass of the sampled softmax on one shard.

    ``z`` from :func:`output_logits`; ``p = exp(z - lse)`` (softmax over every shard's active
    set); ``y = target[b]`` on the first ``forced[b]`` (labels). ``delta = scale * (p - y)``:
    ``grad_w[j] += delta * hidden[b]``, ``grad_b[j] += delta`` (``touched[j] = True``), and the
    input's partial gradient ``sum_j delta * weights[j]`` (weights before the step).

    Returns
    -------
    grad_hidden : (n, H) array
        This shard's part of ``dJ/dhidden``.
    loss : (n,) array
        This shard's part of each sample's loss, ``sum_labels y * (lse - z)``.
    """
    n = active.shape[0]
    width = hidden.shape[1]
    grad_hidden = np.zeros((n, width), dtype=hidden.dtype)
    loss = np.zeros(n, dtype=hidden.dtype)
    for c in prange(n_chunks):
        lo, hi = _chunk(c, n_chunks, n)
        for b in range(lo, hi):
            y = target[b]
            for a in range(count[b]):
                j = active[b, a]
                g = np.exp(z[b, a] - lse[b])
                if a < forced[b]:
                    g -= y
                    loss[b] += y * (lse[b] - z[b, a])
                g *= scale
                touched[j] = True
                grad_b[j] += g
                for d in range(width):
                    grad_hidden[b, d] += g * weights[j, d]
                    grad_w[j, d] += g * hidden[b, d]
    return grad_hidden, loss
