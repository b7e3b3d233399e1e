"""Model-parallel training on a real LocalCluster against an independent dense float64 reference.

The reference (tests/model_reference.py) is written from the maths (dense numpy, masks for the
sparsity pattern); it shares no code with dasknn. Partitions: random, block, uneven, with empty
parts, and hypergraph partitions; P = 1..4 parts on 2 workers.
"""

from __future__ import annotations

import numpy as np
import pytest
import sparse
from distributed import futures_of
from model_reference import DenseReference, assert_same_layers, stored_mask
from random_layers import random_layers

import graph
from dasknn.model import SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.optim import SGD, Adam, AdamW
from dasknn.runtime.cluster import scheduler_workers

pytestmark = pytest.mark.minversions  # also run at the minimum versions (.ci/run)


# ----------------------------------------------------------------- networks and partitions
def _irregular_model(dtype=np.float64, activation="sigmoid", loss="mse", seed=0):
    """Four layers of different widths, random patterns, random weights and biases."""
    weights, biases = random_layers([24, 40, 32, 36, 20], 0.15, seed)
    return SparseMLP(weights, biases, activation=activation, loss=loss, dtype=dtype)


def _partition(kind, sizes, nparts, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "random":
        return [rng.integers(0, nparts, size=n) for n in sizes]
    if kind == "block":
        return [np.arange(n) * nparts // n for n in sizes]
    if kind == "uneven":  # one part owns most neurons
        weights = np.array([0.7] + [0.3 / (nparts - 1)] * (nparts - 1)) if nparts > 1 else [1.0]
        return [rng.choice(nparts, size=n, p=weights) for n in sizes]
    if kind == "empty":  # the last part owns nothing in the inputs and in layer 2
        parts = [rng.integers(0, nparts, size=n) for n in sizes]
        parts[0] = rng.integers(0, nparts - 1, size=sizes[0])
        parts[2] = rng.integers(0, nparts - 1, size=sizes[2])
        return parts
    raise AssertionError(kind)


def _data(model, batch, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, size=(batch, model.n_inputs))
    if model.loss.name == "mse":
        y = rng.uniform(0, 1, size=(batch, model.n_outputs))
    else:
        y = np.eye(model.n_outputs)[rng.integers(0, model.n_outputs, size=batch)]
    return x, y


def _train_and_compare(client, model, partition, steps=2, batch=6, lr=0.3, tol=1e-10, nparts=None):
    reference = DenseReference(
        model.weights,
        model.biases,
        model.activation.name,
        model.output_activation.name,
        model.loss.name,
    )
    dist = DistributedSparseMLP(model, client, partition=partition, nparts=nparts)
    try:
        for step in range(steps):
            x, y = _data(model, batch, seed=step)
            got = dist.train_step(x, y, lr=lr)
            want = reference.step(x.astype(np.float64), y.astype(np.float64), lr)
            assert got == pytest.approx(want, rel=tol, abs=tol)
        trained = dist.gather()
        for k in range(model.n_layers):
            dense = trained.weights[k].toarray()
            np.testing.assert_allclose(dense, reference.W[k], rtol=tol, atol=tol)
            np.testing.assert_array_equal(stored_mask(trained.weights[k]), reference.mask[k])
            np.testing.assert_allclose(trained.biases[k], reference.b[k], rtol=tol, atol=tol)
        x, _ = _data(model, 5, seed=99)
        _, acts = reference.forward(x)
        expected = acts[-1]
        if model.loss.name != "mse":
            expected = np.exp(expected - expected.max(axis=1, keepdims=True))
            expected /= expected.sum(axis=1, keepdims=True)
        output = dist.predict_proba(x) if model.loss.name != "mse" else dist.predict(x)
        np.testing.assert_allclose(output, expected, rtol=tol, atol=tol)
        report = dist.comm_report()
        assert report.exact, report.format()
        return dist, report
    finally:
        dist.close()


# ----------------------------------------------------------------- tests
# the default run takes one part, a random, a block and an uneven partition; the rest are slow
@pytest.mark.parametrize(
    ("kind", "nparts"),
    [
        ("random", 1),
        pytest.param("random", 2, marks=pytest.mark.slow),
        ("random", 3),
        pytest.param("random", 4, marks=pytest.mark.slow),
        pytest.param("block", 2, marks=pytest.mark.slow),
        ("block", 4),
        ("uneven", 3),
    ],
)
def test_steps_equal_dense_reference(dask_client, kind, nparts):
    model = _irregular_model()
    _train_and_compare(dask_client, model, _partition(kind, model.layer_sizes, nparts, nparts))


@pytest.mark.parametrize("nparts", [3, 4])
def test_empty_parts(dask_client, nparts):
    model = _irregular_model(seed=3)
    parts = _partition("empty", model.layer_sizes, nparts, seed=nparts)
    _train_and_compare(dask_client, model, parts, nparts=nparts)


def test_a_part_with_no_neurons_at_all(dask_client):
    model = _irregular_model(seed=4)
    parts = _partition("random", model.layer_sizes, 2, seed=4)
    _train_and_compare(dask_client, model, parts, nparts=4)


@pytest.mark.parametrize("nparts", [2, 4])
def test_hypergraph_partition(dask_client, nparts):
    model = SparseMLP.radixnet(neurons=64, layers=4, seed=nparts, activation="sigmoid")
    partition = graph.partition_network(model.weights, nparts, method="hypergraph")
    _train_and_compare(dask_client, model, partition, lr=0.5)


@pytest.mark.parametrize(
    ("activation", "loss"), [("relu", "softmax_cross_entropy"), ("clipped_relu", "mse")]
)
def test_other_activations_and_losses(dask_client, activation, loss):
    model = _irregular_model(activation=activation, loss=loss, seed=5)
    _train_and_compare(dask_client, model, _partition("random", model.layer_sizes, 3, seed=5))


def test_float32_within_relative_tolerance(dask_client):
    model = _irregular_model(dtype=np.float32, seed=6)
    _train_and_compare(
        dask_client, model, _partition("random", model.layer_sizes, 2, seed=6), tol=1e-5
    )


def test_batch_size_one(dask_client):
    model = _irregular_model(seed=7)
    _train_and_compare(dask_client, model, _partition("block", model.layer_sizes, 2), batch=1)


def test_fit_matches_single_process_fit(dask_client):
    model = _irregular_model(seed=8)
    reference = model.copy()
    x, y = _data(model, 17, seed=8)
    parts = _partition("random", model.layer_sizes, 3, seed=8)
    dist = DistributedSparseMLP(model, dask_client, partition=parts)
    try:
        got = dist.fit(x, y, batch_size=7, epochs=2, lr=0.2, seed=3, progress=False).loss_curve_
        want = reference.fit(x, y, batch_size=7, epochs=2, lr=0.2, seed=3, progress=False)
        np.testing.assert_allclose(got, want.loss_curve_, rtol=1e-10)
        trained = dist.gather()
        for k in range(model.n_layers):
            np.testing.assert_allclose(
                trained.weights[k].toarray(), reference.weights[k].toarray(), atol=1e-10
            )
        assert dist.comm_report().exact
    finally:
        dist.close()


def test_layout_is_pinned_gcxs_chunks(dask_client):
    model = _irregular_model(seed=9)
    parts = _partition("random", model.layer_sizes, 3, seed=9)
    dist = DistributedSparseMLP(model, dask_client, partition=parts)
    try:
        workers = sorted(scheduler_workers(dask_client))
        assert dist.part_workers == [workers[m % 2] for m in range(3)]
        for k in range(1, model.n_layers + 1):
            array = dist.weights[k - 1]
            assert array.numblocks == (1, 3)
            assert array.chunks[1] == tuple(np.bincount(parts[k], minlength=3))
            block = array.blocks[0, 1].compute()
            assert isinstance(block, sparse.GCXS)
            keys = [(array.name, 0, m) for m in range(3)]
            who_has = dask_client.who_has(futures_of(array))
            for m, key in enumerate(keys):
                assert list(who_has[key]) == [dist.part_workers[m]]
            full = array.compute().to_scipy_sparse().toarray()
            order_in, order_out = dist.plan.orders[k - 1], dist.plan.orders[k]
            expected = model.weights[k - 1].toarray()[order_in][:, order_out]
            np.testing.assert_array_equal(full, expected)
            np.testing.assert_array_equal(
                dist.biases[k - 1].compute(), model.biases[k - 1][order_out]
            )
    finally:
        dist.close()


def test_separate_pack_tasks_give_the_same_training(dask_client):
    from dasknn.model_parallel import DistributedSparseMLP

    model = _irregular_model(seed=10)
    parts = _partition("random", model.layer_sizes, 3, seed=10)
    results = []
    for separate in (False, True):
        dist = DistributedSparseMLP(
            model, dask_client, partition=parts, separate_packing=separate, messages="tasks"
        )
        try:
            x, y = _data(model, 5, seed=10)
            losses = [dist.train_step(x, y, lr=0.2) for _ in range(2)]
            assert dist.comm_report().exact
            results.append((losses, dist.gather()))
        finally:
            dist.close()
    (fused_losses, fused), (split_losses, split) = results
    assert fused_losses == split_losses
    for a, b in zip(fused.weights, split.weights, strict=True):
        np.testing.assert_array_equal(a.toarray(), b.toarray())


def test_parts_on_one_worker_exchange_through_the_mailbox(dask_client):
    """P = 4 on 2 workers: a part's message tasks go to other workers only, one per worker, and
    the step's measured traffic still equals the prediction (messages between co-located parts
    never cross a worker boundary, so they are neither tasks nor counted)."""
    from dasknn.model_parallel import DistributedSparseMLP

    model = _irregular_model(seed=4)
    parts = _partition("random", model.layer_sizes, 4, seed=4)
    dist = DistributedSparseMLP(model, dask_client, partition=parts, messages="tasks")
    try:
        workers = sorted(set(dist.part_workers))
        assert len(workers) == 2
        home = [workers.index(address) for address in dist.part_workers]
        template = dist._template("train")
        per_part: dict = {}
        for spec in template.specs:
            if spec.phase in ("fwd", "bwd") and spec.n >= 0:
                assert spec.n != home[spec.m], spec  # never a task for the part's own worker
                per_part.setdefault((spec.phase, spec.k, spec.m), []).append(spec.n)
                # the stacked message holds exactly the receivers on that worker
                route = spec.kwargs["route"]
                assert route.to and all(home[n] == spec.n for n in route.to)
                assert all(home[n] == home[spec.m] for n in route.local)
        assert per_part and all(len(v) == len(set(v)) == 1 for v in per_part.values())
        colocated = [
            (spec.phase, spec.k, spec.m) for spec in template.specs if spec.kwargs.get("route")
            and spec.kwargs["route"].local
        ]
        assert colocated  # the random partition has messages between parts on one worker
        x, y = _data(model, 6)
        dist.train_step(x, y, lr=0.3)
        report = dist.comm_report()
        assert report.exact and report.total() > 0, report.format()
    finally:
        dist.close()


@pytest.mark.parametrize("in_flight", [1, 3])
def test_predict_in_blocks_in_flight(dask_client, in_flight):
    """Several blocks in flight at once give the dense reference's outputs, in order."""
    from dasknn.model_parallel import DistributedSparseMLP

    model = _irregular_model(seed=5)
    reference = DenseReference(
        model.weights, model.biases, "sigmoid", "sigmoid", "mse"
    )
    parts = _partition("random", model.layer_sizes, 3, seed=5)
    dist = DistributedSparseMLP(model, dask_client, partition=parts)
    try:
        x, _ = _data(model, 7, seed=5)
        got = dist.predict(x, batch_size=2, in_flight=in_flight)
        np.testing.assert_allclose(got, reference.forward(x)[1][-1], rtol=1e-12, atol=1e-12)
        report = dist.comm_report()
        assert report.steps == 4 and report.exact and report.total() > 0
        with pytest.raises(ValueError, match="in_flight"):
            dist.predict(x, in_flight=0)
    finally:
        dist.close()


# ----------------------------------------------------------------- optimizers
DISTRIBUTED_OPTIMIZERS = {
    "sgd-momentum": SGD(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.02),
    "sgd-nesterov": SGD(lr=0.1, momentum=0.8, nesterov=True),
    "adam": Adam(lr=0.01, weight_decay=0.05),
    "adamw": AdamW(lr=0.01, betas=(0.85, 0.99), weight_decay=0.2),
}


# the default run takes SGD with momentum, AdamW, and Adam on 3 parts; the rest are slow
OPTIMIZERS_FAST = {("sgd-momentum", 2), ("adamw", 2), ("adam", 3)}


@pytest.mark.parametrize(
    ("name", "nparts"),
    [
        pytest.param(*case, marks=() if case in OPTIMIZERS_FAST else pytest.mark.slow)
        for case in [(name, 2) for name in sorted(DISTRIBUTED_OPTIMIZERS)] + [("adam", 3)]
    ],
)
def test_optimizers_match_single_process(dask_client, name, nparts):
    """20 steps of ``fit`` and one more ``train_step`` with each part's optimizer state on its
    worker, then a step with another optimizer, equal the one-process model."""
    optimizer = DISTRIBUTED_OPTIMIZERS[name]
    model = _irregular_model(seed=11)
    reference = model.copy()
    x, y = _data(model, 40, seed=11)
    parts = _partition("random", model.layer_sizes, nparts, seed=11)
    with DistributedSparseMLP(model, dask_client, partition=parts) as dist:
        fit = {"batch_size": 4, "epochs": 2, "seed": 1, "progress": False, "optimizer": optimizer}
        got = dist.fit(x, y, **fit).loss_curve_
        want = reference.fit(x, y, **fit).loss_curve_
        np.testing.assert_allclose(got, want, rtol=1e-10)
        assert dist.train_step(x[:5], y[:5], optimizer=optimizer) == pytest.approx(
            reference.train_step(x[:5], y[:5], optimizer=optimizer), rel=1e-10
        )
        # a different optimizer starts from fresh state on the workers as in one process
        dist.train_step(x[5:9], y[5:9], optimizer=SGD(lr=0.05, momentum=0.3))
        reference.train_step(x[5:9], y[5:9], optimizer=SGD(lr=0.05, momentum=0.3))
        trained = dist.gather()
    assert_same_layers(trained, reference, atol=1e-10)
    assert not np.allclose(trained.weights[0].toarray(), model.weights[0].toarray())


def test_bad_optimizer_arguments_raise_before_anything_is_scheduled(dask_client):
    model = _irregular_model(seed=12)
    parts = _partition("block", model.layer_sizes, 2)
    with DistributedSparseMLP(model, dask_client, partition=parts) as dist:
        x, y = _data(model, 4)
        step = dist._step
        with pytest.raises(ValueError, match="not both"):
            dist.train_step(x, y, lr=0.1, optimizer=Adam())
        with pytest.raises(ValueError, match="optimizer must be"):
            dist.fit(x, y, optimizer="adam", progress=False)
        with pytest.raises(ValueError, match="learning rate"):
            dist.fit(x, y, lr=float("nan"), progress=False)
        with pytest.raises(ValueError, match=r"betas\[0\]"):
            dist.train_step(x, y, optimizer=Adam(betas=(1.5, 0.9)))
        assert dist._step == step
        assert not [k for k in dask_client.who_has() if dist.token in str(k) and "-x-" in str(k)]
