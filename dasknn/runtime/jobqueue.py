"""Workers as batch jobs: a dask-jobqueue cluster (SLURM, PBS, SGE, LSF, HTCondor) from options.
See docs/deploying.md."""

from __future__ import annotations

import logging
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dask
import yaml
from dask.utils import parse_bytes

__all__ = [
    "BATCH_SYSTEMS",
    "JOBQUEUE_TIMEOUT",
    "JobqueueSpec",
    "jobqueue_cluster",
    "start_jobqueue_cluster",
]

#: batch system name -> (dask-jobqueue cluster class, submit command)
BATCH_SYSTEMS: dict[str, tuple[str, str]] = {
    "slurm": ("SLURMCluster", "sbatch"),
    "pbs": ("PBSCluster", "qsub"),
    "sge": ("SGECluster", "qsub"),
    "lsf": ("LSFCluster", "bsub"),
    "htcondor": ("HTCondorCluster", "condor_submit"),
}

#: default seconds to wait for the workers of the submitted jobs
JOBQUEUE_TIMEOUT = 300.0

# each system's keyword for the account to charge (HTCondor has none)
_ACCOUNT_KEYWORD = {"slurm": "account", "pbs": "account", "sge": "project", "lsf": "project"}
_WALLTIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")


@dataclass
class JobqueueSpec:
    """A dask-jobqueue cluster to start: one Dask worker process per ``processes`` of a job.

    Parameters
    ----------
    system : str
        ``"slurm"``, ``"pbs"``, ``"sge"``, ``"lsf"`` or ``"htcondor"``.
    workers : int
        Worker processes to wait for (jobs = ``ceil(workers / processes)``).
    cores : int, optional
        Cores per job (threads per worker = ``cores // processes``).
    memory : str, optional
        Memory per job, such as ``"64GB"``.
    processes : int, optional
        Worker processes per job.
    walltime : str, optional
        Job time limit, ``[D-]HH:MM[:SS]`` (HTCondor: not supported).
    queue, account : str, optional
        Queue and account (SGE, LSF: project) to charge; not for HTCondor.
    job_extra_directives : list of str
        Extra job script header lines (``"--gres=gpu:1"``); HTCondor: ``"key=value"`` entries.
    interface : str, optional
        Network interface the scheduler and workers listen on (``"ib0"``, ``"lo"``).
    disk : str, optional
        HTCondor only: disk per job (default: ``memory``).
    dashboard_address : str, optional
        Where the scheduler's dashboard listens (dask-jobqueue's default ``":8787"``).
    config_file : path, optional
        A dask config YAML file (``jobqueue: slurm: ...``) for the options not given; cores,
        memory and processes given nowhere are 1, 4GB and 1 per job.
    timeout : float
        Seconds to wait for the workers after submitting the jobs.
    """

    system: str
    workers: int = 1
    cores: int | None = None
    memory: str | None = None
    processes: int | None = None
    walltime: str | None = None
    queue: str | None = None
    account: str | None = None
    job_extra_directives: list[str] = field(default_factory=list)
    interface: str | None = None
    disk: str | None = None
    dashboard_address: str | None = None
    config_file: Path | str | None = None
    timeout: float = JOBQUEUE_TIMEOUT

    def check(self) -> dict[str, Any]:
        """Validate every option; return :attr:`config_file`'s ``jobqueue: SYSTEM:`` options.

        Raises
        ------
        ValueError
            Naming the first malformed option.
        FileNotFoundError
            If :attr:`config_file` does not exist.
        """
        if self.system not in BATCH_SYSTEMS:
            raise ValueError(
                f"unknown cluster {self.system!r}: choose one of {', '.join(BATCH_SYSTEMS)}"
            )
        for name in ("workers", "cores", "processes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.processes is not None and self.cores is not None and self.processes > self.cores:
            raise ValueError(
                f"processes ({self.processes}) must not exceed cores ({self.cores}) per job"
            )
        for name in ("memory", "disk"):
            value = getattr(self, name)
            if value is not None:
                _check_bytes(name, value)
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout!r}")
        if self.system == "htcondor":
            for name in ("walltime", "queue", "account"):
                if getattr(self, name) is not None:
                    raise ValueError(f"htcondor jobs take no {name}; use job-extra directives")
            for directive in self.job_extra_directives:
                if "=" not in directive:
                    raise ValueError(
                        f"an htcondor job-extra directive is key=value, got {directive!r}"
                    )
        elif self.disk is not None:
            raise ValueError(f"disk is an htcondor option, not one of {self.system}")
        if self.walltime is not None and not _WALLTIME.match(self.walltime):
            raise ValueError(f"walltime must look like [D-]HH:MM[:SS], got {self.walltime!r}")
        return _read_config(self.config_file, self.system)

    def cluster_kwargs(self) -> dict[str, Any]:
        """The cluster class's keyword arguments: the options here, then :attr:`config_file`'s,
        then 1 core, 4GB, 1 process where dask's config has none."""
        import dask_jobqueue  # noqa: F401 - loads its config (defaults and the user's files)

        kwargs = self.check()
        for name, value in (
            ("cores", self.cores),
            ("memory", self.memory),
            ("processes", self.processes),
            ("interface", self.interface),
        ):
            if value is not None:
                kwargs[name] = value
        configured = dask.config.get(f"jobqueue.{self.system}", {})
        for name, default in (("cores", 1), ("memory", "4GB"), ("processes", 1)):
            if name not in kwargs and configured.get(name) is None:
                kwargs[name] = default
        if self.dashboard_address is not None:
            options = dict(kwargs.get("scheduler_options") or {})
            options["dashboard_address"] = self.dashboard_address
            kwargs["scheduler_options"] = options
        if self.system == "htcondor":
            disk = self.disk or kwargs.get("disk") or configured.get("disk")
            kwargs["disk"] = disk or kwargs.get("memory") or configured.get("memory")
            if self.job_extra_directives:
                kwargs["job_extra_directives"] = dict(
                    directive.split("=", 1) for directive in self.job_extra_directives
                )
            return kwargs
        if self.job_extra_directives:
            kwargs["job_extra_directives"] = list(self.job_extra_directives)
        for name, value in (("walltime", self.walltime), ("queue", self.queue)):
            if value is not None:
                kwargs[name] = value
        if self.account is not None:
            kwargs[_ACCOUNT_KEYWORD[self.system]] = self.account
        return kwargs


