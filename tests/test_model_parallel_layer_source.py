"""A model-parallel model of a network made a layer at a time (``LayerSource``) on a real
LocalCluster: the same model as from the whole network, never more than a few layers on the
client, and a bad layer refused before anything is placed; the model-parallel challenge run of a
generated network, against scipy."""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest
import scipy.sparse as sp
from challenge_reference import reference_categories
from random_layers import random_layers

import graph
from dasknn.challenge import run_challenge_model_parallel
from dasknn.cli import main
from dasknn.datasets import (
    challenge_bias,
    iter_network,
    load_mnist_test,
    load_network,
    mnist_to_challenge_inputs,
    write_categories,
)
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


@pytest.mark.slow
def test_the_challenge_uses_a_partition_file_of_the_network(dask_client, tmp_path):
    spec = "radixnet:1024:12:4"
    images, _ = load_mnist_test()
    inputs = mnist_to_challenge_inputs(images[:100], side=32)
    network = load_network(spec)
    expected = reference_categories(inputs, network, challenge_bias(1024)) + 1
    parts = tmp_path / "parts.npz"
    graph.partition_stream(iter_network(spec), 3, parts_out=parts)
    categories, stats = run_challenge_model_parallel(
        spec, inputs, client=dask_client, partition=parts, method="random", batch_size=64,
        progress=False,
    )
    np.testing.assert_array_equal(categories, expected)
    assert (stats.nparts, stats.method) == (3, "hypergraph")
    assert stats.measured_bytes == stats.predicted_bytes > 0
    whole = graph.partition_network(network, 3)
    assert run_challenge_model_parallel(
        network, inputs, client=dask_client, partition=whole, progress=False
    )[1].measured_bytes == stats.measured_bytes


def test_a_partition_that_does_not_fit_is_refused_before_any_work(dask_client, tmp_path):
    spec = "radixnet:1024:6"
    inputs = mnist_to_challenge_inputs(load_mnist_test()[0][:10], side=32)
    both = tmp_path / "both.npz"
    graph.save_partitions(
        both, {p: graph.partition_network(load_network(spec), p, method="block") for p in (2, 4)}
    )
    other = graph.partition_network(load_network("radixnet:1024:5"), 2, method="block")
    before = dask_client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
    for partition, nparts, message in [
        (both, None, r"partitions into \[2, 4\] parts: choose one with nparts"),
        (both, 3, r"no partition into 3 parts, only \[2, 4\]"),
        (other, None, "partition has 6 part arrays but the network has 6 layers"),
        (other, 4, "nparts 4 differs from the partition's 2"),
        (tmp_path / "missing.npz", None, None),
    ]:
        error = FileNotFoundError if message is None else ValueError
        with pytest.raises(error, match=message):
            run_challenge_model_parallel(
                spec, inputs, client=dask_client, partition=partition, nparts=nparts
            )
    after = dask_client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
    assert after <= before


def test_the_cli_runs_on_the_partition_file_dasknn_partition_wrote(
    dask_client, tmp_path, capsys
):
    spec = "radixnet:1024:12:4"
    inputs = mnist_to_challenge_inputs(load_mnist_test()[0][:100], side=32)
    coo = inputs.tocoo()
    triples = zip(coo.row, coo.col, coo.data, strict=True)
    (tmp_path / "inputs.tsv").write_text(
        "".join(f"{r + 1}\t{c + 1}\t{v:g}\n" for r, c, v in triples)
    )
    expected = reference_categories(inputs, load_network(spec), challenge_bias(1024)) + 1
    write_categories(tmp_path / "golden.tsv", expected)
    parts = tmp_path / "parts.npz"
    assert main(["partition", spec, "--parts", "2", "--stream", "--out", str(parts)]) == 0
    run = ["challenge", "--network", spec, "--inputs", str(tmp_path / "inputs.tsv"), "--quiet"]
    code = main([
        *run, "--golden", str(tmp_path / "golden.tsv"), "--json", str(tmp_path / "stats.json"),
        "--scheduler", dask_client.scheduler.address, "--model-parallel", "--partition-file",
        str(parts),
    ])
    assert code == 0
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert (stats["passed"], stats["nparts"], stats["method"]) == (True, 2, "hypergraph")
    capsys.readouterr()
    assert main([*run, "--partition-file", str(parts)]) == 2
    assert "--partition-file is for --model-parallel runs" in capsys.readouterr().err
