"""Where a pipeline stage's idle time comes from: the measured passes of a step against the ideal
timeline of its schedule.

:func:`replay` runs a schedule on paper: every pass starts the moment the stage's previous pass
(in the schedule's order) and the pass it reads (the stage before's forward, the stage after's
backward of the same microbatch) have ended, nothing else in between. :func:`idle_sources` splits
each stage's measured idle fraction into four parts that add up to it exactly:

- ``formula``: ``(S - 1) / (m + S - 1)``, the idle of equal stages (:func:`bubble_fraction`);
- ``stage_costs``: what the stages' unequal mean forward and backward passes add (the replay with
  every pass at its stage's mean for its kind, minus the formula): stage imbalance, the last
  stage's loss, the first stage's missing input gradient;
- ``pass_variation``: what passes of one stage and kind taking unequal times add (the replay with
  the measured durations, minus the replay with the means): a slow first pass, a pass slowed by
  the other worker's message handling, the machine's other load;
- ``handover``: the measured idle minus the replay's: every wait between a pass's inputs being
  ready and its start, and what it delays downstream (the scheduler's dispatch, the message's
  transfer and deserialisation, the worker's own event loop).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

from dasknn.pipeline_parallel._schedule import bubble_fraction, stage_order

__all__ = ["IdleSources", "handover_seconds", "idle_sources", "replay"]

PassKey = tuple[int, str, int]  # (stage, "F" | "B", microbatch)


def _source(stage: int, kind: str, u: int, stages: int) -> PassKey | None:
    """The other stage's pass whose message this pass reads (``None``: it reads none)."""
    if kind == "F" and stage > 0:
        return (stage - 1, "F", u)
    if kind == "B" and stage < stages - 1:
        return (stage + 1, "B", u)
    return None


def handover_seconds(passes: dict[int, list[tuple]]) -> dict[int, float]:
    """Per stage, the seconds its passes started after their inputs were ready (the stage's
    previous pass and the pass whose message it reads, :func:`_source`); ``passes[s]`` holds the
    stage's measured ``(kind, u, start, end)``."""
    ends = {(s, kind, u): end for s, events in passes.items() for kind, u, _, end in events}
    stages = max(passes) + 1
    out = {}
    for s, events in passes.items():
        waited, previous_end = 0.0, None
        for kind, u, start, _ in sorted(events, key=lambda e: e[2]):
            ready = [] if previous_end is None else [previous_end]
            source = _source(s, kind, u, stages)
            if source is not None:
                ready.append(ends[source])
            if ready:
                waited += max(0.0, start - max(ready))
            previous_end = ends[(s, kind, u)]
        out[s] = waited
    return out


def replay(
    durations: dict[PassKey, float], schedule: str, stages: int, microbatches: int
) -> dict[PassKey, tuple[float, float]]:
    """The ideal ``(start, end)`` of every pass of a step from 0, with the given ``durations``:
    each pass starts when the stage's previous pass and the pass it reads have ended."""
    orders = [stage_order(schedule, stages, s, microbatches) for s in range(stages)]
    times: dict[PassKey, tuple[float, float]] = {}
    done = [0] * stages
    clock = [0.0] * stages
    while any(done[s] < len(orders[s]) for s in range(stages)):
        moved = False
        for s in range(stages):
            while done[s] < len(orders[s]):
                kind, u = orders[s][done[s]]
                source = _source(s, kind, u, stages)
                if source is not None and source not in times:
                    break
                start = max(clock[s], 0.0 if source is None else times[source][1])
                clock[s] = start + durations[(s, kind, u)]
                times[(s, kind, u)] = (start, clock[s])
                done[s] += 1
                moved = True
        if not moved:
            raise ValueError(f"the {schedule!r} schedule deadlocks: {done} passes ran per stage")
    return times


def _idle(durations: dict[PassKey, float], times: dict[PassKey, tuple[float, float]], stages):
    span = max(end for _, end in times.values()) - min(start for start, _ in times.values())
    return [1.0 - sum(v for k, v in durations.items() if k[0] == s) / span for s in range(stages)]


@dataclass(frozen=True)
class IdleSources:
    """A stage's idle fraction of a step, ``idle = formula + stage_costs + pass_variation +
    handover`` (see the module docstring); ``mean_forward`` and ``mean_backward`` are the stage's
    mean pass durations in seconds."""

    idle: float
    formula: float
    stage_costs: float
    pass_variation: float
    handover: float
    mean_forward: float
    mean_backward: float


def idle_sources(
    passes: dict[int, list[tuple]], schedule: str, microbatches: int
) -> dict[int, IdleSources]:
    """Per stage, its measured idle fraction split into its sources.

    Parameters
    ----------
    passes : dict
        Per stage ``s`` (``0 .. S - 1``), its passes of one step as ``(kind, microbatch, start,
        end)`` (``kind`` ``"F"`` or ``"B"``; every pass of the schedule once).
    schedule : str
    microbatches : int

    Raises
    ------
    ValueError
        If the passes are not those of the schedule.
    """
    stages = len(passes)
    durations = {(s, kind, u): end - start for s, v in passes.items() for kind, u, start, end in v}
    wanted = {
        (s, kind, u)
        for s in range(stages)
        for kind, u in stage_order(schedule, stages, s, microbatches)
    }
    if set(durations) != wanted or sum(map(len, passes.values())) != len(wanted):
        raise ValueError(
            f"the passes are not those of a {schedule!r} step of {microbatches} microbatches"
        )
    measured = {(s, kind, u): (start, end) for s, v in passes.items() for kind, u, start, end in v}
    means = {
        (s, kind): fmean(d for (t, k, _), d in durations.items() if (t, k) == (s, kind))
        for s in range(stages)
        for kind in "FB"
    }
    even = {key: means[key[:2]] for key in durations}
    formula = bubble_fraction(stages, microbatches)
    idle = _idle(durations, measured, stages)
    ideal = _idle(durations, replay(durations, schedule, stages, microbatches), stages)
    smooth = _idle(even, replay(even, schedule, stages, microbatches), stages)
    return {
        s: IdleSources(
            idle=idle[s],
            formula=formula,
            stage_costs=smooth[s] - formula,
            pass_variation=ideal[s] - smooth[s],
            handover=idle[s] - ideal[s],
            mean_forward=means[(s, "F")],
            mean_backward=means[(s, "B")],
        )
        for s in range(stages)
    }
