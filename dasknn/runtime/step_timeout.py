"""``step_timeout``: the option's check, the error naming the workers waited for with their
state, and :func:`run_on_workers`. See docs/reliability.md."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from numbers import Real
from typing import Any

from distributed import Client

from dasknn.exceptions import StepTimeoutError
from dasknn.runtime.cluster import scheduler_workers
from dasknn.runtime.waiting import run_watching

__all__ = [
    "DEFAULT_STEP_TIMEOUT",
    "SILENT_SECONDS",
    "answering_workers",
    "check_step_timeout",
    "describe_worker",
    "describe_workers",
    "run_on_workers",
    "step_timeout_error",
]

#: Seconds a step may go without finishing, unless the model is given another ``step_timeout``.
DEFAULT_STEP_TIMEOUT = 300.0
#: Seconds without a heartbeat after which a worker is said to be silent.
SILENT_SECONDS = 2.0


def check_step_timeout(step_timeout) -> float:
    """``step_timeout`` as a float, checked: a real number of seconds, positive and finite.

    Raises
    ------
    ValueError
        Naming the value otherwise.
    """
    if (
        isinstance(step_timeout, bool)
        or not isinstance(step_timeout, Real)
        or not 0 < step_timeout < math.inf
    ):
        raise ValueError(f"step_timeout must be a number of seconds > 0, got {step_timeout!r}")
    return float(step_timeout)


def _mib(nbytes) -> str:
    return f"{(nbytes or 0) / 2**20:.0f} MiB"


def _pause_advice(info: dict) -> str:
    """What to do about a paused worker's memory, by whether Dask's data fills most of it."""
    metrics = info.get("metrics", {})
    memory, managed = metrics.get("memory"), metrics.get("managed_bytes")
    if not memory or managed is None:
        return " (give the workers more memory)"
    if managed >= memory / 2:
        return (
            f", {_mib(managed)} of it Dask's data (give the workers more memory, train smaller "
            "batches, or let Dask spill to disk)"
        )
    return (
        f", {_mib(memory - managed)} of it the process's own memory, not Dask's data (the "
        "models' state on the worker, step buffers): give the workers more memory or spread "
        "the model over more workers"
    )


def describe_worker(info: dict | None, now: float) -> str:
    """A worker's state in words, from its ``scheduler_workers`` entry."""
    if info is None:
        return "has left the cluster"
    status = info.get("status", "running")
    memory = info.get("metrics", {}).get("memory")
    limit = info.get("memory_limit")
    if status == "paused":
        share = f" ({memory / limit:.0%})" if memory and limit else ""
        return (
            f"is paused at its memory limit: {_mib(memory)} used of {_mib(limit)}{share}"
            f"{_pause_advice(info)}"
        )
    silent = now - info.get("last_seen", now)
    if silent > SILENT_SECONDS:
        return f"has not been heard from for {silent:.0f} s (stopped or overloaded)"
    return f"is {status}" + (f", {_mib(memory)} used of {_mib(limit)}" if limit else "")


def describe_workers(
    client, addresses: Sequence[str], roles: Mapping[str, str] | None = None
) -> str:
    """``worker ADDRESS (ROLE) STATE; ...`` for the distinct ``addresses``, ``roles`` by address."""
    workers = scheduler_workers(client)
    now = time.time()
    roles = roles or {}
    return "; ".join(
        f"worker {w}{f' ({roles[w]})' if w in roles else ''} {describe_worker(workers.get(w), now)}"
        for w in sorted(set(addresses))
    )


def step_timeout_error(
    client,
    what: str,
    timeout: float,
    addresses: Sequence[str],
    roles: Mapping[str, str] | None = None,
) -> StepTimeoutError:
    """The error for a call to the workers that did not finish within ``step_timeout``.

    Parameters
    ----------
    client : distributed.Client
    what : str
        What did not happen, such as ``"the workers did not take the model"``.
    timeout : float
        The ``step_timeout`` in seconds.
    addresses, roles
        As for :func:`describe_workers`: the workers waited for and what they hold.

    Returns
    -------
    StepTimeoutError
        With the message ``"{what} within {timeout} s (step_timeout): worker ADDRESS STATE; ..."``.
    """
    return StepTimeoutError(
        f"{what} within {timeout:g} s (step_timeout): "
        f"{describe_workers(client, addresses, roles) or 'no worker named'}"
    )


def answering_workers(client, addresses: Iterable[str]) -> list[str]:
    """Those of ``addresses`` running and heard from within :data:`SILENT_SECONDS`, sorted."""
    workers = scheduler_workers(client)
    now = time.time()
    return sorted(
        w
        for w in set(addresses)
        if w in workers
        and workers[w].get("status", "running") == "running"
        and now - workers[w].get("last_seen", now) <= SILENT_SECONDS
    )


def run_on_workers(
    client: Client, what: str, step_timeout: float, function: Callable, *args: Any
) -> dict[str, Any]:
    """``Client.run(function, *args)`` on every worker, within ``step_timeout`` seconds.

    Parameters
    ----------
    client : distributed.Client
        A synchronous client.
    what : str
        What the call does, for the error (``"warming the kernel"``).
    step_timeout : float
    function, args

    Returns
    -------
    dict
        ``{address: result}``.

    Raises
    ------
    StepTimeoutError
        If a worker did not answer in time, naming every worker with its state (cancelled).
    """
    try:
        return run_watching(
            client, client.run(function, *args, asynchronous=True), step_timeout,
            lambda: None, step_timeout,
        )  # fmt: skip
    except TimeoutError:
        raise step_timeout_error(
            client, f"the workers did not finish {what}", step_timeout,
            list(scheduler_workers(client)),
        ) from None  # fmt: skip
