"""The plugins models share on a cluster (the transfer monitor, the retirement watch) stay while a
model holds them and leave with the last one's ``close()``; one installed for the cluster's life
stays."""

from __future__ import annotations

import numpy as np
from distributed import Client
from random_layers import random_layers

from dasknn.data_parallel import DistributedEmbeddingMLP
from dasknn.model import EmbeddingMLP, SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.runtime.cluster import local_cluster
from dasknn.runtime.measure import install_comm_monitor

SHARED_ON_SCHEDULER = {"dasknn-comm", "dasknn-retirement-requests"}
SHARED_ON_WORKERS = {"dasknn-transfer-reporter"}


def _dasknn_plugins(client) -> tuple[set[str], set[str]]:
    on_scheduler = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))
    on_workers = client.run(lambda dask_worker: list(dask_worker.plugins))
    names = {n for names in on_workers.values() for n in names}
    return (
        {n for n in on_scheduler if n.startswith("dasknn")},
        {n for n in names if n.startswith("dasknn")},
    )


def _sparse_model() -> DistributedSparseMLP:
    weights, biases = random_layers([8, 10, 4], 0.5, 0)
    return SparseMLP(weights, biases, activation="sigmoid", loss="mse")


def test_shared_plugins_leave_with_the_last_model():
    model = _sparse_model()
    parts = [np.arange(n) % 2 for n in model.layer_sizes]
    x = np.random.default_rng(0).uniform(size=(6, 8))
    with local_cluster(2) as cluster, Client(cluster) as client:
        first = DistributedSparseMLP(model, client, partition=parts)
        second = DistributedEmbeddingMLP(
            EmbeddingMLP(24, 2, 3, hidden=(4,)), client, sparse_partitions=2
        )
        on_scheduler, on_workers = _dasknn_plugins(client)
        assert SHARED_ON_SCHEDULER <= on_scheduler and SHARED_ON_WORKERS <= on_workers
        first.predict(x)
        first.close()
        # the data-parallel model still holds the monitor and the retirement watch
        on_scheduler, on_workers = _dasknn_plugins(client)
        assert SHARED_ON_SCHEDULER <= on_scheduler and SHARED_ON_WORKERS <= on_workers
        second.close()
        assert _dasknn_plugins(client) == (set(), set())
        first.close()  # closing again releases nothing more


def test_a_monitor_installed_for_the_cluster_stays():
    with local_cluster(2) as cluster, Client(cluster) as client:
        install_comm_monitor(client)
        parts = [np.zeros(n, int) for n in (8, 10, 4)]
        with DistributedSparseMLP(_sparse_model(), client, partition=parts):
            pass
        on_scheduler, on_workers = _dasknn_plugins(client)
        assert "dasknn-comm" in on_scheduler and SHARED_ON_WORKERS <= on_workers
