"""Pipeline schedules: the order of a stage's forward (F) and backward (B) passes (docs/samo.md).

- ``"gpipe"``: every forward pass, then every backward pass (``m`` microbatches held).
- ``"1f1b"``: stage ``s`` of ``S`` runs ``min(S - s - 1, m)`` forward passes, then alternates
  forward and backward, then the backward passes left (at most ``S - s`` held).
"""

from __future__ import annotations

__all__ = ["SCHEDULES", "bubble_fraction", "check_schedule", "stage_order"]

SCHEDULES = ("gpipe", "1f1b")


def check_schedule(schedule: str) -> str:
    """``schedule`` if it is one of :data:`SCHEDULES`; ``ValueError`` otherwise."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {SCHEDULES}")
    return schedule


def stage_order(schedule: str, stages: int, stage: int, microbatches: int) -> list[tuple[str, int]]:
    """The passes of ``stage`` in the order it runs them: ``[("F", u) | ("B", u)]``."""
    check_schedule(schedule)
    m = microbatches
    warmup = m if schedule == "gpipe" else min(stages - stage - 1, m)
    order = [("F", u) for u in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", u) for u in range(m - warmup, m)]
    return order


def bubble_fraction(stages: int, microbatches: int) -> float:
    """Idle fraction ``(S - 1) / (m + S - 1)`` of each stage in a step with equal stages."""
    return (stages - 1) / (microbatches + stages - 1)
