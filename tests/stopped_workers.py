"""A worker process stopped (SIGSTOP) for the length of a ``with`` block, and the wait for the
scheduler to let go of a failed step's keys: shared by the step-timeout tests of the models."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def stopped(client, address: str) -> Iterator[None]:
    """Stop the worker process at ``address`` (it stays listed by the scheduler), and let it go
    on (SIGCONT) when the block ends, however it ends, so the cluster can shut down."""
    pid = client.run(os.getpid, workers=[address])[address]
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def wait_until_empty(read: Callable[[], list], seconds: float, what: str) -> None:
    """Poll ``read()`` until it returns an empty list; fail with ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while read():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
