"""Waits and gathers with a time limit that keep no futures alive afterwards, and client calls
that watch the cluster for lost workers. See docs/runtime.md, "Waiting with a time limit"."""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
import time
import traceback
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import CancelledError
from typing import Any

from distributed import Client, Future, wait

from dasknn.exceptions import WorkerLostError
from dasknn.runtime.cluster import scheduler_workers

__all__ = [
    "GATHER_LOSS_GRACE_SECONDS",
    "call_at_most",
    "finished",
    "gather_at_most",
    "gather_watching",
    "in_thread",
    "run_naming_loss",
    "run_watching",
    "wait_at_most",
    "watch_workers",
]

#: Seconds :func:`gather_watching` looks for a lost worker after a cancelled result.
GATHER_LOSS_GRACE_SECONDS = 5.0


def _drop_tracebacks(error: BaseException | None) -> None:
    """Clear and drop the tracebacks of ``error`` and of the errors it was raised from."""
    while error is not None:
        traceback.clear_frames(error.__traceback__)
        error.__traceback__ = None
        error = error.__context__ or error.__cause__


def _is_gather_exit(error: BaseException | None) -> bool:
    """Whether ``error`` is distributed's ``AllExit`` (a gather's waits stopping early)."""
    kind = type(error)
    return kind.__name__ == "AllExit" and kind.__module__ == "distributed.client"


