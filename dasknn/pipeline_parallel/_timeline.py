"""Where a pipeline stage's idle time comes from: measured passes against the schedule's replay.

``idle = formula + stage_costs + pass_variation + handover``: the equal-stage bubble, the
:func:`replay` at each stage's mean pass times minus it, the replay at the measured times minus
that, and the measured idle minus the latter. See docs/samo.md (Schedules).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

from dasknn.pipeline_parallel._schedule import bubble_fraction, stage_order

__all__ = ["IdleBreakdown", "IdleSources", "handover_seconds", "idle_sources", "replay"]

PassKey = tuple[int, str, int]  # (stage, "F" | "B", microbatch)


def _source(stage: int, kind: str, u: int, stages: int) -> PassKey | None:
    """The other stage's pass whose message this pass reads (``None``: it reads none)."""
    if kind == "F" and stage > 0:
        return (stage - 1, "F", u)
    if kind == "B" and stage < stages - 1:
        return (stage + 1, "B", u)
    return None


def handover_seconds(passes: dict[int, list[tuple]]) -> dict[int, float]:
    """Per stage, the seconds its passes started after their inputs were ready (``passes`` as in
    :func:`idle_sources`)."""
    ends = {(s, kind, u): end for s, events in passes.items() for kind, u, _, end in events}
    stages = max(passes) + 1
    out = {}
    for s, events in passes.items():
        waited, previous_end = 0.0, None
        for kind, u, start, _ in sorted(events, key=lambda e: e[2]):
            source = _source(s, kind, u, stages)
            ready = [previous_end, None if source is None else ends[source]]
            ready = [t for t in ready if t is not None]
            if ready:
                waited += max(0.0, start - max(ready))
            previous_end = ends[(s, kind, u)]
        out[s] = waited
    return out


def replay(durations: dict, schedule: str, stages: int, microbatches: int) -> dict:
    """The ideal ``(start, end)`` of every pass ``(stage, kind, microbatch)`` from 0 with its
    ``durations``: each pass starts when its stage's previous pass and the pass it reads have
    ended. ``ValueError`` if the schedule deadlocks."""
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
class IdleBreakdown:
    """A stage replica's idle fraction of a step over its replica's span (first pass started to
    last ended): ``idle = bubble + imbalance``. The ``bubble``, ``1 - busy_max / span``, is the
    busiest stage's idle fraction (fill and drain: ``(S - 1) / (m + S - 1)`` with equal stages);
    the ``imbalance``, ``(busy_max - busy) / span``, the wait for that stage; ``busy`` the
    seconds of the stage's passes; ``handover`` the part of ``idle`` with the next pass's inputs
    ready (:func:`handover_seconds`: a chained task's round trip, the message's transfer)."""

    idle: float
    bubble: float
    imbalance: float
    busy: float
    handover: float = 0.0


@dataclass(frozen=True)
class IdleSources:
    """A stage's idle fraction of a step split into its four sources, and its mean forward and
    backward pass durations in seconds."""

    idle: float
    formula: float
    stage_costs: float
    pass_variation: float
    handover: float
    mean_forward: float
    mean_backward: float


def idle_sources(passes: dict, schedule: str, microbatches: int) -> dict[int, IdleSources]:
    """Per stage, its measured idle fraction split into its sources (see the module docstring).

    ``passes`` holds per stage ``s`` its passes of one step, ``(kind, microbatch, start, end)``
    with ``kind`` ``"F"`` or ``"B"``, each once; ``ValueError`` if they are not the schedule's.
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
