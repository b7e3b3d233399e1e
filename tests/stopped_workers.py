"""A worker process stopped (SIGSTOP) for the length of a ``with`` block, a worker plugin that
signals a process as a key reaches a state, the wait for the scheduler to let go of a failed
step's keys, and the keys of a kind left on the scheduler or in the workers' data: shared by the
step-timeout tests."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from distributed.diagnostics.plugin import WorkerPlugin
from polling import wait_until


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


class SignalOnTransition(WorkerPlugin):
    """On the worker at ``address``: sends ``sent_signal`` to the process ``pid`` (the worker's
    own when None) as a key whose name starts with ``prefix`` (a string or a tuple of them; a
    string key) reaches the state ``finish``; only the first time when ``once``."""

    def __init__(self, name: str, address: str, finish: str, prefix: str | tuple[str, ...],
                 sent_signal: int, pid: int | None = None, once: bool = False) -> None:
        self.name = name
        self.address, self.finish, self.prefix = address, finish, prefix
        self.sent_signal, self.pid, self.once = sent_signal, pid, once

    def setup(self, worker) -> None:
        self.worker = worker

    def transition(self, key, start, finish, **kwargs) -> None:
        if (
            finish == self.finish
            and self.worker.address == self.address
            and isinstance(key, str)
            and key.startswith(self.prefix)
        ):
            if self.once:
                self.address = ""
            os.kill(os.getpid() if self.pid is None else self.pid, self.sent_signal)


def wait_until_empty(read: Callable[[], list], seconds: float, what: str) -> None:
    """Poll ``read()`` until it returns an empty list; fail with ``what`` and what is left
    after ``seconds``."""
    left: list = []

    def empty() -> bool:
        left[:] = read()
        return not left

    wait_until(empty, seconds, lambda: f"{what}: {left}")


def keys_on_scheduler(client, prefix: str) -> list[str]:
    """The keys the scheduler knows whose name starts with ``prefix``."""
    return client.run_on_scheduler(_scheduler_keys, prefix)


def keys_on_workers(client, prefix: str) -> list[str]:
    """The keys in the workers' data whose name starts with ``prefix`` (one entry a copy)."""
    held = client.run(_worker_keys, prefix)
    return [key for keys in held.values() for key in keys]


def _scheduler_keys(prefix: str, dask_scheduler=None) -> list[str]:
    return [str(key) for key in dask_scheduler.tasks if str(key).startswith(prefix)]


def _worker_keys(prefix: str, dask_worker=None) -> list[str]:
    return [str(key) for key in dask_worker.data if str(key).startswith(prefix)]
