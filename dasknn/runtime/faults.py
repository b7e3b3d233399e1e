"""Waiting for a step without waiting for ever: lost, retiring, paused and stalled workers.
See docs/reliability.md, "How a lost worker is detected"."""

from __future__ import annotations

import time
from collections.abc import Sequence

import dask
from distributed.diagnostics.plugin import SchedulerPlugin

from dasknn.exceptions import StepTimeoutError, WorkerLostError
from dasknn.runtime.cluster import scheduler_workers
from dasknn.runtime.shared_plugins import hold_scheduler_plugin, release_scheduler_plugin
from dasknn.runtime.step_timeout import describe_workers
from dasknn.runtime.waiting import (
    run_naming_loss,
    wait_at_most,
)

__all__ = [
    "LOSS_GRACE_SECONDS",
    "POLL_SECONDS",
    "RetirementRequests",
    "install_retirement_watch",
    "release_retirement_watch",
    "lost_error",
    "lost_workers",
    "part_roles",
    "part_workers_lost",
    "retirement_requests",
    "retiring_workers",
    "running_workers",
    "with_memory_room",
    "run_watching_part_workers",
    "wait_for_step",
]

#: Seconds between two checks of the part workers while a step runs.
POLL_SECONDS = 0.25
#: Seconds the scheduler is given to notice a lost worker after a call to it failed.
LOSS_GRACE_SECONDS = 2.0

_CLOSED = ("closing", "closed")
_GONE = ("closing_gracefully", *_CLOSED)


class RetirementRequests(SchedulerPlugin):
    """Scheduler plugin counting retirement requests per worker, also those Dask refuses.

    Attributes
    ----------
    requests : dict
        ``{worker address: retirements requested}``.
    """

    name = "dasknn-retirement-requests"
    idempotent = True

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}

    def log_event(self, topic, msg) -> None:
        if (
            isinstance(msg, dict)
            and msg.get("action") == "worker-status-change"
            and msg.get("status") == "closing_gracefully"
        ):
            self.requests[topic] = self.requests.get(topic, 0) + 1


def install_retirement_watch(client, user: str | None = None) -> None:
    """Register :class:`RetirementRequests` (kept with its counts if there) held for ``user``."""
    hold_scheduler_plugin(client, RetirementRequests(), RetirementRequests.name, user)


def release_retirement_watch(client, user: str) -> None:
    """Drop ``user``'s hold on :class:`RetirementRequests`; the last holder removes it."""
    release_scheduler_plugin(client, RetirementRequests.name, user)


def _worker_states(dask_scheduler) -> tuple[dict, dict]:
    watch = dask_scheduler.plugins.get(RetirementRequests.name)
    requests = watch.requests if watch is not None else {}
    statuses = {address: ws.status.name for address, ws in dask_scheduler.workers.items()}
    return statuses, dict(requests)


def retirement_requests(client) -> dict[str, int]:
    """``{worker address: retirements requested so far}`` (see :class:`RetirementRequests`)."""
    return client.run_on_scheduler(_worker_states)[1]


def lost_workers(
    client,
    part_workers: Sequence[str],
    requests: dict[str, int] | None = None,
    *,
    handing_over: bool = False,
) -> list[str]:
    """The part workers gone, closing, or asked to retire since ``requests``, sorted. With
    ``handing_over`` (a model that hands the parts of retiring workers to the others between
    steps), only those gone or closing: a worker Dask is retiring is not lost yet."""
    statuses, now = client.run_on_scheduler(_worker_states)
    if handing_over:
        return sorted({w for w in part_workers if statuses.get(w, "closed") in _CLOSED})
    asked = {
        w for w in part_workers if requests is not None and now.get(w, 0) > requests.get(w, 0)
    }
    gone = {w for w in part_workers if statuses.get(w, "closed") in _GONE}
    return sorted(asked | gone)


def retiring_workers(
    client, part_workers: Sequence[str], requests: dict[str, int]
) -> list[str]:
    """The part workers still in the cluster that are being retired or were asked to retire
    since ``requests``, sorted (Dask refuses to retire a worker holding an actor, such as a
    model's postbox, so they stay until the model lets them go)."""
    statuses, now = client.run_on_scheduler(_worker_states)
    return sorted(
        w
        for w in set(part_workers)
        if statuses.get(w, "closed") not in _CLOSED
        and (statuses[w] == "closing_gracefully" or now.get(w, 0) > requests.get(w, 0))
    )


def running_workers(client, leaving: Sequence[str] = ()) -> list[str]:
    """The workers neither leaving the cluster nor in ``leaving``, sorted."""
    workers = scheduler_workers(client)
    return sorted(
        w for w, info in workers.items() if info.get("status") not in _GONE and w not in leaving
    )


