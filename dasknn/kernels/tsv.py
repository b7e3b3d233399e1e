"""The numba kernel that parses ``row col value`` text (the bulk of the challenge file formats)."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "BAD_FIELDS",
    "BAD_INDEX",
    "BAD_NUMBER",
    "MAX_INDEX",
    "OK",
    "POW10",
    "parse_triples_into",
]

# status codes returned by the kernel with the 0-based line number of the problem
OK, BAD_FIELDS, BAD_NUMBER, BAD_INDEX = 0, 1, 2, 3

# the largest row or column index accepted (15 digits; the parser reads 15 digits exactly)
MAX_INDEX = 10**15 - 1

# the powers of ten a decimal exponent scales by (exact in float64 up to 10**22)
POW10 = np.array([10.0**k for k in range(23)])


@njit(cache=True)
def parse_triples_into(buf, rows, cols, vals, lines, pow10):  # pragma: no cover - compiled
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
