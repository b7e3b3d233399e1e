"""Compressed states (SAMO): flat indices, compress / expand, magnitude masks and Early-Bird.

The references are numpy written here: ``np.flatnonzero`` for the index, fancy indexing for
compress and expand, a lexicographic sort by (magnitude, flat position) for the masks.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dasknn.compressed import check_index, compress, expand, flat_index
from dasknn.pruning import EarlyBird, hamming_distance, magnitude_masks

shapes = st.tuples(st.integers(1, 12), st.integers(1, 12))


@st.composite
def layer_and_mask(draw, dtype=np.float64):
    shape = draw(shapes)
    x = draw(arrays(dtype, shape, elements=st.floats(-1e3, 1e3, width=64)))
    mask = draw(arrays(np.bool_, shape))
    if not mask.any():
        mask.flat[draw(st.integers(0, mask.size - 1))] = True
    return x, mask


@settings(max_examples=60, deadline=None)
@given(layer_and_mask())
def test_expand_of_compress_is_x_times_mask(case):
    x, mask = case
    index = flat_index(mask)
    np.testing.assert_array_equal(index, np.flatnonzero(mask))
    assert index.dtype == np.int32 and (np.diff(index) > 0).all()  # sorted, CSR order
    values = compress(x, index)
    np.testing.assert_array_equal(values, x[mask])  # numpy's boolean indexing is row-major
    np.testing.assert_array_equal(expand(values, index, x.shape), x * mask)


@settings(max_examples=60, deadline=None)
@given(layer_and_mask(), st.sampled_from(["float32", "float16", "bfloat16"]))
def test_compress_of_expand_is_v(case, dtype_name):
    if dtype_name == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        dtype = np.dtype(ml_dtypes.bfloat16)
    else:
        dtype = np.dtype(dtype_name)
    x, mask = case
    index = flat_index(mask)
    v = x[mask].astype(dtype)
    dense = expand(v, index, mask.shape)
    assert dense.dtype == dtype
    np.testing.assert_array_equal(compress(dense, index).view(np.uint8), v.view(np.uint8))
    assert (dense.astype(np.float64)[~mask] == 0).all()


@pytest.mark.parametrize(
    ("index", "shape", "match"),
    [
        (np.array([3, 1]), (2, 3), "unsorted"),
        (np.array([1, 1]), (2, 3), "duplicate"),
        (np.array([0, 6]), (2, 3), "outside"),
        (np.array([-1, 2]), (2, 3), "outside"),
        (np.array([], dtype=np.int32), (2, 3), "fully pruned"),
        (np.array([0.0, 1.0]), (2, 3), "integer"),
        (np.array([[0, 1]]), (2, 3), "1-D"),
        (np.array([0]), (2**16, 2**15), "2\\*\\*31"),
    ],
)
def test_bad_indices_raise(index, shape, match):
    with pytest.raises(ValueError, match=match):
        check_index(index, shape)


def test_bad_masks_and_values_raise():
    with pytest.raises(ValueError, match="fully pruned"):
        flat_index(np.zeros((3, 2), dtype=bool))
    with pytest.raises(ValueError, match="boolean"):
        flat_index(np.ones((3, 2)))
    with pytest.raises(ValueError, match="one value per index entry"):
        expand(np.ones(3), np.array([0, 1]), (2, 2))
    with pytest.raises(ValueError, match="2-D"):
        compress(np.ones(4), np.array([0, 1]))


def reference_masks(weights, p, scope):
    """Prune the round(p * phi) smallest |w|, ties by flat position, via np.lexsort."""

    def keep(mags):
        order = np.lexsort((np.arange(mags.size), mags))
        kept = np.ones(mags.size, dtype=bool)
        kept[order[: int(round(p * mags.size))]] = False
        return kept

    if scope == "layer":
        return [keep(np.abs(w).ravel()).reshape(w.shape) for w in weights]
    flat = keep(np.concatenate([np.abs(w).ravel() for w in weights]))
    out, start = [], 0
    for w in weights:
        out.append(flat[start : start + w.size].reshape(w.shape))
        start += w.size
    return out


@settings(max_examples=40, deadline=None)
@given(
    st.lists(shapes, min_size=1, max_size=3),
    st.floats(0, 0.6),
    st.sampled_from(["global", "layer"]),
    st.integers(0, 2**31),
)
def test_magnitude_masks_prune_exactly_and_break_ties_by_position(layer_shapes, p, scope, seed):
    rng = np.random.default_rng(seed)
    # few distinct magnitudes, so ties are common
    weights = [rng.integers(-3, 4, size=s).astype(np.float64) for s in layer_shapes]
    want = reference_masks(weights, p, scope)
    if any(not m.any() for m in want):
        with pytest.raises(ValueError, match="removes every weight"):
            magnitude_masks(weights, p, scope)
        return
    masks = magnitude_masks(weights, p, scope)
    for got, ref in zip(masks, want, strict=True):
        np.testing.assert_array_equal(got, ref)
    pruned = sum(int((~m).sum()) for m in masks)
    if scope == "global":
        assert pruned == round(p * sum(w.size for w in weights))


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, float("nan"), "0.5", True])
def test_sparsity_outside_range_raises(p):
    with pytest.raises(ValueError, match="sparsity"):
        magnitude_masks([np.ones((2, 2))], p)
    with pytest.raises(ValueError, match="sparsity"):
        EarlyBird(p)


def test_early_bird_stops_when_the_last_masks_agree():
    rng = np.random.default_rng(0)
    w = [rng.normal(size=(30, 20)), rng.normal(size=(20, 10))]
    bird = EarlyBird(0.5, window=5, threshold=0.1)
    found = []
    # drift that shrinks each epoch: masks settle
    for epoch in range(12):
        w = [x + rng.normal(size=x.shape) * 0.5 / (epoch + 1) ** 2 for x in w]
        found.append(bird.update(w))
    assert found[:4] == [False] * 4 and np.isnan(bird.distances_[:4]).all()
    first = found.index(True)
    older = list(bird.masks_)
    assert max(hamming_distance(older[-1], m) for m in older[:-1]) <= 0.1
    assert bird.distances_[first] <= 0.1
    assert all(d > 0.1 for d in bird.distances_[4:first])
