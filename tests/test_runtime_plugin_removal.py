"""Removing a worker plugin while the scheduler still lists a worker it can no longer reach:
distributed's own removal fails with an OSError, dasknn's counts it as done."""

from __future__ import annotations

import dask
import pytest
from distributed import Client, LocalCluster, WorkerPlugin
from polling import wait_until

from dasknn.runtime.plugin_removal import remove_worker_plugin


class _Probe(WorkerPlugin):
    idempotent = True


def _plugins(dask_worker) -> list[str]:
    return list(dask_worker.plugins)


def _refuse_connections(dask_worker) -> None:
    """Stop accepting connections; the worker's own stream to the scheduler stays open."""
    for listener in dask_worker.listeners:
        listener.stop()


def _forget_comms_to(dask_scheduler, address: str) -> None:
    dask_scheduler.rpc.remove(address)  # the next message to it must connect anew


def _registered(dask_scheduler) -> list[str]:
    return list(dask_scheduler.worker_plugins)


@pytest.fixture
def unreachable_worker():
    """A client of a 2-worker LocalCluster whose second worker is still listed but accepts no
    connection (the state of a worker lost a moment before the scheduler sees it)."""
    with (
        dask.config.set({"distributed.comm.timeouts.connect": "1s"}),  # the scheduler's, here
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        for name in ("probe-raw", "probe"):
            client.register_plugin(_Probe(), name=name)
        live, lost = sorted(client.scheduler_info()["workers"])
        client.run(_refuse_connections, workers=[lost])
        client.run_on_scheduler(_forget_comms_to, address=lost)
        yield client, live, lost


def test_a_worker_listed_but_unreachable_fails_no_removal(unreachable_worker):
    client, live, lost = unreachable_worker
    with pytest.raises(OSError):  # distributed's removal on its own
        client.unregister_worker_plugin("probe-raw")
    assert remove_worker_plugin(client, "probe", 30)
    assert "probe" not in client.run_on_scheduler(_registered)
    assert lost in client.scheduler_info()["workers"]  # still listed throughout
    wait_until(
        lambda: "probe" not in client.run(_plugins, workers=[live])[live],
        10,
        "the live worker kept the plugin",
    )


def test_an_error_with_the_plugin_still_registered_is_raised(unreachable_worker, monkeypatch):
    client, _, _ = unreachable_worker

    def fails(name, nanny=None):
        raise OSError("the removal never reached the scheduler")

    # the client's call fails before the scheduler saw it; the scheduler, asked, still lists it
    monkeypatch.setattr(client, "unregister_worker_plugin", fails)
    with pytest.raises(OSError, match="never reached"):
        remove_worker_plugin(client, "probe", 30)
    assert "probe" in client.run_on_scheduler(_registered)
