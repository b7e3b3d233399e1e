"""Pipeline and compressed-gradient data parallelism (SAMO) on a real 4-worker LocalCluster.

Each distributed step is compared with the one-process step of the same compressed model on the
whole batch (float64, 1e-12); the bytes measured between workers with the formulas, exactly.
"""

from __future__ import annotations

import itertools
import os
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import SchedulerPlugin
from plugin_checks import key_cache_bound_count

from dasknn.exceptions import ModelClosedError
from dasknn.model import CompressedMLP
from dasknn.optim import SGD, Adam
from dasknn.pipeline_parallel import (
    DistributedCompressedMLP,
    dense_layer_bytes,
    plan_parallelism,
    split_stages,
    stage_order,
)
from dasknn.pipeline_parallel._worker_state import StageState
from dasknn.pruning import magnitude_masks
from dasknn.runtime.affinity import pinned_core, usable_cores
from dasknn.runtime.cluster import scheduler_workers
from dasknn.runtime.keys import parse_pipeline_key, pipeline_key
from dasknn.runtime.measure import TOPIC as TRANSFER_TOPIC
from dasknn.runtime.worker_memory import PLUGIN_NAME as REUSE_MEMORY_PLUGIN

SIZES = (30, 24, 16, 5)


@pytest.fixture(scope="module")
def client4():
    cluster = LocalCluster(
        n_workers=4, threads_per_worker=1, processes=True, dashboard_address=":0"
    )
    client = Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


def problem(precision="fp64", seed=0):
    rng = np.random.default_rng(seed)
    weights = [rng.uniform(-1, 1, (a, b)) for a, b in zip(SIZES[:-1], SIZES[1:], strict=True)]
    biases = [rng.uniform(-0.1, 0.1, b) for b in SIZES[1:]]
    masks = magnitude_masks(weights, 0.6)
    x = rng.uniform(0, 1, (16, SIZES[0]))
    y = rng.integers(0, SIZES[-1], 16)
    return CompressedMLP(weights, masks, biases, precision=precision), x, y


def in_flight(order):
    held, peak = 0, 0
    for kind, _ in order:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize(("stages", "m"), [(2, 4), (3, 2), (4, 8), (1, 3)])
def test_schedules_run_every_pass_once_in_a_valid_order(stages, m):
    for s in range(stages):
        for schedule in ("gpipe", "1f1b"):
            order = stage_order(schedule, stages, s, m)
            assert sorted(order) == sorted(itertools.product("FB", range(m)))
            assert all(order.index(("F", u)) < order.index(("B", u)) for u in range(m))
        assert in_flight(stage_order("gpipe", stages, s, m)) == m
        assert in_flight(stage_order("1f1b", stages, s, m)) == min(stages - s, m)


def test_split_stages_minimises_the_largest_stage():
    rng = np.random.default_rng(0)
    for _ in range(20):
        sizes = list(rng.integers(1, 50, rng.integers(1, 7)))
        for stages in range(1, len(sizes) + 1):
            bounds = split_stages(sizes, stages)
            assert [a for a, _ in bounds] == [0] + [b for _, b in bounds[:-1]]
            assert bounds[-1][1] == len(sizes) and all(a < b for a, b in bounds)
            best = min(
                max(sum(sizes[a:b]) for a, b in zip((0, *cut), (*cut, len(sizes)), strict=True))
                for cut in itertools.combinations(range(1, len(sizes)), stages - 1)
            )
            assert max(sum(sizes[a:b]) for a, b in bounds) == best


