"""Messages posted from a task on one worker straight to a task on another, without the scheduler.

A :class:`Postbox` is a Dask actor (documented API: its method calls go from worker to worker, no
scheduler in between), one per worker and model, made on the worker it serves. Its :meth:`post
<Postbox.post>` leaves a message in the ``deliver(key, value)`` of the model's worker plugin
there and reports it to the communication monitor (:func:`dasknn.runtime.measure.report_transfer`),
so posted bytes are counted as Dask's own transfers are. A :class:`Mailbox` holds the messages a
worker received until its task takes them, waiting for one not yet arrived; a failure of the
sending side is posted as well and ends that wait with the sender's error.
"""

from __future__ import annotations

import threading

from distributed import get_worker

from dasknn.runtime.measure import report_transfer

__all__ = ["MESSAGE_TIMEOUT", "Mailbox", "Postbox", "StepFailed"]

#: Seconds a task waits for a message posted by another worker before it fails.
MESSAGE_TIMEOUT = 600.0


class Postbox:
    """Dask actor: receives the messages other workers post for the plugin ``plugin_name``.

    Parameters
    ----------
    plugin_name : str
        The worker plugin the messages go to, as it is when the postbox is made (a message for
        an earlier plugin of that name never reaches a later one); it has ``deliver(key, value)``.
    """

    def __init__(self, plugin_name: str) -> None:
        self.worker = get_worker()  # made by a task on the worker it serves
        self.state = self.worker.plugins[plugin_name]

    async def post(self, key, sender: str, value) -> None:
        """Leave the message ``key`` from the worker at ``sender`` with the plugin and report its
        bytes (``value.nbytes``; none for a :class:`StepFailed`) to the communication monitor
        (runs on the worker's event loop)."""
        self.state.deliver(key, value)
        if not isinstance(value, StepFailed):
            report_transfer(self.worker, key, sender, value.nbytes)


class StepFailed:
    """What a worker posts instead of a message it cannot send: the error that stopped it."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Mailbox:
    """Messages received on a worker, by key, until a task takes them (thread-safe)."""

    def __init__(self) -> None:
        self._messages: dict = {}
        self._arrived = threading.Condition()

    def deliver(self, key, value) -> None:
        """Leave the message ``key`` (from any thread or the event loop)."""
        with self._arrived:
            self._messages[key] = value
            self._arrived.notify_all()

    def take(self, key, failed=None, timeout: float = MESSAGE_TIMEOUT):
        """Remove and return the message ``key``, waiting up to ``timeout`` seconds for it
        (``TimeoutError`` naming the key after that). ``failed`` is the key under which a
        :class:`StepFailed` of the sender may arrive instead: its error is raised."""

        def ready():
            return key in self._messages or (failed is not None and failed in self._messages)

        with self._arrived:
            if not self._arrived.wait_for(ready, timeout):
                raise TimeoutError(f"no message {key} arrived within {timeout:g} s")
            if key not in self._messages:
                raise self._messages[failed].error
            return self._messages.pop(key)

    def drop(self, keep) -> int:
        """Forget every message whose key ``keep(key)`` is false (those of ended steps); returns
        how many."""
        with self._arrived:
            gone = [key for key in self._messages if not keep(key)]
            for key in gone:
                del self._messages[key]
        return len(gone)

    def __len__(self) -> int:
        with self._arrived:
            return len(self._messages)