def with_memory_room(client, candidates: Sequence[str], holders: Sequence[str]) -> list[str]:
    """Those of ``candidates`` that can take the values of any one of the workers ``holders``
    without reaching Dask's pause threshold, the most room first (ties in the order given): a
    worker without a memory limit, or one whose process memory plus the largest process memory
    among ``holders`` (a bound on what a holder keeps; 0 for a worker already gone) stays below
    the fraction ``distributed.worker.memory.pause`` of its ``memory_limit``. From the
    scheduler's latest heartbeats."""
    workers = scheduler_workers(client)
    pause = dask.config.get("distributed.worker.memory.pause") or 1.0

    def process(address: str) -> int:
        return int(workers.get(address, {}).get("metrics", {}).get("memory") or 0)

    def room(address: str) -> float:
        limit = workers.get(address, {}).get("memory_limit")
        return pause * limit - process(address) if limit else float("inf")

    need = max((process(w) for w in holders), default=0)
    return sorted((w for w in candidates if room(w) > need), key=room, reverse=True)


def part_roles(part_workers: Sequence[str]) -> dict[str, str]:
    """``{address: "parts 0, 2"}``: the parts of every part worker (``"part 1"`` for one)."""
    parts: dict[str, list[str]] = {}
    for m, address in enumerate(part_workers):
        parts.setdefault(address, []).append(str(m))
    return {
        address: f"part{'s' if len(ms) > 1 else ''} {', '.join(ms)}"
        for address, ms in parts.items()
    }


def _named(part_workers: Sequence[str], lost: Sequence[str]) -> str:
    """``"ADDRESS (part 1), ..."``: the workers ``lost`` with their parts."""
    roles = part_roles(part_workers)
    return ", ".join(f"{w} ({roles[w]})" if w in roles else w for w in lost)


def lost_error(part_workers: Sequence[str], lost: Sequence[str]) -> WorkerLostError:
    """The error naming the workers ``lost`` with their parts."""
    return WorkerLostError(
        f"worker(s) {_named(part_workers, lost)} of the model left the cluster (or were asked "
        "to), and their weights with them; a fit call given a checkpoint directory "
        "(fit(checkpoint=DIR)) restores its last checkpoint and goes on"
    )


def run_watching_part_workers(
    client, coroutine, part_workers: Sequence[str], timeout: float, doing: str
):
    """The result of ``coroutine`` (a ``client`` call made with ``asynchronous=True``),
    checking the part workers every :data:`POLL_SECONDS`.

    Raises
    ------
    WorkerLostError
        As soon as a part worker is gone or closing, or when the call failed and one is found
        gone within :data:`LOSS_GRACE_SECONDS`; names the workers, parts and ``doing``.
    TimeoutError
        After ``timeout`` seconds.
    Exception
        The call's own error when every part worker is still there.
    """

    return run_naming_loss(
        client,
        coroutine,
        timeout,
        lambda: part_workers_lost(client, part_workers, doing),
        POLL_SECONDS,
        LOSS_GRACE_SECONDS,
    )


def part_workers_lost(client, part_workers: Sequence[str], doing: str) -> WorkerLostError | None:
    """The error naming the part workers gone or closing, with parts and ``doing``, or ``None``."""
    lost = lost_workers(client, part_workers)
    if not lost:
        return None
    return WorkerLostError(
        f"worker(s) {_named(part_workers, lost)} of the model left the cluster while {doing}"
    )


def wait_for_step(
    client,
    futures: list,
    part_workers: Sequence[str],
    parts: Sequence[int],
    timeout: float,
    requests: dict[str, int] | None = None,
    *,
    handing_over: bool = False,
) -> None:
    """Wait until every future of a step is finished (done or failed).

    Parameters
    ----------
    client : distributed.Client
    futures, parts : list of Future, sequence of int
        The step's results and the part of each.
    part_workers : sequence of str
        The worker of every part.
    timeout : float
        Seconds after which an unfinished step is an error.
    requests : dict, optional
        The retirement requests when the model was placed (see :func:`lost_workers`).
    handing_over : bool
        As :func:`lost_workers`: a worker being retired is not lost.

    Raises
    ------
    WorkerLostError
        As soon as a part worker has left the cluster, is closing, or was asked to retire.
    StepTimeoutError
        After ``timeout`` seconds, naming the workers whose results are missing and their state.
    """
    deadline = time.monotonic() + timeout
    while True:
        if wait_at_most(futures, min(POLL_SECONDS, max(deadline - time.monotonic(), 0.01))):
            return
        lost = lost_workers(client, part_workers, requests, handing_over=handing_over)
        if lost:
            raise lost_error(part_workers, lost)
        if time.monotonic() >= deadline:
            break
    waiting = sorted({part_workers[m] for f, m in zip(futures, parts, strict=True) if not f.done()})
    raise StepTimeoutError(
        f"a training or inference step made no progress for {timeout:g} s (step_timeout): "
        f"{describe_workers(client, waiting, part_roles(part_workers)) or 'no worker named'}"
    )
