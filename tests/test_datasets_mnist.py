"""MNIST IDX reading and the conversion to challenge inputs, checked against scipy.ndimage."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from scipy import ndimage

from dasknn.datasets import load_mnist_test, mnist_to_challenge_inputs, read_mnist_idx


def test_bundled_mnist_matches_shared(shared_mnist_dir):
    images, labels = load_mnist_test()
    assert images.shape == (10000, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (10000,) and set(np.unique(labels)) == set(range(10))
    shared = read_mnist_idx(shared_mnist_dir / "t10k-images-idx3-ubyte.gz")
    np.testing.assert_array_equal(images, shared)


def test_idx_plain_and_errors(tmp_path):
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    header = bytes([0, 0, 0x08, 3]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    (tmp_path / "ok.idx").write_bytes(header + array.tobytes())
    np.testing.assert_array_equal(read_mnist_idx(tmp_path / "ok.idx"), array)
    with gzip.open(tmp_path / "ok.idx.gz", "wb") as fh:
        fh.write(header + array.tobytes())
    np.testing.assert_array_equal(read_mnist_idx(tmp_path / "ok.idx.gz"), array)
    (tmp_path / "short.idx").write_bytes(header + array.tobytes()[:-1])
    with pytest.raises(ValueError, match="header says shape"):
        read_mnist_idx(tmp_path / "short.idx")
    (tmp_path / "magic.idx").write_bytes(b"\x01\x02\x08\x03")
    with pytest.raises(ValueError, match="magic"):
        read_mnist_idx(tmp_path / "magic.idx")
    (tmp_path / "code.idx").write_bytes(bytes([0, 0, 0x07, 1, 0, 0, 0, 1, 5]))
    with pytest.raises(ValueError, match="type code"):
        read_mnist_idx(tmp_path / "code.idx")
    with pytest.raises(FileNotFoundError):
        read_mnist_idx(tmp_path / "absent.idx")


def _reference_inputs(images, side, threshold=0.5):
    """Independent resize: scipy.ndimage.map_coordinates, linear, pixel centres aligned."""
    n, height, width = images.shape
    ys = np.clip((np.arange(side) + 0.5) * height / side - 0.5, 0, height - 1)
    xs = np.clip((np.arange(side) + 0.5) * width / side - 0.5, 0, width - 1)
    grid_y, grid_x = np.meshgrid(ys, xs, indexing="ij")
    out = np.empty((n, side * side))
    for k in range(n):
        values = ndimage.map_coordinates(
            images[k].astype(np.float64) / 255.0, [grid_y, grid_x], order=1, mode="nearest"
        )
        out[k] = (values > threshold).ravel()
    return out


@pytest.mark.parametrize("side", [32, 64])
def test_conversion_matches_independent_resize(side):
    images, _ = load_mnist_test()
    sample = images[:200]
    converted = mnist_to_challenge_inputs(sample, side=side)
    assert converted.shape == (200, side * side)
    assert set(np.unique(converted.data)) == {1.0}
    reference = _reference_inputs(sample, side)
    # the two interpolations sum in a different order: only pixels within rounding of the
    # threshold may differ, and there are essentially none
    assert np.mean(converted.toarray() != reference) < 1e-4
    assert converted.nnz > 0.1 * converted.shape[0] * converted.shape[1]


def test_conversion_errors():
    with pytest.raises(ValueError, match="shape"):
        mnist_to_challenge_inputs(np.zeros((28, 28)))
    with pytest.raises(ValueError, match="NaN"):
        mnist_to_challenge_inputs(np.full((1, 28, 28), np.nan))
