"""Numba kernels of compressed model states: compress, expand, and a layer's products from the
values at a sorted int32 flat index (``i * n_out + j``, CSR order; ``row_ptr`` marks each row's
first entry, the column is ``index[p] - i * n_out``). Feature-major activations as in
:mod:`dasknn.kernels.training`; single-threaded, ``nogil``.
"""

from __future__ import annotations

from numba import njit

__all__ = [
    "compress",
    "expand",
    "flat_forward",
    "flat_backward",
    "flat_masked_grad",
    "row_pointers",
]


@njit(cache=True, nogil=True)
def compress(dense, index, out):  # pragma: no cover - compiled
    """``out[p] = dense.flat[index[p]]``: the entries of ``dense`` (any C-contiguous array,
    viewed flat) at the index. 16-bit values move as their bits (``uint16`` views)."""
    flat = dense.reshape(-1)
    for p in range(index.shape[0]):
        out[p] = flat[index[p]]


@njit(cache=True, nogil=True)
def expand(values, index, out):  # pragma: no cover - compiled
    """``out`` (viewed flat) is set to zero and ``out.flat[index[p]] = values[p]``."""
    flat = out.reshape(-1)
    flat[:] = 0
    for p in range(index.shape[0]):
        flat[index[p]] = values[p]


@njit(cache=True, nogil=True)
def row_pointers(index, n_in, n_out, out):  # pragma: no cover - compiled
    """``out[i]``: the position in the sorted ``index`` of row ``i``'s first entry
    (``out[n_in] = len(index)``)."""
    p = 0
    nnz = index.shape[0]
    for i in range(n_in):
        out[i] = p
        end = (i + 1) * n_out
        while p < nnz and index[p] < end:
            p += 1
    out[n_in] = nnz


@njit(cache=True, nogil=True)
def flat_forward(xt, row_ptr, index, n_out, values, outt):  # pragma: no cover - compiled
    """``outt = W.T @ xt`` for the compressed ``W``: entry ``p`` at ``(i, j)`` adds
    ``values[p] * xt[i]`` to row ``j`` of ``outt``.

    Parameters
    ----------
    xt : array (n_in, B)
    row_ptr, index : int arrays
        Row pointers and sorted flat index of the layer.
    n_out : int
    values : array (nnz,)
        The compressed weights (any float dtype; products in ``outt``'s dtype).
    outt : array (n_out, B)
        Overwritten.
    """
    n_in, n_batch = xt.shape
    outt[:] = 0
    for i in range(n_in):
        base = i * n_out
        for p in range(row_ptr[i], row_ptr[i + 1]):
            j = index[p] - base
            w = values[p]
            for t in range(n_batch):
                outt[j, t] += w * xt[i, t]


@njit(cache=True, nogil=True)
def flat_backward(deltat, row_ptr, index, n_out, values, outt):  # pragma: no cover - compiled
    """``outt = W @ deltat`` for the compressed ``W``: row ``i`` gathers ``values[p] *
    deltat[j]`` over its entries. ``outt`` (n_in, B) is overwritten."""
    n_in = row_ptr.shape[0] - 1
    n_batch = deltat.shape[1]
    for i in range(n_in):
        for t in range(n_batch):
            outt[i, t] = 0
        base = i * n_out
        for p in range(row_ptr[i], row_ptr[i + 1]):
            j = index[p] - base
            w = values[p]
            for t in range(n_batch):
                outt[i, t] += w * deltat[j, t]


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def flat_masked_grad(
    xt, deltat, row_ptr, index, n_out, accumulate, out
):  # pragma: no cover - compiled
    """The compressed gradient ``xt[i] . deltat[j]`` (sum over the batch) of entry ``p`` at
    ``(i, j)``, produced compressed, never dense: stored in ``out[p]``, or added to it when
    ``accumulate`` (gradients summed over microbatches)."""
    n_in, n_batch = xt.shape
    for i in range(n_in):
        base = i * n_out
        for p in range(row_ptr[i], row_ptr[i + 1]):
            j = index[p] - base
            acc = xt[i, 0] * deltat[j, 0]
            for t in range(1, n_batch):
                acc += xt[i, t] * deltat[j, t]
            if accumulate:
                out[p] += acc
            else:
                out[p] = acc
