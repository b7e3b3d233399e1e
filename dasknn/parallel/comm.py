"""Communication volume as a measured quantity: a scheduler plugin and the report built from it.

:class:`CommMonitor` is a :class:`distributed.diagnostics.plugin.SchedulerPlugin`. Whenever a worker
finishes fetching a key from another worker it tells the scheduler (the ``add-keys`` message, sent
once per fetched key); the plugin sees that message before the scheduler records the new replica,
so the key's current holder is the sender. It adds the key's size (``nbytes`` as Dask measures it:
for the packed numpy messages exactly ``array.nbytes``) and one message to the counters of
``(model token, layer, phase, sender, receiver)``. Phase and layer come from the key name
(:func:`dasknn.parallel.taskgraph.message_phase`); keys of anything else count as phase ``other``.

Payload is what the plugin counts. Serialization overhead (headers, framing) is measured from the
workers' own ``transfer_outgoing_log`` (wire bytes written minus payload) by :func:`wire_bytes`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from distributed.diagnostics.plugin import SchedulerPlugin

from dasknn.parallel.taskgraph import message_phase

__all__ = [
    "CommMonitor",
    "CommReport",
    "install_comm_monitor",
    "read_transfers",
    "reset_transfers",
    "wire_bytes",
]

PLUGIN_NAME = "dasknn-comm"


class CommMonitor(SchedulerPlugin):
    """Records every transfer of a key between workers: bytes and messages per sender/receiver.

    Attributes
    ----------
    counters : dict
        ``{(token, layer, phase, sender, receiver): [bytes, messages]}``; ``token`` and ``layer``
        are ``None`` for keys that are not messages of a dasknn step.
    """

    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.counters: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
        self._scheduler = None
        self._original_handler = None

    async def start(self, scheduler) -> None:
        self._scheduler = scheduler
        self._original_handler = scheduler.stream_handlers["add-keys"]
        scheduler.stream_handlers["add-keys"] = self._add_keys

    async def close(self) -> None:
        if self._scheduler is not None and self._original_handler is not None:
            self._scheduler.stream_handlers["add-keys"] = self._original_handler
            self._original_handler = None

    def _add_keys(self, worker=None, keys=(), **msg):
        for key in keys:
            self.record(worker, key)
        return self._original_handler(worker=worker, keys=keys, **msg)

    def record(self, receiver: str, key) -> None:
        """Count one fetched ``key`` that has just arrived at ``receiver``."""
        ts = self._scheduler.tasks.get(key)
        if ts is None:
            return
        holders = sorted(ws.address for ws in (ts.who_has or ()) if ws.address != receiver)
        sender = holders[0] if holders else "unknown"
        parsed = message_phase(key)
        token, phase, layer = parsed if parsed else (None, "other", None)
        counter = self.counters[(token, layer, phase, sender, receiver)]
        counter[0] += int(ts.nbytes or 0)
        counter[1] += 1

    def snapshot(self, token: str | None) -> list[tuple]:
        """``[(layer, phase, sender, receiver, bytes, messages)]`` of one model."""
        return [
            (layer, phase, sender, receiver, value[0], value[1])
            for (tok, layer, phase, sender, receiver), value in self.counters.items()
            if tok == token
        ]

    def reset(self, token: str | None) -> None:
        """Forget the counters of one model."""
        for key in [key for key in self.counters if key[0] == token]:
            del self.counters[key]


def _plugin(dask_scheduler) -> CommMonitor:
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    if plugin is None:
        raise RuntimeError("the dasknn communication monitor is not installed on this scheduler")
    return plugin


def _snapshot_on_scheduler(dask_scheduler, token):
    return _plugin(dask_scheduler).snapshot(token)


def _reset_on_scheduler(dask_scheduler, token):
    _plugin(dask_scheduler).reset(token)


def _installed(dask_scheduler) -> bool:
    return PLUGIN_NAME in dask_scheduler.plugins


def install_comm_monitor(client) -> None:
    """Register :class:`CommMonitor` on the client's scheduler unless it is there already."""
    if not client.run_on_scheduler(_installed):
        client.register_plugin(CommMonitor(), name=PLUGIN_NAME)


