"""Checks of the sampled network's inputs, hyperparameters and labels, made before any work."""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp

from dasknn.lsh import FAMILIES, MAX_CODE_BITS, check_bucket_size

__all__ = [
    "CORRECTIONS",
    "HASHINGS",
    "HIDDEN_UPDATES",
    "UNDERFLOW_MODES",
    "check_features",
    "check_k",
    "check_hyperparameters",
    "check_labels",
    "check_positive_int",
]

UNDERFLOW_MODES = ("fill", "stop")
CORRECTIONS = ("none", "logq")
HASHINGS = ("plain", "mips")
HIDDEN_UPDATES = ("rows", "all")


def check_positive_int(name: str, value) -> int:
    """``value`` as an int; ``ValueError`` unless it is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def check_k(k, n_labels: int | None = None) -> int:
    """``k`` of a top-``k`` as an int; ``ValueError`` unless it is an integer >= 1 and, given
    ``n_labels``, at most the model's labels."""
    if isinstance(k, bool) or not isinstance(k, Integral) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    if n_labels is not None and k > n_labels:
        raise ValueError(f"k is {k}, but the model has only {n_labels} labels")
    return int(k)


def check_hyperparameters(model) -> None:
    """Check the hyperparameters of a :class:`~dasknn.sampled.SampledMLP` (``ValueError``)."""
    for name in ("hidden", "k", "n_tables", "rehash_every", "rebuild_every", "shards"):
        check_positive_int(name, getattr(model, name))
    check_bucket_size(model.bucket_size)
    if model.hash_family not in FAMILIES:
        raise ValueError(
            f"unknown hash family {model.hash_family!r}; expected one of {sorted(FAMILIES)}"
        )
    if model.underflow not in UNDERFLOW_MODES:
        raise ValueError(
            f"unknown underflow mode {model.underflow!r}; expected one of {UNDERFLOW_MODES}"
        )
    if model.correction not in CORRECTIONS:
        raise ValueError(
            f"unknown sampled-softmax correction {model.correction!r}; expected one of "
            f"{CORRECTIONS}"
        )
    if model.hashing not in HASHINGS:
        raise ValueError(f"unknown hashing {model.hashing!r}; expected one of {HASHINGS}")
    if model.hidden_update not in HIDDEN_UPDATES:
        raise ValueError(
            f"unknown hidden_update {model.hidden_update!r}; expected one of {HIDDEN_UPDATES}"
        )
    share = model.uniform_fraction
    if (
        isinstance(share, bool)
        or not isinstance(share, Real)
        or not np.isfinite(share)
        or not 0 <= share < 1
    ):
        raise ValueError(f"uniform_fraction must lie in [0, 1), got {share!r}")
    if share > 0 and model.underflow != "fill":
        raise ValueError(
            f"uniform_fraction={share!r} > 0 needs underflow='fill' (the fill draws them); "
            "set uniform_fraction=0 with underflow='stop'"
        )
    fraction = model.active_fraction
    if (
        isinstance(fraction, bool)
        or not isinstance(fraction, Real)
        or not np.isfinite(fraction)
        or not 0 < fraction <= 1
    ):
        raise ValueError(f"active_fraction must lie in (0, 1], got {fraction!r}")
    decay = model.lr_decay
    if (
        isinstance(decay, bool)
        or not isinstance(decay, Real)
        or not np.isfinite(decay)
        or not 0 <= decay <= 1
    ):
        raise ValueError(f"lr_decay must lie in [0, 1], got {decay!r}")
    if model.decay_horizon is not None:
        check_positive_int("decay_horizon", model.decay_horizon)
    if model.hash_family == "dwta":
        size = model.bin_size
        if isinstance(size, bool) or not isinstance(size, Integral) or size < 2:
            raise ValueError(f"bin_size must be a power of two >= 2, got {size!r}")
        if size & (size - 1):
            raise ValueError(f"bin_size must be a power of two >= 2, got {size!r}")
        bits = model.k * (int(size).bit_length() - 1)
    else:
        bits = model.k
    if bits > MAX_CODE_BITS:
        raise ValueError(
            f"a table's code would have {bits} bits; at most {MAX_CODE_BITS} (lower k)"
        )
    if np.dtype(model.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype must be float32 or float64, got {model.dtype!r}")
    if not isinstance(model.hogwild, bool):
        raise ValueError(f"hogwild must be True or False, got {model.hogwild!r}")


def check_features(X, n_features: int | None, dtype) -> sp.csr_matrix:
    """``X`` as a canonical CSR matrix of ``dtype`` (sparse input is never densified).

    Raises
    ------
    ValueError
        If ``X`` is not 2-D, has the wrong number of columns (when ``n_features`` is given), no
        rows, or a NaN or infinite value.
    """
    if sp.issparse(X):
        X = sp.csr_matrix(X, dtype=dtype)
    else:
        X = np.asarray(X)
        if X.ndim != 2:
            raise ValueError(f"X must be a 2-D array or sparse matrix, got shape {X.shape}")
        if X.dtype.kind not in "biuf":
            raise ValueError(f"X must hold numbers, got dtype {X.dtype}")
        X = sp.csr_matrix(X.astype(dtype))
    if X.shape[0] == 0:
        raise ValueError("X has no rows")
    if n_features is not None and X.shape[1] != n_features:
        raise ValueError(f"X has {X.shape[1]} features, the model expects {n_features}")
    if not np.all(np.isfinite(X.data)):
        raise ValueError("X holds NaN or infinite values")
    X.sum_duplicates()
    X.sort_indices()
    return X


def _label_row(row, index: int) -> np.ndarray:
    """The sorted distinct labels of one row of label lists; ``ValueError`` naming the row for
    a label that is not an integer (``1.5``, ``"a"``, NaN)."""
    values = np.asarray(row).reshape(-1)
    if values.size == 0:
        return np.zeros(0, dtype=np.int64)
    if values.dtype.kind in "iu":
        return np.unique(values.astype(np.int64))
    if values.dtype.kind == "f" and np.isfinite(values).all() and (values == np.rint(values)).all():
        return np.unique(values.astype(np.int64))
    raise ValueError(f"row {index} of Y holds labels that are not integers: {values.tolist()}")


def check_labels(
    Y, n_rows: int, n_labels: int | None, training: bool
) -> tuple[np.ndarray, np.ndarray, int]:
    """The labels of every row as CSR arrays ``(ptr, ids, width)``.

    ``Y`` is a sparse indicator matrix or a sequence of label lists; ``width`` is the labels
    the data implies (the matrix's width, or the largest label + 1).

    Raises
    ------
    ValueError
        If the number of rows differs from ``n_rows``, a label is not an integer, negative or
        not below ``n_labels``, or (``training``) a row has no label.
    """
    if sp.issparse(Y):
        Y = sp.csr_matrix(Y)
        Y.eliminate_zeros()
        Y.sum_duplicates()
        Y.sort_indices()
        ptr, ids, width = Y.indptr.astype(np.int64), Y.indices.astype(np.int64), Y.shape[1]
    else:
        try:
            rows = [_label_row(row, i) for i, row in enumerate(Y)]
        except TypeError as exc:
            raise ValueError(f"Y must be a sparse indicator matrix or label lists: {exc}") from exc
        ptr = np.zeros(len(rows) + 1, dtype=np.int64)
        ptr[1:] = np.cumsum([len(r) for r in rows])
        ids = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        width = int(ids.max()) + 1 if ids.size else 0
    if len(ptr) - 1 != n_rows:
        raise ValueError(f"Y has {len(ptr) - 1} rows, X has {n_rows}")
    if ids.size and ids.min() < 0:
        raise ValueError(f"labels must be >= 0, got {int(ids.min())}")
    if n_labels is not None and (width > n_labels or (ids.size and ids.max() >= n_labels)):
        raise ValueError(
            f"labels out of range: the model has {n_labels} labels, Y has labels up to "
            f"{max(width, int(ids.max()) + 1 if ids.size else 0) - 1}"
        )
    if training:
        empty = np.flatnonzero(np.diff(ptr) == 0)
        if empty.size:
            raise ValueError(f"training row {int(empty[0])} has no label ({empty.size} such rows)")
    return ptr, ids, int(width)