def _check_bytes(name: str, value: str) -> None:
    try:
        nbytes = parse_bytes(value)
    except (ValueError, TypeError):
        nbytes = 0
    if nbytes <= 0:
        raise ValueError(f"{name} must be an amount of memory such as '64GB', got {value!r}")


def _read_config(path: Path | str | None, system: str) -> dict[str, Any]:
    """The ``jobqueue: SYSTEM:`` section of a dask config file as the cluster's keywords."""
    if path is None:
        return {}
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"jobqueue config file {str(path)!r} does not exist")
    try:
        config = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValueError(f"jobqueue config file {str(path)!r} is not YAML: {exc}") from None
    config = {} if config is None else config
    if not isinstance(config, dict) or set(config) - {"jobqueue"}:
        raise ValueError(
            f"jobqueue config file {str(path)!r} must hold a mapping with one key, jobqueue "
            "(jobqueue: SYSTEM: options, in dask's config format)"
        )
    section = (config.get("jobqueue") or {}).get(system) or {}
    if not isinstance(section, dict):
        raise ValueError(f"jobqueue.{system} of {str(path)!r} must be a mapping of options")
    kwargs = {}
    for key, value in section.items():
        name = str(key).replace("-", "_")
        kwargs["job_name" if name == "name" else name] = value
    return kwargs


