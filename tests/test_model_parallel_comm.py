"""The scheduler plugin's transfer counts: against the workers' own logs and an independent count
of the words the partition makes cross between workers; bad input is rejected up front."""

from __future__ import annotations

import os
import signal
from collections import Counter

import numpy as np
import pytest

from dasknn.model import SparseMLP
from dasknn.model_parallel import DistributedSparseMLP

pytestmark = pytest.mark.minversions  # also run at the minimum versions (.ci/run)


def _expected_bytes(model, parts, part_workers, batch, steps):
    """Forward words of every layer plus backward words of layers 2..L that cross workers."""
    total = 0
    for k, weight in enumerate(model.weights, start=1):
        coo = weight.tocoo()
        pairs = {(int(i), int(parts[k][j])) for i, j in zip(coo.row, coo.col, strict=True)}
        crossing = sum(
            1
            for i, consumer in pairs
            if part_workers[consumer] != part_workers[int(parts[k - 1][i])]
        )
        total += crossing * (2 if k >= 2 else 1)
    return total * batch * steps * model.dtype.itemsize


def _incoming_logs(client, token):
    def read(dask_worker, token):
        return [
            (entry["who"], key, nbytes)
            for entry in dask_worker.transfer_incoming_log
            for key, nbytes in entry["keys"].items()
            if isinstance(key, tuple) and token in str(key[0])
        ]

    return client.run(read, token=token)


def _run(client, model, parts, steps=2, batch=4, nparts=None, **options):
    dist = DistributedSparseMLP(model, client, partition=parts, nparts=nparts, **options)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        x = rng.uniform(size=(batch, model.n_inputs))
        y = rng.uniform(size=(batch, model.n_outputs))
        dist.train_step(x, y, lr=0.1)
    return dist


@pytest.mark.parametrize("nparts", [2, 4])
def test_plugin_agrees_with_worker_logs_and_prediction(dask_client, nparts):
    """With a task per layer step, every message is a transfer Dask logs itself: the plugin's
    counts equal the workers' logs, and the serialization overhead is measured. (Posted messages,
    ``messages="posted"``, are outside Dask's transfer logs; their payload is checked against
    the prediction in ``test_model_parallel_microbatches.py``.)"""
    model = SparseMLP.radixnet(neurons=64, layers=3, seed=1)
    rng = np.random.default_rng(nparts)
    parts = [rng.integers(0, nparts, size=n) for n in model.layer_sizes]
    dist = _run(dask_client, model, parts, messages="tasks")
    try:
        report = dist.comm_report()
        expected = _expected_bytes(model, parts, dist.part_workers, batch=4, steps=2)
        assert report.total() == report.total("predicted") == expected > 0
        assert report.total(phase="other") == 0
        # Per layer, phase and worker pair: measured equals predicted, bytes and messages.
        assert report.exact, report.format()
        # The workers' incoming-transfer logs: same bytes per (sender, receiver), same messages.
        logged_bytes: Counter = Counter()
        logged_messages: Counter = Counter()
        for receiver, entries in _incoming_logs(dask_client, dist.token).items():
            for sender, _, nbytes in entries:
                logged_bytes[(sender, receiver)] += nbytes
                logged_messages[(sender, receiver)] += 1
        pair_bytes: Counter = Counter()
        pair_messages: Counter = Counter()
        for (_, _, sender, receiver), (nbytes, messages) in report.measured.items():
            pair_bytes[(sender, receiver)] += nbytes
            pair_messages[(sender, receiver)] += messages
        assert dict(pair_bytes) == dict(logged_bytes)
        assert dict(pair_messages) == dict(logged_messages)
        # No partial sums go back in layer 1.
        assert not any(k[:2] == (1, "backward") for k in report.measured)
        assert report.by("what") == report.by("what", "predicted")
        details = report.details
        assert details["wire_total"] > details["wire_payload"] > 0
        assert details["serialization_overhead"] == details["wire_total"] - details["wire_payload"]
        assert "equal" in report.format()
        # A reset starts a new measurement.
        dist.reset_comm()
        assert dist.comm_report().total() == 0
    finally:
        dist.close()


def test_partition_ratio_measured_equals_analytic(dask_client):
    """Hypergraph against random partition: the measured byte ratio is the analytic one."""
    partition_module = pytest.importorskip("graph.partition")
    model = SparseMLP.radixnet(neurons=64, layers=3, seed=2)
    measured, analytic = {}, {}
    for method in ("hypergraph", "random"):
        partition = partition_module.partition_network(model.weights, 2, method=method, seed=0)
        dist = _run(dask_client, model, partition, steps=1)
        try:
            measured[method] = dist.comm_report().total()
            analytic[method] = _expected_bytes(model, partition.parts, dist.part_workers, 4, 1)
        finally:
            dist.close()
    assert measured["hypergraph"] < measured["random"]
    assert measured["hypergraph"] / measured["random"] == pytest.approx(
        analytic["hypergraph"] / analytic["random"], rel=0, abs=0
    )


def _scheduler_task_count(client):
    return client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))


def test_bad_input_is_rejected_before_scheduling(dask_client):
    model = SparseMLP.radixnet(neurons=32, layers=2, seed=3, loss="mse")
    parts = [np.arange(32) % 2] * 3
    dist = DistributedSparseMLP(model, dask_client, partition=parts)
    try:
        before = _scheduler_task_count(dask_client)
        x = np.ones((3, 32))
        y = np.ones((3, 32))
        bad_x = x.copy()
        bad_x[1, 2] = np.nan
        cases = [
            (lambda: dist.train_step(np.ones((3, 31)), y), "features"),
            (lambda: dist.train_step(x, np.ones((3, 30))), "shape"),
            (lambda: dist.train_step(x, np.ones((4, 32))), "shape"),
            (lambda: dist.train_step(bad_x, y), "NaN"),
            (lambda: dist.train_step(x, y, lr=float("nan")), "learning rate"),
            (lambda: dist.fit(x, y, batch_size=0), "batch_size"),
            (lambda: dist.predict(np.ones((2, 33))), "features"),
        ]
        for call, message in cases:
            with pytest.raises(ValueError, match=message):
                call()
        assert _scheduler_task_count(dask_client) == before
    finally:
        dist.close()
    with pytest.raises(ValueError, match="part arrays"):
        DistributedSparseMLP(model, dask_client, partition=parts[:2])
    with pytest.raises(ValueError, match="neurons"):
        DistributedSparseMLP(
            model, dask_client, partition=[np.zeros(32, int), np.zeros(31, int), np.zeros(32, int)]
        )


@pytest.mark.slow
def test_a_lost_worker_is_reported_by_name():
    from distributed import Client, LocalCluster

    model = SparseMLP.radixnet(neurons=32, layers=2, seed=4)
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:
        dist = DistributedSparseMLP(model, client, partition=[np.arange(32) % 2] * 3)
        victim = dist.part_workers[1]
        pid = client.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)
        x, y = np.ones((2, 32)), np.ones((2, 32))
        with pytest.raises(RuntimeError, match=f"{victim} \\(part 1\\)"):
            for _ in range(50):  # until the scheduler notices the loss
                dist.train_step(x, y, lr=0.1)
