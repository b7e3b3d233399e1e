"""Numba kernels for training on one weight chunk ``W`` (CSR, ``(n_in, n_out)``) on feature-major
activations ``xt`` (``(n_features, B)``, ``x.T``), so every entry meets a contiguous run of
samples and nothing is transposed (docs/benchmarks.md, "Training kernels"). Single-threaded (the
parallelism is across workers) and ``nogil``.
"""

from __future__ import annotations

from numba import njit

__all__ = ["masked_outer_grad", "spmm_backward", "spmm_forward"]


@njit(cache=True, nogil=True)
def spmm_forward(xt, indptr, indices, data, outt, accumulate=False):  # pragma: no cover
    """``outt = W.T @ xt``: each stored ``(i, j)`` adds ``w * xt[i]`` to row ``j`` of ``outt``.

    Parameters
    ----------
    xt : array (n_in, B)
        Feature-major inputs.
    indptr, indices, data : CSR arrays of ``W`` (n_in, n_out)
        ``indptr`` may be a slice ``indptr[lo : hi + 1]`` of a larger matrix's, with ``xt`` the
        inputs ``lo:hi``.
    outt : array (n_out, B)
        Overwritten with the feature-major pre-activations (without bias), or added to with
        ``accumulate``.
    accumulate : bool
        Add the product to ``outt`` instead of overwriting it.
    """
    n_in, n_batch = xt.shape
    if not accumulate:
        outt[:] = 0
    if n_batch == 1:  # plain SGD: skip the zero inputs (ReLU networks, binary images)
        for i in range(n_in):
            xi = xt[i, 0]
            if xi != 0:
                for p in range(indptr[i], indptr[i + 1]):
                    outt[indices[p], 0] += data[p] * xi
        return
    for i in range(n_in):
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            w = data[p]
            for t in range(n_batch):
                outt[j, t] += w * xt[i, t]


@njit(cache=True, nogil=True)
def spmm_backward(deltat, indptr, indices, data, outt):  # pragma: no cover - compiled
    """``outt = W @ deltat``: row ``i`` of ``outt`` gathers ``w * deltat[j]`` over its entries.

    Parameters
    ----------
    deltat : array (n_out, B)
        Feature-major deltas of the layer's outputs.
    indptr, indices, data : CSR arrays of ``W`` (n_in, n_out)
    outt : array (n_in, B)
        Overwritten with the feature-major partial sums for the inputs.
    """
    n_in = indptr.shape[0] - 1
    n_batch = deltat.shape[1]
    if n_batch == 1:  # plain SGD: one dot product per row, summed in a register
        for i in range(n_in):
            acc = 0.0
            for p in range(indptr[i], indptr[i + 1]):
                acc += data[p] * deltat[indices[p], 0]
            outt[i, 0] = acc
        return
    for i in range(n_in):
        for t in range(n_batch):
            outt[i, t] = 0
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            w = data[p]
            for t in range(n_batch):
                outt[i, t] += w * deltat[j, t]


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def masked_outer_grad(xt, deltat, indptr, indices, scale, out):  # pragma: no cover - compiled
    """Gradient of ``W`` restricted to its pattern: ``out[p] = scale * (xt[i] . deltat[j])``.

    ``(i, j)`` is the position of stored entry ``p``; the dot product runs over the batch, summed
    in vector lanes. ``out`` has the length of ``indices``.
    """
    n_in, n_batch = xt.shape
    for i in range(n_in):
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            acc = xt[i, 0] * deltat[j, 0]
            for t in range(1, n_batch):
                acc += xt[i, t] * deltat[j, t]
            out[p] = scale * acc
