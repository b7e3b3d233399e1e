"""Where a pipeline stage's idle time comes from: the ideal timeline of a schedule and the split of
measured idle time into the formula, unequal stages, unequal passes and handover, on timelines
worked out by hand (no cluster)."""

from __future__ import annotations

import pytest

from dasknn.pipeline_parallel._timeline import idle_sources, replay

# S = 2, m = 2, GPipe. Stage 0: forward 1.5 then 0.5 s, backward 2 and 2 s; stage 1: forward 1
# then 2 s, backward 2 and 2 s. Busy: stage 0 6 s, stage 1 7 s. Measured: stage 1's first forward
# starts 0.5 s after stage 0's ended, stage 0's second backward 0.25 s after its first.
MEASURED = {
    0: [("F", 0, 0.0, 1.5), ("F", 1, 1.5, 2.0), ("B", 0, 7.0, 9.0), ("B", 1, 9.25, 11.25)],
    1: [("F", 0, 2.0, 3.0), ("F", 1, 3.0, 5.0), ("B", 0, 5.0, 7.0), ("B", 1, 7.0, 9.0)],
}


def test_replay_starts_each_pass_once_its_stage_and_its_message_are_done():
    durations = {(s, k, u): end - start for s, v in MEASURED.items() for k, u, start, end in v}
    times = replay(durations, "gpipe", 2, 2)
    expected = {
        (0, "F", 0): (0.0, 1.5),
        (0, "F", 1): (1.5, 2.0),
        (1, "F", 0): (1.5, 2.5),
        (1, "F", 1): (2.5, 4.5),
        (1, "B", 0): (4.5, 6.5),
        (1, "B", 1): (6.5, 8.5),
        (0, "B", 0): (6.5, 8.5),
        (0, "B", 1): (8.5, 10.5),
    }
    assert set(times) == set(expected)
    for key, span in expected.items():
        assert times[key] == pytest.approx(span), key


def test_idle_splits_into_formula_stage_costs_pass_variation_and_handover():
    sources = idle_sources(MEASURED, "gpipe", 2)
    # spans: measured 11.25 s; the replay of the measured durations 10.5 s; the replay with each
    # stage's mean forward (1 / 1.5 s) and backward (2 / 2 s) 10 s (stage 0's forwards end at 2,
    # stage 1's at 4, its backwards at 8, stage 0's at 10)
    busy = {0: 6.0, 1: 7.0}
    for s, parts in sources.items():
        smooth, ideal, idle = (1 - busy[s] / span for span in (10.0, 10.5, 11.25))
        assert parts.idle == pytest.approx(idle, abs=1e-12)
        assert parts.formula == pytest.approx(1 / 3, abs=1e-12)
        assert parts.stage_costs == pytest.approx(smooth - 1 / 3, abs=1e-12)
        assert parts.pass_variation == pytest.approx(ideal - smooth, abs=1e-12)
        assert parts.handover == pytest.approx(idle - ideal, abs=1e-12)
    assert (sources[0].mean_forward, sources[1].mean_forward) == pytest.approx((1.0, 1.5))
    assert (sources[0].mean_backward, sources[1].mean_backward) == pytest.approx((2.0, 2.0))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("stages", "m"), [(2, 2), (3, 4), (4, 8)])
def test_equal_stages_without_delays_idle_the_formula(schedule, stages, m):
    forward, backward = 1.0, 2.0  # per pass on every stage
    durations = {
        (s, k, u): forward if k == "F" else backward
        for s in range(stages)
        for k in "FB"
        for u in range(m)
    }
    times = replay(durations, schedule, stages, m)
    span = max(end for _, end in times.values())
    assert span == pytest.approx((m + stages - 1) * (forward + backward))
    passes = {s: [] for s in range(stages)}
    for (s, k, u), (start, end) in times.items():
        passes[s].append((k, u, start, end))
    for parts in idle_sources(passes, schedule, m).values():
        assert parts.idle == pytest.approx((stages - 1) / (m + stages - 1), abs=1e-12)
        assert parts.stage_costs == pytest.approx(0, abs=1e-12)
        assert parts.pass_variation == pytest.approx(0, abs=1e-12)
        assert parts.handover == pytest.approx(0, abs=1e-12)


def test_passes_that_are_not_the_schedule_s_are_refused():
    missing = {0: MEASURED[0][:-1], 1: MEASURED[1]}
    with pytest.raises(ValueError, match="not those of a 'gpipe' step of 2 microbatches"):
        idle_sources(missing, "gpipe", 2)
