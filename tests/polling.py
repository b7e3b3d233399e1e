"""Waiting for a condition in a test: poll it with a deadline instead of sleeping a fixed time
(``distributed.utils_test`` style)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll(predicate: Callable[[], T], timeout: float, interval: float = 0.05) -> T:
    """Call ``predicate()`` every ``interval`` seconds until it returns a true value or
    ``timeout`` seconds pass, and return its last value (false when the time ran out)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(interval)
    return value


def wait_until(predicate: Callable[[], T], timeout: float, what: str | Callable[[], str],
               interval: float = 0.05) -> T:
    """:func:`poll` ``predicate`` and return its true value; fail (AssertionError with ``what``,
    or ``what()`` when it is callable, and the last value) when ``timeout`` seconds pass first.
    The deadline is a hang guard: pass a generous one."""
    value = poll(predicate, timeout, interval)
    if not value:
        said = what() if callable(what) else what
        raise AssertionError(f"{said} (not within {timeout:g} s; last: {value!r})")
    return value


#: Seconds within which a fault test's error must come at all: a hang guard, not a timing
#: (generous on a loaded 2-core machine, yet below Dask's 30 s connect timeout and its
#: minutes-long worker-ttl and message timeouts, which an error must not wait for).
HANG_GUARD = 25.0
