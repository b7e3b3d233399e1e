"""A numba parser for ``row col value`` text, the bulk of the challenge file formats."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["parse_triples"]

# status codes returned by the kernel with the 0-based line number of the problem
OK, BAD_FIELDS, BAD_NUMBER, BAD_INDEX = 0, 1, 2, 3

# the largest row or column index accepted (15 digits; the parser reads 15 digits exactly)
MAX_INDEX = 10**15 - 1

_POW10 = np.array([10.0**k for k in range(23)])


@njit(cache=True)
def _parse(buf, rows, cols, vals, lines, pow10):  # pragma: no cover - compiled
    """Parse ``buf`` (uint8) into the output arrays; returns (status, count, bad_line, fallback).

    Values whose decimal mantissa exceeds 2**53 or whose exponent exceeds 22 cannot be converted
    exactly here; their positions are flagged with NaN and left to Python's ``float`` (fallback).
    An index (row or column) beyond ``MAX_INDEX`` stops the parse with ``BAD_INDEX``.
    """
    n = buf.shape[0]
    pos = 0
    line = 0
    count = 0
    fallback = 0
    while pos < n:
        fields = 0
        while pos < n and buf[pos] != 10:
            c = buf[pos]
            if c == 32 or c == 9 or c == 13:
                pos += 1
                continue
            if fields >= 3:
                return BAD_FIELDS, count, line, fallback
            negative = False
            if c == 45 or c == 43:
                negative = c == 45
                pos += 1
            mantissa = 0
            digits = 0
            scale = 0
            exact = True
            seen_point = False
            while pos < n:
                c = buf[pos]
                if 48 <= c <= 57:
                    if mantissa < 900719925474099:
                        mantissa = mantissa * 10 + (c - 48)
                        if seen_point:
                            scale -= 1
                    else:
                        exact = False
                        if not seen_point:
                            scale += 1
                    digits += 1
                    pos += 1
                elif c == 46 and not seen_point and fields == 2:
                    seen_point = True
                    pos += 1
                else:
                    break
            if pos < n and (buf[pos] == 101 or buf[pos] == 69) and fields == 2 and digits > 0:
                pos += 1
                exp_negative = False
                if pos < n and (buf[pos] == 45 or buf[pos] == 43):
                    exp_negative = buf[pos] == 45
                    pos += 1
                exp_digits = 0
                exponent = 0
                while pos < n and 48 <= buf[pos] <= 57:
                    if exponent < 10000:
                        exponent = exponent * 10 + (buf[pos] - 48)
                    exp_digits += 1
                    pos += 1
                if exp_digits == 0:
                    return BAD_NUMBER, count, line, fallback
                scale += -exponent if exp_negative else exponent
            if digits == 0:
                return BAD_NUMBER, count, line, fallback
            if pos < n:
                c = buf[pos]
                if not (c == 32 or c == 9 or c == 13 or c == 10):
                    return BAD_NUMBER, count, line, fallback
            if fields < 2:
                if not exact or mantissa > MAX_INDEX:
                    return BAD_INDEX, count, line, fallback
                if negative:
                    mantissa = -mantissa
                if fields == 0:
                    rows[count] = mantissa
                else:
                    cols[count] = mantissa
            else:
                if not exact or scale > 22 or scale < -22:
                    vals[count] = np.nan
                    fallback += 1
                else:
                    value = float(mantissa)
                    if scale < 0:
                        value = value / pow10[-scale]
                    else:
                        value = value * pow10[scale]
                    vals[count] = -value if negative else value
            fields += 1
        if fields == 3:
            lines[count] = line
            count += 1
        elif fields != 0:
            return BAD_FIELDS, count, line, fallback
        line += 1
        pos += 1
    return OK, count, -1, fallback


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
    status, count, bad_line, fallback = _parse(buf, rows, cols, vals, lines, _POW10)
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
