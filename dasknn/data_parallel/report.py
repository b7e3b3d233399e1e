"""The communication report of a data-parallel model: measured beside predicted bytes."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

__all__ = ["DataParallelReport", "split_carried"]


def split_carried(table: dict, carried: dict) -> dict:
    """``table`` (``{(variable, phase, sender, receiver): (bytes, messages)}``) with the bytes
    that messages of one variable carry for another (``carried``:
    ``{(variable, phase, sender, receiver, other): bytes}``, fixed by the message layout) moved
    to ``(other, phase, sender, receiver)``, with no message of its own."""
    out = dict(table)
    for (*message, other), nbytes in carried.items():
        message = tuple(message)
        if message not in out:
            continue
        total, messages = out[message]
        out[message] = (total - nbytes, messages)
        rider = (other, *message[1:])
        rider_bytes, rider_messages = out.get(rider, (0, 0))
        out[rider] = (rider_bytes + nbytes, rider_messages)
    return out


@dataclass(frozen=True)
class DataParallelReport:
    """Bytes between workers since the model started (or :meth:`reset_comm`).

    Attributes
    ----------
    architecture : str
    workers : list of str
    machine_of : list of int
        The machine of every worker.
    measured, predicted : dict
        ``{(variable, phase, sender, receiver): (bytes, messages)}`` with worker numbers; the
        measured figures come from the transfer monitor, the predicted ones from the batch ids.
        A message of one variable that carries another's bytes (the dense chunks riding the
        fused sparse messages of ``hybrid``) is measured whole; the carried bytes, fixed by the
        message's layout, are listed under the other variable with no message of their own
        (:func:`split_carried`), in both tables.
    alpha : dict
        Per variable, the mean fraction of its elements a worker touched per step.
    model_alpha : float or None
        Size-weighted alpha of the model.
    steps : int
        Training steps counted.
    """

    architecture: str
    workers: list[str]
    machine_of: list[int]
    measured: dict
    predicted: dict
    alpha: dict
    model_alpha: float | None
    steps: int

    def matches(self) -> bool:
        """Whether every message was measured exactly as predicted (bytes and count)."""
        return self.measured == self.predicted

    def _intra(self, key) -> bool:
        return self.machine_of[key[2]] == self.machine_of[key[3]]

    def total(self, which: str = "measured", scope: str = "all") -> int:
        """Bytes in all (``scope`` ``"all"``, ``"intra"`` or ``"inter"`` machine)."""
        table = self.measured if which == "measured" else self.predicted
        return sum(
            v[0] for k, v in table.items() if scope == "all" or (scope == "intra") == self._intra(k)
        )

    def by(self, field: str, which: str = "measured", scope: str = "all") -> dict:
        """Bytes summed by ``"variable"`` or ``"phase"``."""
        index = {"variable": 0, "phase": 1}[field]
        table = self.measured if which == "measured" else self.predicted
        out: dict = defaultdict(int)
        for k, v in table.items():
            if scope == "all" or (scope == "intra") == self._intra(k):
                out[k[index]] += v[0]
        return dict(out)

    def machine_bytes(
        self, which: str = "measured", variable: str | None = None, phases=None
    ) -> dict:
        """Per machine, the bytes it sent plus received across machines (optionally of one
        variable and some phases): the figure of Table 3 of Kim et al."""
        table = self.measured if which == "measured" else self.predicted
        out: dict = defaultdict(int)
        for k, v in table.items():
            if self._intra(k) or (variable is not None and k[0] != variable):
                continue
            if phases is not None and k[1] not in phases:
                continue
            out[self.machine_of[k[2]]] += v[0]
            out[self.machine_of[k[3]]] += v[0]
        return dict(out)

    def __str__(self) -> str:
        lines = [
            f"data-parallel traffic ({self.architecture}, {len(self.workers)} workers, "
            f"{len(set(self.machine_of))} machines, {self.steps} steps): "
            f"{self.total()} bytes measured, {self.total(which='predicted')} predicted, "
            f"{'exact' if self.matches() else 'DIFFERENT'}",
            f"  inter-machine {self.total(scope='inter')} B, intra-machine "
            f"{self.total(scope='intra')} B",
        ]
        for phase, nbytes in sorted(self.by("phase").items()):
            lines.append(f"  {phase:20s} {nbytes:14d} B")
        if self.model_alpha is not None:
            alphas = ", ".join(f"{k} {v:.4f}" for k, v in self.alpha.items() if v < 1)
            lines.append(f"  alpha: model {self.model_alpha:.4f}; sparse: {alphas}")
        return "\n".join(lines)
