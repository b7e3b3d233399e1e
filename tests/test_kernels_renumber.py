"""The layer-splitting kernels against scipy's fancy indexing and a direct count."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn.model_parallel._plan import boundary, renumbered_chunks, reorder


def _layer(n_in, n_out, density, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return sp.random(n_in, n_out, density=density, format="csr", random_state=rng, dtype=dtype)


@pytest.mark.parametrize("nparts", [1, 2, 3, 7])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_renumbered_chunks_equal_scipy_indexing(nparts, dtype):
    weight = _layer(50, 64, 0.1, nparts, dtype)
    rng = np.random.default_rng(10 + nparts)
    order_in, _ = reorder(rng.integers(0, nparts, 50), nparts)
    order_out, offsets = reorder(rng.integers(0, nparts, 64), nparts)
    expected = weight[order_in][:, order_out].toarray()
    chunks = renumbered_chunks(weight, order_in, order_out, offsets)
    assert len(chunks) == nparts
    for m, chunk in enumerate(chunks):
        lo, hi = offsets[m], offsets[m + 1]
        assert chunk.shape == (50, hi - lo) and chunk.dtype == dtype
        np.testing.assert_array_equal(chunk.toarray(), expected[:, lo:hi])
        for r in range(50):  # indices ascending within each row, as scipy's sorted format
            row = chunk.indices[chunk.indptr[r] : chunk.indptr[r + 1]]
            assert np.all(np.diff(row) > 0)
        assert chunk.has_canonical_format


def test_renumbered_chunks_of_an_empty_part_and_a_csc_layer():
    weight = _layer(20, 12, 0.3, 1).tocsc()
    parts = np.array([0] * 6 + [2] * 6)  # part 1 has no neuron
    order_out, offsets = reorder(parts, 3)
    order_in = np.random.default_rng(2).permutation(20)
    chunks = renumbered_chunks(weight, order_in, order_out, offsets)
    assert chunks[1].shape == (20, 0) and chunks[1].nnz == 0
    dense = weight.toarray()[order_in][:, order_out]
    np.testing.assert_array_equal(sp.hstack(chunks).toarray(), dense)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_boundary_flags_the_rows_feeding_another_part(seed):
    weight = _layer(40, 30, 0.08, seed)
    rng = np.random.default_rng(seed)
    parts_in, parts_out = rng.integers(0, 3, 40), rng.integers(0, 3, 30)
    dense = weight.toarray() != 0
    expected = [bool(np.any(parts_out[dense[i]] != parts_in[i])) for i in range(40)]
    np.testing.assert_array_equal(boundary(weight, parts_in, parts_out), expected)
