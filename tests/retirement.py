"""A worker retired (``Client.retire_workers``) while a model trains: the request comes from a
thread once the model has trained a given number of steps, as an adaptive cluster scaling down
would send it; and a worker brought near its memory limit, to be no place for a model's
values."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import dask
import numpy as np
import psutil
from distributed import LocalCluster
from polling import HANG_GUARD, wait_until

from dasknn.runtime.cluster import scheduler_workers
from dasknn.runtime.faults import retirement_requests


def after_steps(model, steps: int, action) -> threading.Thread:
    """Run ``action()`` in a thread once ``model`` has trained ``steps`` steps (its
    ``n_steps_``), polling every 5 ms for at most :data:`~polling.HANG_GUARD` seconds."""

    def watch():
        wait_until(lambda: model.n_steps_ >= steps, HANG_GUARD, f"{steps} steps", 0.005)
        action()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def retire_after_steps(client, model, steps: int, worker: str) -> threading.Thread:
    """:func:`after_steps` that asks the scheduler to retire ``worker``."""
    return after_steps(model, steps, lambda: client.retire_workers([worker]))


def retire_between_fits(
    client, model, worker: str, first: Callable[[], object], rest: Callable[[], object]
) -> threading.Thread:
    """Run ``first()`` (the training up to the request), ask the scheduler to retire ``worker``
    from a thread (the call returns once Dask has retired it), wait until the scheduler counts
    the request and the model's next look at retirements is due (at most
    :data:`~polling.HANG_GUARD` seconds each), then run ``rest()``: the model meets the request
    at the first task of ``rest``, whatever the machine's speed. Returns the thread."""
    first()
    before = retirement_requests(client).get(worker, 0)
    thread = threading.Thread(target=client.retire_workers, args=([worker],), daemon=True)
    thread.start()
    wait_until(lambda: retirement_requests(client).get(worker, 0) > before, HANG_GUARD,
               f"the request to retire {worker}")  # fmt: skip
    wait_until(lambda: time.monotonic() >= model._next_retire_check, HANG_GUARD,
               "the model's next look at retirements", 0.01)  # fmt: skip
    rest()
    return thread


def _fill_to(fraction: float, dask_worker) -> None:
    """Hold an array on ``dask_worker`` (outside its data) so that its process memory is about
    ``fraction`` of its memory limit."""
    rss = psutil.Process().memory_info().rss
    extra = int(fraction * dask_worker.memory_manager.memory_limit) - rss
    dask_worker.ballast = np.ones(max(extra, 0) // 8)


def fill_memory_to(client, worker: str, fraction: float) -> None:
    """Bring ``worker``'s process memory to about ``fraction`` of its memory limit, and wait
    (at most :data:`~polling.HANG_GUARD` seconds) until the scheduler's heartbeats say so."""
    client.run(_fill_to, fraction, workers=[worker])
    limit = scheduler_workers(client)[worker]["memory_limit"]
    wait_until(
        lambda: scheduler_workers(client)[worker]["metrics"]["memory"] > (fraction - 0.01) * limit,
        HANG_GUARD, f"the memory of {worker} was not reported",
    )  # fmt: skip


@contextmanager
def pausing_cluster(local_directory) -> Iterator[LocalCluster]:
    """Two single-threaded worker processes with a memory limit of 200 MiB, paused at half of it:
    below what a worker with dasknn loaded takes, so Dask pauses them as the model is placed
    (no spilling, no termination, the memory looked at every 20 ms)."""
    limits = {
        "distributed.worker.memory.target": False,
        "distributed.worker.memory.spill": False,
        "distributed.worker.memory.pause": 0.5,
        "distributed.worker.memory.terminate": False,
        "distributed.worker.memory.monitor-interval": "20ms",
    }
    with dask.config.set(limits), LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
        memory_limit="200 MiB", local_directory=local_directory,
    ) as cluster:  # fmt: skip
        yield cluster
