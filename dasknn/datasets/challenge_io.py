"""Readers and writers for the Sparse DNN Graph Challenge file formats: ``row<TAB>col<TAB>value``
triples, 1-based, a line. A layer is ``(n_in, n_out)`` (``Y_next = f(Y @ W + b)``); input files
have a sample a row; category files list 1-based sample ids, one a line.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from dasknn.datasets.tsv_parser import MAX_INDEX, parse_triples
from graph.atomic import write_atomically

__all__ = [
    "challenge_bias",
    "iter_challenge_network",
    "read_challenge_network",
    "read_sparse_tsv",
    "write_sparse_tsv",
    "read_categories",
    "write_categories",
    "layer_file",
]

# most by which an input file's largest row id may exceed twice its entries (rows may be absent)
ROW_SLACK = 1024

_CHALLENGE_BIAS = {1024: -0.30, 4096: -0.35, 16384: -0.40, 65536: -0.45}
_LAYER_NAME = re.compile(r"^n(\d+)-l(\d+)\.tsv(\.gz)?$")


def challenge_bias(neurons: int) -> float:
    """Return the Graph Challenge bias for a network of ``neurons`` neurons per layer.

    Parameters
    ----------
    neurons : int
        Neurons per layer: 1024, 4096, 16384 or 65536.

    Returns
    -------
    float
        -0.30, -0.35, -0.40 or -0.45.
    """
    try:
        return _CHALLENGE_BIAS[int(neurons)]
    except KeyError:
        raise ValueError(
            f"the Graph Challenge defines a bias only for {sorted(_CHALLENGE_BIAS)} neurons, "
            f"not {neurons}; pass the bias explicitly"
        ) from None


def _read_bytes(path: Path) -> bytes:
    """The content of ``path``, gunzipped when it ends in ``.gz``; ``ValueError`` naming the file
    when it cannot be read."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                return fh.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"{path}: cannot read file: {exc}") from None


