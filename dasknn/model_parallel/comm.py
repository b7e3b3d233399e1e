"""The communication report of a distributed model: measured bytes against the prediction.

The transfers are measured by the runtime's plugins (:mod:`dasknn.runtime.measure`: each
receiving worker reports the key, its exact sender and its size; the scheduler plugin
:class:`~dasknn.runtime.measure.CommMonitor` counts them per layer, phase, sender and receiver).
:class:`CommReport` sets them beside the partition's prediction.

Payload is what the plugin counts. Serialization overhead (headers, framing) is measured from the
workers' own ``transfer_outgoing_log`` (wire bytes written minus payload) by :func:`wire_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dasknn.runtime.keys import message_phase
from dasknn.runtime.measure import (
    CommMonitor,
    install_comm_monitor,
    read_transfers,
    reset_transfers,
)

__all__ = [
    "CommMonitor",
    "CommReport",
    "install_comm_monitor",
    "read_transfers",
    "reset_transfers",
    "wire_bytes",
]


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
