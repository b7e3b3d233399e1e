"""The workers of a cluster as the scheduler knows them, read without the client's refresh race.

``Client.scheduler_info(n_workers=-1)["workers"]`` (distributed 2025.x and later) may come back
empty while every worker is there: the client refreshes the same record every
``distributed.client.scheduler-info-interval`` asking for no worker, and that answer can land
between the call's own request and its return. Read as "every worker left", it failed a healthy
``fit`` with ``WorkerLostError`` for both workers (the soak under a slowed client). A client with a
1 ms interval makes the refresh overlap about a third of the calls.
"""

from __future__ import annotations

import os

import dask
import pytest
from distributed import Client

from dasknn.runtime.cluster import scheduler_workers
from dasknn.runtime.faults import lost_workers, running_workers
from dasknn.runtime.step_timeout import describe_workers

pytestmark = pytest.mark.minversions  # also run at the minimum versions (.ci/run)

#: Rounds of back-to-back calls while the client refreshes its record every millisecond.
ROUNDS = 100


def test_every_worker_is_seen_while_the_client_refreshes_its_scheduler_info(dask_client):
    expected = sorted(dask_client.run(os.getpid))
    with (
        dask.config.set({"distributed.client.scheduler-info-interval": "1ms"}),
        Client(dask_client.scheduler.address) as client,
    ):
        for _ in range(ROUNDS):
            workers = scheduler_workers(client)
            assert sorted(workers) == expected
            assert all(info["status"] == "running" for info in workers.values())
            assert running_workers(client) == expected
            assert lost_workers(client, expected) == []
            assert "left the cluster" not in describe_workers(client, expected)
