"""A network made a layer at a time: its checks as the layers are made, and the partition of
layers that come one at a time against the in-memory partitioner."""

from __future__ import annotations

import numpy as np
import pytest
from random_layers import random_layers

import graph
from dasknn.model import LayerSource, SparseMLP

SIZES = [30, 24, 36, 12]


def _source(weights, **options) -> LayerSource:
    return LayerSource(lambda: iter(weights), [w.shape for w in weights], **options)


def test_the_layers_are_those_of_the_in_memory_model_made_anew_each_pass():
    weights, biases = random_layers(SIZES, 0.3, seed=1)
    made = []

    def layers():
        for w in weights:
            made.append(w)
            yield w

    source = LayerSource(layers, [w.shape for w in weights], biases=biases.__getitem__,
                         dtype="float32")
    model = SparseMLP(weights, biases, dtype="float32")
    for _ in range(2):
        for ours, theirs in zip(source.iter_weights(), model.iter_weights(), strict=True):
            assert ours.dtype == np.float32 and ours.has_sorted_indices
            assert (ours != theirs).nnz == 0
    assert len(made) == 2 * len(weights)
    assert source.layer_sizes == model.layer_sizes == SIZES
    for k in range(3):
        np.testing.assert_array_equal(source.biases[k], model.biases[k])
    assert [b.tolist() for b in _source(weights).biases] == [[0.0] * n for n in SIZES[1:]]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda ws: ws[:2], r"the layers end after 2 of the 3"),
        (lambda ws: [*ws, ws[-1]], r"go on past the 3"),
        (lambda ws: [ws[0], ws[1].T, ws[2]], r"weights\[1\] has shape \(36, 24\), expected"),
        (lambda ws: [ws[0], np.ones(3), ws[2]], r"weights\[1\] has shape \(3,\), expected"),
    ],
)
def test_a_layer_that_is_not_as_declared_is_named_when_it_is_made(change, message):
    weights, _ = random_layers(SIZES, 0.3, seed=2)
    source = LayerSource(lambda: iter(change(weights)), [w.shape for w in weights])
    with pytest.raises(ValueError, match=message):
        list(source.iter_weights())


def test_bad_values_and_biases_are_named():
    weights, _ = random_layers(SIZES, 0.3, seed=3)
    bad = [w.copy() for w in weights]
    bad[2].data[0] = np.nan
    with pytest.raises(ValueError, match=r"weights\[2\]"):
        list(_source(bad).iter_weights())
    source = _source(weights, biases=lambda k: np.full(5, np.inf if k else 0.0))
    with pytest.raises(ValueError, match=r"biases\[0\] must have shape \(24,\)"):
        source.biases[0]
    source = _source(weights, biases=lambda k: np.full(SIZES[k + 1], np.inf))
    with pytest.raises(ValueError, match=r"biases\[1\] contains NaN or infinite"):
        source.biases[1]


@pytest.mark.parametrize(
    ("layers", "shapes", "message"),
    [
        ([], [(3, 4), (5, 2)], "4 output neurons"),
        ([], [], "at least one weight matrix"),
        ([], [(0, 4)], "at least one neuron"),
        ("not callable", [(3, 4)], "function returning"),
    ],
)
def test_bad_declarations_are_refused_at_once(layers, shapes, message):
    make = layers if isinstance(layers, str) else (lambda: iter(layers))
    with pytest.raises(ValueError, match=message):
        LayerSource(make, shapes)


@pytest.mark.parametrize("method", ["hypergraph", "random", "block"])
def test_layers_one_at_a_time_partition_as_the_whole_network(method):
    weights, _ = random_layers([64, 48, 64, 32], 0.1, seed=4)
    whole = graph.partition_network(weights, 4, method=method, seed=7)
    streamed = graph.partition_layers(iter(weights), 4, method=method, seed=7)
    assert (streamed.nparts, streamed.method) == (4, method)
    assert len(streamed.parts) == len(whole.parts) == 4
    for ours, theirs in zip(streamed.parts, whole.parts, strict=True):
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("method", ["hypergraph", "random"])
def test_a_partition_of_layers_one_at_a_time_refuses_bad_input(method):
    weights, _ = random_layers([64, 48, 64], 0.1, seed=5)
    with pytest.raises(ValueError, match="the network has no layers"):
        graph.partition_layers(iter([]), 2, method=method)
    with pytest.raises(ValueError, match="layer 2 has 64 inputs but layer 1 has 48 outputs"):
        graph.partition_layers(iter([weights[0], weights[0]]), 2, method=method)
    with pytest.raises(ValueError, match="cannot split into 100 parts"):
        graph.partition_layers(iter(weights), 100, method=method)
    with pytest.raises(ValueError, match="unknown partitioning method"):
        graph.partition_layers(iter(weights), 2, method="spectral")
    with pytest.raises(ValueError, match="layer 1 is not a 2-d scipy sparse matrix"):
        graph.partition_layers(iter([np.ones((4, 4))]), 2, method=method)
