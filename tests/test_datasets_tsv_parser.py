"""The numba triple parser agrees with Python's own number parsing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dasknn.datasets.tsv_parser import parse_triples

_values = st.floats(allow_nan=False, allow_infinity=False, width=64)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 10**9), st.integers(1, 10**9), _values, st.sampled_from(["g", "r"])
        ),
        max_size=20,
    ),
    st.sampled_from(["\t", " ", " \t "]),
)
def test_parse_matches_python(triples, sep):
    text = "".join(
        f"{r}{sep}{c}{sep}{(format(v, 'g') if style == 'g' else repr(v))}\n"
        for r, c, v, style in triples
    )
    rows, cols, vals, lines = parse_triples(text.encode())
    expected = [ln.split() for ln in text.splitlines()]
    np.testing.assert_array_equal(rows, [int(f[0]) for f in expected])
    np.testing.assert_array_equal(cols, [int(f[1]) for f in expected])
    np.testing.assert_array_equal(vals, [float(f[2]) for f in expected])
    np.testing.assert_array_equal(lines, np.arange(len(expected)))


def test_blank_lines_and_line_numbers():
    rows, _, vals, lines = parse_triples(b"\n1 2 0.5\r\n\n3 4 -1e-3")
    np.testing.assert_array_equal(rows, [1, 3])
    np.testing.assert_array_equal(vals, [0.5, -1e-3])
    np.testing.assert_array_equal(lines, [1, 3])


@pytest.mark.parametrize("text", [b"1 2\n", b"1 2 3 4\n", b"1 2 x\n", b"1.5 2 3\n", b"1 2 3e\n"])
def test_rejects_malformed(text):
    with pytest.raises(ValueError, match="line 1"):
        parse_triples(b"\n".join([b"", text]).lstrip(b"\n"))
