"""Calls made in a background thread, in order, at most one on its way: the caller makes the
next piece of work (a layer, a batch of chunks) while the thread uses the last one (hashes it,
hands it to the workers)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Self

__all__ = ["OneAtATime"]


class OneAtATime:
    """A thread of its own (named ``name``) running the calls submitted, in order, one at a time,
    with at most one of them on its way: :meth:`submit` first waits for the call before it.

    Used as a ``with`` block: leaving it waits for the last call and raises its error; leaving it
    on an error waits for the call still running and drops its outcome.
    """

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._last: Future | None = None

    def wait(self) -> None:
        """Wait for the call submitted last (if not waited for yet), raising its error."""
        last, self._last = self._last, None
        if last is not None:
            last.result()

    def submit(self, call: Callable[..., Any], *args: Any) -> None:
        """Wait for the call before (:meth:`wait`), then start ``call(*args)`` in the thread."""
        self.wait()
        self._last = self._executor.submit(call, *args)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind, error, trace) -> None:
        try:
            if kind is None:
                self.wait()
        finally:
            self._executor.shutdown(wait=True)