def test_the_planner_gives_samo_fewer_stages_and_more_replicas():
    shapes = list(zip(SIZES[:-1], SIZES[1:], strict=True))
    dense = dense_layer_bytes(shapes, arrays=4)
    limit = int(sum(dense) * 0.7)
    plan = plan_parallelism(dense, workers=2, memory_limit=limit)
    assert (plan.stages, plan.replicas) == (2, 1)
    samo = [b // 5 for b in dense]
    plan = plan_parallelism(samo, workers=2, memory_limit=limit)
    assert (plan.stages, plan.replicas) == (1, 2) and plan.stage_bytes == [sum(samo)]
    with pytest.raises(ValueError, match=f"needs {max(dense):,} bytes .* limit is 100 bytes"):
        plan_parallelism(dense, workers=4, memory_limit=100)


# (stages, replicas, schedule, messages); the default run takes one pipeline, one data-parallel
# and one hybrid case (both schedules, both ways of sending), the others are slow
CONFIGS = [
    (2, 1, "gpipe", "posted"),
    pytest.param(2, 1, "1f1b", "posted", marks=pytest.mark.slow),
    (1, 2, "gpipe", "posted"),
    pytest.param(2, 2, "1f1b", "posted", marks=pytest.mark.slow),
    pytest.param(2, 1, "gpipe", "tasks", marks=pytest.mark.slow),
    (2, 2, "1f1b", "tasks"),
]


@pytest.mark.parametrize(("stages", "replicas", "schedule", "messages"), CONFIGS)
def test_a_distributed_step_equals_the_full_batch_step(
    client4, stages, replicas, schedule, messages
):
    model, x, y = problem()
    reference, _, _ = problem()
    with DistributedCompressedMLP(
        model,
        client4,
        stages=stages,
        replicas=replicas,
        microbatches=4,
        schedule=schedule,
        messages=messages,
    ) as pipe:
        for _ in range(2):
            loss = pipe.train_step(x, y, optimizer=Adam(lr=0.01))
            want = reference.train_step(x, y, optimizer=Adam(lr=0.01))
            assert loss == pytest.approx(want, abs=1e-12)
        replicas_held = [pipe.replica(d) for d in range(replicas)]
        for held in replicas_held:
            for a, b in zip(held.weights, reference.weights, strict=True):
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
            for a, b in zip(held.biases, reference.biases, strict=True):
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
            # the optimizer state comes along: one more step in this process follows the reference
            assert held.steps_ == 2 and held.optimizer == Adam(lr=0.01)
            for a, b in zip(held.stack.layers, reference.stack.layers, strict=True):
                (a_w, a_b), (b_w, b_b) = a.optimizer_state, b.optimizer_state
                assert (a_w.step, a_b.step) == (b_w.step, b_b.step)
                for name, moment in b_w.arrays.items():
                    np.testing.assert_allclose(a_w.arrays[name], moment, rtol=0, atol=1e-12)
        resumed = replicas_held[0]
        resumed.train_step(x, y, optimizer=Adam(lr=0.01))
        reference_next, _, _ = problem()
        for _ in range(3):
            reference_next.train_step(x, y, optimizer=Adam(lr=0.01))
        for a, b in zip(resumed.weights, reference_next.weights, strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
        report = pipe.comm_report()  # the two steps
        assert report.exact, report
        assert report.steps == 2
        boundary = SIZES[pipe.bounds[0][1]] if stages > 1 else 0
        for phase in ("forward", "backward"):  # a step: (S - 1) 16 rows x the boundary, float64
            assert report.total(phase=phase) == 2 * (stages - 1) * 16 * boundary * 8
            assert report.messages(phase=phase) == 2 * (stages - 1) * 4 * replicas
        params = model.nnz + sum(SIZES[1:])
        assert report.total(phase="allreduce") == 2 * 2 * (replicas - 1) * params * 8
        assert report.messages(phase="allreduce") == 2 * 2 * stages * replicas * (replicas - 1)
        assert report.total(phase="predict") == 0
        step = pipe.step_report()
        for (s, _), value in step.items():
            assert value["peak"] == (4 if schedule == "gpipe" else min(stages - s, 4))
        breakdown = pipe.idle_breakdown()
        for d in range(replicas):
            passes = {s: [e for e in step[(s, d)]["events"] if e[0] in "FB"] for s in range(stages)}
            assert all(len(events) == 2 * 4 for events in passes.values())
            span = max(e[3] for v in passes.values() for e in v) - min(
                e[2] for v in passes.values() for e in v
            )
            busy = {s: sum(e[3] - e[2] for e in events) for s, events in passes.items()}
            for s in range(stages):
                parts = breakdown[(s, d)]
                assert parts.idle == pytest.approx(1 - busy[s] / span, abs=1e-12)
                assert parts.bubble == pytest.approx(1 - max(busy.values()) / span, abs=1e-12)
                assert parts.idle == pytest.approx(parts.bubble + parts.imbalance, abs=1e-12)
                assert 0 <= parts.handover <= parts.idle + 1e-12
        for parts in pipe.idle_sources().values():
            total = parts.formula + parts.stage_costs + parts.pass_variation + parts.handover
            assert parts.idle == pytest.approx(total, abs=1e-12)
        assert {key: p.idle for key, p in pipe.idle_sources().items()} == pytest.approx(
            {key: p.idle for key, p in breakdown.items()}, abs=1e-12
        )


def test_each_boundary_activation_runs_on_the_receiving_stage_and_the_step_is_unchanged(client4):
    # sigmoid (whose derivative reads the activations) and mse, one layer a stage: the middle
    # stage receives pre-activations, applies the activation, and sends back deltas already
    # times its derivative; two steps equal the one-process full-batch steps
    rng = np.random.default_rng(7)
    weights = [rng.uniform(-1, 1, (a, b)) for a, b in zip(SIZES[:-1], SIZES[1:], strict=True)]
    x, y = rng.uniform(0, 1, (16, SIZES[0])), rng.uniform(0, 1, (16, SIZES[-1]))

    def model():
        masks = magnitude_masks(weights, 0.6)
        return CompressedMLP(weights, masks, activation="sigmoid", loss="mse", precision="fp64")

    reference = model()
    bounds = [(0, 1), (1, 2), (2, 3)]
    with DistributedCompressedMLP(
        model(), client4, stages=3, microbatches=2, bounds=bounds
    ) as pipe:
        for _ in range(2):
            loss = pipe.train_step(x, y, optimizer=Adam(lr=0.05))
            assert loss == pytest.approx(reference.train_step(x, y, optimizer=Adam(lr=0.05)))
        for a, b in zip(pipe.gather().weights, reference.weights, strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


def test_bf16_allreduce_sends_the_compressed_16_bit_values(client4):
    pytest.importorskip("ml_dtypes")
    model, x, y = problem(precision="bf16")
    with DistributedCompressedMLP(model, client4, stages=1, replicas=2, microbatches=2) as pipe:
        pipe.train_step(x, y, optimizer=Adam(lr=0.01))
        report = pipe.comm_report()
        assert report.exact
        assert report.total(phase="allreduce") == 2 * (model.nnz + sum(SIZES[1:])) * 2
        a, b = pipe.replica(0), pipe.replica(1)
        for wa, wb in zip(a.weights, b.weights, strict=True):
            np.testing.assert_array_equal(wa, wb)


def storage_dtype(precision):
    if precision == "fp16":
        return np.dtype(np.float16)
    return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)


def reference_gradients(weights, biases, masks, x, y, storage):
    """Float64 loss and gradients of the masked ReLU / softmax cross-entropy network at the
    weights the 16-bit model multiplies with (float32 master values rounded to ``storage``)."""
    W = [np.where(m, w.astype(np.float32).astype(storage), 0).astype(np.float64)
         for w, m in zip(weights, masks, strict=True)]  # fmt: skip
    b = [np.float32(v).astype(np.float64) for v in biases]
    acts, zs = [x.astype(np.float32).astype(np.float64)], []
    for k in range(len(W)):
        zs.append(acts[-1] @ W[k] + b[k])
        acts.append(zs[-1] if k == len(W) - 1 else np.maximum(zs[-1], 0))
    z = zs[-1] - zs[-1].max(1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    loss = -np.log(p[np.arange(len(y)), y]).mean()
    delta = (p - np.eye(W[-1].shape[1])[y]) / len(y)
    grads = [None] * len(W)
    for k in range(len(W) - 1, -1, -1):
        grads[k] = ((acts[k].T @ delta) * masks[k], delta.sum(0))
        if k:
            delta = (delta @ W[k].T) * (zs[k - 1] > 0)
    return loss, grads


def held_master(pipe, replica):
    """Per layer, the replica's float32 master weights (dense) and biases."""
    held = pipe.replica(replica)
    return held.weights, held.biases


@pytest.mark.parametrize(("precision", "tolerance"), [("fp16", 2e-3), ("bf16", 2e-2)])
def test_a_sixteen_bit_pipeline_step_follows_the_float64_gradient(client4, precision, tolerance):
    storage = storage_dtype(precision)
    rng = np.random.default_rng(5)
    weights = [rng.uniform(-1, 1, (a, b)) for a, b in zip(SIZES[:-1], SIZES[1:], strict=True)]
    biases = [rng.uniform(-0.1, 0.1, b) for b in SIZES[1:]]
    masks = magnitude_masks(weights, 0.6)
    x, y = rng.uniform(0, 1, (16, SIZES[0])), rng.integers(0, SIZES[-1], 16)
    model = CompressedMLP(weights, masks, biases, precision=precision)
    want_loss, grads = reference_gradients(weights, biases, masks, x, y, storage)
    with DistributedCompressedMLP(model, client4, stages=2, replicas=2, microbatches=2) as pipe:
        loss = pipe.train_step(x, y, optimizer=SGD(lr=1.0))
        assert loss == pytest.approx(want_loss, rel=1e-6)  # float32 forward
        for d in range(2):
            held_w, held_b = held_master(pipe, d)
            for k, (gw, gb) in enumerate(grads):
                # plain SGD with lr 1: the update is minus the gradient the stages accumulated
                step_w = held_w[k] - np.where(masks[k], weights[k].astype(np.float32), 0)
                step_b = held_b[k] - biases[k].astype(np.float32)
                assert np.abs(step_w + gw).max() <= tolerance * np.abs(gw).max(), (k, d)
                assert np.abs(step_b + gb).max() <= tolerance * np.abs(gb).max(), (k, d)
                assert (held_w[k][~masks[k]] == 0).all()
        if precision == "fp16":
            assert pipe.scaler.skipped_steps == 0 and pipe.scaler.scale == 2.0**16
        report = pipe.comm_report()
        assert report.exact, report
        assert report.total(phase="allreduce") == 2 * (model.nnz + sum(SIZES[1:])) * 2


def test_fp16_overflow_on_one_stage_skips_the_step_on_every_stage(client4):
    rng = np.random.default_rng(6)
    weights = [rng.uniform(-1, 1, (a, b)) for a, b in zip(SIZES[:-1], SIZES[1:], strict=True)]
    weights[-1] *= 1e-4  # stage 0's gradients become far smaller than stage 1's
    biases = [rng.uniform(-0.1, 0.1, b) for b in SIZES[1:]]
    masks = magnitude_masks(weights, 0.6, scope="layer")
    x, y = rng.uniform(0, 1, (16, SIZES[0])), rng.integers(0, SIZES[-1], 16)
    _, grads = reference_gradients(weights, biases, masks, x, y, np.float16)
    largest = [max(np.abs(g).max() for g in grads[k]) for k in range(3)]
    # an initial scale that overflows float16 (65504) on stage 1 (layer 3) by 16x or more while
    # stage 0 (layers 1, 2) stays 16x below it
    scale = 2.0 ** np.ceil(np.log2(16 * 65504 / largest[2]))
    assert scale * max(largest[:2]) < 65504 / 16
    model = CompressedMLP(weights, masks, biases, precision="fp16", loss_scale=scale)
    before = model.weights, model.biases
    with DistributedCompressedMLP(
        model, client4, stages=2, replicas=2, microbatches=2, bounds=[(0, 2), (2, 3)]
    ) as pipe:
        for skipped in range(1, 4):
            pipe.train_step(x, y, optimizer=SGD(lr=1.0))
            assert pipe.scaler.skipped_steps == skipped and pipe.scaler.scale == scale / 2**skipped
            for d in range(2):
                held_w, held_b = held_master(pipe, d)
                for k in range(3):  # no stage replica applied the step
                    np.testing.assert_array_equal(held_w[k], before[0][k])
                    np.testing.assert_array_equal(held_b[k], before[1][k])
        while pipe.scaler.skipped_steps < 8 and pipe.scaler.good_steps == 0:
            pipe.train_step(x, y, optimizer=SGD(lr=1.0))
        assert pipe.scaler.good_steps == 1  # the first step applied: the float64 gradient
        held_w, held_b = held_master(pipe, 1)
        for k, (gw, gb) in enumerate(grads):
            step_w = held_w[k] - before[0][k]
            assert np.abs(step_w + gw).max() <= 2e-3 * np.abs(gw).max(), k
            assert np.abs(held_b[k] - before[1][k] + gb).max() <= 2e-3 * np.abs(gb).max(), k
        assert pipe.gather().scaler.scale == pipe.scaler.scale


def _pipeline_plugins(dask_worker):
    return [name for name in dask_worker.plugins if name.startswith("dasknn-pipeline-")]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"microbatches": 0}, "microbatches must be an integer >= 1"),
        ({"stages": 4}, "4 stages for a network of 3 layers"),
        ({"stages": 3, "replicas": 2}, "6 workers needed, 4 available"),
        ({"schedule": "zigzag"}, "unknown schedule"),
        ({"replicas": 1.5}, "replicas must be an integer"),
        ({"stages": 2, "bounds": [(0, 1), (2, 3)]}, "bounds must be 2 contiguous"),
        ({"messages": "mail"}, "messages must be 'posted' or 'tasks'"),
        ({"pin_cores": "no"}, "pin_cores must be True or False, got 'no'"),
        ({"reuse_memory": 1}, "reuse_memory must be True or False, got 1"),
    ],
)
def test_bad_settings_raise_before_anything_is_installed(client4, kwargs, match):
    model, _, _ = problem()
    with pytest.raises(ValueError, match=match):
        DistributedCompressedMLP(model, client4, **kwargs)
    assert not any(client4.run(_pipeline_plugins).values())


