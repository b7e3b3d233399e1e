"""A real next-word prediction task with a large output layer from the standard library's
sources, test suites included (nothing downloaded): words are runs of ASCII letters (case kept);
sample ``t`` of a file predicts word ``t`` from the ``context`` before it, as (position, word)
one-hot features scaled to unit length; every ``test_every``-th file is held out.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from dasknn.datasets.stdlib_corpus import stdlib_files, token_windows

__all__ = ["TextTask", "stdlib_next_word"]

_WORD = re.compile(r"[A-Za-z]+")


class TextTask(NamedTuple):
    """Training and held-out rows of a next-word task (labels as 0/1 indicator matrices).

    Attributes
    ----------
    X_train, X_test : scipy.sparse.csr_matrix, float32
        Context windows as (position, word) one-hot features scaled to unit length.
    Y_train, Y_test : scipy.sparse.csr_matrix, float32
        The next word of each window as a 0/1 indicator row.
    vocabulary : list of str
        The word of each word id.
    """

    X_train: sp.csr_matrix
    Y_train: sp.csr_matrix
    X_test: sp.csr_matrix
    Y_test: sp.csr_matrix
    vocabulary: list[str]


def _one_hot_rows(
    windows: np.ndarray, labels: np.ndarray, vocab: int
) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Features (position, word) one-hot and scaled to unit length, and labels as indicators."""
    n, context = windows.shape
    feats = windows + np.arange(context) * vocab
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
        _WORD.findall(f.read_text(encoding="utf-8", errors="replace"))
        for f in stdlib_files(tests=True)
    ]
    vocabulary = sorted({w for words in texts for w in words})
    index = {w: i for i, w in enumerate(vocabulary)}
    ids = [np.fromiter((index[w] for w in words), dtype=np.int64) for words in texts]
    windows, labels, document = token_windows(ids, context)
    held = document % test_every == 0
    X_train, Y_train = _one_hot_rows(
        windows[~held][:max_train], labels[~held][:max_train], len(vocabulary)
    )
    X_test, Y_test = _one_hot_rows(
        windows[held][:max_test], labels[held][:max_test], len(vocabulary)
    )
    return TextTask(X_train, Y_train, X_test, Y_test, vocabulary)
