"""A text corpus with no download, from Python's standard library: ``kind="prose"``, the lower-case
words of its comments and docstrings; ``kind="code"``, its tokens (a string literal is one
``<str>``). Files in sorted order, windows within a file; vocabulary by falling count, ties
alphabetically, id 0 ``<unk>`` (beyond ``max_vocab`` or unseen).
"""

from __future__ import annotations

import ast
import io
import re
import sysconfig
import tokenize
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "Corpus",
    "load_stdlib_corpus",
    "stdlib_files",
    "token_windows",
    "tokenize_source",
]

UNKNOWN = "<unk>"
KINDS = ("prose", "code")
_WORD = re.compile(r"[a-z]+")
#: Folders left out: installed third-party packages.
_PACKAGE_DIRS = frozenset({"site-packages", "dist-packages"})
#: Folders of the standard library's test suites.
_TEST_DIRS = frozenset({"test", "tests", "idle_test"})


def stdlib_files(packages: tuple[str, ...] | None = None, tests: bool = False) -> list[Path]:
    """The standard library's ``.py`` files in sorted order, without third-party packages and,
    unless ``tests``, the test suites.

    Parameters
    ----------
    packages : tuple of str, optional
        Only these top-level modules or packages (e.g. ``("json", "email")``).
    tests : bool
        Keep the files of the test suites.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    skipped = _PACKAGE_DIRS if tests else _PACKAGE_DIRS | _TEST_DIRS
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if skipped.intersection(parts[:-1]):
            continue
        top = parts[0].removesuffix(".py")
        if packages is None or top in packages:
            files.append(path)
    return files


def _docstrings(tree: ast.AST) -> list[str]:
    nodes = [tree] + [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]
    return [doc for doc in (ast.get_docstring(n, clean=False) for n in nodes) if doc]


def tokenize_source(source: str, kind: str) -> list[str]:
    """The tokens of one file's text (see the module docs); ``[]`` if it does not parse."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
        tree = ast.parse(source)
    except (SyntaxError, tokenize.TokenError, ValueError):
        return []
    if kind == "code":
        out = []
        for tok in tokens:
            if tok.type in (tokenize.NAME, tokenize.OP, tokenize.NUMBER):
                out.append(tok.string)
            elif tok.type == tokenize.STRING:
                out.append("<str>")
        return out
    texts = [tok.string for tok in tokens if tok.type == tokenize.COMMENT]
    texts += _docstrings(tree)
    return _WORD.findall(" ".join(texts).lower())


def token_windows(ids: list[np.ndarray], context: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every window of ``context`` ids and the id after it, within each stream of ``ids``.

    Returns
    -------
    X : int64 array (n, context)
        The ``context`` ids before each predicted id, streams in order.
    y : int64 array (n,)
        The id after each window.
    document : int64 array (n,)
        Index in ``ids`` of the stream each window comes from.

    Raises
    ------
    ValueError
        If no stream holds more than ``context`` ids.
    """
    xs, ys, docs = [], [], []
    for doc, stream in enumerate(ids):
        if len(stream) <= context:
            continue
        xs.append(np.lib.stride_tricks.sliding_window_view(stream, context)[:-1])
        ys.append(stream[context:])
        docs.append(np.full(len(stream) - context, doc, dtype=np.int64))
    if not xs:
        raise ValueError(f"the corpus has no window of {context} + 1 tokens")
    return np.ascontiguousarray(np.concatenate(xs)), np.concatenate(ys), np.concatenate(docs)


@dataclass(frozen=True)
class Corpus:
    """Token windows of a corpus.

    Attributes
    ----------
    vocabulary : list of str
        ``vocabulary[i]`` is the word of id ``i`` (``<unk>`` at 0).
    counts : numpy.ndarray
        Occurrences of every id in the token streams.
    X, y, document : int64 arrays
        As :func:`token_windows` returns them (``document``: the file's index).
    n_tokens : int
        Tokens in the streams.
    """

    vocabulary: list[str]
    counts: np.ndarray
    X: np.ndarray
    y: np.ndarray
    document: np.ndarray
    n_tokens: int

    def split(self, every: int = 10) -> tuple[tuple, tuple]:
        """``((X, y) train, (X, y) held out)``: the windows of every ``every``-th file (files
        ``every - 1, 2 every - 1, ...``) are held out."""
        held = (self.document % every) == every - 1
        return (self.X[~held], self.y[~held]), (self.X[held], self.y[held])


def load_stdlib_corpus(
    kind: str = "prose",
    context: int = 3,
    max_vocab: int | None = None,
    packages: tuple[str, ...] | None = None,
) -> Corpus:
    """Tokenize the standard library, build the vocabulary and the windows.

    Parameters
    ----------
    kind : {"prose", "code"}
    context : int
        Ids per window (>= 1).
    max_vocab : int, optional
        Keep the ``max_vocab - 1`` most frequent words (and ``<unk>``); all of them by default.
    packages : tuple of str, optional
        Only these top-level modules or packages (see :func:`stdlib_files`).

    Raises
    ------
    ValueError
        For an unknown kind, ``context < 1``, ``max_vocab < 2`` or a corpus with no window.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ValueError(f"context must be an integer >= 1, got {context!r}")
    if max_vocab is not None and (not isinstance(max_vocab, int) or max_vocab < 2):
        raise ValueError(f"max_vocab must be an integer >= 2, got {max_vocab!r}")
    streams = []
    for path in stdlib_files(packages):
        source = path.read_text(encoding="utf-8", errors="replace")
        streams.append(tokenize_source(source, kind))
    counter = Counter(token for stream in streams for token in stream)
    counter.pop(UNKNOWN, None)
    words = sorted(counter, key=lambda w: (-counter[w], w))
    if max_vocab is not None:
        words = words[: max_vocab - 1]
    vocabulary = [UNKNOWN, *words]
    index = {w: i for i, w in enumerate(vocabulary)}
    ids = [
        np.fromiter((index.get(t, 0) for t in stream), dtype=np.int64, count=len(stream))
        for stream in streams
    ]
    counts = np.zeros(len(vocabulary), dtype=np.int64)
    for stream in ids:
        np.add.at(counts, stream, 1)
    X, y, document = token_windows(ids, context)
    return Corpus(
        vocabulary=vocabulary,
        counts=counts,
        X=X,
        y=y,
        document=document,
        n_tokens=int(counts.sum()),
    )