def test_a_worker_named_twice_is_refused(client4):
    model, _, _ = problem()
    address = sorted(scheduler_workers(client4))[0]
    with pytest.raises(ValueError, match="workers must be distinct addresses"):
        DistributedCompressedMLP(model, client4, stages=2, workers=[address, address])
    assert not any(client4.run(_pipeline_plugins).values())


def test_posted_messages_run_a_task_per_stage_and_time_every_pass(client4):
    """With posted messages the scheduler sees one task per stage replica and step (no pass
    keys), the messages still equal the byte formula exactly, and every pass has its thread's
    CPU time and page faults beside its wall-clock time."""
    model, x, y = problem()
    client4.register_plugin(_RecordConsumers())
    start = time.time()  # the scheduler's clock: it runs in this process
    try:
        with DistributedCompressedMLP(
            model, client4, stages=3, microbatches=4, schedule="1f1b"
        ) as pipe:
            pipe.train_step(x, y, lr=0.1)
            keys = [parse_pipeline_key(k) for k in client4.run_on_scheduler(_consumers)]
            report = pipe.comm_report()
            step = pipe.step_report()
            events = [m for t, m in client4.get_events(TRANSFER_TOPIC) if t >= start]
    finally:
        client4.unregister_scheduler_plugin(_RecordConsumers.name)
    kinds = {k.kind for k in keys if k.token == pipe.token}
    assert "run" in kinds and not kinds & {"fwd", "bwd", "fwd-done", "bwd-done"}
    assert report.exact and report.messages(phase="forward") == 2 * 4, report
    assert report.messages(phase="backward") == 2 * 4, report
    # each stage's task reports the messages it received in one event (stages 1 and 2 get
    # forward messages, stages 0 and 1 backward ones), not one event a message
    posted = [m for m in events if "transfers" in m]
    assert 0 < len(posted) <= 3
    assert sum(len(m["transfers"]) for m in posted) == 2 * 2 * 4
    for s in range(3):
        events, usage = step[(s, 0)]["events"], step[(s, 0)]["usage"]
        passes = [(kind, u) for kind, u, _, _ in events if kind in "FB"]
        assert passes == stage_order("1f1b", 3, s, 4)
        assert [(kind, u) for kind, u, *_ in usage] == [(kind, u) for kind, u, _, _ in events]
        for (_, _, start, end), (_, _, cpu, *counts) in zip(events, usage, strict=True):
            assert 0 <= cpu <= end - start + 1e-3 and min(counts) >= 0 and len(counts) == 3


