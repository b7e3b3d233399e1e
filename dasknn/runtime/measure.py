"""Bytes moved between workers, measured through distributed's documented plugin hooks.

Two plugins work together:

- :class:`TransferReporter`, a :class:`distributed.WorkerPlugin` on every worker. Its
  ``transition`` hook sees each key the worker fetches from another worker reach ``flight`` (the
  worker's task state then names the one worker it is fetching from, ``coming_from``) and then
  ``memory`` (the value has arrived; ``nbytes`` is its size as Dask measures it, for a numpy
  array exactly ``array.nbytes``). On arrival it logs one event with the key, the
  sender, the receiver and the size (:meth:`distributed.Worker.log_event`); messages received
  outside Dask's transfers (the postboxes', :mod:`dasknn.runtime.postbox`) are reported several
  in one event (:func:`report_transfers`).
- :class:`CommMonitor`, a :class:`distributed.diagnostics.plugin.SchedulerPlugin`, receives those
  events through its ``log_event`` hook and adds them to the counters of
  ``(token, layer, phase, sender, receiver)`` (:func:`dasknn.runtime.keys.describe`). It is the one
  place the figures are read from (:func:`read_transfers`).

A worker sends its events on the same ordered stream as its task results, so by the time the
client has the result of a task, the transfers that task waited for are counted.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from distributed import WorkerPlugin
from distributed.diagnostics.plugin import SchedulerPlugin

from dasknn.runtime.keys import describe
from dasknn.runtime.plugin_removal import remove_worker_plugin
from dasknn.runtime.shared_plugins import hold_scheduler_plugin, release_scheduler_plugin

__all__ = [
    "CommMonitor",
    "TransferReporter",
    "install_comm_monitor",
    "read_transfers",
    "release_comm_monitor",
    "report_transfer",
    "report_transfers",
    "reset_transfers",
]

MONITOR_NAME = "dasknn-comm"
REPORTER_NAME = "dasknn-transfer-reporter"
TOPIC = "dasknn-transfer"


class TransferReporter(WorkerPlugin):
    """Logs one event per key this worker received from another worker (see the module docs)."""

    idempotent = True

    def __init__(self) -> None:
        self._worker = None
        self._senders: dict = {}  # key in flight -> the worker it is fetched from

    def setup(self, worker) -> None:
        self._worker = worker
        self._senders = {}

    def teardown(self, worker) -> None:
        self._senders.clear()

    def transition(self, key, start: str, finish: str, **kwargs) -> None:
        # ``finish`` is the state asked for; a request the worker declines (such as ``fetch``
        # for a key still in flight) leaves the task where it was, so read the state reached.
        ts = self._worker.state.tasks.get(key)
        state = ts.state if ts is not None else "forgotten"
        if state == "flight":
            self._senders[key] = ts.coming_from
            return
        # A cancelled or resumed fetch may still complete; any other state ends it.
        if state in ("cancelled", "resumed") or key not in self._senders:
            return
        sender = self._senders.pop(key)
        if state == "memory":
            report_transfer(self._worker, key, sender, int(ts.nbytes or 0))


def report_transfer(worker, key, sender: str, nbytes: int) -> None:
    """Report to :class:`CommMonitor` that ``worker`` received ``key`` (``nbytes`` bytes of
    payload) from the worker at ``sender``: by :class:`TransferReporter` for the keys Dask
    fetches, and by whatever receives a message outside Dask's data transfers."""
    worker.log_event(
        TOPIC, {"key": key, "sender": sender, "receiver": worker.address, "nbytes": int(nbytes)}
    )


def report_transfers(worker, receipts: list[tuple]) -> None:
    """Report to :class:`CommMonitor` that ``worker`` received each ``(key, sender, nbytes)`` of
    ``receipts`` (as :func:`report_transfer` does for one), in one event; none if empty.

    Logged from a task, the event goes to the scheduler before that task's result does."""
    if receipts:
        transfers = [(key, sender, int(nbytes)) for key, sender, nbytes in receipts]
        worker.log_event(TOPIC, {"receiver": worker.address, "transfers": transfers})


class CommMonitor(SchedulerPlugin):
    """Counts the transfers the workers report: bytes and messages per sender and receiver.

    Attributes
    ----------
    counters : dict
        ``{(token, layer, phase, sender, receiver): [bytes, messages]}``; ``token`` and ``layer``
        are ``None`` for keys that are not dasknn messages (phase ``"other"``), ``layer`` is
        ``None`` for collectives.
    """

    name = MONITOR_NAME
    idempotent = True

    def __init__(self) -> None:
        self.counters: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])

    def log_event(self, topic: str, msg: Any) -> None:
        if topic != TOPIC:
            return
        if "transfers" in msg:  # several, from report_transfers
            for key, sender, nbytes in msg["transfers"]:
                self.record(sender, msg["receiver"], key, nbytes)
        else:
            self.record(msg["sender"], msg["receiver"], msg["key"], msg["nbytes"])

    def record(self, sender: str, receiver: str, key, nbytes: int) -> None:
        """Count one transfer of ``key`` (``nbytes`` bytes) from ``sender`` to ``receiver``."""
        token, phase, layer = describe(key)
        counter = self.counters[(token, layer, phase, sender, receiver)]
        counter[0] += int(nbytes)
        counter[1] += 1

    def snapshot(self, token: str | None) -> list[tuple]:
        """``[(layer, phase, sender, receiver, bytes, messages)]`` of one token."""
        return [
            (layer, phase, sender, receiver, value[0], value[1])
            for (tok, layer, phase, sender, receiver), value in self.counters.items()
            if tok == token
        ]

    def reset(self, token: str | None) -> None:
        """Forget the counters of one token."""
        for key in [key for key in self.counters if key[0] == token]:
            del self.counters[key]


def _snapshot_on_scheduler(dask_scheduler, token):
    plugin = dask_scheduler.plugins.get(MONITOR_NAME)
    return [] if plugin is None else plugin.snapshot(token)


def _reset_on_scheduler(dask_scheduler, token):
    plugin = dask_scheduler.plugins.get(MONITOR_NAME)
    if plugin is not None:
        plugin.reset(token)


def install_comm_monitor(client, user: str | None = None) -> None:
    """Register :class:`CommMonitor` on the scheduler and :class:`TransferReporter` on every
    worker (present and future), held for ``user`` (a model's token; ``None``: for the cluster's
    life); plugins already registered are kept, with their counts."""
    hold_scheduler_plugin(client, CommMonitor(), MONITOR_NAME, user)
    client.register_plugin(TransferReporter(), name=REPORTER_NAME)


def release_comm_monitor(client, user: str, seconds: float | None = None) -> None:
    """Forget ``user``'s counts and its hold on the monitor; with the last holder gone, remove
    :class:`CommMonitor` from the scheduler and :class:`TransferReporter` from the workers,
    waiting for them at most ``seconds`` (``None``: until all answered; see
    :func:`~dasknn.runtime.waiting.call_at_most`)."""
    reset_transfers(client, user)
    if release_scheduler_plugin(client, MONITOR_NAME, user):
        remove_worker_plugin(client, REPORTER_NAME, seconds)


def read_transfers(client, token: str | None) -> list[tuple]:
    """Counted transfers of one token: ``[(layer, phase, sender, receiver, bytes, messages)]``
    (none where the monitor is not installed)."""
    return client.run_on_scheduler(_snapshot_on_scheduler, token=token)


def reset_transfers(client, token: str | None) -> None:
    """Zero the monitor's counts of one token."""
    client.run_on_scheduler(_reset_on_scheduler, token=token)
