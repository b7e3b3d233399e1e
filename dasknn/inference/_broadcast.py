"""Weights placed on the workers once: the same data on every worker, or a copy loaded on each
named worker by a task pinned there, sent from the client or taken from a copy the worker holds.
Every scatter has a time limit and leaves no key behind when given up
(:func:`~dasknn.runtime.scatter.scatter_released_if_given_up`); docs/reliability.md."""

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
    """``Client.scatter(value, hash=False, **options)``, cancelled with a ``TimeoutError`` after
    ``timeout`` seconds; a late key leaves the cluster once registered."""
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
    """Wait until the copy task of every worker still running has run there, until the monotonic
    ``deadline``.

    Raises
    ------
    TimeoutError
        If a running worker's copy task had not run by ``deadline``.
    WorkerLostError
        If a copy task was cancelled: the value was lost with the worker holding it.
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

    Scattered to one worker, then taken by a task pinned to each running worker (running
    workers looked at every :data:`WORKERS_POLL_SECONDS`); why not Dask's ``broadcast=True``:
    docs/reliability.md.

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
    """Submit ``function(*args)`` to the worker ``address`` only (not pure); its result stays
    there."""
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
    ``TimeoutError``) and run ``load(value, *args)`` there; return each worker's pinned copy's
    future, by address."""
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
    """Run ``load(held[address], *args)`` on each worker of ``held`` (nothing sent from the
    client); return each worker's pinned copy's future, by address."""
    return {
        address: submit_pinned(client, address, load, copy, *args) for address, copy in held.items()
    }
