"""Waiting for futures and gathering their results with a time limit, without keeping them
alive afterwards, and running a client call while watching the cluster."""

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
    """Clear the frames of ``error``'s traceback and of the errors it was raised from, and drop
    the tracebacks (see :func:`wait_at_most`)."""
    while error is not None:
        traceback.clear_frames(error.__traceback__)
        error.__traceback__ = None
        error = error.__context__ or error.__cause__


def _is_gather_exit(error: BaseException | None) -> bool:
    """Whether ``error`` is distributed's ``AllExit``, the signal with which a gather's waits on
    its futures stop early (not an error)."""
    kind = type(error)
    return kind.__name__ == "AllExit" and kind.__module__ == "distributed.client"


def _quiet_gather_exits(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """An event loop's exception handler that drops asyncio's report of a task ended by
    :func:`_is_gather_exit` and passes every other report on to the loop's default handler."""
    if not _is_gather_exit(context.get("exception")):
        loop.default_exception_handler(context)


def _cancel_call(client: Client, running: concurrent.futures.Future) -> None:
    """Cancel a client call running on the client's event loop.

    A cancelled ``Client.gather`` leaves behind the tasks that wait on each of its futures
    (distributed's ``All`` watches them only when one fails, not when it is cancelled); once
    those futures are cancelled (the model's clean-up, the client's close) each such task ends
    in ``AllExit`` that nobody retrieves, and asyncio reports it as "Task exception was never
    retrieved" with a traceback on stderr. The loop's exception handler is set to drop those
    reports (:func:`_quiet_gather_exits`), unless the loop already has a handler of its own.
    """
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
        True if all of them (or one of them) finished in time.

    Notes
    -----
    ``distributed.wait`` reports a timeout by raising ``TimeoutError``. The traceback of that
    error passes through the client's ``sync`` frame, whose closure refers back to the error: a
    reference cycle that holds the futures (the closure's arguments) until the garbage collector
    runs, so their keys stay on the cluster long after the caller dropped them. The error and
    the ones it was raised from lose their tracebacks here (their frames cleared), which breaks
    the cycle. Any other error of the wait (``FuturesCancelledError``) is raised with the
    locals of its traceback's frames cleared, for the same reason.
    """
    try:
        wait(list(futures), timeout=seconds, return_when=return_when)
    except TimeoutError as exc:
        _drop_tracebacks(exc)
        return False
    except Exception as exc:
        # the wait's own error (futures cancelled) is in the same cycle: the traceback is kept,
        # the locals of its frames cleared
        traceback.clear_frames(exc.__traceback__)
        raise
    return True


def gather_at_most(client: Client, futures: Sequence[Future], seconds: float) -> list:
    """The results of ``futures``, in order, fetched by one ``Client.gather`` within ``seconds``.

    Parameters
    ----------
    client : distributed.Client
        A synchronous client (not one used inside ``async`` code).
    futures : sequence of Future
        Futures of ``client``.
    seconds : float
        How long the results may take to arrive.

    Returns
    -------
    list
        The results.

    Raises
    ------
    TimeoutError
        If they did not all arrive within ``seconds`` (a worker holding one stopped answering);
        the gather is cancelled and the error has no traceback that could hold the futures.
        A failed gather's own error is in no reference cycle either.
    Exception
        A failed future's error, as ``Client.gather`` raises it.

    Notes
    -----
    ``Client.gather`` takes no timeout, and a worker that stops (``SIGSTOP``, a swapping node)
    after its tasks finished blocks it for ever. Here the same single gather request runs as a
    coroutine (``Client.gather(..., asynchronous=True)``) on the client's event loop
    (``asyncio.run_coroutine_threadsafe``), and the caller waits for it with a time limit and
    cancels it on timeout, as ``Future.result(timeout)`` does for one future.
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
        # distributed raises a failed future's error from a frame that holds it: without the
        # locals of the traceback's frames it is in no reference cycle that keeps the callers'
        # frames (and their futures) alive until the garbage collector runs
        traceback.clear_frames(exc.__traceback__)
        raise
    finally:
        del gathering  # it holds the error too, whose traceback holds this frame


def call_at_most(call: Callable[[], Any], seconds: float | None) -> bool:
    """Call ``call()`` in a thread of its own and wait for it at most ``seconds``, leaving it to
    finish after that.

    Parameters
    ----------
    call : callable
        A synchronous client call, such as ``lambda: client.unregister_worker_plugin(name)``.
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

    Notes
    -----
    For calls the scheduler carries out on every worker (a plugin's removal): the request
    reaches the scheduler at once, and the scheduler goes on with it after the wait ends, so a
    worker that does not answer now (stopped) is reached when it goes on, or dropped with it
    when the scheduler removes it. The thread is a daemon: it keeps no process from ending.
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


async def in_thread(call: Callable[[], Any]) -> Any:
    """A coroutine for :func:`run_watching` and :func:`run_naming_loss` of a synchronous client
    call that has no ``asynchronous=True`` form (``Client.register_plugin``): ``call()`` runs in
    a daemon thread of its own, and cancelling the coroutine leaves it to finish there, as
    :func:`call_at_most` does (a registration reaches the scheduler at once; a stopped worker
    gets it when it goes on)."""
    return await asyncio.wrap_future(_start_call(call))


def run_watching(
    client: Client,
    coroutine: Coroutine,
    seconds: float,
    check: Callable[[], None],
    poll: float,
) -> Any:
    """The result of ``coroutine`` run on the client's event loop, calling ``check()`` every
    ``poll`` seconds while it runs.

    Parameters
    ----------
    client : distributed.Client
        A synchronous client; ``coroutine`` is one of its calls made with ``asynchronous=True``
        (``Client.run``, ``Client.scatter``, ...).
    coroutine : coroutine
        The call to run.
    seconds : float
        How long it may take.
    check : callable
        Called between two polls; raises to give up (the call is then cancelled).
    poll : float
        Seconds between two checks.

    Raises
    ------
    TimeoutError
        If the call did not finish within ``seconds`` (it is cancelled).
    Exception
        What ``check()`` raised, or the call's own error.

    Notes
    -----
    A call that must reach a worker which has just died waits for Dask's connect timeout
    (``distributed.comm.timeouts.connect``, 30 s by default) before it fails; ``check`` lets the
    caller notice the loss from the scheduler's side within ``poll`` seconds instead.
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
    """:func:`run_watching`, raising ``lost_error()`` as soon as it finds a lost worker, also
    when the call failed because of the loss.

    Parameters
    ----------
    client, coroutine, seconds, poll
        As for :func:`run_watching`.
    lost_error : callable
        The error naming the lost workers and what they held, or ``None`` while none is lost.
    grace : float
        Seconds the scheduler is given to notice the loss after the call failed with an error of
        the types ``graced`` (a call to a worker that died under it can fail before the scheduler
        removed that worker); other errors are looked at once.
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
    """The ``lost_error`` of :func:`run_naming_loss` for a computation that depends on
    ``workers``: a :class:`WorkerLostError` naming those the scheduler no longer lists and what
    was lost with them, or ``None`` while every one is there.

    Parameters
    ----------
    client : distributed.Client
    workers : iterable of str
        Addresses of the workers the computation depends on.
    what : str or callable
        What was lost with them, for the error (``"the shards it held are gone"``), or a
        function of the sorted lost addresses that says it.
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
    """The results of ``futures``, gathered while checking every ``poll`` seconds that the
    ``workers`` holding the model are still in the cluster.

    Tasks pinned to a worker (``allow_other_workers=False``), or results held by one, are waited
    for for ever once that worker has died; this turns the loss into an error.

    Parameters
    ----------
    client : distributed.Client
        A synchronous client.
    futures : sequence of Future
        Futures of ``client``.
    workers : iterable of str
        Addresses of the workers the results depend on.
    what : str or callable
        What was lost with them, for the error (``"the model's shards there are gone"``), or a
        function of the lost addresses that says it (see :func:`watch_workers`).
    poll : float
        Seconds between two checks.
    graced : exception type or tuple of them
        The gather's errors after which a lost worker is looked for during
        :data:`GATHER_LOSS_GRACE_SECONDS` (by default a result cancelled with its worker; add the
        errors a task on another worker raises when it cannot reach a lost one).
    timeout : float
        Seconds the results may take (by default no limit).
    timed_out : callable, optional
        The error to raise when they did not arrive within ``timeout``, made from the futures
        not yet finished (all of them when every one finished but the results did not arrive:
        a worker holding one stopped answering); by default a ``TimeoutError``.

    Returns
    -------
    list
        The results, in order.

    Raises
    ------
    WorkerLostError
        As soon as the scheduler no longer lists one of ``workers``, naming them and ``what``
        (the gather is cancelled), also when the gather failed because of the loss (a result
        cancelled with its worker, or another error of ``graced``, looked for during
        :data:`GATHER_LOSS_GRACE_SECONDS`).
    TimeoutError
        Or what ``timed_out`` made, if the results did not arrive within ``timeout`` (the
        gather is cancelled).
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
        # the error's traceback holds this frame and so the futures: release them now, or a
        # caller keeping the error (a test report, a notebook's last traceback) would keep
        # their keys, and tasks still waiting on them, on the cluster
        for future in futures:
            future.release()
        raise