def jobqueue_cluster(spec: JobqueueSpec):
    """The dask-jobqueue cluster of ``spec``, no job submitted (``job_script()`` shows one).

    Raises
    ------
    ValueError, FileNotFoundError
        If the spec is malformed (:meth:`JobqueueSpec.check`).
    """
    kwargs = spec.cluster_kwargs()
    import dask_jobqueue

    cluster_class = getattr(dask_jobqueue, BATCH_SYSTEMS[spec.system][0])
    try:
        return cluster_class(**kwargs)
    except TypeError as exc:
        raise ValueError(f"a {spec.system} cluster does not take these options: {exc}") from None


def start_jobqueue_cluster(spec: JobqueueSpec):
    """Open the cluster of ``spec``, submit the jobs and wait for ``spec.workers`` workers.

    Returns
    -------
    dask_jobqueue.JobQueueCluster
        With the workers joined; closing it cancels the jobs.

    Raises
    ------
    ValueError, FileNotFoundError
        If the spec is malformed, before anything is started.
    RuntimeError
        If the submit command is not on ``PATH``, a submission fails (with its message), or the
        workers have not joined within ``spec.timeout`` seconds (the cluster is closed).
    """
    spec.check()
    submit = BATCH_SYSTEMS[spec.system][1]
    if shutil.which(submit) is None:
        raise RuntimeError(
            f"cannot start a {spec.system} cluster: {submit!r} is not on PATH "
            "(run on a login node of the batch system)"
        )
    cluster = jobqueue_cluster(spec)
    try:
        _submit_jobs(cluster, spec)
        _wait_for_workers(cluster, spec)
    except BaseException:
        cluster.close()
        raise
    return cluster


class _LoopErrors(logging.Handler):
    """Keeps the exceptions the cluster's event loop logs (a failed submit command)."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[BaseException] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.errors.append(record.exc_info[1])


def _submit_jobs(cluster, spec: JobqueueSpec) -> None:
    """Submit the jobs for ``spec.workers`` workers and wait for the submit commands; a
    failure (which the cluster's loop only logs) is a ``RuntimeError`` with its message."""
    from distributed.core import Status

    loop_log = logging.getLogger("tornado.application")
    caught = _LoopErrors()
    handlers, propagate = loop_log.handlers[:], loop_log.propagate
    loop_log.handlers, loop_log.propagate = [caught], False
    deadline = time.monotonic() + spec.timeout
    try:
        cluster.scale(spec.workers)
        while not caught.errors and not _all_submitted(cluster):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the {spec.system} cluster's submit command ({BATCH_SYSTEMS[spec.system][1]})"
                    f" did not return within {spec.timeout:g} s"
                )
            time.sleep(0.05)
        while caught.errors and len(cluster.workers) < len(cluster.worker_spec):
            time.sleep(0.05)  # the other submissions finish before the jobs are listed
    finally:
        loop_log.handlers, loop_log.propagate = handlers, propagate
    failed = [job for job in cluster.workers.values() if job.job_id is None]
    for job in failed:
        job.status = Status.failed
    if failed or caught.errors:
        text = str(caught.errors[0]) if caught.errors else "no job id in its output"
        said = text.split("stderr:", 1)[-1] if "stderr:" in text else text
        raise RuntimeError(
            f"the {spec.system} cluster could not submit {len(failed) or 'its'} job(s) "
            f"({BATCH_SYSTEMS[spec.system][1]}): " + " ".join(said.split())
        )


def _all_submitted(cluster) -> bool:
    jobs = list(cluster.workers.values())
    return len(jobs) == len(cluster.worker_spec) and all(job.job_id for job in jobs)


def _wait_for_workers(cluster, spec: JobqueueSpec) -> None:
    """Poll until the scheduler has ``spec.workers`` workers."""
    deadline = time.monotonic() + spec.timeout
    while len(cluster.scheduler_info.get("workers", {})) < spec.workers:
        if time.monotonic() > deadline:
            joined = len(cluster.scheduler_info.get("workers", {}))
            raise RuntimeError(
                f"the {spec.system} cluster has {joined} of {spec.workers} workers after "
                f"{spec.timeout:g} s; the jobs may still be queued (check the queue) or failed "
                "to start (check their output files)"
            )
        time.sleep(0.1)
