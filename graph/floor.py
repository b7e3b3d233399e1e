"""A lower bound on the words any balanced partition must exchange: with at most ``s = ceil(n / P)``
neurons of a layer a part, an input with ``d`` consumers reaches ``ceil(d / s) - 1`` remote parts,
forward and back (docs/partitioning.md, "The floor").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

__all__ = ["volume_floor", "layer_volume_floor"]


def layer_volume_floor(layer: sp.spmatrix, nparts: int) -> int:
    """Least words (forward plus backward) one layer exchanges, ``ceil(n_out/nparts)`` per part.

    Parameters
    ----------
    layer : scipy.sparse matrix ``(n_in, n_out)``
        The layer's connections.
    nparts : int
        Number of parts; no part owns more than ``ceil(n_out / nparts)`` outputs.

    Returns
    -------
    int
        The least words: ``2 * sum_i max(ceil(c_i / ceil(n_out / nparts)) - 1, 0)`` over inputs
        ``i`` feeding ``c_i`` outputs.
    """
    layer = sp.csr_matrix(layer)
    per_part = -(-layer.shape[1] // nparts)
    consumers = np.diff(layer.indptr)
    remote = np.maximum(-(-consumers // per_part) - 1, 0)
    return int(2 * remote.sum())


def volume_floor(layers: Sequence[sp.spmatrix], nparts: int) -> int:
    """Least total words of all layers; divide by ``nparts`` for the floor of the average.

    Parameters
    ----------
    layers : sequence of scipy.sparse matrices
        The network's layers, ``(n_in, n_out)`` each.
    nparts : int

    Returns
    -------
    int
        The sum of :func:`layer_volume_floor` over the layers.
    """
    return sum(layer_volume_floor(layer, nparts) for layer in layers)
