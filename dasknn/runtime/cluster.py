"""Connect to a Dask cluster, or start a local one, for the runs of the command line and API.

Local clusters listen on 127.0.0.1 only (scheduler, workers and dashboard), so nobody else on the
network reaches them; pass ``host`` to listen elsewhere. Connecting to a scheduler address gives up
after ``connect_timeout`` seconds (:data:`CONNECT_TIMEOUT`, or the environment variable
``DASKNN_CONNECT_TIMEOUT``) with a ``RuntimeError`` naming the address. :func:`open_client` also
takes a running cluster object (a ``LocalCluster``, a dask-jobqueue cluster, ...) or a
:class:`~dasknn.runtime.jobqueue.JobqueueSpec` of batch jobs to start.
"""

from __future__ import annotations

import os
from contextlib import ExitStack

from distributed import Client, LocalCluster
from distributed.deploy import Cluster

from dasknn.runtime.jobqueue import JobqueueSpec, start_jobqueue_cluster

__all__ = [
    "CONNECT_TIMEOUT",
    "LOCAL_HOST",
    "connect_timeout",
    "local_cluster",
    "local_cuda_cluster",
    "open_client",
]

LOCAL_HOST = "127.0.0.1"
CONNECT_TIMEOUT = 5.0


def connect_timeout() -> float:
    """Seconds to wait for a scheduler: ``DASKNN_CONNECT_TIMEOUT`` if set, else
    :data:`CONNECT_TIMEOUT`.

    Raises
    ------
    ValueError
        If the environment variable is not a positive number.
    """
    text = os.environ.get("DASKNN_CONNECT_TIMEOUT")
    if text is None:
        return CONNECT_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"DASKNN_CONNECT_TIMEOUT must be a number of seconds > 0, got {text!r}")
    return seconds


def local_cluster(
    workers: int | None = None, threads_per_worker: int = 1, host: str = LOCAL_HOST
) -> LocalCluster:
    """Start a LocalCluster of worker processes, one single-threaded worker per core by default,
    listening (scheduler, workers, dashboard) on ``host`` only."""
    return LocalCluster(
        n_workers=workers or os.cpu_count() or 1,
        threads_per_worker=threads_per_worker,
        processes=True,
        host=host,
        dashboard_address=f"{host}:0",
    )


def local_cuda_cluster(workers: int | None = None, host: str = LOCAL_HOST):
    """Start dask-cuda's ``LocalCUDACluster``: one worker per GPU (the first ``workers`` GPUs).

    Raises
    ------
    RuntimeError
        When dask-cuda is not installed or this machine has no CUDA GPU, with the install hint.
    """
    from dasknn.kernels.cuda_inference import CUDA_INSTALL_HINT, cuda_runtime

    try:
        from dask_cuda import LocalCUDACluster
    except ImportError as error:
        raise RuntimeError(
            f"device='cuda' without a scheduler needs dask-cuda ({error}); {CUDA_INSTALL_HINT}"
        ) from None
    if cuda_runtime() != "gpu":
        raise RuntimeError(
            "device='cuda': numba finds no CUDA GPU on this machine (no driver, or no device); "
            f"give the address of a cluster whose workers have GPUs, or {CUDA_INSTALL_HINT}"
        )
    options = {"host": host, "dashboard_address": f"{host}:0", "threads_per_worker": 1}
    if workers is not None:
        options["CUDA_VISIBLE_DEVICES"] = list(range(workers))
    return LocalCUDACluster(**options)


def open_client(
    stack: ExitStack,
    client: Client | Cluster | JobqueueSpec | str | None = None,
    workers: int | None = None,
    threads_per_worker: int = 1,
    device: str = "cpu",
) -> Client:
    """The client to run on: ``client`` itself, one of a running cluster object, one of the
    batch jobs a :class:`~dasknn.runtime.jobqueue.JobqueueSpec` describes (submitted here, and
    waited for), one connected to a scheduler address, or one on a new :func:`local_cluster`
    (``device="cuda"``: :func:`local_cuda_cluster`); whatever is opened here is closed when
    ``stack`` closes.

    Raises
    ------
    RuntimeError
        If no scheduler answers at the address ``client`` within :func:`connect_timeout` seconds,
        or the batch jobs of a spec cannot be submitted or do not start in time.
    ValueError
        If a spec is malformed (before anything is submitted).
    """
    if isinstance(client, Client):
        return client
    if isinstance(client, Cluster):
        return stack.enter_context(Client(client))
    if isinstance(client, JobqueueSpec):
        cluster = start_jobqueue_cluster(client)
        stack.callback(cluster.close)
        return stack.enter_context(Client(cluster))
    if client is not None:
        seconds = connect_timeout()
        try:
            connected = Client(client, timeout=seconds)
        except (OSError, TimeoutError, ValueError) as exc:
            raise RuntimeError(
                f"cannot reach the Dask scheduler at {client!r} within {seconds:g} s "
                f"(DASKNN_CONNECT_TIMEOUT sets the wait): {exc}"
            ) from None
        return stack.enter_context(connected)
    if device == "cuda":
        cluster = stack.enter_context(local_cuda_cluster(workers))
    else:
        cluster = stack.enter_context(local_cluster(workers, threads_per_worker))
    return stack.enter_context(Client(cluster))
