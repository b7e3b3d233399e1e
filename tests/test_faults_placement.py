"""A worker killed while a distributed model is being placed (its constructor): a quick error
naming the worker, instead of Dask's 30 s connect timeout, and nothing of the model left."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import scipy.sparse as sp
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin

from dasknn.model import SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.model_parallel.faults import WorkerLostError


def _model() -> SparseMLP:
    rng = np.random.default_rng(0)
    sizes = [16, 24, 6]
    weights = []
    for k in range(2):
        w = sp.random(sizes[k], sizes[k + 1], density=0.4, format="csr", random_state=rng)
        weights.append(w)
    return SparseMLP(weights, [np.zeros(n) for n in sizes[1:]], activation="sigmoid")


class _KillWorkerWhenPlansArrive(WorkerPlugin):
    """On the worker ``here``: kills (SIGKILL) the worker process ``pid`` the moment the first
    layer plan of a model arrives: the model's values are half placed, and the next call of the
    placement must reach the killed worker."""

    name = "dasknn-test-kill-during-placement"

    def __init__(self, here: str, pid: int):
        self.here_address = here
        self.pid = pid
        self.here = self.killed = False

    def setup(self, worker) -> None:
        self.here = worker.address == self.here_address

    def transition(self, key, start, finish, **kwargs) -> None:
        plan = isinstance(key, tuple) and str(key[0]).startswith("dasknn-plan-")
        if self.here and plan and not self.killed:
            self.killed = True
            os.kill(self.pid, signal.SIGKILL)


def _model_plugins(client) -> list[str]:
    names = client.run(lambda dask_worker: list(dask_worker.plugins))
    return [n for ns in names.values() for n in ns if n.startswith(("dasknn-model-", "dasknn-key"))]


def _model_keys(dask_scheduler) -> list[str]:
    return [str(key) for key in dask_scheduler.tasks if "dasknn-" in str(key)]


def test_worker_killed_while_the_model_is_placed_is_a_quick_error_naming_it():
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        pids = client.run(os.getpid)
        first, victim = sorted(pids)  # parts 0 and 1 go to the workers in address order
        plugin = _KillWorkerWhenPlansArrive(first, pids[victim])
        client.register_plugin(plugin)
        model = _model()
        parts = [np.arange(n) % 2 for n in model.layer_sizes]
        start = time.monotonic()
        with pytest.raises(
            WorkerLostError,
            match=f"worker\\(s\\) {victim} holding parts \\[1\\] of the model left the cluster "
            "while the model was placed",
        ):
            DistributedSparseMLP(model, client, parts, step_timeout=60)
        assert time.monotonic() - start < 5  # Dask's connect timeout alone is 30 s
        killed = client.run(lambda dask_worker: dask_worker.plugins[plugin.name].killed)
        assert killed[first]
        deadline = time.monotonic() + 10
        while client.run_on_scheduler(_model_keys) or _model_plugins(client):
            assert time.monotonic() < deadline, "the failed model left keys or plugins for 10 s"
            time.sleep(0.05)
