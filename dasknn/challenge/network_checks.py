"""The checks every challenge network passes before it runs: square layers of one width, finite
weights that fit the kernel's arithmetic, and (tiled CUDA mode) column degrees the footprint tiles
hold."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from dasknn.kernels.footprint_tiles import check_tileable

__all__ = ["CheckedNetwork", "check_network"]


class CheckedNetwork(NamedTuple):
    """What :func:`check_network` found: the width ``N``, the number of layers and of edges."""

    width: int
    layers: int
    edges: int


def check_network(
    matrices: Iterable[sp.csr_matrix], dtype: np.dtype, tiled: bool
) -> CheckedNetwork:
    """Check the layers of a network in one pass (each layer is let go once checked).

    Parameters
    ----------
    matrices : iterable of scipy.sparse.csr_matrix
        The layers, ``(N, N)`` each (a list, or an iterator that makes them one at a time).
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
    width, layers, edges = None, 0, 0
    degrees = []
    for k, m in enumerate(matrices):
        width = m.shape[0] if width is None else width
        if m.shape != (width, width):
            raise ValueError(f"layer {k + 1} has shape {m.shape}, expected ({width}, {width})")
        if not np.all(np.isfinite(m.data)):
            raise ValueError(f"layer {k + 1} has a weight that is NaN or infinite")
        if m.nnz and np.abs(m.data).max() > np.finfo(dtype).max:
            raise ValueError(f"layer {k + 1} has a weight that does not fit {dtype.name}")
        if tiled:
            degrees.append(np.bincount(sp.csr_matrix(m).indices, minlength=width))
        layers, edges = k + 1, edges + int(m.nnz)
    if width is None:
        raise ValueError("the network has no layers")
    if tiled:
        check_tileable(degrees)
    return CheckedNetwork(int(width), layers, edges)