def _quiet_gather_exits(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """Event loop exception handler: drop reports of ``AllExit``, pass the others on."""
    if not _is_gather_exit(context.get("exception")):
        loop.default_exception_handler(context)


def _cancel_call(client: Client, running: concurrent.futures.Future) -> None:
    """Cancel a call on the client's loop, first making the loop drop the ``AllExit`` reports
    a cancelled gather leaves (unless it has a handler of its own)."""
    loop = client.loop.asyncio_loop
    if loop.get_exception_handler() is None:
        loop.set_exception_handler(_quiet_gather_exits)
    running.cancel()


def wait_at_most(
    futures: Sequence[Future], seconds: float, return_when: str = "ALL_COMPLETED"
) -> bool:
    """Wait up to ``seconds`` for every future to finish (done, failed or cancelled), or with
    ``return_when="FIRST_COMPLETED"`` for one of them.

    Returns
    -------
    bool
        True if all of them (or one of them) finished in time. Errors lose their traceback
        frames' locals, so no reference cycle keeps the futures alive.
    """
    try:
        wait(list(futures), timeout=seconds, return_when=return_when)
    except TimeoutError as exc:
        _drop_tracebacks(exc)
        return False
    except Exception as exc:
        # same cycle: keep the traceback, clear its frames' locals
        traceback.clear_frames(exc.__traceback__)
        raise
    return True


def gather_at_most(client: Client, futures: Sequence[Future], seconds: float) -> list:
    """The results of ``futures``, in order, fetched by one ``Client.gather`` within ``seconds``.

    Parameters
    ----------
    client : distributed.Client
        A synchronous client.
    futures : sequence of Future
    seconds : float

    Returns
    -------
    list

    Raises
    ------
    TimeoutError
        If they did not all arrive within ``seconds`` (the gather is cancelled).
    Exception
        A failed future's error, as ``Client.gather`` raises it.
    """
    gathering = asyncio.run_coroutine_threadsafe(
        client.gather(list(futures), asynchronous=True), client.loop.asyncio_loop
    )
    try:
        return gathering.result(timeout=seconds)
    except TimeoutError as exc:
        _cancel_call(client, gathering)
        _drop_tracebacks(exc)
        raise TimeoutError(f"the results did not arrive within {seconds:g} s") from None
    except Exception as exc:
        # clear the frames' locals: no reference cycle keeps the callers' futures alive
        traceback.clear_frames(exc.__traceback__)
        raise
    finally:
        del gathering  # it holds the error, whose traceback holds this frame


def call_at_most(call: Callable[[], Any], seconds: float | None) -> bool:
    """Call ``call()`` in a daemon thread, waiting at most ``seconds`` (it may finish later).

    Parameters
    ----------
    call : callable
        A synchronous client call the scheduler goes on with (removing a plugin, ...).
    seconds : float or None
        How long to wait for it (``None``: called here, until it returns).

    Returns
    -------
    bool
        True if it returned in time, False if it still runs.

    Raises
    ------
    Exception
        The call's own error, if it failed in time (a later one is dropped).
    """
    if seconds is None:
        call()
        return True
    try:
        _start_call(call).result(timeout=seconds)
    except TimeoutError:
        return False
    return True


def _start_call(call: Callable[[], Any]) -> concurrent.futures.Future:
    """Start ``call()`` in a daemon thread of its own; the future gets its result or error."""
    outcome: concurrent.futures.Future = concurrent.futures.Future()
    # running: a waiter that gives up cancels its wait, not the call's future
    outcome.set_running_or_notify_cancel()

    def run() -> None:
        try:
            outcome.set_result(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, or dropped
            outcome.set_exception(exc)

    threading.Thread(target=run, name="dasknn-call-at-most", daemon=True).start()
    return outcome


async def finished(futures: Sequence[Future]) -> None:
    """Wait, on the client's loop, until every one of ``futures`` has finished (done, failed or
    cancelled), their results left on the workers: a wait for :func:`run_watching` that moves
    no data (``Client.gather`` would fetch every result). Each future's done callback, which
    distributed runs in a thread of its own, wakes the wait; it costs no polling."""
    signals = []
    for future in futures:
        signal: concurrent.futures.Future = concurrent.futures.Future()
        future.add_done_callback(lambda _, signal=signal: signal.set_result(None))
        signals.append(asyncio.wrap_future(signal))
    await asyncio.gather(*signals)


async def in_thread(call: Callable[[], Any]) -> Any:
    """Run the synchronous ``call()`` in a daemon thread; cancelling leaves it to finish."""
    return await asyncio.wrap_future(_start_call(call))


def run_watching(
    client: Client,
    coroutine: Coroutine,
    seconds: float,
    check: Callable[[], None],
    poll: float,
) -> Any:
    """The result of ``coroutine`` on the client's loop, calling ``check()`` every ``poll`` s.

    Parameters
    ----------
    client : distributed.Client
        A synchronous client.
    coroutine : coroutine
        One of its calls made with ``asynchronous=True`` (``Client.run``, ...).
    seconds, poll : float
        How long it may take; seconds between two checks.
    check : callable
        Called between two polls; raises to give up (the call is then cancelled).

    Raises
    ------
    TimeoutError
        If the call did not finish within ``seconds`` (it is cancelled).
    Exception
        What ``check()`` raised, or the call's own error.
    """
    running = asyncio.run_coroutine_threadsafe(coroutine, client.loop.asyncio_loop)
    deadline = time.monotonic() + seconds
    try:
        while True:
            left = deadline - time.monotonic()
            done, _ = concurrent.futures.wait([running], timeout=max(min(poll, left), 0))
            if done:
                return running.result()
            check()
            if left <= poll:
                raise TimeoutError(f"the call did not finish within {seconds:g} s")
    except BaseException:
        _cancel_call(client, running)
        raise


def run_naming_loss(
    client: Client,
    coroutine: Coroutine,
    seconds: float,
    lost_error: Callable[[], WorkerLostError | None],
    poll: float,
    grace: float,
    graced: type[BaseException] | tuple[type[BaseException], ...] = Exception,
) -> Any:
    """:func:`run_watching`, raising ``lost_error()`` once a worker is lost (also on failure).

    Parameters
    ----------
    client, coroutine, seconds, poll
        As for :func:`run_watching`.
    lost_error : callable
        The error naming the lost workers and what they held, or ``None`` while none is lost.
    grace : float
        Seconds the scheduler is given to notice a loss after the call failed with one of
        ``graced``; other errors are looked at once.
    graced : exception type or tuple of them

    Raises
    ------
    WorkerLostError
        What ``lost_error()`` returned, chained from the call's error if there was one.
    TimeoutError
        If the call did not finish within ``seconds``.
    Exception
        The call's own error when no worker is found lost.
    """

    def check() -> None:
        error = lost_error()
        if error is not None:
            raise error

    try:
        return run_watching(client, coroutine, seconds, check, poll)
    except (WorkerLostError, TimeoutError):
        raise
    except Exception as exc:
        deadline = time.monotonic() + (grace if isinstance(exc, graced) else 0.0)
        while True:
            error = lost_error()
            if error is not None:
                raise error from exc
            if time.monotonic() >= deadline:
                raise
            time.sleep(min(poll, 0.25))


def watch_workers(
    client: Client, workers, what: str | Callable[[list[str]], str]
) -> Callable[[], WorkerLostError | None]:
    """The ``lost_error`` of :func:`run_naming_loss`: a :class:`WorkerLostError` naming the
    ``workers`` the scheduler no longer lists and ``what``, or ``None``.

    Parameters
    ----------
    client : distributed.Client
    workers : iterable of str
        Addresses of the workers the computation depends on.
    what : str or callable
        What was lost with them, or a function of the sorted lost addresses that says it.
    """
    watched = list(workers)

    def lost_error() -> WorkerLostError | None:
        present = set(scheduler_workers(client))
        lost = sorted(w for w in watched if w not in present)
        if not lost:
            return None
        lost_what = what(lost) if callable(what) else what
        return WorkerLostError(f"lost worker {', '.join(lost)}: {lost_what}")

    return lost_error


def gather_watching(
    client: Client,
    futures: Sequence[Future],
    workers,
    what: str | Callable[[list[str]], str],
    poll: float = 1.0,
    graced: type[BaseException] | tuple[type[BaseException], ...] = CancelledError,
    timeout: float = math.inf,
    timed_out: Callable[[list[Future]], BaseException] | None = None,
) -> list:
    """The results of ``futures``, checking every ``poll`` s that ``workers`` are still there.

    Parameters
    ----------
    client, workers, what
        As for :func:`watch_workers` (``client`` synchronous).
    futures : sequence of Future
    poll : float
    graced : exception type or tuple of them
        Errors after which a lost worker is looked for during
        :data:`GATHER_LOSS_GRACE_SECONDS` (default: a result cancelled with its worker).
    timeout : float
        Seconds the results may take (default no limit).
    timed_out : callable, optional
        Makes the error raised after ``timeout`` from the unfinished futures (all of them if all
        finished); default a ``TimeoutError``.

    Returns
    -------
    list

    Raises
    ------
    WorkerLostError
        As soon as one of ``workers`` is gone, naming them and ``what`` (the gather is
        cancelled), also when the gather failed with one of ``graced`` because of the loss.
    TimeoutError
        Or what ``timed_out`` made, after ``timeout`` (the gather is cancelled).
    Exception
        A failed future's error, as ``Client.gather`` raises it.
    """
    futures = list(futures)
    try:
        try:
            return run_naming_loss(
                client,
                client.gather(futures, asynchronous=True),
                timeout,
                watch_workers(client, workers, what),
                poll,
                GATHER_LOSS_GRACE_SECONDS,
                graced,
            )
        except TimeoutError as exc:
            if timed_out is None:
                raise
            _drop_tracebacks(exc)
            unfinished = [future for future in futures if not future.done()] or futures
            raise timed_out(unfinished) from None
    except BaseException:
        # a kept error's traceback holds this frame: release the futures now
        for future in futures:
            future.release()
        raise
