"""Connect to a Dask cluster, or start a local one, for the runs of the command line and API."""

from __future__ import annotations

import os
from contextlib import ExitStack

from distributed import Client, LocalCluster

__all__ = ["local_cluster", "local_cuda_cluster", "open_client"]


def local_cluster(workers: int | None = None, threads_per_worker: int = 1) -> LocalCluster:
    """Start a LocalCluster of worker processes, one single-threaded worker per core by default."""
    return LocalCluster(
        n_workers=workers or os.cpu_count() or 1,
        threads_per_worker=threads_per_worker,
        processes=True,
        dashboard_address=":0",
    )


def local_cuda_cluster(workers: int | None = None):
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
    options = {"dashboard_address": ":0", "threads_per_worker": 1}
    if workers is not None:
        options["CUDA_VISIBLE_DEVICES"] = list(range(workers))
    return LocalCUDACluster(**options)


def open_client(
    stack: ExitStack,
    client: Client | str | None = None,
    workers: int | None = None,
    threads_per_worker: int = 1,
    device: str = "cpu",
) -> Client:
    """The client to run on: ``client`` itself, one connected to a scheduler address, or one on
    a new :func:`local_cluster` (``device="cuda"``: :func:`local_cuda_cluster`); whatever is
    opened here is closed when ``stack`` closes."""
    if isinstance(client, Client):
        return client
    if client is not None:
        return stack.enter_context(Client(client))
    if device == "cuda":
        cluster = stack.enter_context(local_cuda_cluster(workers))
    else:
        cluster = stack.enter_context(local_cluster(workers, threads_per_worker))
    return stack.enter_context(Client(cluster))
