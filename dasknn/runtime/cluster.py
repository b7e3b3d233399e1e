"""Connect to a Dask cluster, or start a local one (on 127.0.0.1 unless ``host`` says); see
docs/runtime.md, "Connecting". ``security``: a ``distributed.Security``, ``True`` for temporary
certificates (local clusters only), or ``None`` (no TLS locally, dask's configuration otherwise)."""

from __future__ import annotations

import os
import time
from contextlib import ExitStack

import dask
from distributed import Client, LocalCluster, Security
from distributed.deploy import Cluster

from dasknn.runtime.header_keys import hold_header_keys
from dasknn.runtime.jobqueue import JobqueueSpec, start_jobqueue_cluster
from dasknn.runtime.security import client_uses_tls, temporary_security
from dasknn.runtime.worker_memory import PLUGIN_NAME as REUSE_MEMORY_PLUGIN
from dasknn.runtime.worker_memory import ReuseFreedMemory

__all__ = [
    "CONNECT_TIMEOUT",
    "LOCAL_HOST",
    "LOW_LEVEL_LOG_LENGTH",
    "connect_timeout",
    "local_cluster",
    "local_cuda_cluster",
    "open_client",
    "scheduler_workers",
    "short_dask_records",
]

LOCAL_HOST = "127.0.0.1"
CONNECT_TIMEOUT = 5.0

#: Entries of Dask's debugging records on what dasknn opens (:func:`short_dask_records`).
LOW_LEVEL_LOG_LENGTH = 100
_LOG_LENGTH_KEY = "distributed.admin.low-level-log-length"
_PROFILE_KEY = "distributed.worker.profile.enabled"


def _user_sets(key: str) -> bool:
    """Whether ``key`` is set: not Dask's default in the program, or in YAML or ``DASK_...``."""
    defaults = dask.config.merge(*dask.config.defaults)
    if dask.config.get(key) != dask.config.get(key, config=defaults):
        return True
    return dask.config.get(key, None, config=dask.config.collect()) is not None


def short_dask_records() -> dict:
    """The dask configuration dasknn starts clusters and opens clients under:
    ``distributed.admin.low-level-log-length`` at :data:`LOW_LEVEL_LOG_LENGTH` (Dask: 1,000) and
    ``distributed.worker.profile.enabled`` off, each left out when the user's configuration sets
    it. It applies to the processes and connections started under it, not to a user's own
    cluster. Why: docs/reliability.md, "Long runs: memory (soak)".
    """
    config = {}
    if not _user_sets(_LOG_LENGTH_KEY):
        config[_LOG_LENGTH_KEY] = LOW_LEVEL_LOG_LENGTH
    if not _user_sets(_PROFILE_KEY):
        config[_PROFILE_KEY] = False
    return config


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


def _tls_options(security: Security | bool | None) -> dict:
    """The options that make a local cluster use TLS with ``security`` (none without it)."""
    if security is None or security is False:
        return {}
    if security is True:
        security = temporary_security()
    if not client_uses_tls(security):
        raise ValueError("security has no TLS certificates (a CA file and a certificate)")
    return {"protocol": "tls://", "security": security}


def local_cluster(
    workers: int | None = None,
    threads_per_worker: int = 1,
    host: str = LOCAL_HOST,
    security: Security | bool | None = None,
) -> LocalCluster:
    """Start a LocalCluster of worker processes (default one single-threaded worker per core)
    listening on ``host`` only, with TLS if ``security``, under :func:`short_dask_records`; this
    process holds Dask's header keys (:func:`hold_header_keys`)."""
    hold_header_keys()
    with dask.config.set(short_dask_records()):
        return LocalCluster(
            n_workers=workers or os.cpu_count() or 1,
            threads_per_worker=threads_per_worker,
            processes=True,
            host=host,
            dashboard_address=f"{host}:0",
            **_tls_options(security),
        )


def local_cuda_cluster(
    workers: int | None = None, host: str = LOCAL_HOST, security: Security | bool | None = None
):
    """Start dask-cuda's ``LocalCUDACluster``: one worker per GPU (the first ``workers`` GPUs),
    with TLS when ``security`` is given (as for :func:`local_cluster`).

    Raises
    ------
    RuntimeError
        Without dask-cuda or a CUDA GPU (with the install hint), or when numba-cuda cannot
        compile kernels (:func:`~dasknn.kernels.cuda_inference.check_cuda_compiler`).
    """
    from dasknn.kernels.cuda_inference import CUDA_INSTALL_HINT, check_cuda_compiler, cuda_runtime

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
    check_cuda_compiler()
    options = {"host": host, "dashboard_address": f"{host}:0", "threads_per_worker": 1}
    options.update(_tls_options(security))
    if workers is not None:
        options["CUDA_VISIBLE_DEVICES"] = list(range(workers))
    return LocalCUDACluster(**options)


