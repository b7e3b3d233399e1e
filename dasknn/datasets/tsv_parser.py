"""A parser for ``row col value`` text, the bulk of the challenge file formats (its numba kernel
is :func:`dasknn.kernels.tsv.parse_triples_into`)."""

from __future__ import annotations

import numpy as np

from dasknn.kernels.tsv import BAD_INDEX, MAX_INDEX, OK, POW10, parse_triples_into

__all__ = ["parse_triples"]


def parse_triples(text: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Parse ``row col value`` lines (blank lines allowed) into arrays.

    Returns
    -------
    rows, cols : int64 arrays as written (1-based in the challenge files)
    vals : float64 array (``nan`` and ``inf`` spelled out are rejected as bad numbers)
    lines : 0-based line number of each triple

    Raises
    ------
    ValueError
        With the 1-based line number of the first line that is not three numbers, whose first two
        are integers of at most ``MAX_INDEX``.
    """
    buf = np.frombuffer(text, dtype=np.uint8)
    capacity = int(np.count_nonzero(buf == 10)) + 1
    rows = np.empty(capacity, dtype=np.int64)
    cols = np.empty(capacity, dtype=np.int64)
    vals = np.empty(capacity, dtype=np.float64)
    lines = np.empty(capacity, dtype=np.int64)
    status, count, bad_line, fallback = parse_triples_into(buf, rows, cols, vals, lines, POW10)
    if status != OK:
        line = text.split(b"\n")[bad_line].decode(errors="replace").rstrip("\r")
        if status == BAD_INDEX:
            raise ValueError(
                f"line {bad_line + 1}: an index does not fit (at most {MAX_INDEX}), got {line!r}"
            )
        raise ValueError(f"line {bad_line + 1}: expected 'row col value', got {line!r}")
    rows, cols, vals, lines = rows[:count], cols[:count], vals[:count], lines[:count]
    if fallback:
        all_lines = text.split(b"\n")
        for k in np.flatnonzero(np.isnan(vals)):
            vals[k] = float(all_lines[lines[k]].split()[2])
    return rows, cols, vals, lines