def _arrays_made(dask_worker, token):
    return StageState.on_worker(token, dask_worker).buffers.made


def test_posted_steps_reuse_the_arrays_of_the_step_before(client4):
    """``messages="posted"``: a stage's passes take their arrays (activations, deltas, the
    messages they post) from the stage's buffers and give them back when the step is over, so
    later steps make none anew; the steps are those of one process."""
    model, x, y = problem()
    reference, _, _ = problem()
    with DistributedCompressedMLP(model, client4, stages=3, microbatches=4) as pipe:
        losses = [pipe.train_step(x, y, lr=0.1)]
        made = client4.run(_arrays_made, token=pipe.token)
        losses += [pipe.train_step(x, y, lr=0.1) for _ in range(3)]
        assert client4.run(_arrays_made, token=pipe.token) == made
        weights = pipe.gather().weights
    assert sum(made.values()) > 0
    want = [reference.train_step(x, y, lr=0.1) for _ in range(4)]
    assert losses == pytest.approx(want, abs=1e-12)
    for got, expected in zip(weights, reference.weights, strict=True):
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def _plugin_names(dask_worker):
    return sorted(dask_worker.plugins)


def test_reuse_memory_is_on_by_default_and_removed_on_close(client4):
    model, x, y = problem()
    reference, _, _ = problem()
    with DistributedCompressedMLP(model, client4, stages=2, microbatches=2) as pipe:
        name = f"{REUSE_MEMORY_PLUGIN}-{pipe.token}"
        assert all(name in names for names in client4.run(_plugin_names).values())
        loss = pipe.train_step(x, y, lr=0.1)
        assert loss == pytest.approx(reference.train_step(x, y, lr=0.1), abs=1e-12)
    assert not any(name in names for names in client4.run(_plugin_names).values())


