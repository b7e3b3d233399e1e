"""A lower bound on the words any balanced partition must exchange.

If a part holds at most ``s`` neurons of layer ``k``, the ``d`` consumers of an input neuron span
at least ``ceil(d / s)`` parts, so at least ``ceil(d / s) - 1`` of them are remote to its owner (the
owner is at best one of them): that many forward words and as many backward partial sums. With equal
neuron weights and ``epsilon < 1 / ceil(n / P)`` a balanced part holds at most ``s = ceil(n / P)``
neurons, which is the ``s`` used here.
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
        Words that every partition into ``nparts`` parts of at most ``ceil(n_out / nparts)``
        outputs exchanges at least: an input feeding ``c`` outputs reaches at least
        ``ceil(c / ceil(n_out / nparts))`` parts and is sent to all of them but one, forward and
        back.
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
        Number of parts.

    Returns
    -------
    int
        The sum of :func:`layer_volume_floor` over the layers.
    """
    return sum(layer_volume_floor(layer, nparts) for layer in layers)
