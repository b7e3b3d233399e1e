"""Removing a worker plugin from a cluster that may have just lost a worker. See
docs/reliability.md, "Closing after a lost worker"."""

from __future__ import annotations

from dasknn.runtime.waiting import call_at_most

__all__ = ["remove_worker_plugin"]


def _registered(dask_scheduler, name: str) -> bool:
    return name in dask_scheduler.worker_plugins


def remove_worker_plugin(client, name: str, seconds: float | None) -> bool:
    """``client.unregister_worker_plugin(name)``, waiting for the workers at most ``seconds``
    (:func:`~dasknn.runtime.waiting.call_at_most`: ``None`` waits until all answered).

    The scheduler forgets the plugin, then sends its removal to every worker it lists. A worker
    lost but still listed (its death not yet seen) fails that broadcast, which distributed
    reports to the client as an ``OSError`` (``CommClosedError``: the scheduler closes the
    client's connection) while the removal goes on to the other workers; the lost worker took
    the plugin with it. Such an error counts as a removal done when the scheduler no longer
    lists the plugin (one more call to the scheduler).

    Returns
    -------
    bool
        True if the removal ended in time, False if it still runs.

    Raises
    ------
    OSError
        When the removal failed and the scheduler still lists the plugin (or cannot be asked).
    """
    try:
        return call_at_most(lambda: client.unregister_worker_plugin(name), seconds)
    except OSError:
        if client.run_on_scheduler(_registered, name=name):
            raise
        return True
