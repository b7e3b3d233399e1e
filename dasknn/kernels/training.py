"""Numba kernels for training on one weight chunk.

A chunk is a CSR matrix ``W`` of shape ``(n_in, n_out)`` given by its arrays ``(indptr, indices,
data)``; batches are row blocks (``B`` samples a block, C-contiguous). These kernels are the only
per-element arithmetic of the training path: the single-process model and every worker of the
model-parallel runtime call them.

Batches of at least ``FEATURE_MAJOR_MIN_BATCH`` samples are processed on feature-major copies
(``x.T``, ``delta.T``, made by a blocked transpose): every stored entry of ``W`` then meets a
contiguous run of samples, and the innermost loops are SIMD-vectorised. The two products go
through the batch in blocks of 512 bytes of samples per feature (64 float64 or 128 float32), which
keeps the activations one block reads in a smaller part of the cache hierarchy (0.5 MiB, the L2 of
a core here, for 1024 features; 1.8-2x faster in float64 at B = 256). Smaller
batches (plain SGD) use row-wise loops that skip zero inputs. The kernels are single-threaded on
purpose: the parallelism is across Dask workers (one thread each), and ``parallel=True`` variants
measured slower on the 2-core test machine even in one process (see ``docs/benchmarks.md``,
``## Training kernels``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["FEATURE_MAJOR_MIN_BATCH", "spmm_forward", "spmm_backward", "masked_outer_grad"]

FEATURE_MAJOR_MIN_BATCH = 8
_TILE = 32
_BLOCK_BYTES = 512


@njit(cache=True)
def _transpose(a, out):  # pragma: no cover - compiled
    """``out = a.T`` for 2-D arrays, in tiles of 32 x 32."""
    n_rows, n_cols = a.shape
    for r0 in range(0, n_rows, _TILE):
        r1 = min(r0 + _TILE, n_rows)
        for c0 in range(0, n_cols, _TILE):
            c1 = min(c0 + _TILE, n_cols)
            for c in range(c0, c1):
                for r in range(r0, r1):
                    out[c, r] = a[r, c]


@njit(cache=True)
def _forward_feature_major(xt, indptr, indices, data, outt):  # pragma: no cover - compiled
    """``outt = W.T @ xt``: each stored ``(i, j)`` adds ``w * xt[i]`` to row ``j`` of ``outt``."""
    n_in, n_batch = xt.shape
    outt[:] = 0
    for i in range(n_in):
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            w = data[p]
            for t in range(n_batch):
                outt[j, t] += w * xt[i, t]


@njit(cache=True)
def _backward_feature_major(deltat, indptr, indices, data, outt):  # pragma: no cover - compiled
    """``outt = W @ deltat``: row ``i`` of ``outt`` gathers ``w * deltat[j]`` over its entries."""
    n_in = indptr.shape[0] - 1
    n_batch = deltat.shape[1]
    for i in range(n_in):
        for t in range(n_batch):
            outt[i, t] = 0
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            w = data[p]
            for t in range(n_batch):
                outt[i, t] += w * deltat[j, t]


@njit(cache=True, fastmath={"reassoc", "contract"})
def _grad_feature_major(xt, deltat, indptr, indices, scale, out):  # pragma: no cover - compiled
    """``out[p] = scale * (xt[i] . deltat[j])``, the dot products summed in vector lanes."""
    n_in, n_batch = xt.shape
    for i in range(n_in):
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            acc = xt[i, 0] * deltat[j, 0]
            for t in range(1, n_batch):
                acc += xt[i, t] * deltat[j, t]
            out[p] = scale * acc


@njit(cache=True)
def _forward_rows(x, indptr, indices, data, out):  # pragma: no cover - compiled
    n_batch, n_in = x.shape
    out[:] = 0
    for b in range(n_batch):
        for i in range(n_in):
            xi = x[b, i]
            if xi != 0:
                for p in range(indptr[i], indptr[i + 1]):
                    out[b, indices[p]] += xi * data[p]


@njit(cache=True)
def _backward_rows(delta, indptr, indices, data, out):  # pragma: no cover - compiled
    n_batch = delta.shape[0]
    n_in = indptr.shape[0] - 1
    for b in range(n_batch):
        for i in range(n_in):
            out[b, i] = 0
            for p in range(indptr[i], indptr[i + 1]):
                out[b, i] += data[p] * delta[b, indices[p]]


@njit(cache=True)
def _grad_rows(x, delta, indptr, indices, scale, out):  # pragma: no cover - compiled
    n_in = indptr.shape[0] - 1
    out[:] = 0
    for b in range(x.shape[0]):
        for i in range(n_in):
            xi = x[b, i]
            if xi != 0:
                for p in range(indptr[i], indptr[i + 1]):
                    out[p] += xi * delta[b, indices[p]]
    for p in range(out.shape[0]):
        out[p] *= scale


@njit(cache=True)
def spmm_forward(x, indptr, indices, data, out):  # pragma: no cover - compiled
    """``out[b, :] = x[b, :] @ W`` for every sample ``b``; ``out`` is overwritten.

    Parameters
    ----------
    x : array (B, n_in)
    indptr, indices, data : CSR arrays of ``W`` (n_in, n_out)
    out : array (B, n_out)
    """
    n_batch = x.shape[0]
    if n_batch < FEATURE_MAJOR_MIN_BATCH:
        _forward_rows(x, indptr, indices, data, out)
        return
    block = _BLOCK_BYTES // x.itemsize
    for lo in range(0, n_batch, block):
        hi = min(lo + block, n_batch)
        xt = np.empty((x.shape[1], hi - lo), dtype=x.dtype)
        _transpose(x[lo:hi], xt)
        outt = np.empty((out.shape[1], hi - lo), dtype=out.dtype)
        _forward_feature_major(xt, indptr, indices, data, outt)
        _transpose(outt, out[lo:hi])


@njit(cache=True)
def spmm_backward(delta, indptr, indices, data, out):  # pragma: no cover - compiled
    """``out[b, :] = delta[b, :] @ W.T`` for every sample ``b``; ``out`` is overwritten.

    Parameters
    ----------
    delta : array (B, n_out)
    indptr, indices, data : CSR arrays of ``W`` (n_in, n_out)
    out : array (B, n_in)
    """
    n_batch = delta.shape[0]
    if n_batch < FEATURE_MAJOR_MIN_BATCH:
        _backward_rows(delta, indptr, indices, data, out)
        return
    block = _BLOCK_BYTES // delta.itemsize
    for lo in range(0, n_batch, block):
        hi = min(lo + block, n_batch)
        deltat = np.empty((delta.shape[1], hi - lo), dtype=delta.dtype)
        _transpose(delta[lo:hi], deltat)
        outt = np.empty((out.shape[1], hi - lo), dtype=out.dtype)
        _backward_feature_major(deltat, indptr, indices, data, outt)
        _transpose(outt, out[lo:hi])


@njit(cache=True)
def masked_outer_grad(x, delta, indptr, indices, scale, out):  # pragma: no cover - compiled
    """Gradient of ``W`` restricted to its pattern: ``out[p] = scale * sum_b x[b, i] delta[b, j]``.

    ``(i, j)`` is the position of stored entry ``p``. ``out`` has the length of ``indices``.
    """
    n_batch = x.shape[0]
    if n_batch < FEATURE_MAJOR_MIN_BATCH:
        _grad_rows(x, delta, indptr, indices, scale, out)
        return
    xt = np.empty((x.shape[1], n_batch), dtype=x.dtype)
    _transpose(x, xt)
    deltat = np.empty((delta.shape[1], n_batch), dtype=delta.dtype)
    _transpose(delta, deltat)
    _grad_feature_major(xt, deltat, indptr, indices, scale, out)
