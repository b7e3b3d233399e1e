"""Waiting for futures with a time limit, without keeping them alive afterwards."""

from __future__ import annotations

import traceback
from collections.abc import Sequence

from distributed import Future, wait

__all__ = ["wait_at_most"]


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
        error: BaseException | None = exc
        while error is not None:
            traceback.clear_frames(error.__traceback__)
            error.__traceback__ = None
            error = error.__context__ or error.__cause__
        return False
    return True
