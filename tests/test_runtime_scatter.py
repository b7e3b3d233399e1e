"""A scatter given up at a stopped worker (``dasknn.runtime.scatter``) on a real LocalCluster:
whether the worker then goes on or dies, nothing of it stays, on the cluster or on the client."""

from __future__ import annotations

import os
import signal
import uuid

import numpy as np
import pytest
from distributed import Client, LocalCluster
from stopped_workers import keys_on_scheduler, keys_on_workers, wait_until_empty

from dasknn.runtime.cluster import scheduler_workers
from dasknn.runtime.scatter import scatter_released_if_given_up
from dasknn.runtime.waiting import run_watching

pytestmark = pytest.mark.minversions

PREFIX = "dasknn-test-scatter-"


@pytest.fixture(scope="module")
def client():
    """One worker process, restarted by its nanny when a test kills it."""
    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        yield client


def _on_client(client: Client) -> list[str]:
    """The test's keys the client holds a future of, or counts references to."""
    held = {*client.futures, *client.refcount}
    return sorted(str(key) for key in held if str(key).startswith(PREFIX))


@pytest.mark.slow
@pytest.mark.parametrize("then", ["goes on", "is killed"])
def test_a_scatter_given_up_at_a_stopped_worker_leaves_nothing(client, then):
    """The worker stopped (SIGSTOP) before the scatter, which is given up after 1 s; the worker
    then goes on (SIGCONT: the scheduler completes the scatter) or is killed (SIGKILL: the
    scheduler's scatter fails): the client soon holds no future of the keys, and neither the
    scheduler nor a worker holds them."""
    address = next(iter(scheduler_workers(client)))
    pid = client.run(os.getpid, workers=[address])[address]
    token = uuid.uuid4().hex
    data = {f"{PREFIX}{token}-{i}": np.arange(10.0) + i for i in range(2)}
    os.kill(pid, signal.SIGSTOP)
    try:
        scattering = scatter_released_if_given_up(client, data, workers=[address])
        with pytest.raises(TimeoutError, match="within 1 s"):
            run_watching(client, scattering, 1.0, lambda: None, 0.25)
        assert _on_client(client) == sorted(data)  # waiting for the scheduler
    finally:
        os.kill(pid, signal.SIGCONT if then == "goes on" else signal.SIGKILL)
    wait_until_empty(lambda: _on_client(client), 5, "a future of the scatter stayed")
    wait_until_empty(lambda: keys_on_scheduler(client, PREFIX), 5, "a key stayed")
    client.wait_for_workers(1, timeout=30)  # the killed worker's nanny starts another
    wait_until_empty(lambda: keys_on_workers(client, PREFIX), 5, "a value stayed on the worker")
