"""``pack_layers`` against scipy's CSC conversion (the independent reference)."""

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn.kernels.inference import pack_layers


def _messy_layer(n: int, seed: int) -> sp.csr_matrix:
    """A CSR layer with duplicate entries and unsorted indices inside its rows."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, n, 6 * n)
    cols = rng.integers(0, n, 6 * n)
    coo = sp.coo_matrix((rng.normal(size=rows.size), (rows, cols)), shape=(n, n))
    csr = sp.csr_matrix(coo)  # scipy keeps duplicates
    for r in range(n):
        lo, hi = csr.indptr[r], csr.indptr[r + 1]
        csr.indices[lo:hi] = csr.indices[lo:hi][::-1].copy()
        csr.data[lo:hi] = csr.data[lo:hi][::-1].copy()
    csr.has_sorted_indices = False
    return csr


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_packed_layers_equal_scipy_csc(dtype):
    n = 37
    layers = [_messy_layer(n, s) for s in range(4)] + [sp.csr_matrix((n, n))]
    layers.append(sp.coo_matrix(_messy_layer(n, 9)))
    packed = pack_layers(layers, dtype)
    offset = 0
    for k, layer in enumerate(layers):
        csc = sp.csc_matrix(layer, dtype=np.float64)
        csc.sum_duplicates()
        csc.sort_indices()
        np.testing.assert_array_equal(packed.indptr[k], csc.indptr + offset)
        np.testing.assert_array_equal(packed.indices[offset:offset + csc.nnz], csc.indices)
        np.testing.assert_array_equal(packed.data[offset:offset + csc.nnz],
                                      csc.data.astype(dtype))
        np.testing.assert_array_equal(packed.out_degree[k], np.diff(sp.csr_matrix(csc).indptr))
        offset += csc.nnz
    assert packed.indices.dtype == np.int32 and packed.data.dtype == dtype


def test_weight_out_of_float32_range_is_refused():
    layer = sp.csr_matrix(np.eye(4) * 1e300)
    with pytest.raises(ValueError, match="layer 2 has a weight that is not finite in float32"):
        pack_layers([sp.csr_matrix(np.eye(4)), layer], np.float32)
    assert np.all(pack_layers([layer], np.float64).data == 1e300)


def test_non_square_layer_is_refused():
    with pytest.raises(ValueError, match="layer 2 has shape"):
        pack_layers([sp.eye(4, format="csr"), sp.csr_matrix((4, 5))])
