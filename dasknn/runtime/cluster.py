"""Connect to a Dask cluster, or start a local one, for the runs of the command line and API.

Local clusters listen on 127.0.0.1 only (scheduler, workers and dashboard), so nobody else on the
network reaches them; pass ``host`` to listen elsewhere. Connecting to a scheduler address gives up
after ``connect_timeout`` seconds (:data:`CONNECT_TIMEOUT`, or the environment variable
``DASKNN_CONNECT_TIMEOUT``) with a ``RuntimeError`` naming the address. :func:`open_client` also
takes a running cluster object (a ``LocalCluster``, a dask-jobqueue cluster, ...) or a
:class:`~dasknn.runtime.jobqueue.JobqueueSpec` of batch jobs to start.

Every function that opens a connection or starts a cluster takes ``security``: a
``distributed.Security`` (see :mod:`dasknn.runtime.security`), ``True`` for temporary certificates
(a local cluster only), or ``None``: no TLS for a local cluster, dask's configuration
(``distributed.comm.tls.*``) for a scheduler address.

The clusters and clients opened here keep Dask's debugging records short
(:func:`short_dask_records`): :data:`LOW_LEVEL_LOG_LENGTH` entries of
``distributed.admin.low-level-log-length`` instead of Dask's 1,000, and no worker profiler
(``distributed.worker.profile.enabled``), unless the user's configuration sets them, and the
process that opens them holds Dask's serialization header keys interned
(:func:`~dasknn.runtime.header_keys.hold_header_keys`).
"""

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
from dasknn.runtime.worker_memory import MMAP_THRESHOLD, TOP_PAD, TRIM_THRESHOLD

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
    "worker_environ",
]

LOCAL_HOST = "127.0.0.1"
CONNECT_TIMEOUT = 5.0

#: Entries of Dask's bounded debugging records on what dasknn opens (see
#: :func:`short_dask_records`).
LOW_LEVEL_LOG_LENGTH = 100
_LOG_LENGTH_KEY = "distributed.admin.low-level-log-length"
_PROFILE_KEY = "distributed.worker.profile.enabled"


def _user_sets(key: str) -> bool:
    """Whether the user's configuration sets ``key``: a value other than Dask's default in the
    program, or any value in a YAML file or the environment (``DASK_...``)."""
    defaults = dask.config.merge(*dask.config.defaults)
    if dask.config.get(key) != dask.config.get(key, config=defaults):
        return True
    return dask.config.get(key, None, config=dask.config.collect()) is not None


def short_dask_records() -> dict:
    """The dask configuration under which dasknn starts clusters and opens clients:
    ``distributed.admin.low-level-log-length`` at :data:`LOW_LEVEL_LOG_LENGTH` and
    ``distributed.worker.profile.enabled`` off, each left out when the user's configuration sets
    it (a value other than Dask's default in the program, or any value in a YAML file or the
    environment, such as ``DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH`` or
    ``DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED``).

    That length bounds Dask's records of the last messages of every batched stream (each step's
    task message with its task, the client's graph messages), the scheduler's transitions and
    events of every topic and the workers' state-machine logs. They are bounded, but at 1,000
    entries of several KiB they go on filling for the first thousands of training steps, which
    reads as growth of the scheduler and the client (``docs/reliability.md``, ``## Long runs:
    memory (soak)``).

    The worker profiler samples the call stack of every running task every 10 ms and keeps one
    tree of the samples per second in two deques of ``low-level-log-length`` entries: about
    55 KiB a second for a training step's stacks, so a worker's history fills for 100 s to about
    5 MiB at dasknn's length (for 1,000 s to about 50 MiB at Dask's), which reads as growth of
    every worker over the first minutes of a run. It serves the dashboard's profile pages and
    ``Client.profile`` only.

    Each record is made when its scheduler, worker or stream starts, so the settings apply to
    the processes and connections started under them: the scheduler, workers and clients opened
    here, not a worker that joins later nor a ``Client`` or cluster the user made.
    """
    config = {}
    if not _user_sets(_LOG_LENGTH_KEY):
        config[_LOG_LENGTH_KEY] = LOW_LEVEL_LOG_LENGTH
    if not _user_sets(_PROFILE_KEY):
        config[_PROFILE_KEY] = False
    return config


