"""A real next-word prediction task with a large output layer, from text every Python install
has: the sources of the standard library (nothing is downloaded, no text is shipped).

Words are the runs of ASCII letters (case kept; about 52 K distinct words in CPython 3.11's
library). Sample ``t`` of a file predicts word ``t`` from the ``context`` words before it: its
features are the pairs (position, word), one-hot, scaled to unit length. Files are split into
training and held-out files (every ``test_every``-th file in sorted order is held out).
"""

from __future__ import annotations

import re
import sysconfig
from pathlib import Path
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

__all__ = ["TextTask", "stdlib_next_word"]

_WORD = re.compile(r"[A-Za-z]+")


class TextTask(NamedTuple):
    """Training and held-out rows of a next-word task (labels as 0/1 indicator matrices)."""

    X_train: sp.csr_matrix
    Y_train: sp.csr_matrix
    X_test: sp.csr_matrix
    Y_test: sp.csr_matrix
    vocabulary: list[str]


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(f for f in root.rglob("*.py") if "site-packages" not in f.parts)


def _rows(words: list[np.ndarray], context: int, vocab: int, limit: int | None):
    feats, labels = [], []
    for ids in words:
        if len(ids) <= context:
            continue
        windows = np.lib.stride_tricks.sliding_window_view(ids, context + 1)
        feats.append(windows[:, :context] + np.arange(context) * vocab)
        labels.append(windows[:, context])
    feats = np.concatenate(feats)[:limit]
    labels = np.concatenate(labels)[:limit]
    n = len(labels)
    X = sp.csr_matrix(
        (
            np.full(n * context, 1 / np.sqrt(context), dtype=np.float32),
            feats.ravel(),
            np.arange(0, n * context + 1, context),
        ),
        shape=(n, context * vocab),
    )
    X.sum_duplicates()
    Y = sp.csr_matrix((np.ones(n, dtype=np.float32), labels, np.arange(n + 1)), shape=(n, vocab))
    return X, Y


def stdlib_next_word(
    context: int = 3,
    max_train: int | None = None,
    max_test: int | None = None,
    test_every: int = 10,
) -> TextTask:
    """The next-word task on the standard library's sources (see the module docstring).

    Parameters
    ----------
    context : int
        Words before the predicted one.
    max_train, max_test : int, optional
        Keep at most that many rows (the first, in file order).
    test_every : int
        Every ``test_every``-th file is held out.

    Raises
    ------
    ValueError
        If ``context`` or ``test_every`` is below 1.
    """
    if context < 1 or test_every < 1:
        raise ValueError("context and test_every must be >= 1")
    texts = [
        _WORD.findall(f.read_text(encoding="utf-8", errors="replace")) for f in _stdlib_files()
    ]
    vocabulary = sorted({w for words in texts for w in words})
    index = {w: i for i, w in enumerate(vocabulary)}
    ids = [np.fromiter((index[w] for w in words), dtype=np.int64) for words in texts]
    train = [x for i, x in enumerate(ids) if i % test_every]
    test = [x for i, x in enumerate(ids) if i % test_every == 0]
    X_train, Y_train = _rows(train, context, len(vocabulary), max_train)
    X_test, Y_test = _rows(test, context, len(vocabulary), max_test)
    return TextTask(X_train, Y_train, X_test, Y_test, vocabulary)
