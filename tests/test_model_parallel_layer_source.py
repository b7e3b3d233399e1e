"""A model-parallel model of a network made a layer at a time (``LayerSource``) on a real
LocalCluster: the same model as from the whole network, never more than a few layers on the
client, and a bad layer refused before anything is placed; the model-parallel challenge run of a
generated network, against scipy."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import scipy.sparse as sp
from challenge_reference import reference_categories
from random_layers import random_layers

from dasknn.challenge import run_challenge_model_parallel
from dasknn.datasets import challenge_bias, load_mnist_test, load_network, mnist_to_challenge_inputs
from dasknn.model import LayerSource, SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.model_parallel._worker_state import ModelState
from dasknn.optim import SGD

SIZES = [40, 37, 37, 37, 37, 37, 37, 37, 37, 37, 37, 37, 12]


def _network(seed: int = 0):
    weights, biases = random_layers(SIZES, 0.2, seed)
    return weights, biases


def _reference(weights, biases, x: np.ndarray) -> np.ndarray:
    """The forward pass in float64 with scipy: sigmoid on every layer."""
    y = x
    for w, b in zip(weights, biases, strict=True):
        y = 1.0 / (1.0 + np.exp(-(sp.csr_matrix(w).T @ y.T).T - b))
    return y


def _layers_on_the_client(shape: tuple[int, int]) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if sp.issparse(o) and o.shape == shape)


def _models_on_workers(dask_worker) -> int:
    return sum(isinstance(p, ModelState) for p in dask_worker.plugins.values())


def test_a_network_made_a_layer_at_a_time_is_the_same_model(dask_client):
    weights, biases = _network()
    alive = []  # square 37 x 37 layers on the client whenever one is made

    def layers():
        for w in weights:
            alive.append(_layers_on_the_client((37, 37)))
            yield w.copy()

    source = LayerSource(layers, [w.shape for w in weights], biases=biases.__getitem__)
    held = _layers_on_the_client((37, 37))  # the test's own: ``weights``
    dist = DistributedSparseMLP(source, dask_client, nparts=3)
    model = SparseMLP(weights, biases)
    whole = DistributedSparseMLP(model, dask_client, partition=dist._parts, nparts=3)
    try:
        # three passes (partition, renumbering, placement), each holding two layers at most
        assert len(alive) == 3 * len(weights)
        assert max(alive) - held <= 2
        x = np.random.default_rng(1).uniform(size=(9, SIZES[0]))
        np.testing.assert_allclose(dist.predict(x), _reference(weights, biases, x), rtol=1e-12)
        np.testing.assert_array_equal(dist.predict(x), whole.predict(x))
        assert dist._identity() == whole._identity()
        y = np.random.default_rng(2).uniform(size=(9, SIZES[-1]))
        dist.train_step(x, y, optimizer=SGD(0.1))
        model.train_step(x, y, optimizer=SGD(0.1))
        for ours, theirs in zip(dist.gather().weights, model.weights, strict=True):
            np.testing.assert_allclose(ours.toarray(), theirs.toarray(), rtol=1e-12, atol=1e-15)
    finally:
        dist.close()
        whole.close()


def test_a_bad_layer_is_refused_before_anything_is_placed(dask_client):
    weights, biases = _network(3)
    bad = [w.copy() for w in weights]
    bad[5].data[2] = np.inf
    source = LayerSource(lambda: iter(bad), [w.shape for w in bad])
    before = sum(dask_client.run(_models_on_workers).values())
    with pytest.raises(ValueError, match=r"weights\[5\] contains NaN or infinite values"):
        DistributedSparseMLP(source, dask_client, nparts=2)
    assert sum(dask_client.run(_models_on_workers).values()) == before


@pytest.mark.parametrize("method", ["hypergraph", "random"])
def test_the_challenge_runs_a_generated_network_a_layer_at_a_time(dask_client, method):
    images, _ = load_mnist_test()
    inputs = mnist_to_challenge_inputs(images[:200], side=32)
    network = load_network("radixnet:1024:12:4")
    expected = reference_categories(inputs, network, challenge_bias(1024)) + 1
    categories, stats = run_challenge_model_parallel(
        "radixnet:1024:12:4", inputs, client=dask_client, nparts=3, method=method,
        batch_size=64, dtype="float64", progress=False,
    )
    np.testing.assert_array_equal(categories, expected)
    assert (stats.neurons, stats.layers, stats.edges) == (1024, 12, 12 * 1024 * 32)
    assert stats.measured_bytes == stats.predicted_bytes > 0
