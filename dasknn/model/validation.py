"""Checks of what a caller gives a model: input batches and targets.

Shared by :class:`dasknn.model.SparseMLP` and the model-parallel runtime so that both reject bad
input with the same clear ``ValueError`` before any work is done.
"""

from __future__ import annotations

from numbers import Integral

import numpy as np
import scipy.sparse as sp

from dasknn.model.losses import Loss
from graph.checks import check_csr

__all__ = [
    "check_batch_size",
    "check_epochs",
    "check_bias",
    "check_inputs",
    "check_layer",
    "check_learning_rate",
    "check_targets",
    "epoch_batches",
]


def check_inputs(X, n_inputs: int, dtype: np.dtype) -> np.ndarray:
    """Return ``X`` as a C-contiguous ``(B, n_inputs)`` array of ``dtype``.

    Parameters
    ----------
    X : array-like or scipy.sparse matrix of shape (B, n_inputs)
        A batch of samples, one per row.
    n_inputs : int
        Width of the network's input layer.
    dtype : numpy dtype
        The model's value type.

    Raises
    ------
    ValueError
        If ``X`` is not 2-D, has no rows, has the wrong width, or holds NaN or infinite values.
    """
    if sp.issparse(X):
        X = X.toarray()
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"X must be a 2-D array (samples, features), got shape {X.shape}")
    if X.shape[1] != n_inputs:
        raise ValueError(
            f"X has {X.shape[1]} features per sample but the network's input layer has {n_inputs}"
        )
    if X.shape[0] == 0:
        raise ValueError("X has no samples (0 rows; at least one is needed)")
    return _finite_real(X, "X", dtype)


def _finite_real(A: np.ndarray, name: str, dtype: np.dtype) -> np.ndarray:
    """``A`` as a C-contiguous array of ``dtype``, checked to hold finite real numbers."""
    if not np.issubdtype(A.dtype, np.number) or np.iscomplexobj(A):
        raise ValueError(f"{name} must hold real numbers, got dtype {A.dtype}")
    A = np.ascontiguousarray(A, dtype=dtype)
    if not np.isfinite(A).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return A


def check_targets(Y, n_samples: int, n_outputs: int, loss: Loss, dtype: np.dtype) -> np.ndarray:
    """Return the targets as a C-contiguous ``(n_samples, n_outputs)`` array of ``dtype``.

    For ``softmax_cross_entropy`` a 1-D array of integer class labels in ``[0, n_outputs)`` is also
    accepted and turned into one-hot rows.

    Raises
    ------
    ValueError
        If the shape does not match ``(n_samples, n_outputs)``, a label is out of range, or a
        value is NaN or infinite.
    """
    if sp.issparse(Y):
        Y = Y.toarray()
    Y = np.asarray(Y)
    if Y.ndim == 1 and loss.name == "softmax_cross_entropy":
        if not np.issubdtype(Y.dtype, np.integer):
            raise ValueError(f"1-D class labels must be integers, got dtype {Y.dtype}")
        if Y.shape[0] != n_samples:
            raise ValueError(
                f"got {Y.shape[0]} labels for {n_samples} samples (one per row of X: its rows "
                "and the labels' length differ)"
            )
        if Y.size and (Y.min() < 0 or Y.max() >= n_outputs):
            raise ValueError(
                f"class labels must lie in [0, {n_outputs}), got range [{Y.min()}, {Y.max()}]"
            )
        onehot = np.zeros((n_samples, n_outputs), dtype=dtype)
        onehot[np.arange(n_samples), Y] = 1
        return onehot
    if Y.shape != (n_samples, n_outputs):
        accepted = f"({n_samples}, {n_outputs})"
        if loss.name == "softmax_cross_entropy":
            accepted += f" or integer labels of shape ({n_samples},)"
        raise ValueError(f"Y must have shape {accepted}, got {Y.shape}")
    return _finite_real(Y, "Y", dtype)


def check_layer(w, k: int, dtype: np.dtype) -> sp.csr_matrix:
    """Own CSR copy of the weights ``weights[k]`` in ``dtype`` with sorted, duplicate-free
    indices.

    The arrays are checked by :func:`graph.checks.check_csr` first (bounds, ``indptr``, finite
    values); the values are checked again once cast to ``dtype``, where they may overflow.
    ``ValueError`` naming ``weights[k]``.
    """
    csr = sp.csr_matrix(check_csr(w, name=f"weights[{k}]"), dtype=dtype, copy=True)
    csr.sum_duplicates()
    csr.sort_indices()
    if not np.isfinite(csr.data).all():
        raise ValueError(f"weights[{k}] contains NaN or infinite values")
    return csr


def check_bias(b, k: int, size: int, dtype: np.dtype) -> np.ndarray:
    """Own copy of the bias ``biases[k]`` in ``dtype``; ``ValueError`` naming it unless it has
    ``size`` finite values."""
    b = np.array(b, dtype=dtype, copy=True)
    if b.shape != (size,):
        raise ValueError(f"biases[{k}] must have shape ({size},), got {b.shape}")
    if not np.isfinite(b).all():
        raise ValueError(f"biases[{k}] contains NaN or infinite values")
    return b


def check_float_dtype(dtype) -> np.dtype:
    """Return ``dtype`` as a numpy dtype; ``ValueError`` unless it is float32 or float64 (the
    arithmetic of every model and kernel)."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    return dtype


def check_learning_rate(lr: float) -> float:
    """Return ``lr`` as a float; ``ValueError`` unless it is finite and >= 0."""
    lr = float(lr)
    if not np.isfinite(lr) or lr < 0:
        raise ValueError(f"learning rate must be a finite number >= 0, got {lr}")
    return lr


def _is_integer(value) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def check_count(name: str, value, low: int = 1) -> int:
    """Return ``value`` as an int; ``ValueError`` naming ``name`` unless it is an integer >=
    ``low``."""
    if not _is_integer(value) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def check_batch_size(batch_size: int) -> int:
    """Return ``batch_size`` as an int; ``ValueError`` unless it is an integer >= 1."""
    if not _is_integer(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    return int(batch_size)


def check_in_flight(in_flight: int) -> int:
    """Return ``in_flight`` (blocks on the workers at once) as an int; ``ValueError`` unless it
    is an integer >= 1."""
    if not _is_integer(in_flight) or in_flight < 1:
        raise ValueError(f"in_flight must be an integer >= 1, got {in_flight!r}")
    return int(in_flight)


def check_epochs(epochs: int) -> int:
    """Return ``epochs`` as an int; ``ValueError`` unless it is an integer >= 0."""
    if not _is_integer(epochs) or epochs < 0:
        raise ValueError(f"epochs must be an integer >= 0, got {epochs!r}")
    return int(epochs)


def epoch_batches(
    n: int, batch_size: int, rng: np.random.Generator, shuffle: bool
) -> list[np.ndarray]:
    """The sample indices of one epoch's batches: a permutation from ``rng`` cut in blocks.

    Every trainer draws its batches here, so the single-process and the model-parallel ``fit``
    take the same steps for the same seed.
    """
    order = rng.permutation(n) if shuffle else np.arange(n)
    return [order[start : start + batch_size] for start in range(0, n, batch_size)]

