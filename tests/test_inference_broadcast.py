"""Values placed on the workers (``dasknn.inference._broadcast``) on a real LocalCluster: on
the named worker, on every worker, loaded by a task pinned to each; a placement given up at a
stopped worker leaves nothing on the cluster once the worker goes on."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster
from polling import HANG_GUARD, poll
from stopped_workers import keys_on_scheduler, keys_on_workers, stopped, wait_until_empty

from dasknn.exceptions import WorkerLostError
from dasknn.inference._broadcast import broadcast, load_on_each, scatter_within
from dasknn.runtime.cluster import scheduler_workers


@pytest.fixture(scope="module")
def client():
    """Two worker processes; Dask's active memory manager off, so that it does not drop the
    copies a broadcast made (no task waits for them) while a test looks at them."""
    with dask.config.set({"distributed.scheduler.active-memory-manager.start": False}):
        with LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster, Client(cluster) as client:  # fmt: skip
            yield client


def test_scatter_within_places_the_value_on_the_named_worker(client):
    value = np.arange(10.0)
    for address in scheduler_workers(client):
        placed = scatter_within(client, value, 10, workers=[address])
        assert client.who_has(placed)[placed.key] == (address,)
        np.testing.assert_array_equal(placed.result(), value)
        placed.release()


def test_broadcast_places_the_value_on_every_worker(client):
    value = np.arange(1000.0)
    placed = broadcast(client, value, 10)
    assert sorted(client.who_has(placed)[placed.key]) == sorted(scheduler_workers(client))
    np.testing.assert_array_equal(placed.result(), value)
    placed.release()
    wait_until_empty(lambda: keys_on_scheduler(client, "ndarray-"), 5, "the value stayed")


def test_load_on_each_loads_a_copy_pinned_to_each_worker(client):
    workers = sorted(scheduler_workers(client))
    loaded = load_on_each(client, np.arange(6.0), workers, 10, np.multiply, 2.0)
    assert sorted(loaded) == workers
    for address, future in loaded.items():
        np.testing.assert_array_equal(future.result(), np.arange(6.0) * 2)
        assert client.who_has(future)[future.key] == (address,)


@pytest.mark.slow
@pytest.mark.parametrize("stopped_worker", [0, 1])
def test_a_broadcast_given_up_at_a_stopped_worker_leaves_nothing(client, stopped_worker):
    """Each worker stopped (SIGSTOP) before a broadcast in turn (the value is scattered to one
    worker and copied to the other): ``TimeoutError`` after the timeout, and once the worker
    goes on no key of the value on the scheduler and no copy on a worker."""
    victim = sorted(scheduler_workers(client))[stopped_worker]
    with stopped(client, victim):
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="within 2 s"):
            broadcast(client, np.arange(1000.0), 2)
        assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing
    client.run(os.getpid)  # the stopped worker went on and answered
    time.sleep(1)  # lets a late copy land: a copy that may never come has no condition to poll
    wait_until_empty(lambda: keys_on_scheduler(client, "ndarray-"), 10, "the value stayed")
    wait_until_empty(lambda: keys_on_workers(client, "ndarray-"), 10, "a copy stayed on a worker")


@pytest.mark.slow
def test_broadcasts_finish_while_the_memory_manager_drops_copies():
    """Dask's active memory manager, run every 10 ms, drops a copy as soon as no task waits
    for it: every broadcast still finishes at once with the value on the cluster (waiting for
    every copy to be held at once, 15 of 40 broadcasts waited until their timeout)."""
    amm = {
        "distributed.scheduler.active-memory-manager.start": True,
        "distributed.scheduler.active-memory-manager.interval": "10ms",
    }
    with dask.config.set(amm):
        with LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster, Client(cluster) as client:  # fmt: skip
            for size in range(1000, 1020):
                start = time.monotonic()
                placed = broadcast(client, np.arange(float(size)), 30)
                assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing
                np.testing.assert_array_equal(placed.result(), np.arange(float(size)))
                placed.release()


def _holders(prefix: str, dask_scheduler=None) -> list[str]:
    return [
        ws.address
        for key, ts in dask_scheduler.tasks.items()
        if str(key).startswith(prefix)
        for ws in ts.who_has or ()
    ]


def _holder_within(client, seconds: float) -> str | None:
    """The worker holding the one value of the kind ``ndarray-`` once the scheduler knows it
    (None if it does not within ``seconds``)."""
    holders = poll(lambda: client.run_on_scheduler(_holders, "ndarray-"), seconds, interval=0.02)
    return holders[0] if holders else None


@pytest.mark.slow
def test_a_broadcast_whose_holder_dies_names_the_loss():
    """The worker holding the scattered value killed while the other, stopped (SIGSTOP), has
    not taken its copy: ``WorkerLostError`` as soon as the scheduler lost the value, not a wait
    until the timeout. The scatter may go to the stopped worker (it then waits for it): the
    test tries again (the scheduler scatters to the workers in turn), once the scheduler has let
    go of the last value (else its holder, the worker that took its copy, would be taken for the
    new value's and killed while the new value was scattered to it)."""
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        pids = client.run(os.getpid)
        waiter = sorted(pids)[0]
        for _ in range(6):
            with ThreadPoolExecutor(1) as pool:
                with stopped(client, waiter):
                    running = pool.submit(broadcast, client, np.arange(1000.0), 60)
                    holder = _holder_within(client, 3)
                    if holder is not None and holder != waiter:
                        start = time.monotonic()
                        os.kill(pids[holder], signal.SIGKILL)
                        with pytest.raises(WorkerLostError, match="holding it left"):
                            running.result(timeout=30)
                        # below the broadcast's 60 s timeout: a hang guard, not a timing
                        assert time.monotonic() - start < HANG_GUARD
                        return
                running.result(timeout=30).release()
            # the next look at the holders sees only the next value
            wait_until_empty(lambda: keys_on_scheduler(client, "ndarray-"), 10, "the value stayed")
    pytest.fail("every scatter went to the stopped worker")
