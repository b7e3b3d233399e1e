"""Maximum inner product search with an angular hash: simple-LSH (Neyshabur & Srebro, ICML'15) on
centred items with a bias.

Items ``u_j = (w_j - mean w, b_j - mean b)`` are scaled by their largest norm ``M`` and completed to
unit length, ``x_j = (u_j / M, sqrt(1 - |u_j|^2 / M^2))``; the query is ``y = (h, 1, 0)``. Then
``x_j . y = (z_j - c(h)) / M`` with ``c(h)`` the same for every item, so the angle falls as the
logit ``z_j = h . w_j + b_j`` grows (docs/sampled.md).
"""

from __future__ import annotations

import numpy as np

from dasknn.kernels.lsh import mips_transform

__all__ = ["mips_items", "mips_queries"]


def mips_items(weights: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """The unit item vectors ``(n, H + 2)`` of neuron-major ``weights`` ``(n, H)`` and ``bias``.

    Parameters
    ----------
    weights : numpy.ndarray ``(n, H)``
        One row a neuron.
    bias : numpy.ndarray ``(n,)``
        The neurons' biases.

    Returns
    -------
    numpy.ndarray ``(n, H + 2)``, ``weights``' dtype
        ``x_j = (u_j / M, sqrt(1 - |u_j|^2 / M^2))`` (see the module docstring).
    """
    weights = np.ascontiguousarray(weights)
    return mips_transform(weights, np.ascontiguousarray(bias, dtype=weights.dtype))


def mips_queries(hidden: np.ndarray) -> np.ndarray:
    """The query vectors ``(B, H + 2)`` of layer inputs ``hidden`` ``(B, H)``: ``(h, 1, 0)``.

    Parameters
    ----------
    hidden : numpy.ndarray ``(B, H)``
        The layer's inputs, one row a sample.

    Returns
    -------
    numpy.ndarray ``(B, H + 2)``, ``hidden``'s dtype
    """
    queries = np.zeros((hidden.shape[0], hidden.shape[1] + 2), dtype=hidden.dtype)
    queries[:, :-2] = hidden
    queries[:, -2] = 1
    return queries
