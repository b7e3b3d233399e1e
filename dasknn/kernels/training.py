"""Numba kernels for training on one weight chunk.

A chunk is a CSR matrix ``W`` of shape ``(n_in, n_out)`` given by its arrays ``(indptr, indices,
data)``; batches are row blocks (``B`` samples a block, C-contiguous). These kernels are the only
per-element arithmetic of the training path: the single-process model and every worker of the
model-parallel runtime call them.
"""

from __future__ import annotations

from numba import njit, prange

__all__ = ["spmm_forward", "spmm_backward", "masked_outer_grad"]


@njit(parallel=True, cache=True, fastmath=False)
def spmm_forward(x, indptr, indices, data, out):  # pragma: no cover - compiled
    """``out[b, :] = x[b, :] @ W`` for every sample ``b``; ``out`` is overwritten.

    Parameters
    ----------
    x : array (B, n_in)
    indptr, indices, data : CSR arrays of ``W`` (n_in, n_out)
    out : array (B, n_out)
    """
    n_batch, n_in = x.shape
    for b in prange(n_batch):
        row = out[b]
        row[:] = 0
        xb = x[b]
        for i in range(n_in):
            xi = xb[i]
            if xi != 0:
                for p in range(indptr[i], indptr[i + 1]):
                    row[indices[p]] += xi * data[p]


@njit(parallel=True, cache=True, fastmath=False)
def spmm_backward(delta, indptr, indices, data, out):  # pragma: no cover - compiled
    """``out[b, :] = delta[b, :] @ W.T`` for every sample ``b``; ``out`` is overwritten.

    Parameters
    ----------
    delta : array (B, n_out)
    indptr, indices, data : CSR arrays of ``W`` (n_in, n_out)
    out : array (B, n_in)
    """
    n_batch = delta.shape[0]
    n_in = indptr.shape[0] - 1
    for b in prange(n_batch):
        db = delta[b]
        for i in range(n_in):
            acc = 0.0
            for p in range(indptr[i], indptr[i + 1]):
                acc += data[p] * db[indices[p]]
            out[b, i] = acc


@njit(parallel=True, cache=True, fastmath=False)
def masked_outer_grad(x, delta, indptr, indices, scale, out):  # pragma: no cover - compiled
    """Gradient of ``W`` restricted to its pattern: ``out[p] = scale * sum_b x[b, i] delta[b, j]``.

    ``(i, j)`` is the position of stored entry ``p``. ``out`` has the length of ``indices``.
    """
    n_in = indptr.shape[0] - 1
    n_batch = x.shape[0]
    for i in prange(n_in):
        for p in range(indptr[i], indptr[i + 1]):
            out[p] = 0
        for b in range(n_batch):
            xi = x[b, i]
            if xi != 0:
                db = delta[b]
                for p in range(indptr[i], indptr[i + 1]):
                    out[p] += xi * db[indices[p]]
        for p in range(indptr[i], indptr[i + 1]):
            out[p] *= scale
