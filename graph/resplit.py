"""Re-split classes of identical neurons against the next layer, exactly: a class's occupied
places are re-dealt to its members to maximise the neurons owned by one of their consumer parts
(input ``j`` of layer ``k+1`` costs ``|C_j| - [owner(j) in C_j]`` words a direction), a linear
assignment per class (docs/partitioning.md, "Two-sided refinement").
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linear_sum_assignment

from graph.hypergraph import identical_classes

__all__ = ["resplit_classes"]


def resplit_classes(
    layer: sp.spmatrix, parts: np.ndarray, consumer_parts: sp.csr_matrix
) -> np.ndarray:
    """Permute the parts of identical neurons of ``layer`` to suit the next layer's consumers.

    Parameters
    ----------
    layer : scipy.sparse matrix
        The stored layer ``k`` (its columns are the neurons being re-dealt).
    parts : numpy.ndarray
        Present part of every neuron of layer ``k``.
    consumer_parts : scipy.sparse.csr_matrix
        ``(n_out, nparts)``, nonzero where a part consumes the neuron in layer ``k+1``.

    Returns
    -------
    numpy.ndarray
        New parts: the same multiset of parts within every class, never fewer neurons owned by one
        of their consumers.
    """
    by_column = sp.csc_matrix(layer)
    by_column.sort_indices()
    weights = np.diff(by_column.indptr)
    classes = identical_classes(by_column.indptr, by_column.indices, weights)
    order = np.argsort(classes, kind="stable")
    bounds = np.flatnonzero(np.diff(classes[order])) + 1
    consumers = sp.csr_matrix(consumer_parts)
    result = np.array(parts, dtype=np.int64, copy=True)
    for members in np.split(order, bounds):
        places = result[members]
        if len(members) < 2 or np.all(places == places[0]):
            continue
        profit = consumers[members][:, places].toarray()
        rows, cols = linear_sum_assignment(profit, maximize=True)
        result[members[rows]] = places[cols]
    return result
