"""The partition table in the form of Table 1 of Demirci & Ferhatosmanoglu (ICS'21)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from graph.metrics import PartitionMetrics

__all__ = ["PartitionRow", "format_table"]


@dataclass(frozen=True)
class PartitionRow:
    """One part count: the method (H), the baseline (R), the volume floor and the time of H.

    Attributes
    ----------
    nparts : int
        Number of parts ``P``.
    method, baseline : PartitionMetrics
        The metrics of the method's partition (H) and of the baseline's (R).
    floor_volume : int
        :func:`~graph.volume_floor` of the network at ``nparts``.
    seconds : float
        Time the method took to partition.
    """

    nparts: int
    method: PartitionMetrics
    baseline: PartitionMetrics
    floor_volume: int
    seconds: float

    @property
    def floor_avg_volume(self) -> float:
        """Floor of the average volume per part."""
        return self.floor_volume / self.nparts

    def ratio(self, name: str) -> float:
        """H/R ratio of a scalar metric (``avg_volume``, ``max_messages``, ...)."""
        base = getattr(self.baseline, name)
        return getattr(self.method, name) / base if base else float("nan")

    @property
    def floor_ratio(self) -> float:
        """Floor of the average volume over the baseline's average volume."""
        base = self.baseline.avg_volume
        return self.floor_avg_volume / base if base else float("nan")


def format_table(rows: Sequence[PartitionRow], title: str = "") -> str:
    """Markdown table: per P, H/R ratios and raw values of volume and messages, floor, balance.

    Parameters
    ----------
    rows : sequence of PartitionRow
        One row a part count.
    title : str, optional
        A line written above the table.

    Returns
    -------
    str
        The table (Table 1 of Demirci & Ferhatosmanoglu, with the floor beside each ratio).
    """
    header = (
        "| P | vol avg H/R | floor/R | vol max H/R | msg avg H/R | msg max H/R "
        "| vol avg H | vol avg R | floor avg | vol max H | vol max R "
        "| msg avg H | msg avg R | msg max H | msg max R | imbalance H | time H (s) |"
    )
    lines = [title, ""] if title else []
    lines += [header, _rule(header)]
    for row in rows:
        h, r = row.method, row.baseline
        lines.append(
            f"| {row.nparts} | {row.ratio('avg_volume'):.3f} | {row.floor_ratio:.3f} "
            f"| {row.ratio('max_volume'):.3f} | {row.ratio('avg_messages'):.3f} "
            f"| {row.ratio('max_messages'):.3f} "
            f"| {h.avg_volume:.0f} | {r.avg_volume:.0f} | {row.floor_avg_volume:.0f} "
            f"| {h.max_volume} | {r.max_volume} "
            f"| {h.avg_messages:.0f} | {r.avg_messages:.0f} | {h.max_messages} | {r.max_messages} "
            f"| {h.imbalance:.3f} | {row.seconds:.2f} |"
        )
    return "\n".join(lines)


def _rule(header: str) -> str:
    return "|" + "---:|" * (header.count("|") - 1)
