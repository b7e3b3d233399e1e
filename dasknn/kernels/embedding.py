"""Numba kernels of an embedding layer: gather rows into windows, scatter-add row gradients. A
batch of ``B`` windows of ``c`` ids is ``inverse`` (B, c), positions in ``rows`` (u, d), the
batch's distinct rows; a window's rows are concatenated or summed times ``scale`` (``1 / c``: the
mean). Single-threaded, ``nogil``.
"""

from __future__ import annotations

from numba import njit

__all__ = ["gather_windows", "scatter_add_windows"]


@njit(cache=True, nogil=True)
def gather_windows(rows, inverse, concat, scale, out):  # pragma: no cover - compiled
    """Combine the rows of every window into ``out``.

    Parameters
    ----------
    rows : array (u, d)
        The distinct embedding rows of the batch.
    inverse : int array (B, c)
        Position in ``rows`` of every id of every window.
    concat : bool
        Concatenate (``out`` is (B, c * d)) or sum scaled by ``scale`` (``out`` is (B, d)).
    scale : scalar of the rows' dtype
        Factor of the sum (unused when concatenating).
    out : array
        Overwritten with the combined windows.
    """
    n_batch, context = inverse.shape
    dim = rows.shape[1]
    if concat:
        for b in range(n_batch):
            for j in range(context):
                r = inverse[b, j]
                for k in range(dim):
                    out[b, j * dim + k] = rows[r, k]
        return
    out[:] = 0
    for b in range(n_batch):
        for j in range(context):
            r = inverse[b, j]
            for k in range(dim):
                out[b, k] += rows[r, k]
        for k in range(dim):
            out[b, k] *= scale


@njit(cache=True, nogil=True)
def scatter_add_windows(grad_rows, inverse, concat, scale, grad_out):  # pragma: no cover
    """Add the gradient of the combined windows into the gradient of the distinct rows.

    The transpose of :func:`gather_windows`, in order, so repeated ids add up.

    Parameters
    ----------
    grad_rows : array (u, d)
        Accumulated in place (zero it first for a fresh gradient).
    inverse : int array (B, c)
    concat : bool
    scale : scalar of the rows' dtype
    grad_out : array (B, c * d) or (B, d)
        Gradient of the loss with respect to ``out`` of :func:`gather_windows`.
    """
    n_batch, context = inverse.shape
    dim = grad_rows.shape[1]
    for b in range(n_batch):
        for j in range(context):
            r = inverse[b, j]
            if concat:
                for k in range(dim):
                    grad_rows[r, k] += grad_out[b, j * dim + k]
            else:
                for k in range(dim):
                    grad_rows[r, k] += scale * grad_out[b, k]
