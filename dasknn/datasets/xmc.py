"""Reader of the Extreme Classification Repository's text format.

The first line is ``n_samples n_features n_labels``; every further line is one sample:
comma-separated 0-based labels (none: the line starts with its features), then
``feature:value`` pairs separated by spaces, features 0-based.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import scipy.sparse as sp

__all__ = ["read_xmc"]


def _header(line: str, path: Path) -> tuple[int, int, int]:
    parts = line.split()
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 3 or min(values) < 0 or values[1] < 1 or values[2] < 1:
        raise ValueError(
            f"{path}: line 1: the header must be 'n_samples n_features n_labels' "
            f"(non-negative integers, features and labels >= 1), got {line.strip()!r}"
        )
    return values[0], values[1], values[2]


def _index(text: str, bound: int, what: str, path: Path, lineno: int) -> int:
    if not text.isdigit():
        raise ValueError(f"{path}: line {lineno}: malformed {what} index {text!r}")
    value = int(text)
    if value >= bound:
        raise ValueError(f"{path}: line {lineno}: {what} index {value} out of range [0, {bound})")
    return value


def read_xmc(path: str | Path) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Read a data set in the Extreme Classification Repository format.

    Returns
    -------
    X : scipy.sparse.csr_matrix, float32, ``(n_samples, n_features)``
    Y : scipy.sparse.csr_matrix, float32 0/1 indicator, ``(n_samples, n_labels)``

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        Naming the line: a wrong header, a malformed pair or label, an index out of range, a NaN
        or infinite value, or a sample count other than the header's.
    """
    path = Path(path)
    with path.open(encoding="utf-8", errors="strict") as handle:
        first = handle.readline()
        n_samples, n_features, n_labels = _header(first, path)
        x_ptr, x_idx, x_val = [0], [], []
        y_ptr, y_idx = [0], []
        rows = 0
        for lineno, line in enumerate(handle, start=2):
            if not line.strip():
                continue
            rows += 1
            if rows > n_samples:
                raise ValueError(
                    f"{path}: line {lineno}: more samples than the header's {n_samples}"
                )
            tokens = line.split()
            start = 0
            if not line[0].isspace() and ":" not in tokens[0]:
                for label in tokens[0].split(","):
                    y_idx.append(_index(label, n_labels, "label", path, lineno))
                start = 1
            for token in tokens[start:]:
                feature, sep, value = token.partition(":")
                if not sep:
                    raise ValueError(
                        f"{path}: line {lineno}: malformed pair {token!r} (index:value)"
                    )
                x_idx.append(_index(feature, n_features, "feature", path, lineno))
                try:
                    number = float(value)
                except ValueError:
                    raise ValueError(
                        f"{path}: line {lineno}: malformed value in {token!r} (index:value)"
                    ) from None
                if not math.isfinite(number):
                    raise ValueError(f"{path}: line {lineno}: value {value!r} is not finite")
                x_val.append(number)
            x_ptr.append(len(x_idx))
            y_ptr.append(len(y_idx))
    if rows != n_samples:
        raise ValueError(f"{path}: the header announces {n_samples} samples, the file has {rows}")
    X = sp.csr_matrix(
        (np.asarray(x_val, dtype=np.float32), np.asarray(x_idx, dtype=np.int64), x_ptr),
        shape=(n_samples, n_features),
    )
    Y = sp.csr_matrix(
        (np.ones(len(y_idx), dtype=np.float32), np.asarray(y_idx, dtype=np.int64), y_ptr),
        shape=(n_samples, n_labels),
    )
    for m in (X, Y):
        m.sum_duplicates()
        m.sort_indices()
    Y.data[:] = 1
    return X, Y
