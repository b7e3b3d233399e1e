"""Pipeline schedules: the order in which a stage runs the forward (F) and backward (B) passes
of a step's microbatches.

The task graph (:mod:`dasknn.pipeline_parallel._taskgraph`) makes each of a stage's tasks depend on
the one before it in this order, besides the data it needs (the activations from the stage before,
the partial sums from the stage after), so the schedule is a property of the graph, not of the
scheduler's choices; within a run of passes of one kind a pass depends on the pass two before it,
so the next one is handed to the worker before the one before it ends, and their priorities order
them.

- ``"gpipe"`` (Huang et al.): every forward pass, then every backward pass. A stage holds the
  activations of all ``m`` microbatches at once.
- ``"1f1b"`` (PipeDream-Flush, Narayanan et al.): stage ``s`` of ``S`` (0-based) runs
  ``min(S - s - 1, m)`` forward passes, then alternates one forward and one backward, then runs
  the backward passes left. It holds at most ``S - s`` microbatches' activations.

Both have the same bubble: with equal stages each stage idles a fraction ``(S - 1) / (m + S - 1)``
of the step.
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
    if schedule == "gpipe":
        return [("F", u) for u in range(m)] + [("B", u) for u in range(m)]
    warmup = min(stages - stage - 1, m)
    order = [("F", u) for u in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", u) for u in range(m - warmup, m)]
    return order


def bubble_fraction(stages: int, microbatches: int) -> float:
    """Idle fraction ``(S - 1) / (m + S - 1)`` of each stage in a step with equal stages."""
    return (stages - 1) / (microbatches + stages - 1)
