"""Where a command runs: the options shared by every command that uses a Dask cluster.

A local cluster by default, ``--scheduler ADDRESS`` for a running one, or ``--cluster SYSTEM``
for workers started as batch jobs through dask-jobqueue, sized by ``--cores``, ``--memory``,
``--processes``, ``--walltime``, ``--queue``, ``--account``, ``--job-extra``, ``--interface``
(and ``--jobqueue-config FILE`` for the rest, in dask's config format). ``--step-timeout`` is
how long a command's distributed work may go without progress.
"""

from __future__ import annotations

import argparse
import math
from contextlib import ExitStack
from pathlib import Path

from dasknn.cli.tls import add_tls_options, security_from_args
from dasknn.runtime.cluster import open_client
from dasknn.runtime.jobqueue import BATCH_SYSTEMS, JOBQUEUE_TIMEOUT, JobqueueSpec
from dasknn.runtime.step_timeout import DEFAULT_STEP_TIMEOUT
from graph.atomic import check_output_path

__all__ = [
    "add_cluster_arguments",
    "add_distributed_arguments",
    "check_distributed_options",
    "open_cluster",
    "add_step_timeout_argument",
    "check_step_timeout_option",
    "cluster_target",
]

# the options copied as they are onto the JobqueueSpec field of the same name
_SPEC_OPTIONS = (
    "cores",
    "memory",
    "processes",
    "walltime",
    "queue",
    "account",
    "interface",
    "disk",
)
# the options only meaningful with --cluster
_JOBQUEUE_OPTIONS = (*_SPEC_OPTIONS, "job_extra", "jobqueue_config", "cluster_timeout")


def add_cluster_arguments(parser: argparse.ArgumentParser, group) -> None:
    """Add ``--scheduler``, ``--cluster`` and the jobqueue options; ``group`` is the mutually
    exclusive group of the command's cluster choices."""
    group.add_argument("--scheduler", help="address of a running Dask scheduler")
    group.add_argument(
        "--cluster",
        metavar="SYSTEM",
        help=f"start the workers as batch jobs through dask-jobqueue: {', '.join(BATCH_SYSTEMS)}"
        " (--workers of them, waited for)",
    )
    jobs = parser.add_argument_group("batch jobs (with --cluster)")
    jobs.add_argument("--cores", type=int, help="cores per job (default 1)")
    jobs.add_argument("--memory", help="memory per job, such as 64GB (default 4GB)")
    jobs.add_argument("--processes", type=int, help="worker processes per job (default 1)")
    jobs.add_argument("--walltime", help="job time limit [D-]HH:MM[:SS]")
    jobs.add_argument("--queue", help="queue or partition")
    jobs.add_argument("--account", help="account (SGE, LSF: project) to charge")
    jobs.add_argument(
        "--job-extra",
        action="append",
        metavar="DIRECTIVE",
        help="extra job-script directive, such as --gres=gpu:1 (repeatable; htcondor: key=value)",
    )
    jobs.add_argument("--interface", help="network interface of scheduler and workers (ib0)")
    jobs.add_argument("--disk", help="htcondor: disk per job (default: --memory)")
    jobs.add_argument(
        "--jobqueue-config",
        metavar="FILE",
        help="YAML file in dask's config format (jobqueue: slurm: ...) for options not given",
    )
    jobs.add_argument(
        "--cluster-timeout",
        type=float,
        help=f"seconds to wait for the jobs' workers (default {JOBQUEUE_TIMEOUT:g})",
    )


def cluster_target(args: argparse.Namespace, workers: int | None) -> JobqueueSpec | str | None:
    """What to run on: a checked :class:`JobqueueSpec` (``--cluster``), a scheduler address, or
    ``None`` for a local cluster.

    Raises
    ------
    ValueError, FileNotFoundError
        For an unknown ``--cluster``, a malformed jobqueue option, or a jobqueue option given
        without ``--cluster``.
    """
    given = [name for name in _JOBQUEUE_OPTIONS if getattr(args, name) is not None]
    if args.cluster is None:
        if given:
            option = "--" + given[0].replace("_", "-")
            raise ValueError(f"{option} is an option of batch jobs: give --cluster SYSTEM too")
        return args.scheduler
    spec = JobqueueSpec(system=args.cluster, workers=workers or 1)
    for name in _SPEC_OPTIONS:
        value = getattr(args, name)
        if value is not None:
            setattr(spec, name, value)
    spec.job_extra_directives = list(args.job_extra or [])
    spec.config_file = args.jobqueue_config
    if args.cluster_timeout is not None:
        spec.timeout = args.cluster_timeout
    spec.check()
    return spec


def add_step_timeout_argument(parser: argparse.ArgumentParser, waits: str) -> None:
    """Add ``--step-timeout SECONDS`` (default the models' ``step_timeout``): how long ``waits``
    (``"a step may go without finishing"``) before the command stops, naming the workers."""
    parser.add_argument(
        "--step-timeout",
        type=float,
        default=DEFAULT_STEP_TIMEOUT,
        help=f"seconds {waits} before the run stops, naming the workers it waits for "
        f"(default {DEFAULT_STEP_TIMEOUT:g})",
    )


def check_step_timeout_option(seconds: float) -> None:
    """Refuse a ``--step-timeout`` that is not a finite number of seconds > 0 (0, negative,
    ``inf``, ``nan``) with a ``ValueError`` naming the option."""
    if not 0 < seconds < math.inf:
        raise ValueError("--step-timeout must be a finite number of seconds > 0")


def add_distributed_arguments(parser: argparse.ArgumentParser, workers: int, waits: str) -> None:
    """Add what a command that trains on a cluster takes: ``--step-timeout`` (how long
    ``waits``), ``--workers`` (default ``workers``), the cluster choices
    (:func:`add_cluster_arguments`), the TLS options and ``--json FILE``."""
    add_step_timeout_argument(parser, waits)
    parser.add_argument(
        "--workers",
        type=int,
        default=workers,
        help="local worker processes (with --cluster: the batch jobs' workers to wait for)",
    )
    add_cluster_arguments(parser, parser.add_mutually_exclusive_group())
    add_tls_options(parser)
    parser.add_argument("--json", type=Path, help="write every statistic to this JSON file")


def check_distributed_options(args: argparse.Namespace) -> None:
    """``ValueError`` naming a bad ``--workers``, ``--step-timeout`` or ``--json``, before any
    work."""
    if args.workers < 1:
        raise ValueError("--workers must be at least 1")
    check_step_timeout_option(args.step_timeout)
    if args.json is not None:
        check_output_path(args.json)


def open_cluster(stack: ExitStack, args: argparse.Namespace):
    """The client the options name (a local cluster, ``--scheduler``, ``--cluster`` batch
    jobs; with the TLS options), closed with ``stack``."""
    security = security_from_args(args)
    target = cluster_target(args, args.workers)
    return open_client(stack, target, args.workers, security=security)
