"""The training kernels (feature-major activations, (n, B)) against scipy.sparse in float64."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn.kernels.training import masked_outer_grad, spmm_backward, spmm_forward

pytestmark = pytest.mark.minversions  # also run at the minimum versions (.ci/run)


def chunk(n_in, n_out, dtype, index_dtype, seed=0):
    """A random CSR chunk with empty rows and columns, sorted indices."""
    rng = np.random.default_rng(seed)
    dense = rng.uniform(-1, 1, (n_in, n_out)) * (rng.random((n_in, n_out)) < 0.3)
    dense[3] = 0
    dense[:, 2] = 0
    w = sp.csr_matrix(dense.astype(dtype))
    return w.indptr.astype(index_dtype), w.indices.astype(index_dtype), w.data, w


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-13), (np.float32, 2e-6)])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("batch", [1, 7, 8, 37, 300])
def test_kernels_match_scipy(dtype, rtol, index_dtype, batch):
    n_in, n_out = 29, 41
    indptr, indices, data, w = chunk(n_in, n_out, dtype, index_dtype)
    rng = np.random.default_rng(batch)
    x = (rng.random((batch, n_in)) * (rng.random((batch, n_in)) < 0.7)).astype(dtype)
    delta = rng.standard_normal((batch, n_out)).astype(dtype)
    w64 = w.astype(np.float64)
    x64, d64 = x.astype(np.float64), delta.astype(np.float64)

    xt, deltat = np.ascontiguousarray(x.T), np.ascontiguousarray(delta.T)

    out = np.full((n_out, batch), np.nan, dtype=dtype)
    spmm_forward(xt, indptr, indices, data, out)
    np.testing.assert_allclose(out, w64.T @ x64.T, rtol=rtol, atol=rtol * 10)

    back = np.full((n_in, batch), np.nan, dtype=dtype)
    spmm_backward(deltat, indptr, indices, data, back)
    np.testing.assert_allclose(back, w64 @ d64.T, rtol=rtol, atol=rtol * 10)

    grad = np.full(w.nnz, np.nan, dtype=dtype)
    masked_outer_grad(xt, deltat, indptr, indices, 0.5, grad)
    rows = np.repeat(np.arange(n_in), np.diff(w.indptr))
    expected = 0.5 * (x64.T @ d64)[rows, w.indices]
    np.testing.assert_allclose(grad, expected, rtol=rtol, atol=rtol * 10)


def test_kernels_accept_non_contiguous_arrays():
    """Views (a row block's transpose, a strided slice) give the same results as copies."""
    indptr, indices, data, w = chunk(16, 12, np.float64, np.int32, seed=3)
    rng = np.random.default_rng(0)
    xt = rng.random((16, 40))[:, ::2]
    deltat = rng.random((20, 12)).T
    out = np.empty((12, 20))
    spmm_forward(xt, indptr, indices, data, out)
    np.testing.assert_allclose(out, w.toarray().T @ xt, rtol=1e-13)
    back = np.empty((16, 20))
    spmm_backward(deltat, indptr, indices, data, back)
    np.testing.assert_allclose(back, w.toarray() @ deltat, rtol=1e-13)
    grad = np.empty(w.nnz)
    masked_outer_grad(xt, deltat, indptr, indices, 1.0, grad)
    rows = np.repeat(np.arange(16), np.diff(w.indptr))
    np.testing.assert_allclose(grad, (xt @ deltat.T)[rows, w.indices], rtol=1e-13)