def _read_triples(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Parse a ``row col value`` file into 0-based index arrays, values and line numbers;
    ``ValueError`` naming the file and the first bad line."""
    text = _read_bytes(path)
    try:
        rows, cols, vals, lines_used = parse_triples(text)
    except ValueError as exc:
        raise ValueError(f"{path}, {exc}") from None
    bad = np.flatnonzero((rows < 1) | (cols < 1))
    if bad.size:
        raise ValueError(
            f"{path}, line {lines_used[bad[0]] + 1}: indices are 1-based, got row {rows[bad[0]]} "
            f"col {cols[bad[0]]}"
        )
    bad = np.flatnonzero(~np.isfinite(vals))
    if bad.size:
        raise ValueError(
            f"{path}, line {lines_used[bad[0]] + 1}: value is not finite ({vals[bad[0]]})"
        )
    return rows - 1, cols - 1, vals, lines_used


def _cast(path: Path, vals: np.ndarray, lines_used: np.ndarray, dtype) -> np.ndarray:
    """``vals`` as ``dtype``; ``ValueError`` naming the file and line of a value that does not fit
    (finite as float64, infinite as ``dtype``)."""
    with np.errstate(over="ignore"):
        cast = vals.astype(dtype)
    bad = np.flatnonzero(~np.isfinite(cast))
    if bad.size:
        raise ValueError(
            f"{path}, line {lines_used[bad[0]] + 1}: value {vals[bad[0]]} does not fit "
            f"{np.dtype(dtype).name}"
        )
    return cast


def _check_range(path: Path, rows, cols, lines_used, shape) -> None:
    for name, idx, bound in (("row", rows, shape[0]), ("col", cols, shape[1])):
        bad = np.flatnonzero(idx >= bound)
        if bad.size:
            raise ValueError(
                f"{path}, line {lines_used[bad[0]] + 1}: {name} {idx[bad[0]] + 1} is out of range "
                f"(at most {bound})"
            )


def layer_file(directory: str | os.PathLike, neurons: int, layer: int) -> Path:
    """Return the path of layer ``layer`` (1-based), ``.tsv`` or ``.tsv.gz``, in ``directory``.

    Parameters
    ----------
    directory : str or os.PathLike
        A directory of challenge layer files ``n{neurons}-l{layer}.tsv[.gz]``.
    neurons, layer : int
        Neurons per layer; the layer, 1-based.

    Returns
    -------
    pathlib.Path
        The ``.tsv`` file if it exists, else the ``.tsv.gz`` one.

    Raises
    ------
    FileNotFoundError
        If neither exists.
    """
    directory = Path(directory)
    for suffix in (".tsv", ".tsv.gz"):
        path = directory / f"n{neurons}-l{layer}{suffix}"
        if path.exists():
            return path
    raise FileNotFoundError(
        f"{directory}: missing layer file n{neurons}-l{layer}.tsv or n{neurons}-l{layer}.tsv.gz"
    )


def _discover(directory: Path) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for entry in directory.iterdir():
        m = _LAYER_NAME.match(entry.name)
        if m:
            found.setdefault(int(m.group(1)), []).append(int(m.group(2)))
    return found


def iter_challenge_network(
    directory: str | os.PathLike,
    neurons: int | None = None,
    layers: int | Sequence[int] | None = None,
    dtype: np.dtype | type = np.float64,
) -> Iterator[sp.csr_matrix]:
    """Read a Graph Challenge network one layer at a time.

    The folder, width and layer files are checked at the call, before any layer is read.

    Parameters
    ----------
    directory : path
        Folder holding ``n{N}-l{k}.tsv`` or ``n{N}-l{k}.tsv.gz`` files.
    neurons : int, optional
        Neurons per layer ``N``; inferred when the folder holds one width.
    layers : int or sequence of int, optional
        Layers ``1..layers`` or explicit 1-based numbers; by default all, numbered 1 to L.
    dtype : numpy dtype
        Value type of the matrices.

    Returns
    -------
    iterator of scipy.sparse.csr_matrix
        One ``(N, N)`` matrix per layer, read when asked for.

    Raises
    ------
    FileNotFoundError
        If the folder or a requested layer file is missing (``layers=None``: a gap).
    ValueError
        On a malformed line, an index out of range or inconsistent widths.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"network directory {directory} does not exist")
    found = _discover(directory)
    if neurons is None:
        if len(found) != 1:
            raise ValueError(
                f"{directory}: cannot infer the width, found layer files for widths "
                f"{sorted(found) or 'none'}; pass neurons="
            )
        neurons = next(iter(found))
    neurons = int(neurons)
    if layers is None:
        present = set(found.get(neurons, []))
        if not present:
            raise FileNotFoundError(f"{directory}: no layer files n{neurons}-l*.tsv[.gz]")
        missing = sorted(set(range(1, max(present) + 1)) - present)
        if missing:
            raise FileNotFoundError(
                f"{directory}: missing layer file n{neurons}-l{missing[0]}.tsv[.gz] (layers "
                f"1 to {max(present)} are needed, layer {missing[0]} is absent)"
            )
        numbers: list[int] = list(range(1, max(present) + 1))
    elif isinstance(layers, int | np.integer):
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        numbers = list(range(1, int(layers) + 1))
    else:
        numbers = [int(k) for k in layers]
    for k in numbers:
        layer_file(directory, neurons, k)
    return _iter_layers(directory, neurons, numbers, dtype)


def _iter_layers(
    directory: Path, neurons: int, numbers: list[int], dtype: np.dtype | type
) -> Iterator[sp.csr_matrix]:
    for k in numbers:
        path = layer_file(directory, neurons, k)
        rows, cols, vals, lines_used = _read_triples(path)
        _check_range(path, rows, cols, lines_used, (neurons, neurons))
        mat = sp.csr_matrix(
            (_cast(path, vals, lines_used, dtype), (rows, cols)), shape=(neurons, neurons)
        )
        mat.sum_duplicates()
        yield mat


