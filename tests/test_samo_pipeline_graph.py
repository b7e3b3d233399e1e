"""The pipeline's stage split by estimated cost, the dependencies of a step's task graph (which
pass runs after which, which key a message travels under) and the handover time, without a
cluster."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dasknn.model import CompressedMLP
from dasknn.optim import SGD
from dasknn.pipeline_parallel import balanced_bounds, layer_costs, split_stages, stage_order
from dasknn.pipeline_parallel._taskgraph import build_step, chain_links, final_passes
from dasknn.pipeline_parallel._timeline import handover_seconds
from dasknn.runtime.keys import parse_pipeline_key


def test_layer_costs_count_three_products_a_layer_and_two_for_the_first():
    shapes = [(64, 100), (100, 100), (100, 10)]
    assert layer_costs(shapes, [64 * 100, 100 * 100, 1000]) == [2 * 6400, 3 * 10_000, 3 * 1000]
    assert layer_costs(shapes, [5, 7, 9]) == [10, 21, 27]
    with pytest.raises(ValueError, match="2 entry counts for 3 layers"):
        layer_costs(shapes, [1, 2])
    with pytest.raises(ValueError, match=r"layer 2: 1001 entries for a layer of shape \(100, 10\)"):
        layer_costs(shapes, [1, 1, 1001])


def _model(sizes, densities, compute):
    rng = np.random.default_rng(0)
    weights, masks = [], []
    for (a, b), density in zip(itertools.pairwise(sizes), densities, strict=True):
        weights.append(rng.uniform(-1, 1, (a, b)))
        mask = np.zeros(a * b, dtype=bool)
        mask[: max(1, round(density * a * b))] = True
        masks.append(mask.reshape(a, b))
    return CompressedMLP(weights, masks, compute=compute)


def test_balanced_bounds_split_the_work_not_the_weights():
    # three equal dense layers: by weights 1 | 2 layers; by cost (2 + 3 | 3) the first two
    model = _model((40, 40, 40, 40), (1.0, 1.0, 1.0), "dense")
    assert split_stages([layer.nnz for layer in model.stack.layers], 2) == [(0, 1), (1, 3)]
    assert balanced_bounds(model, 2) == [(0, 2), (2, 3)]
    # sparse compute counts the unpruned weights: a dense first layer outweighs two sparse ones
    sparse = _model((40, 40, 40, 40), (1.0, 0.2, 0.2), "sparse")
    assert balanced_bounds(sparse, 2) == [(0, 1), (1, 3)]
    # dense compute multiplies every entry, whatever the mask keeps
    assert balanced_bounds(_model((40, 40, 40, 40), (1.0, 0.2, 0.2), "dense"), 2) == [
        (0, 2),
        (2, 3),
    ]
    with pytest.raises(ValueError, match="4 stages for a network of 3 layers"):
        balanced_bounds(model, 4)


def _graph(schedule, stages, m):
    workers = {(s, 0): f"w{s}" for s in range(stages)}
    columns = [np.arange(u, u + 1) for u in range(m)]
    data = {("x", 0): ("held-x", columns), ("y", 0): ("held-y", columns)}
    return build_step(
        "t", 1, stages, 1, m, schedule, workers, SGD(lr=0.1), 1 / m, [1] * stages, None,
        data=data,
    )


def _ancestors(tasks, key):
    seen, todo = set(), [key]
    while todo:
        for dep in tasks[todo.pop()].dependencies:
            if dep in tasks and dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_chain_links_hand_a_run_s_next_pass_over_early_and_keep_the_interleaving():
    gpipe = stage_order("gpipe", 2, 1, 4)  # F0 F1 F2 F3 B0 B1 B2 B3
    assert chain_links(gpipe) == [(), (), (0,), (1,), (3, 2), (3, 2), (4,), (5,)]
    assert final_passes(gpipe) == (7, 6)
    one_f_one_b = stage_order("1f1b", 2, 0, 4)  # F0 F1 B0 F2 B1 F3 B2 B3
    assert chain_links(one_f_one_b) == [(), (), (1, 0), (2,), (3,), (4,), (5,), (5,)]
    assert chain_links(stage_order("1f1b", 2, 1, 3)) == [(), (0,), (1,), (2,), (3,), (4,)]


@pytest.mark.parametrize(("stages", "m"), [(1, 3), (2, 4), (3, 2), (4, 5)])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_every_pass_precedes_the_update_and_the_other_kind_s_later_passes(schedule, stages, m):
    tasks = _graph(schedule, stages, m).tasks
    for s in range(stages):
        order = stage_order(schedule, stages, s, m)
        keys = [("fwd" if kind == "F" else "bwd", u) for kind, u in order]
        by_pass = {}
        for key in tasks:
            p = parse_pipeline_key(key)
            if p.stage == s and p.kind in ("fwd", "bwd"):
                by_pass[(p.kind, p.microbatch)] = key
        update = next(k for k in tasks if parse_pipeline_key(k).kind == "update"
                      and parse_pipeline_key(k).stage == s)  # fmt: skip
        before_update = _ancestors(tasks, update)
        assert all(by_pass[key] in before_update for key in keys)
        for j, later in enumerate(keys):
            ancestors = _ancestors(tasks, by_pass[later])
            for i in range(j):
                # the schedule's interleaving of forward and backward passes is kept (so the
                # microbatches in flight stay as the schedule's), and a backward pass follows its
                # own forward pass
                if keys[i][0] != later[0]:
                    assert by_pass[keys[i]] in ancestors, (keys[i], later)


def test_a_message_is_the_pass_key_and_the_sender_waits_for_a_mark_where_it_may_wait():
    tasks = _graph("gpipe", 2, 3).tasks
    marks = sorted(
        (p.kind, p.stage, p.microbatch)
        for p in map(parse_pipeline_key, tasks)
        if p.kind.endswith("-done")
    )
    # stage 0's first backward passes (they also wait for stage 1) run after its last two
    # forward passes, the update after stage 1's last two backward passes: they wait for marks;
    # the other sent passes are read on the sender only by the next but one pass of their run
    assert marks == [("bwd-done", 1, 1), ("bwd-done", 1, 2), ("fwd-done", 0, 1), ("fwd-done", 0, 2)]
    for key, task in tasks.items():
        p = parse_pipeline_key(key)
        if p.kind.endswith("-done"):
            assert set(task.dependencies) == {key[:1] + (p.kind.removesuffix("-done"),) + key[2:]}
        if p.stage == 1 and p.kind == "fwd":  # reads stage 0's pass key, and nothing else there
            assert {d for d in task.dependencies if parse_pipeline_key(d).stage == 0} == {
                key[:1] + ("fwd", 1, 0, 0, p.microbatch)
            }


def test_handover_is_the_wait_after_a_pass_could_start():
    passes = {
        0: [("F", 0, 0.0, 1.0), ("F", 1, 1.2, 2.2), ("B", 0, 5.0, 6.0), ("B", 1, 7.5, 8.5)],
        1: [("F", 0, 1.5, 2.5), ("F", 1, 2.6, 3.6), ("B", 0, 3.7, 4.7), ("B", 1, 4.8, 5.8)],
    }
    # stage 0: F1 0.2 after F0; B0 0.3 after stage 1's B0; B1 1.5 after its own B0
    # stage 1: F0 0.5 after stage 0's F0; then 0.1 after each of its own passes
    assert handover_seconds(passes) == pytest.approx({0: 2.0, 1: 0.8}, abs=1e-12)