#: Dask's key of the environment its nannies start worker processes with.
_ENVIRON_KEY = "distributed.nanny.pre-spawn-environ"
#: Dask's default trim threshold of its workers (it keeps their unmanaged memory low).
_DASK_TRIM_THRESHOLD = 65536


def worker_environ() -> dict:
    """The environment of the worker processes of the clusters dasknn starts: Dask's configured
    ``distributed.nanny.pre-spawn-environ`` with glibc's malloc thresholds of
    :mod:`~dasknn.runtime.worker_memory` (freed step buffers are kept and reused rather than
    faulted in again at every step; ``docs/benchmarks.md``), unless the user's configuration sets
    them (a trim threshold other than Dask's default, or the other two at all)."""
    environ = dict(dask.config.get(_ENVIRON_KEY, default={}) or {})
    if int(environ.get("MALLOC_TRIM_THRESHOLD_", _DASK_TRIM_THRESHOLD)) == _DASK_TRIM_THRESHOLD:
        environ["MALLOC_TRIM_THRESHOLD_"] = TRIM_THRESHOLD
    environ.setdefault("MALLOC_MMAP_THRESHOLD_", MMAP_THRESHOLD)
    environ.setdefault("MALLOC_TOP_PAD_", TOP_PAD)
    return environ


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
    """Start a LocalCluster of worker processes, one single-threaded worker per core by default,
    listening (scheduler, workers, dashboard) on ``host`` only; with ``security`` (a
    ``distributed.Security``, or ``True`` for temporary certificates) every connection uses TLS.
    Dask's debugging records are kept short (:func:`short_dask_records`), the workers start with
    :func:`worker_environ`, and this process (the scheduler's) holds Dask's header keys interned
    (:func:`hold_header_keys`)."""
    hold_header_keys()
    with dask.config.set(short_dask_records() | {_ENVIRON_KEY: worker_environ()}):
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
        When dask-cuda is not installed or this machine has no CUDA GPU, with the install hint,
        or when its numba-cuda cannot compile kernels with its numpy
        (:func:`~dasknn.kernels.cuda_inference.check_cuda_compiler`).
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
    """The client to run on: ``client`` itself, one of a running cluster object, one of the
    batch jobs a :class:`~dasknn.runtime.jobqueue.JobqueueSpec` describes (submitted here, and
    waited for), one connected to a scheduler address, or one on a new :func:`local_cluster`
    (``device="cuda"``: :func:`local_cuda_cluster`); whatever is opened here is closed when
    ``stack`` closes.

    ``security`` (see the module's docstring) is used for what is opened here; a ``Client``
    passed in keeps its own. What is opened here keeps Dask's debugging records short
    (:func:`short_dask_records`); this process holds Dask's header keys interned
    (:func:`hold_header_keys`), also for a ``Client`` passed in.

    Raises
    ------
    ValueError
        If ``client`` is a ``tls://`` address and neither ``security`` nor dask's configuration
        gives TLS certificates, or ``security=True`` (temporary certificates) with an address.
    RuntimeError
        If no scheduler answers at the address ``client`` within :func:`connect_timeout` seconds,
        it refuses this client's certificate, or the batch jobs of a spec cannot be submitted or
        do not start in time.
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
        else:
            cluster = local_cluster(workers, threads_per_worker, security=security)
            cluster = stack.enter_context(cluster)
        return stack.enter_context(Client(cluster))


def _workers_identity(dask_scheduler) -> dict:
    return dask_scheduler.identity()["workers"]


def scheduler_workers(client: Client) -> dict[str, dict]:
    """Every worker the scheduler knows now, ``{address: info}`` with the entries of
    ``Client.scheduler_info()["workers"]`` (``status``, ``memory_limit``, ``metrics``,
    ``last_seen``, ...), asked of the scheduler at each call.

    ``Client.scheduler_info(n_workers=-1)["workers"]`` may be empty while every worker is there
    (distributed 2025.x and later): the client's own refresh, every
    ``distributed.client.scheduler-info-interval`` (2 s), asks for no worker and can replace the
    answer between the request and the return (about 1 call in 7,000 on a local cluster, 1 in 3
    with a 1 ms interval), which read as every worker gone.
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