def read_sparse_tsv(
    path: str | os.PathLike,
    shape: tuple[int | None, int] | None = None,
    dtype: np.dtype | type = np.float64,
) -> sp.csr_matrix:
    """Read a challenge sparse-input file (``row col value``, 1-based) into a CSR matrix.

    Parameters
    ----------
    path : path
        ``.tsv`` or ``.tsv.gz`` file.
    shape : (rows, cols), optional
        Matrix shape; ``rows=None`` takes the largest row index.
    dtype : numpy dtype

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        Naming the file and line: a malformed line, an index out of range, or (``rows`` taken
        from the file) a row id beyond ``2 * entries + ROW_SLACK``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"input file {path} does not exist")
    rows, cols, vals, lines_used = _read_triples(path)
    if rows.size and (shape is None or shape[0] is None):
        bound = 2 * rows.size + ROW_SLACK
        if rows.max() >= bound:
            at = int(np.argmax(rows))
            raise ValueError(
                f"{path}, line {lines_used[at] + 1}: row {rows[at] + 1} is absurd for a file of "
                f"{rows.size} entries (row ids may reach {bound}; number the rows from 1)"
            )
    n_rows = int(rows.max()) + 1 if rows.size else 0
    n_cols = int(cols.max()) + 1 if cols.size else 0
    if shape is not None:
        if shape[0] is not None:
            n_rows = int(shape[0])
        n_cols = int(shape[1])
        _check_range(path, rows, cols, lines_used, (n_rows, n_cols))
    mat = sp.csr_matrix(
        (_cast(path, vals, lines_used, dtype), (rows, cols)), shape=(n_rows, n_cols)
    )
    mat.sum_duplicates()
    return mat


def _write_lines(path: Path, lines: Iterable[str]) -> None:
    """Write ``lines`` to ``path`` (gzip when it ends in ``.gz``) with no partial file on error."""
    payload = "".join(lines).encode()

    def write(handle) -> None:
        if path.suffix == ".gz":
            with gzip.GzipFile(fileobj=handle, mode="wb") as compressed:
                compressed.write(payload)
        else:
            handle.write(payload)

    write_atomically(path, write)


def write_sparse_tsv(path: str | os.PathLike, matrix: sp.spmatrix) -> None:
    """Write a sparse matrix as a challenge ``row col value`` file (1-based, row-major order).

    Parameters
    ----------
    path : str or os.PathLike
        The file to write, atomically (gzip-compressed when it ends in ``.gz``).
    matrix : scipy.sparse matrix
        The entries to write; values as ``{:g}``.
    """
    coo = sp.csr_matrix(matrix).tocoo()
    order = np.lexsort((coo.col, coo.row))
    lines = (
        f"{r + 1}\t{c + 1}\t{v:g}\n"
        for r, c, v in zip(coo.row[order], coo.col[order], coo.data[order], strict=True)
    )
    _write_lines(Path(path), lines)


def read_categories(path: str | os.PathLike) -> np.ndarray:
    """Read a category file: 1-based sample ids, one a line. Returns them as given (1-based).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        Naming the file and line: unreadable, or not a decimal id from 1 to ``MAX_INDEX``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"category file {path} does not exist")
    text = _read_bytes(path)
    ids = []
    for lineno, raw in enumerate(text.split(b"\n"), start=1):
        ln = raw.strip()
        if not ln:
            continue
        if not ln.isdigit():
            shown = ln.decode(errors="replace")
            raise ValueError(f"{path}, line {lineno}: expected an integer id, got {shown!r}")
        value = int(ln)
        if not 1 <= value <= MAX_INDEX:
            raise ValueError(f"{path}, line {lineno}: ids run from 1 to {MAX_INDEX}, got {value}")
        ids.append(value)
    return np.asarray(ids, dtype=np.int64)


def write_categories(path: str | os.PathLike, categories: np.ndarray) -> None:
    """Write 1-based category ids, one a line, atomically.

    Parameters
    ----------
    path : str or os.PathLike
        The file to write (gzip-compressed when it ends in ``.gz``).
    categories : array-like of int
        1-based sample ids.

    Raises
    ------
    ValueError
        If an id is below 1 (nothing is written).
    """
    ids = np.asarray(categories, dtype=np.int64)
    if ids.size and ids.min() < 1:
        raise ValueError("category ids are 1-based and must be >= 1")
    _write_lines(Path(path), (f"{int(i)}\n" for i in ids))


def read_challenge_network(
    directory: str | os.PathLike,
    neurons: int | None = None,
    layers: int | Sequence[int] | None = None,
    dtype: np.dtype | type = np.float64,
) -> list[sp.csr_matrix]:
    """Read a Graph Challenge network from its layer files (:func:`iter_challenge_network`).

    Parameters
    ----------
    directory, neurons, layers, dtype
        As :func:`iter_challenge_network`'s.

    Returns
    -------
    list of scipy.sparse.csr_matrix
        One ``(N, N)`` matrix per layer.

    Raises
    ------
    FileNotFoundError, ValueError
        As :func:`iter_challenge_network`.
    """
    return list(iter_challenge_network(directory, neurons, layers, dtype))
