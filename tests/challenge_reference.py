"""Independent float64 numpy reference of the Graph Challenge's inference, for the engine tests.

It shares no code with ``dasknn``: dense matrices and the challenge's rule written out again,
``Y = min(max(Y W + b, 0), ymax)`` with the bias on the nonzero sums only.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def reference_activations(inputs, layers, bias: float, ymax: float = 32.0) -> np.ndarray:
    """The activations after every layer, in float64 numpy."""
    y = sp.csr_matrix(inputs).toarray().astype(np.float64)
    for w in layers:
        z = y @ sp.csr_matrix(w).toarray().astype(np.float64)
        y = np.where(z != 0, np.clip(z + bias, 0.0, ymax), 0.0)
    return y


def reference_categories(inputs, layers, bias: float, ymax: float = 32.0) -> np.ndarray:
    """0-based ids of the rows not all zero after every layer, in float64 numpy."""
    return np.flatnonzero(reference_activations(inputs, layers, bias, ymax).any(axis=1))
