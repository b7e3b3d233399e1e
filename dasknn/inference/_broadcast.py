"""Weights placed on the workers once: the same data on every worker, or a copy loaded on each
named worker by a task pinned there (for example into its GPU's memory), sent from the client or
taken from a copy the worker already holds. Every scatter runs on the client's event loop with a
time limit, since a stopped worker never takes its data, and a scatter given up leaves no key
behind once that worker takes it (:func:`~dasknn.runtime.scatter.scatter_released_if_given_up`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import CancelledError
from typing import Any

from distributed import Client, Future

from dasknn.exceptions import WorkerLostError
from dasknn.runtime.cluster import scheduler_workers
from dasknn.runtime.scatter import scatter_released_if_given_up
from dasknn.runtime.waiting import (
    run_watching,
    wait_at_most,
)

__all__ = [
    "WORKERS_POLL_SECONDS",
    "broadcast",
    "load_held",
    "load_on_each",
    "scatter_within",
    "submit_pinned",
]


def scatter_within(client: Client, value: Any, timeout: float, **options: Any) -> Future:
    """``Client.scatter(value, hash=False, **options)``, given up (and cancelled) with a
    ``TimeoutError`` after ``timeout`` seconds; its key, named as Dask names an unhashed value,
    leaves the cluster once the scheduler registers it after that."""
    key = f"{type(value).__name__}-{uuid.uuid4().hex}"
    scattering = scatter_released_if_given_up(client, {key: value}, **options)
    return run_watching(client, scattering, timeout, lambda: None, timeout)[key]


#: Seconds between two looks, while a broadcast waits, at which workers are still running.
WORKERS_POLL_SECONDS = 0.25


def _copied(value: Any) -> None:
    """Task that takes ``value``, so that Dask copies it to the task's worker."""


def _running_workers(client: Client) -> set[str]:
    """The workers the scheduler lists as running (not paused, closing or gone)."""
    return {w for w, info in scheduler_workers(client).items() if info.get("status") == "running"}


def _wait_for_copies(
    client: Client, copies: dict[str, Future], deadline: float, timeout: float
) -> None:
    """Wait until the copy task of every worker still running has run there (see
    :func:`broadcast`), until the monotonic ``deadline`` (else ``TimeoutError`` naming the
    broadcast's ``timeout``).

    Raises
    ------
    TimeoutError
        If a running worker's copy task had not run by ``deadline``.
    WorkerLostError
        If a copy task was cancelled: the value was lost with the worker holding it (Dask
        cancels the tasks that take a scattered value it lost).
    Exception
        A copy task's own error (the value could not be taken there).
    """
    workers = set(copies)
    try:
        while waiting := [copies[w] for w in workers if not copies[w].done()]:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the value did not reach every worker within {timeout:g} s")
            if not wait_at_most(waiting, min(left, WORKERS_POLL_SECONDS), "FIRST_COMPLETED"):
                workers &= _running_workers(client)
        for w in workers:
            if copies[w].status != "finished":
                copies[w].result()  # its error; cancelled when the value was lost
    except CancelledError as error:
        raise WorkerLostError(
            "the broadcast value was lost before every worker took a copy (the worker holding "
            f"it left the cluster): {error}"
        ) from None


def broadcast(client: Client, value: Any, timeout: float) -> Future:
    """Send ``value`` to every running worker once, within ``timeout`` seconds (else
    ``TimeoutError``, and nothing of it stays on the cluster); tasks that take the returned
    future read it there.

    The value is scattered to one worker (:func:`scatter_within`), and a task pinned to each
    running worker takes it (:func:`_copied`), so that the worker fetches a copy; once the task
    of every worker still running has run (which workers run is looked at after each
    :data:`WORKERS_POLL_SECONDS` in which no copy task finished), those tasks are released,
    whether they ran or not. Each copy is one Dask's task states know of: a copy that lands
    after the broadcast was given up is dropped again. The scheduler's own broadcast
    (``Client.scatter(broadcast=True)``, its ``replicate``) copies the value outside them: a
    worker stopped after it takes its copy and before it answers keeps that copy for good once
    the key is released, which is why this function does not use it.

    Dask's active memory manager (its ``ReduceReplicas`` policy, on by default) drops the
    copies no task waits for: the broadcast waits for each copy task to run, not for every
    copy to be held at once, which that policy may never let happen. A worker whose copy was
    dropped fetches the value again for its next task that takes it.

    Raises
    ------
    TimeoutError
        If a running worker did not take the value within ``timeout`` seconds.
    WorkerLostError
        If the worker holding the value left the cluster before every worker took a copy.
    """
    deadline = time.monotonic() + timeout
    placed = scatter_within(client, value, timeout)
    try:
        copies = {
            w: client.submit(_copied, placed, workers=[w], allow_other_workers=False, pure=False)
            for w in _running_workers(client)
        }
        try:
            _wait_for_copies(client, copies, deadline, timeout)
        finally:
            for copy in copies.values():
                copy.release()
    except BaseException:
        placed.release()
        raise
    return placed


def submit_pinned(client: Client, address: str, function: Callable, *args: Any) -> Future:
    """Submit ``function(*args)`` to the worker ``address`` only (``allow_other_workers=False``,
    not pure: every call is a task of its own); its result stays on that worker."""
    return client.submit(function, *args, workers=[address], allow_other_workers=False, pure=False)


def load_on_each(
    client: Client,
    value: Any,
    addresses: Sequence[str],
    timeout: float,
    load: Callable,
    *args: Any,
) -> dict[str, Future]:
    """Send ``value`` to each worker of ``addresses`` (within ``timeout`` seconds each, else
    ``TimeoutError``) and run ``load(value, *args)`` there.

    Returns the future of each worker's loaded copy, by address; its task is pinned to the worker
    (``allow_other_workers=False``), so the copy never moves.
    """
    loaded = {}
    try:
        for address in addresses:
            host = scatter_within(client, value, timeout, workers=[address])
            loaded[address] = submit_pinned(client, address, load, host, *args)
    except BaseException:
        for future in loaded.values():  # the error's traceback holds them
            future.release()
        raise
    return loaded


def load_held(
    client: Client, held: Mapping[str, Future], load: Callable, *args: Any
) -> dict[str, Future]:
    """Run ``load(held[address], *args)`` on each worker of ``held``, whose value that worker
    already holds (nothing is sent from the client).

    Returns the future of each worker's loaded copy, by address, pinned there as by
    :func:`load_on_each`.
    """
    return {
        address: submit_pinned(client, address, load, copy, *args) for address, copy in held.items()
    }