def _affinities(dask_worker):
    """The distinct sets of cores the threads of the worker's process may run on."""
    threads = [int(name) for name in os.listdir("/proc/self/task")]
    return sorted({tuple(sorted(os.sched_getaffinity(t))) for t in threads})


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity")
def test_pin_cores_binds_each_stage_worker_to_a_core_of_its_own_until_close(client4):
    model, x, y = problem()
    reference, _, _ = problem()
    before = client4.run(_affinities)
    with DistributedCompressedMLP(model, client4, stages=2, microbatches=2, pin_cores=True) as pipe:
        loss = pipe.train_step(x, y, lr=0.1)  # the step starts task threads: they inherit it
        pinned = client4.run(pinned_core)
        during = client4.run(_affinities)
        stage_workers = [pipe.workers[(s, 0)] for s in range(2)]
    assert loss == pytest.approx(reference.train_step(x, y, lr=0.1), abs=1e-12)
    cores = [pinned[address][0] for address in stage_workers]
    allowed = sorted(set(before[stage_workers[0]][0]))
    assert cores == [allowed[0], allowed[1 % len(allowed)]]
    for address, core in zip(stage_workers, cores, strict=True):
        assert during[address] == [(core,)]
        assert all(threads == [core] for threads in pinned[address][1])
    for address in set(pinned) - set(stage_workers):
        assert pinned[address][0] is None and during[address] == before[address]
    assert client4.run(_affinities) == before


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity")
def test_pin_cores_is_on_by_default_only_on_a_cluster_of_the_models_own(client4):
    model, x, y = problem()
    with DistributedCompressedMLP(model, client4, stages=2) as pipe:
        assert pipe.pin_cores is False  # the user's cluster: nothing process-wide by default
    with DistributedCompressedMLP(problem()[0], stages=1) as pipe:
        assert pipe.pin_cores is (len(usable_cores()) > 1)
        pipe.train_step(x, y, lr=0.1)
        pinned = pipe.client.run(pinned_core)
        assert (pinned[pipe.workers[(0, 0)]][0] is not None) is pipe.pin_cores


