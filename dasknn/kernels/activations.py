"""Numba kernels of elementwise activations: one pass, no temporaries, no overflow warnings."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["sigmoid"]


@njit(cache=True, nogil=True)
def sigmoid(z, out):  # pragma: no cover - compiled
    """``out = 1 / (1 + exp(-z))`` on flat arrays; ``exp`` overflowing to ``inf`` gives 0.

    Parameters
    ----------
    z : 1-D float array
    out : 1-D float array of the length of ``z``
        Overwritten.
    """
    for i in range(z.shape[0]):
        out[i] = 1 / (1 + np.exp(-z[i]))
