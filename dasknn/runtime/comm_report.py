"""One communication report for every distributed model: measured beside predicted traffic,
keyed ``(what, phase, sender, receiver)`` (the monitor: :mod:`dasknn.runtime.measure`)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FIELDS", "CommReport", "Key", "counts_of"]

#: ``(what, phase, sender, receiver)``: a layer or variable, a phase, two workers (or ``None``).
Key = tuple[Any, str, str | None, str | None]
#: The names of a key's fields, in order (the columns of :meth:`CommReport.records`).
FIELDS = ("what", "phase", "sender", "receiver")


def counts_of(records: Iterable[tuple]) -> dict[Key, tuple[int, int]]:
    """``{key: (bytes, messages)}`` summed from records ``(*key, bytes, messages)``."""
    out: dict[Key, list[int]] = defaultdict(lambda: [0, 0])
    for what, phase, sender, receiver, nbytes, messages in records:
        row = out[(what, phase, sender, receiver)]
        row[0] += int(nbytes)
        row[1] += int(messages)
    return {key: (b, m) for key, (b, m) in out.items()}


@dataclass(frozen=True)
class CommReport:
    """Measured and predicted traffic of a distributed model since its ``reset_comm()``.

    Attributes
    ----------
    measured : dict
        ``{(what, phase, sender, receiver): (bytes, messages)}`` as the monitor counted them.
    predicted : dict
        The same, from the model's plan (summed over the fields that are ``None``).
    steps : int
        Training steps (and forward passes, where they move data) covered.
    details : dict
        What a mode adds (plain JSON values, such as wire bytes).
    """

    measured: Mapping[Key, tuple[int, int]]
    predicted: Mapping[Key, tuple[int, int]]
    steps: int = 0
    details: Mapping[str, Any] = field(default_factory=dict)

    def total(self, which: str = "measured", phase: str | None = None) -> int:
        """Bytes in all (of one ``phase``), ``which`` ``"measured"`` or ``"predicted"``."""
        return sum(b for k, (b, _) in self._table(which).items() if phase in (None, k[1]))

    def messages(self, which: str = "measured", phase: str | None = None) -> int:
        """Messages in all (of one ``phase``)."""
        return sum(m for k, (_, m) in self._table(which).items() if phase in (None, k[1]))

    def by(self, name: str, which: str = "measured") -> dict:
        """Bytes summed by one field of :data:`FIELDS`."""
        index = FIELDS.index(name)
        out: dict = defaultdict(int)
        for key, (nbytes, _) in self._table(which).items():
            out[key[index]] += nbytes
        return dict(out)

    def compared(self) -> dict[Key, tuple[tuple[int, int], tuple[int, int]]]:
        """``{key: (measured, predicted)}``, measured summed over the fields a predicted key
        leaves ``None``; an unpredicted key has ``(0, 0)`` predicted."""
        out: dict[Key, list] = {key: [[0, 0], list(value)] for key, value in self.predicted.items()}
        shapes = {tuple(f is None for f in key) for key in self.predicted}
        for key, (nbytes, count) in self.measured.items():
            coarse = [
                tuple(None if gone else f for f, gone in zip(key, shape, strict=True))
                for shape in shapes
            ]
            matches = [c for c in coarse if c in self.predicted]
            target = matches[0] if matches else key
            row = out.setdefault(target, [[0, 0], [0, 0]])
            row[0][0] += nbytes
            row[0][1] += count
        return {k: (tuple(m), tuple(p)) for k, (m, p) in out.items()}

    @property
    def exact(self) -> bool:
        """Whether every measured count equals its prediction (bytes and messages)."""
        return all(m == p for m, p in self.compared().values())

    def records(self) -> list[dict]:
        """One dict per key of :meth:`compared`, :data:`FIELDS` plus ``measured_bytes``,
        ``predicted_bytes``, ``measured_messages``, ``predicted_messages``, sorted."""
        rows = []
        for key, ((mb, mm), (pb, pm)) in self.compared().items():
            row = dict(zip(FIELDS, key, strict=True))
            row.update(
                measured_bytes=mb, predicted_bytes=pb, measured_messages=mm, predicted_messages=pm
            )
            rows.append(row)
        return sorted(rows, key=lambda r: tuple(str(r[f]) for f in FIELDS))

    def to_json(self) -> str:
        """The report as JSON: ``steps``, ``exact``, the totals, ``details`` and the records."""
        return json.dumps(
            {
                "steps": self.steps,
                "exact": self.exact,
                "measured_bytes": self.total(),
                "predicted_bytes": self.total("predicted"),
                "measured_messages": self.messages(),
                "predicted_messages": self.messages("predicted"),
                "details": dict(self.details),
                "records": self.records(),
            },
            default=str,
        )

    def format(self) -> str:
        """A text table by ``what`` and phase, then the totals."""
        table: dict = defaultdict(lambda: [0, 0, 0, 0])
        for key, ((mb, mm), (pb, pm)) in self.compared().items():
            row = table[(key[0], key[1])]
            row[0] += mb
            row[1] += pb
            row[2] += mm
            row[3] += pm
        lines = [f"{'what':>8} {'phase':<12} {'measured B':>14} {'predicted B':>14} {'msgs':>7}"]
        for (what, phase), (mb, pb, mm, _) in sorted(table.items(), key=lambda i: str(i[0])):
            label = "-" if what is None else str(what)
            lines.append(f"{label:>8} {phase:<12} {mb:>14,d} {pb:>14,d} {mm:>7d}")
        lines.append(
            f"total: measured {self.total():,d} B in {self.messages()} messages, predicted "
            f"{self.total('predicted'):,d} B in {self.messages('predicted')} "
            f"({'equal' if self.exact else 'DIFFERENT'}); {self.steps} steps"
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()

    def _table(self, which: str) -> Mapping[Key, tuple[int, int]]:
        if which not in ("measured", "predicted"):
            raise ValueError(f"which must be 'measured' or 'predicted', got {which!r}")
        return self.measured if which == "measured" else self.predicted
