"""The checks every challenge network passes before it runs: square layers of one width, finite
weights that fit the kernel's arithmetic, and (tiled CUDA mode) column degrees the footprint tiles
hold."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dasknn.kernels.footprint_tiles import check_tileable

__all__ = ["check_network"]


def check_network(matrices: list[sp.csr_matrix], dtype: np.dtype, tiled: bool) -> int:
    """Check the layers of a network and return its width.

    Parameters
    ----------
    matrices : list of scipy.sparse.csr_matrix
        The layers, ``(N, N)`` each.
    dtype : numpy dtype
        The kernel's arithmetic, which every weight must fit.
    tiled : bool
        Check that every column fits a footprint (tiled CUDA mode).

    Raises
    ------
    ValueError
        Naming the first layer that has no layers, a shape other than ``(N, N)``, a NaN or
        infinite weight, a weight beyond ``dtype``, or (``tiled``) a column too long.
    """
    if not matrices:
        raise ValueError("the network has no layers")
    width = matrices[0].shape[0]
    for k, m in enumerate(matrices):
        if m.shape != (width, width):
            raise ValueError(f"layer {k + 1} has shape {m.shape}, expected ({width}, {width})")
        if not np.all(np.isfinite(m.data)):
            raise ValueError(f"layer {k + 1} has a weight that is NaN or infinite")
        if m.nnz and np.abs(m.data).max() > np.finfo(dtype).max:
            raise ValueError(f"layer {k + 1} has a weight that does not fit {dtype.name}")
    if tiled:
        check_tileable(np.bincount(sp.csr_matrix(m).indices, minlength=width) for m in matrices)
    return int(width)