def test_bad_batches_raise_before_anything_is_scheduled(client4):
    model, x, y = problem()
    with DistributedCompressedMLP(model, client4, stages=2, microbatches=3) as pipe:
        workers = len(scheduler_workers(client4))
        assert key_cache_bound_count(client4, pipe.token) == 1 + workers
        with pytest.raises(ValueError, match="16 rows does not split into .* 3 equal"):
            pipe.train_step(x, y, lr=0.1)
        with pytest.raises(ValueError, match="learning rate"):
            pipe.train_step(x[:15], y[:15], optimizer=Adam(lr=float("nan")))
        assert pipe.n_steps_ == 0
        for a, b in zip(pipe.gather().weights, model.weights, strict=True):
            np.testing.assert_array_equal(a, b)
    assert not any(client4.run(_pipeline_plugins).values())
    assert key_cache_bound_count(client4, pipe.token) == 0


def test_outputs_and_scores_equal_numpy(client4):
    """predict, predict_proba, evaluate and score of the pipeline model (the estimator API's,
    run through the stages on the workers) against the masked network in float64 numpy; the
    stages' messages of the row blocks equal the prediction exactly."""
    model, x, y = problem()
    rng = np.random.default_rng(0)
    weights = [rng.uniform(-1, 1, (a, b)) for a, b in zip(SIZES[:-1], SIZES[1:], strict=True)]
    biases = [rng.uniform(-0.1, 0.1, b) for b in SIZES[1:]]
    masks = magnitude_masks(weights, 0.6)
    a = x
    for k, (w, mask, b) in enumerate(zip(weights, masks, biases, strict=True)):
        z = a @ (w * mask) + b
        a = z if k == len(weights) - 1 else np.maximum(z, 0)
    shifted = np.exp(a - a.max(axis=1, keepdims=True))
    proba = shifted / shifted.sum(axis=1, keepdims=True)
    loss = -np.mean(np.log(proba[np.arange(len(y)), y]))
    with DistributedCompressedMLP(model, client4, stages=2, microbatches=2) as pipe:
        np.testing.assert_array_equal(pipe.predict(x, batch_size=5), np.argmax(a, axis=1))
        np.testing.assert_allclose(pipe.predict_proba(x), proba, rtol=1e-12, atol=1e-15)
        assert pipe.evaluate(x, y, batch_size=7) == pytest.approx(loss, rel=1e-12)
        assert pipe.score(x, y) == np.mean(np.argmax(a, axis=1) == y)
        with pytest.raises(ValueError, match="batch_size"):
            pipe.score(x, y, batch_size=0)
        report = pipe.comm_report()
        boundary = SIZES[pipe.bounds[0][1]]
        # four predictions of the 16 rows: the boundary's pre-activations, float64, once a block
        assert report.exact and report.total(phase="predict") == 4 * 16 * boundary * 8, report
        # predict: blocks of 5, 5, 5, 1 rows; predict_proba: 16; evaluate: 7, 7, 2; score: 16
        assert report.messages(phase="predict") == 4 + 1 + 3 + 1
        assert report.steps == 0 and report.total(phase="forward") == 0


