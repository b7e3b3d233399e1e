"""Magnitude pruning masks and the Early-Bird ticket detector.

A mask is a boolean array of a layer's shape, ``True`` where the weight is kept. Magnitude
pruning removes the ``round(p * phi)`` weights of smallest absolute value: over all layers
together (``scope="global"``, ``phi`` the weights of the network) or in each layer on its own
(``scope="layer"``, ``phi`` the layer's weights). Ties are broken by the flat index (the layers'
row-major entries one after the other): of equal magnitudes the earlier entry is pruned first.

Early-Bird (You et al., ICLR 2020, the pruning SAMO uses) draws a mask at the end of each training
epoch and keeps the last five; the ticket is found when the newest is within normalised Hamming
distance 0.1 (the fraction of weights on which two masks differ) of each of the other four.
You et al. prune channels, by batch-norm scales; the networks here are fully connected layers
without batch normalisation, so dasknn applies the same rule to single weights, by magnitude.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from numbers import Integral, Real

import numpy as np

__all__ = ["EarlyBird", "hamming_distance", "magnitude_masks"]

SCOPES = ("global", "layer")


def _check_sparsity(sparsity) -> float:
    if isinstance(sparsity, bool) or not isinstance(sparsity, Real):
        raise ValueError(f"sparsity must be a number in [0, 1), got {sparsity!r}")
    sparsity = float(sparsity)
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity must lie in [0, 1), got {sparsity}")
    return sparsity


def _check_weights(weights: Sequence) -> list[np.ndarray]:
    arrays = [np.asarray(w) for w in weights]
    if not arrays:
        raise ValueError("no weight matrices to prune")
    for k, w in enumerate(arrays):
        if w.ndim != 2 or w.size == 0:
            raise ValueError(f"weights[{k}] must be a non-empty 2-D array, got shape {w.shape}")
        if w.dtype.kind not in "fiu":
            raise ValueError(f"weights[{k}] must hold real numbers, got dtype {w.dtype}")
        if not np.isfinite(w).all():
            raise ValueError(f"weights[{k}] contains NaN or infinite values")
    return arrays


def _smallest(magnitudes: np.ndarray, count: int) -> np.ndarray:
    """Positions of the ``count`` smallest ``magnitudes``, ties to the lower position."""
    return np.argsort(magnitudes, kind="stable")[:count]


def magnitude_masks(weights: Sequence, sparsity: float, scope: str = "global") -> list[np.ndarray]:
    """Masks that keep all but the ``round(sparsity * phi)`` smallest-magnitude weights.

    Parameters
    ----------
    weights : sequence of 2-D arrays
        Dense layer matrices.
    sparsity : float
        Fraction ``p`` to prune, in ``[0, 1)``.
    scope : {"global", "layer"}
        Rank all weights together, or each layer on its own.

    Returns
    -------
    list of numpy.ndarray
        Boolean masks of the layers' shapes, ``True`` where a weight is kept.

    Raises
    ------
    ValueError
        For a sparsity outside ``[0, 1)``, an unknown scope, weights that are not non-empty
        finite 2-D arrays, or a mask that would prune a whole layer.
    """
    sparsity = _check_sparsity(sparsity)
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}; expected one of {SCOPES}")
    arrays = _check_weights(weights)
    masks = [np.ones(w.shape, dtype=bool) for w in arrays]
    if scope == "global":
        magnitudes = np.concatenate([np.abs(w, dtype=np.float64).ravel() for w in arrays])
        pruned = _smallest(magnitudes, int(round(sparsity * magnitudes.size)))
        flat = np.ones(magnitudes.size, dtype=bool)
        flat[pruned] = False
        start = 0
        for mask in masks:
            mask.reshape(-1)[...] = flat[start : start + mask.size]
            start += mask.size
    else:
        for w, mask in zip(arrays, masks, strict=True):
            pruned = _smallest(np.abs(w, dtype=np.float64).ravel(), int(round(sparsity * w.size)))
            mask.reshape(-1)[pruned] = False
    for k, mask in enumerate(masks):
        if not mask.any():
            raise ValueError(
                f"pruning to sparsity {sparsity} removes every weight of layer {k + 1}"
            )
    return masks


def hamming_distance(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    """Fraction of weights on which the masks ``a`` and ``b`` (lists of layers) differ.

    Parameters
    ----------
    a, b : sequence of numpy.ndarray
        Two masks of the same network, one array a layer (shapes equal layer by layer).

    Returns
    -------
    float
        Entries that differ over all entries, in ``[0, 1]``.
    """
    differ = sum(int(np.count_nonzero(x != y)) for x, y in zip(a, b, strict=True))
    return differ / sum(x.size for x in a)


class EarlyBird:
    """Detects the Early-Bird ticket: masks drawn once per epoch stop changing.

    Parameters
    ----------
    sparsity : float
        Pruned fraction of each drawn mask, in ``[0, 1)``.
    scope : {"global", "layer"}
        As in :func:`magnitude_masks`.
    window : int
        Masks kept (5).
    threshold : float
        Largest normalised Hamming distance between the newest mask and each older kept one (0.1).

    Attributes
    ----------
    masks_ : deque of lists of arrays
        The last ``window`` masks, oldest first.
    distances_ : list of float
        Per :meth:`update`, the largest distance from the newest mask to the older kept ones
        (``nan`` while fewer than ``window`` masks are kept).
    found_ : bool
    """

    def __init__(
        self, sparsity: float, scope: str = "global", window: int = 5, threshold: float = 0.1
    ) -> None:
        self.sparsity = _check_sparsity(sparsity)
        if scope not in SCOPES:
            raise ValueError(f"unknown scope {scope!r}; expected one of {SCOPES}")
        self.scope = scope
        if isinstance(window, bool) or not isinstance(window, Integral) or window < 2:
            raise ValueError(f"window must be an integer >= 2, got {window!r}")
        self.window = int(window)
        if not (isinstance(threshold, Real) and 0.0 <= float(threshold) <= 1.0):
            raise ValueError(f"threshold must lie in [0, 1], got {threshold!r}")
        self.threshold = float(threshold)
        self.masks_: deque = deque(maxlen=self.window)
        self.distances_: list[float] = []
        self.found_ = False

    def update(self, weights: Sequence) -> bool:
        """Draw the mask of ``weights`` (the model after an epoch); returns whether the ticket is
        found (the newest mask is within the threshold of each of the other kept ones)."""
        newest = magnitude_masks(weights, self.sparsity, self.scope)
        self.masks_.append(newest)
        if len(self.masks_) < self.window:
            self.distances_.append(float("nan"))
            return False
        distance = max(hamming_distance(newest, old) for old in list(self.masks_)[:-1])
        self.distances_.append(distance)
        self.found_ = distance <= self.threshold
        return self.found_

    @property
    def mask_(self) -> list[np.ndarray]:
        """The newest mask."""
        if not self.masks_:
            raise AttributeError("no mask drawn yet: call update() after an epoch")
        return self.masks_[-1]
