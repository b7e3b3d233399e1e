"""A worker retired (``Client.retire_workers``) while a model trains: the request comes from a
thread once the model has trained a given number of steps, as an adaptive cluster scaling down
would send it."""

from __future__ import annotations

import threading

from polling import HANG_GUARD, wait_until


def after_steps(model, steps: int, action) -> threading.Thread:
    """Run ``action()`` in a thread once ``model`` has trained ``steps`` steps (its
    ``n_steps_``), polling every 5 ms for at most :data:`~polling.HANG_GUARD` seconds."""

    def watch():
        wait_until(lambda: model.n_steps_ >= steps, HANG_GUARD, f"{steps} steps", 0.005)
        action()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def retire_after_steps(client, model, steps: int, worker: str) -> threading.Thread:
    """:func:`after_steps` that asks the scheduler to retire ``worker``."""
    return after_steps(model, steps, lambda: client.retire_workers([worker]))