def test_to_dask_gives_each_layer_on_its_stage_worker_and_a_closed_model_refuses_work(client4):
    """to_dask: every layer's master weights (a GCXS chunk) and bias equal the gathered model's,
    each copy made on the layer's stage worker of replica 0, and they stay those of the step
    they were taken after; a closed model raises ModelClosedError."""
    model, x, y = problem()
    bounds = [(0, 2), (2, 3)]
    with DistributedCompressedMLP(
        model, client4, stages=2, replicas=2, microbatches=2, bounds=bounds
    ) as pipe:
        pipe.train_step(x, y, lr=0.1)
        arrays = pipe.to_dask()
        gathered = pipe.gather()
        pipe.train_step(x, y, lr=0.1)  # the copies keep the first step's values
        assert sorted(arrays) == sorted(
            [f"weights_{k}" for k in range(3)] + [f"bias_{k}" for k in range(3)]
        )
        for k in range(3):
            weights, bias = arrays[f"weights_{k}"], arrays[f"bias_{k}"]
            assert weights.shape == model.layer_shapes[k] and weights.numblocks == (1, 1)
            np.testing.assert_array_equal(weights.compute().todense(), gathered.weights[k])
            np.testing.assert_array_equal(bias.compute(), gathered.biases[k])
            owner = pipe.workers[(0 if k < 2 else 1, 0)]
            for array in (weights, bias):
                held = array.persist()
                assert all(w == (owner,) for w in client4.who_has(held).values()), k
        with pytest.raises(ValueError, match="replica must be an integer in \\[0, 2\\)"):
            pipe.replica(2)
    with pytest.raises(ModelClosedError):
        pipe.to_dask()
    with pytest.raises(ModelClosedError):
        pipe.predict(x)


def _set_first_weight_infinite(dask_worker, token):
    stack = dask_worker.plugins[f"dasknn-pipeline-{token}"].stack
    stack.layers[0].master[0] = np.inf
    stack.layers[0].refresh()


@pytest.mark.parametrize(
    ("bounds", "stage", "layer"),
    [([(0, 1), (1, 3)], 0, 1), ([(0, 1), (1, 2), (2, 3)], 1, 2), ([(0, 2), (2, 3)], 1, 3)],
)
def test_a_nonfinite_loss_names_the_layer_where_values_first_became_nonfinite(
    client4, bounds, stage, layer
):
    model, x, y = problem()
    with DistributedCompressedMLP(
        model, client4, stages=len(bounds), microbatches=2, bounds=bounds, schedule="1f1b"
    ) as pipe:
        pipe.train_step(x, y, lr=0.01)
        address = pipe.workers[(stage, 0)]
        client4.run(_set_first_weight_infinite, token=pipe.token, workers=[address])
        with pytest.raises(FloatingPointError, match=f"step 2: .* layer {layer} is the first"):
            pipe.train_step(x, y, lr=0.01)


