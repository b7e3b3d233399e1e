"""The communication report of a data-parallel model: measured beside predicted bytes."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

__all__ = ["DataParallelReport"]


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
