"""The RadiX-Net generator against the official challenge network and its structure class."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.datasets import radixnet, radixnet_group_size, read_challenge_network


def _row_patterns(w):
    w = w.tocsr()
    w.sort_indices()
    return [tuple(w.indices[w.indptr[i] : w.indptr[i + 1]]) for i in range(w.shape[0])]


def _circulant_row(neurons, stride, i):
    base = neurons // 16
    return tuple(sorted((i - b * stride + base * q) % neurons for b in (0, 1) for q in range(16)))


def _row_relabelling(w, neurons, stride):
    """The circulant row each row of ``w`` copies, as one representative row index per row."""
    lookup = {}
    for i in range(neurons):
        lookup.setdefault(_circulant_row(neurons, stride, i), i)
    return np.array([lookup.get(p, -1) for p in _row_patterns(w)])


def _assert_structure_class(layers, neurons):
    """Every layer of group g is the circulant of its position with rows relabelled by one map."""
    group = radixnet_group_size(neurons)
    for start in range(0, len(layers), group):
        # the first layer of a group has stride 1, whose rows are all distinct patterns per class
        labels = _row_relabelling(layers[start], neurons, 1)
        assert np.all(labels >= 0)
        assert np.all(np.bincount(labels % (neurons // 16), minlength=neurons // 16) == 16)
        for offset in range(1, min(group, len(layers) - start)):
            stride = 1 << offset
            relabelled = [_circulant_row(neurons, stride, i) for i in labels]
            assert _row_patterns(layers[start + offset]) == relabelled


def test_first_group_reproduces_official_exactly(official_1024_dir):
    official = read_challenge_network(official_1024_dir, layers=6)
    generated = radixnet(1024, 6, seed=123)
    for mine, theirs in zip(generated, official, strict=True):
        assert (mine != theirs).nnz == 0


def test_official_and_generated_share_structure_class(official_1024_dir):
    official = read_challenge_network(official_1024_dir, layers=24)
    _assert_structure_class(official, 1024)
    _assert_structure_class(radixnet(1024, 24, seed=5), 1024)


@pytest.mark.parametrize("neurons", [1024, 4096, 16384])
def test_degrees_values_and_determinism(neurons):
    depth = radixnet_group_size(neurons) + 1
    layers = radixnet(neurons, depth, seed=7)
    for w in layers:
        assert w.shape == (neurons, neurons)
        assert np.all(np.diff(w.indptr) == 32)
        assert np.all(np.bincount(w.indices, minlength=neurons) == 32)
        assert np.all(w.data == 1 / 16)
    again = radixnet(neurons, depth, seed=7)
    assert all((a != b).nnz == 0 for a, b in zip(layers, again, strict=True))
    other = radixnet(neurons, depth, seed=8)
    group = radixnet_group_size(neurons)
    assert (layers[group] != other[group]).nnz > 0


def test_structure_class_for_wider_network():
    _assert_structure_class(radixnet(4096, 20, seed=1), 4096)


def test_65536_and_depths():
    layers = radixnet(65536, 2)
    assert layers[1].nnz == 65536 * 32
    assert len(radixnet(1024, 1920, seed=0)) == 1920


@pytest.mark.parametrize("neurons", [0, 16, 1000, 1536, -1024])
def test_invalid_widths(neurons):
    with pytest.raises(ValueError, match="16 \\* 2\\*\\*m"):
        radixnet(neurons, 3)


def test_invalid_depth():
    with pytest.raises(ValueError, match="layers"):
        radixnet(1024, 0)


def test_layers_have_scipys_index_dtype_and_own_their_arrays():
    first, second = radixnet(1024, 2, seed=3)
    for w in (first, second):
        assert w.indices.dtype == w.indptr.dtype == np.int32  # as scipy would choose them
        assert w.has_sorted_indices and w.has_canonical_format
    kept = second.copy()
    first.indptr[:] = 0
    first.indices[:] = 0
    first.data[:] = 0
    assert (second != kept).nnz == 0  # nothing shared between layers