class _RecordPriorities(SchedulerPlugin):
    """Keeps the priorities the scheduler assigned to the pipeline keys of every graph."""

    name = "test-record-pipeline-priorities"

    def __init__(self):
        self.priorities = {}

    def update_graph(self, scheduler, *, priority, **kwargs):
        self.priorities.update({k: p for k, p in priority.items() if parse_pipeline_key(k)})


def _recorded(dask_scheduler):
    return dask_scheduler.plugins[_RecordPriorities.name].priorities


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_the_scheduler_gets_priorities_in_the_schedule_order(client4, schedule):
    model, x, y = problem()
    client4.register_plugin(_RecordPriorities())
    try:
        with DistributedCompressedMLP(
            model, client4, stages=2, microbatches=4, schedule=schedule, messages="tasks"
        ) as pipe:
            pipe.train_step(x, y, lr=0.1)
            recorded = client4.run_on_scheduler(_recorded)
    finally:
        client4.unregister_scheduler_plugin(_RecordPriorities.name)
    for s in range(2):
        passes = {
            parse_pipeline_key(k): p
            for k, p in recorded.items()
            if parse_pipeline_key(k).stage == s and parse_pipeline_key(k).kind in ("fwd", "bwd")
        }
        by_priority = sorted(passes, key=passes.get)  # Dask runs the smallest tuple first
        got = [("F" if k.kind == "fwd" else "B", k.microbatch) for k in by_priority]
        assert got == stage_order(schedule, 2, s, 4)
        update = recorded[pipeline_key(pipe.token, "update", 1, s, 0)]
        assert all(update[0] > p[0] for p in passes.values())


class _RecordConsumers(SchedulerPlugin):
    """Keeps, for every pipeline key of every graph, the keys of the tasks that read it."""

    name = "test-record-pipeline-consumers"

    def __init__(self):
        self.consumers = {}

    def update_graph(self, scheduler, *, keys, **kwargs):
        for ts in scheduler.tasks.values():
            if parse_pipeline_key(ts.key):
                self.consumers[ts.key] = [d.key for d in ts.dependents]


def _consumers(dask_scheduler):
    return dask_scheduler.plugins[_RecordConsumers.name].consumers


def test_a_message_is_read_on_the_sender_only_by_tasks_that_run_at_once(client4):
    """Every key a task of another stage replica reads is a pass (or an fp16 flag) with one
    remote reader, read on the sender only by tasks that are processing as soon as it ends
    (its mark, or a pass that needs nothing else): a key the sender reads later could lose the
    sender's copy to Dask's active memory manager and be fetched back, beyond the byte
    formula."""
    rng = np.random.default_rng(7)
    weights = [rng.uniform(-1, 1, (a, b)) for a, b in zip(SIZES[:-1], SIZES[1:], strict=True)]
    biases = [rng.uniform(-0.1, 0.1, b) for b in SIZES[1:]]
    model = CompressedMLP(weights, magnitude_masks(weights, 0.6), biases, precision="fp16")
    x, y = rng.uniform(0, 1, (16, SIZES[0])), rng.integers(0, SIZES[-1], 16)
    client4.register_plugin(_RecordConsumers())
    try:
        with DistributedCompressedMLP(
            model, client4, stages=2, replicas=2, microbatches=4, messages="tasks"
        ) as pipe:
            pipe.train_step(x, y, lr=0.1)
            consumers = client4.run_on_scheduler(_consumers)
    finally:
        client4.unregister_scheduler_plugin(_RecordConsumers.name)
    messages = 0
    for key, readers in consumers.items():
        sender = parse_pipeline_key(key)
        parsed = [parse_pipeline_key(r) for r in readers]
        remote = [
            r for r in parsed
            if r is not None and (r.stage, r.replica) != (sender.stage, sender.replica)
        ]
        local = [r for r in parsed if r not in remote]
        if sender.kind in ("fwd", "bwd") and remote:
            messages += 1
            assert len(remote) == 1, (key, readers)
            assert all(
                r.kind == f"{sender.kind}-done" or (r.kind, r.stage) in (("fwd", 0), ("bwd", 1))
                for r in local
            ), (key, readers)
        elif remote:
            assert sender.kind in ("finite", "verdict"), (key, readers)
    assert messages == 2 * 1 * 4 * 2  # 2 (S - 1) m D
