"""Connect to a Dask cluster, or start a local one, for the runs of the command line and API."""

from __future__ import annotations

import os
from contextlib import ExitStack

from distributed import Client, LocalCluster

__all__ = ["local_cluster", "open_client"]


def local_cluster(workers: int | None = None, threads_per_worker: int = 1) -> LocalCluster:
    """Start a LocalCluster of worker processes, one single-threaded worker per core by default."""
    return LocalCluster(
        n_workers=workers or os.cpu_count() or 1,
        threads_per_worker=threads_per_worker,
        processes=True,
        dashboard_address=":0",
    )


def open_client(
    stack: ExitStack,
    client: Client | str | None = None,
    workers: int | None = None,
    threads_per_worker: int = 1,
) -> Client:
    """The client to run on: ``client`` itself, one connected to a scheduler address, or one on
    a new :func:`local_cluster`; whatever is opened here is closed when ``stack`` closes."""
    if isinstance(client, Client):
        return client
    if client is not None:
        return stack.enter_context(Client(client))
    cluster = stack.enter_context(local_cluster(workers, threads_per_worker))
    return stack.enter_context(Client(cluster))
