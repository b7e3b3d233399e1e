"""The training kernels (feature-major activations, (n, B)) against scipy.sparse in float64."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn.kernels.training import (
    add_rows,
    column_runs,
    masked_outer_grad,
    spmm_backward,
    spmm_forward,
)

pytestmark = pytest.mark.minversions  # also run at the minimum versions (.ci/run)


def chunk(n_in, n_out, dtype, index_dtype, seed=0):
    """A random CSR chunk with empty rows and columns, sorted indices."""
    rng = np.random.default_rng(seed)
    dense = rng.uniform(-1, 1, (n_in, n_out)) * (rng.random((n_in, n_out)) < 0.3)
    dense[3] = 0
    dense[:, 2] = 0
    w = sp.csr_matrix(dense.astype(dtype))
    return w.indptr.astype(index_dtype), w.indices.astype(index_dtype), w.data, w


def forward(xt, indptr, indices, data, out):
    """``spmm_forward`` over all rows of the CSR pattern."""
    bounds, rows, order = column_runs(indptr, indices, out.shape[0],
                                      np.array([0, len(indptr) - 1]))
    spmm_forward(xt, bounds[0], bounds[-1], rows, order, data, out)


# float32 vectors hold 16 lanes and float64 8; a pass takes as many vectors as the batch has
# left, up to 16, then a scalar loop takes the rest: 300 float32 samples are passes of 16 and 2
# vectors and 12 scalars, 100 one of 6 vectors and 4 scalars, 1 the scalar loop alone
@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-13), (np.float32, 2e-6)])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("batch", [1, 7, 8, 37, 100, 300])
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
    forward(xt, indptr, indices, data, out)
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
    forward(xt, indptr, indices, data, out)
    np.testing.assert_allclose(out, w.toarray().T @ xt, rtol=1e-13)
    back = np.empty((16, 20))
    spmm_backward(deltat, indptr, indices, data, back)
    np.testing.assert_allclose(back, w.toarray() @ deltat, rtol=1e-13)
    grad = np.empty(w.nnz)
    masked_outer_grad(xt, deltat, indptr, indices, 1.0, grad)
    rows = np.repeat(np.arange(16), np.diff(w.indptr))
    np.testing.assert_allclose(grad, (xt @ deltat.T)[rows, w.indices], rtol=1e-13)


def test_outputs_must_be_c_contiguous():
    indptr, indices, data, w = chunk(16, 12, np.float64, np.int32, seed=3)
    deltat = np.ones((12, 20))
    with pytest.raises(ValueError, match="outt must be a writeable C-contiguous array"):
        spmm_backward(deltat, indptr, indices, data, np.empty((20, 16)).T)
    with pytest.raises(ValueError, match="out must be a writeable C-contiguous array"):
        masked_outer_grad(np.ones((16, 20)), deltat, indptr, indices, 1.0,
                          np.empty(2 * w.nnz)[::2])


def test_shapes_that_do_not_match_are_refused():
    """The kernels write through raw pointers: a wrong output shape or batch is an error
    naming it, and the output is left as it was."""
    indptr, indices, data, w = chunk(16, 12, np.float64, np.int32, seed=3)
    bounds, rows, order = column_runs(indptr, indices, 12, np.array([0, 16]))
    xt, deltat = np.ones((16, 20)), np.ones((12, 20))
    out = np.full((12, 19), 7.0)
    with pytest.raises(ValueError, match=r"outt must have shape \(12, 20\), got \(12, 19\)"):
        spmm_forward(xt, bounds[0], bounds[-1], rows, order, data, out)
    assert (out == 7.0).all()
    with pytest.raises(ValueError, match="starts and ends differ in shape"):
        spmm_forward(xt, bounds[0], bounds[-1][:5], rows, order, data, np.empty((12, 20)))
    with pytest.raises(ValueError, match=r"outt must have shape \(16, 20\)"):
        spmm_backward(deltat, indptr, indices, data, np.empty((16, 21)))
    with pytest.raises(ValueError, match="xt and deltat hold 20 and 21 samples"):
        masked_outer_grad(xt, np.ones((12, 21)), indptr, indices, 1.0, np.empty(w.nnz))
    with pytest.raises(ValueError, match=rf"out must have shape \({w.nnz},\)"):
        masked_outer_grad(xt, deltat, indptr, indices, 1.0, np.empty(w.nnz + 1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_add_rows_adds_each_row_in_place(dtype):
    rng = np.random.default_rng(0)
    target = rng.standard_normal((50, 33)).astype(dtype)
    rows = np.array([7, 0, 49, 7, 12], dtype=np.int64)  # row 7 twice: both added
    values = rng.standard_normal((5, 33)).astype(dtype)
    expected = target.astype(np.float64)
    np.add.at(expected, rows, values.astype(np.float64))
    add_rows(target, rows.astype(np.int32), values)
    np.testing.assert_allclose(target, expected, rtol=1e-6 if dtype == np.float32 else 1e-12)


def test_add_rows_refuses_bad_arguments_before_writing():
    target = np.zeros((4, 3))
    with pytest.raises(ValueError, match="outside the target"):
        add_rows(target, np.array([0, 4]), np.ones((2, 3)))
    assert not target.any()
    with pytest.raises(ValueError, match=r"values must have shape \(2, 3\)"):
        add_rows(target, np.array([0, 1]), np.ones((2, 4)))
    with pytest.raises(ValueError, match="C-contiguous"):
        add_rows(np.zeros((3, 4)).T, np.array([0]), np.ones((1, 3)))


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_column_runs_cut_each_column_at_the_row_groups(index_dtype):
    """Against a walk of the dense pattern: each column's entries of each row group, in row
    order, with the position of their weight."""
    indptr, indices, data, w = chunk(29, 41, np.float64, index_dtype, seed=4)
    groups = np.array([0, 0, 5, 17, 29])  # an empty group too
    bounds, rows, order = column_runs(indptr, indices, 41, groups)
    assert bounds.shape == (5, 41) and rows.dtype == order.dtype == index_dtype
    position = {(i, j): p for i in range(29) for p, j in
                enumerate(indices[indptr[i]:indptr[i + 1]], start=indptr[i])}
    for c in range(41):
        for g in range(4):
            expected = [i for i in range(groups[g], groups[g + 1]) if (i, c) in position]
            run = slice(bounds[g, c], bounds[g + 1, c])
            assert rows[run].tolist() == expected
            assert order[run].tolist() == [position[i, c] for i in expected]
    assert np.array_equal(data[order], w.tocsc().data)


@pytest.mark.parametrize(
    ("groups", "n_out", "message"),
    [
        ([0, 20], 41, "groups must run from 0 to the number of rows"),
        ([1, 29], 41, "groups must run from 0 to the number of rows"),
        ([0, 20, 10, 29], 41, "groups must not decrease"),
        ([0, 29], 40, "a column index is outside"),
    ],
)
def test_column_runs_refuses_bad_groups_and_indices(groups, n_out, message):
    indptr, indices, _, _ = chunk(29, 41, np.float64, np.int32, seed=4)
    with pytest.raises(ValueError, match=message):
        column_runs(indptr, indices, n_out, np.array(groups))


_NARROW_RUN = """
import sys
import numpy as np
import scipy.sparse as sp
from dasknn.kernels.lane_vectors import ROW_VECTORS
from dasknn.kernels.training import column_runs, masked_outer_grad, spmm_backward, spmm_forward
weights = sp.load_npz(f"{sys.argv[1]}/w.npz")
for dtype in (np.float32, np.float64):
    w = weights.astype(dtype)
    xt, deltat = (np.load(f"{sys.argv[1]}/{name}.npy").astype(dtype) for name in ("x", "d"))
    bounds, rows, order = column_runs(w.indptr, w.indices, w.shape[1], np.array([0, w.shape[0]]))
    out = np.empty((w.shape[1], xt.shape[1]), dtype)
    spmm_forward(xt, bounds[0], bounds[-1], rows, order, w.data, out)
    back = np.empty(xt.shape, dtype)
    spmm_backward(deltat, w.indptr, w.indices, w.data, back)
    grad = np.empty(w.nnz, dtype)
    masked_outer_grad(xt, deltat, w.indptr, w.indices, 1.0, grad)
    np.savez(f"{sys.argv[1]}/{np.dtype(dtype).name}.npz", out=out, back=back, grad=grad)
