"""Waiting for futures and gathering their results with a time limit, without keeping them
alive afterwards, and running a client call while watching the cluster."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import traceback
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from distributed import Client, Future, wait

__all__ = ["gather_at_most", "run_watching", "wait_at_most"]


def _drop_tracebacks(error: BaseException | None) -> None:
    """Clear the frames of ``error``'s traceback and of the errors it was raised from, and drop
    the tracebacks (see :func:`wait_at_most`)."""
    while error is not None:
        traceback.clear_frames(error.__traceback__)
        error.__traceback__ = None
        error = error.__context__ or error.__cause__


def wait_at_most(futures: Sequence[Future], seconds: float) -> bool:
    """Wait up to ``seconds`` for every future to finish (done, failed or cancelled).

    Returns
    -------
    bool
        True if all of them finished in time.

    Notes
    -----
    ``distributed.wait`` reports a timeout by raising ``TimeoutError``. The traceback of that
    error passes through the client's ``sync`` frame, whose closure refers back to the error: a
    reference cycle that holds the futures (the closure's arguments) until the garbage collector
    runs, so their keys stay on the cluster long after the caller dropped them. The error and
    the ones it was raised from lose their tracebacks here (their frames cleared), which breaks
    the cycle.
    """
    try:
        wait(list(futures), timeout=seconds)
    except TimeoutError as exc:
        _drop_tracebacks(exc)
        return False
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
        gathering.cancel()
        _drop_tracebacks(exc)
        raise TimeoutError(f"the results did not arrive within {seconds:g} s") from None


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
        running.cancel()
        raise