def open_client(
    stack: ExitStack,
    client: Client | Cluster | JobqueueSpec | str | None = None,
    workers: int | None = None,
    threads_per_worker: int = 1,
    device: str = "cpu",
    security: Security | bool | None = None,
) -> Client:
    """The client to run on: ``client`` itself, or one of a running cluster object, of the
    batch jobs a :class:`~dasknn.runtime.jobqueue.JobqueueSpec` describes (submitted and waited
    for), of a scheduler address, or of a new :func:`local_cluster` (``device="cuda"``:
    :func:`local_cuda_cluster`). What is opened here (with ``security`` and
    :func:`short_dask_records`) is closed when ``stack`` closes.

    Raises
    ------
    ValueError
        If ``client`` is a ``tls://`` address and neither ``security`` nor dask's configuration
        gives TLS certificates, or ``security=True`` (temporary certificates) with an address.
    RuntimeError
        If no scheduler answers at ``client`` within :func:`connect_timeout` seconds or it
        refuses the certificate, or a spec's batch jobs cannot be submitted or do not start.
    ValueError
        If a spec is malformed (before anything is submitted).
    """
    hold_header_keys()
    if isinstance(client, Client):
        return client
    with dask.config.set(short_dask_records()):
        if isinstance(client, Cluster):
            return stack.enter_context(Client(client))
        if isinstance(client, JobqueueSpec):
            cluster = start_jobqueue_cluster(client)
            stack.callback(cluster.close)
            return stack.enter_context(Client(cluster))
        if client is not None:
            return stack.enter_context(_connect(str(client), security))
        if device == "cuda":
            cluster = stack.enter_context(local_cuda_cluster(workers, security=security))
            return stack.enter_context(Client(cluster))
        cluster = stack.enter_context(local_cluster(workers, threads_per_worker, security=security))
        local = stack.enter_context(Client(cluster))
        local.register_plugin(ReuseFreedMemory(), name=REUSE_MEMORY_PLUGIN)
        return local


def _workers_identity(dask_scheduler) -> dict:
    return dask_scheduler.identity()["workers"]


def scheduler_workers(client: Client) -> dict[str, dict]:
    """Every worker the scheduler knows now, ``{address: info}`` as in
    ``Client.scheduler_info()["workers"]``, asked of the scheduler (``Client.scheduler_info``
    can briefly list none; see docs/reliability.md, "How a lost worker is detected").
    """
    return client.run_on_scheduler(_workers_identity)


def _connect(address: str, security: Security | bool | None) -> Client:
    """A client connected to the scheduler at ``address``; see :func:`open_client`."""
    if security is True:
        raise ValueError(
            "temporary TLS certificates (security=True) are for a local cluster only; give the "
            f"certificates the scheduler at {address!r} trusts"
        )
    if security is None or security is False:
        security = Security()  # dask's configuration: distributed.comm.tls.*
    if address.startswith("tls://") and not client_uses_tls(security):
        raise ValueError(
            f"the scheduler at {address!r} uses TLS: give a CA file, a certificate and its key "
            "(--tls-ca-file, --tls-cert, --tls-key; security= in the API; or "
            "distributed.comm.tls.* in the dask configuration)"
        )
    seconds = connect_timeout()
    start = time.monotonic()
    try:
        return Client(address, timeout=seconds, security=security)
    except (OSError, TimeoutError, ValueError) as exc:
        if time.monotonic() - start < seconds:  # refused at once: an address or TLS mismatch
            raise RuntimeError(
                f"cannot reach the Dask scheduler at {address!r}: it refused the connection "
                f"(a TLS certificate it does not trust, or TLS on one side only): {exc}"
            ) from None
        raise RuntimeError(
            f"cannot reach the Dask scheduler at {address!r} within {seconds:g} s "
            f"(DASKNN_CONNECT_TIMEOUT sets the wait): {exc}"
        ) from None