print(ROW_VECTORS)
"""


@pytest.mark.slow
def test_kernels_compiled_without_avx512(tmp_path):
    """Compiled for the host without AVX-512 (a fresh numba cache), a pass holds 4 vectors: the
    forward and backward products equal this process's bit for bit (each lane sums its terms in
    the same order with the same fused multiply-adds), the gradient (summed in other chains)
    matches the float64 reference."""
    import os
    import subprocess
    import sys

    import llvmlite.binding as llvm

    host = llvm.get_host_cpu_features().flatten().split(",")
    if "+avx512f" not in host or "+fma" not in host:
        pytest.skip("the host has no AVX-512 to take away (or no FMA)")
    features = ",".join("-" + f[1:] if f.startswith("+avx512") else f for f in host)
    indptr, indices, data, w = chunk(60, 50, np.float64, np.int32, seed=7)
    rng = np.random.default_rng(8)
    xt, deltat = rng.random((60, 300)), rng.standard_normal((50, 300))
    sp.save_npz(tmp_path / "w.npz", w)
    np.save(tmp_path / "x.npy", xt)
    np.save(tmp_path / "d.npy", deltat)
    env = {**os.environ, "NUMBA_CPU_FEATURES": features,
           "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}
    done = subprocess.run([sys.executable, "-c", _NARROW_RUN, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) == 4
    rows = np.repeat(np.arange(60), np.diff(indptr))
    for dtype, rtol in ((np.float32, 2e-6), (np.float64, 1e-13)):
        narrow = np.load(tmp_path / f"{np.dtype(dtype).name}.npz")
        w_t, x_t, d_t = w.astype(dtype), xt.astype(dtype), deltat.astype(dtype)
        out = np.empty((50, 300), dtype)
        forward(x_t, w_t.indptr, w_t.indices, w_t.data, out)
        np.testing.assert_array_equal(narrow["out"], out)
        back = np.empty((60, 300), dtype)
        spmm_backward(d_t, w_t.indptr, w_t.indices, w_t.data, back)
        np.testing.assert_array_equal(narrow["back"], back)
        expected = (x_t.astype(np.float64) @ d_t.astype(np.float64).T)[rows, w.indices]
        np.testing.assert_allclose(narrow["grad"], expected, rtol=rtol, atol=rtol * 10)