def read_transfers(client, token: str | None) -> list[tuple]:
    """Records of one model: ``[(layer, phase, sender, receiver, bytes, messages)]``."""
    return client.run_on_scheduler(_snapshot_on_scheduler, token=token)


def reset_transfers(client, token: str | None) -> None:
    """Zero the monitor's records of one model."""
    client.run_on_scheduler(_reset_on_scheduler, token=token)


def _outgoing_log(dask_worker, token, first_step):
    entries = []
    for entry in dask_worker.transfer_outgoing_log:
        if entry.get("who") is None:
            continue
        keys = [
            key for key in entry["keys"] if (parsed := message_phase(key)) and parsed[0] == token
        ]
        if keys and all(key[1] >= first_step for key in keys):
            entries.append((len(keys), int(entry["total"]), int(entry["compressed"])))
    return entries


def wire_bytes(client, token: str, first_step: int) -> tuple[int, int, int]:
    """``(messages, payload bytes, wire bytes)`` of a model's messages from step ``first_step`` on,
    as the sending workers logged them (their logs keep only the most recent transfers)."""
    logs = client.run(_outgoing_log, token=token, first_step=first_step)
    messages = payload = wire = 0
    for entries in logs.values():
        for count, total, compressed in entries:
            messages += count
            payload += total
            wire += compressed
    return messages, payload, wire


@dataclass
class CommReport:
    """Measured against predicted communication of a distributed model since the last reset.

    Attributes
    ----------
    batches : int
        Training steps and forward passes covered.
    layers : dict
        ``{(layer, phase): {"measured": bytes, "messages": n, "predicted": bytes}}`` for phases
        ``forward``, ``backward`` and ``other``.
    pairs : dict
        ``{(sender, receiver): {"bytes": n, "messages": n}}`` over all phases.
    payload : int
        Measured forward plus backward bytes.
    predicted : int
        Predicted forward plus backward bytes between different workers.
    predicted_parts : int
        Predicted forward plus backward bytes between different parts (equals ``predicted`` when
        every part has its own worker).
    other : int
        Bytes of other transfers (softmax statistics, anything not a layer message).
    wire_messages, wire_payload, wire_total : int
        The senders' logs: messages, their payload and the bytes actually written.
    """

    batches: int
    layers: dict = field(default_factory=dict)
    pairs: dict = field(default_factory=dict)
    payload: int = 0
    predicted: int = 0
    predicted_parts: int = 0
    other: int = 0
    wire_messages: int = 0
    wire_payload: int = 0
    wire_total: int = 0

    @property
    def matches(self) -> bool:
        """Whether the measured payload equals the prediction exactly."""
        return self.payload == self.predicted

    @property
    def serialization_overhead(self) -> int:
        """Bytes written beyond the payload, over the logged messages."""
        return self.wire_total - self.wire_payload

    def format(self) -> str:
        """A text table: per layer and phase, then totals."""
        lines = [f"{'layer':>5} {'phase':<9} {'measured B':>14} {'predicted B':>14} {'msgs':>6}"]
        rows = sorted(self.layers.items(), key=lambda item: (item[0][0] or 0, item[0][1]))
        for (layer, phase), row in rows:
            lines.append(
                f"{layer if layer is not None else '-':>5} {phase:<9} {row['measured']:>14,d} "
                f"{row['predicted']:>14,d} {row['messages']:>6d}"
            )
        lines.append(
            f"forward+backward payload: measured {self.payload:,d} B, predicted {self.predicted:,d}"
            f" B ({'equal' if self.matches else 'DIFFERENT'}); other transfers {self.other:,d} B"
        )
        if self.wire_messages:
            lines.append(
                f"serialization overhead: {self.serialization_overhead:,d} B over "
                f"{self.wire_messages} logged messages "
                f"({self.serialization_overhead / self.wire_messages:.0f} B per message)"
            )
        return "\n".join(lines)
