"""Data-parallel training of the embedding MLP (Parallax): every architecture equals the
one-process run, the measured bytes equal the prediction and Table 3 of Kim et al., the shard
count search, and bad input."""

from __future__ import annotations

import gc
import os
import re
import signal
import sys
import time

import dask
import numpy as np
import pytest
from dask.task_spec import TaskRef
from distributed import Client, get_task_stream
from plugin_checks import key_cache_bound_count
from polling import HANG_GUARD
from stopped_workers import SignalOnTransition, stopped, wait_until_empty

from dasknn.data_parallel import (
    DistributedEmbeddingMLP,
    _hybrid,
    _model,
    machine_bytes,
    machine_total,
)
from dasknn.data_parallel._posted import step_tasks
from dasknn.data_parallel._search import balanced, search_partitions
from dasknn.data_parallel._worker_state import ReplicaState
from dasknn.exceptions import StepTimeoutError, WorkerLostError
from dasknn.model import EmbeddingMLP
from dasknn.optim import SGD, Adam
from dasknn.runtime.cluster import local_cluster, scheduler_workers
from dasknn.runtime.keys import dp_postbox_key, parse_dp_key
from dasknn.runtime.measure import TOPIC as TRANSFER_TOPIC
from dasknn.runtime.posted import WorkerProgram
from dasknn.runtime.worker_memory import PLUGIN_NAME as REUSE_MEMORY_PLUGIN

V, C, D = 24, 2, 3
STEPS = 5


@pytest.fixture(scope="module")
def client4():
    """One real LocalCluster of 4 single-thread worker processes for the whole module."""
    with local_cluster(4) as cluster, Client(cluster) as client:
        yield client


def _batches(n_workers: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Five global batches: repeated ids inside and across windows; one batch with fewer windows
    than workers (a worker with no rows); ids from a narrow range (workers that touch no row of
    some shards)."""
    rng = np.random.default_rng(seed)
    sizes = [11, n_workers - 1, 9, 7, 13]
    out = []
    for step, size in enumerate(sizes):
        high = 6 if step == 2 else V  # step 3: only rows 0..5
        X = rng.integers(0, high, (size, C))
        X[0, :] = X[-1, 0]  # a repeated id
        out.append((X, rng.integers(0, V, size)))
    return out


def _one_process(model, batches, optimizer):
    reference = model.copy()
    for X, y in batches:
        reference.train_step(X, y, optimizer=optimizer)
    return reference


def _assert_same(got, want, atol):
    np.testing.assert_allclose(got.embedding, want.embedding, rtol=0, atol=atol)
    for a, b in zip(got.dense_variables(), want.dense_variables(), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=atol)


# (architecture, workers, shards, machines of 2 workers each, combine, optimizer)
CASES = [
    ("hybrid", 2, 1, False, "concat", "sgd"),
    ("hybrid", 3, 5, False, "sum", "adam"),
    ("hybrid", 4, 8, True, "mean", "sgd"),
    ("hybrid", 4, 3, False, "concat", "sgd"),
    ("ps", 2, 4, False, "mean", "adam"),
    ("ps", 3, 2, False, "concat", "sgd"),
    ("ps", 4, 5, True, "sum", "sgd"),
    ("ar", 2, None, True, "sum", "sgd"),
    ("ar", 3, None, False, "mean", "sgd"),
    ("ar", 4, None, False, "concat", "adam"),
    ("ar-dense", 2, None, False, "concat", "sgd"),
    ("ar-dense", 3, None, False, "sum", "adam"),
    ("ar-dense", 4, None, True, "mean", "sgd"),
]


MESSAGES = ["tasks", "posted"]


def _matrix(cases, messages, fast):
    """Every case with every way of sending messages, those in ``fast`` in the default run and
    the others marked ``slow`` (run with ``--runslow``)."""
    return [
        pytest.param(*case, m, marks=() if (*case, m) in fast else pytest.mark.slow)
        for case in cases
        for m in messages
    ]


# every architecture, both ways of sending, both optimizers, every combine, machines or not
FIVE_STEP_FAST = {
    ("hybrid", 4, 8, True, "mean", "sgd", "posted"),
    ("hybrid", 3, 5, False, "sum", "adam", "tasks"),
    ("ps", 4, 5, True, "sum", "sgd", "tasks"),
    ("ps", 3, 2, False, "concat", "sgd", "posted"),
    ("ar", 4, None, False, "concat", "adam", "posted"),
    ("ar-dense", 4, None, True, "mean", "sgd", "tasks"),
}


@pytest.mark.parametrize(
    "arch,n,shards,local,combine,opt,messages", _matrix(CASES, MESSAGES, FIVE_STEP_FAST)
)
def test_five_steps_equal_one_process(client4, arch, n, shards, local, combine, opt, messages):
    workers = sorted(scheduler_workers(client4))[:n]
    machines = {w: i // 2 for i, w in enumerate(workers)} if local else None
    model = EmbeddingMLP(V, C, D, hidden=(4,), combine=combine, dtype=np.float64, seed=n)
    optimizer = SGD(lr=0.4, momentum=0.5) if opt == "sgd" else Adam(lr=0.05)
    batches = _batches(n)
    want = _one_process(model, batches, optimizer)
    with DistributedEmbeddingMLP(
        model,
        client4,
        architecture=arch,
        sparse_partitions=shards,
        machines=machines,
        workers=workers,
        shard_rows="div" if shards == 5 else "mod",
        messages=messages,
    ) as dp:
        losses = [dp.train_step(X, y, optimizer=optimizer) for X, y in batches]
        _assert_same(dp.gather(), want, 1e-9)
        report = dp.comm_report()
    assert report.exact, str(report)
    assert report.steps == STEPS and report.total() > 0
    assert np.isfinite(losses).all()
    if local:  # machines of two workers: the first sums and talks to the other machines
        assert machine_total(report, scope="intra") > 0
        assert (machine_total(report, scope="inter") > 0) == (n > 2)


SAMPLED_CASES = [
    ("hybrid", 3, 2, False, "sgd"),
    ("hybrid", 4, 5, True, "adam"),
    ("ps", 2, 3, False, "adam"),
    ("ar", 3, None, False, "adam"),
    ("ar-dense", 4, None, True, "sgd"),
]


@pytest.mark.slow
@pytest.mark.parametrize("messages", MESSAGES)
@pytest.mark.parametrize("arch,n,shards,local,opt", SAMPLED_CASES)
def test_sampled_softmax_five_steps_equal_one_process(
    client4, arch, n, shards, local, opt, messages
):
    """The output table of a sampled softmax is a sparse variable: on the parameter servers
    (hybrid, ps), allgathered (ar) or densified (ar-dense); every way equals one process."""
    workers = sorted(scheduler_workers(client4))[:n]
    machines = {w: i // 2 for i, w in enumerate(workers)} if local else None
    model = EmbeddingMLP(
        V,
        C,
        D,
        hidden=(4,),
        n_classes=20,
        dtype=np.float64,
        seed=n,
        output="sampled",
        n_sampled=6,
    )
    optimizer = SGD(lr=0.4, momentum=0.5) if opt == "sgd" else Adam(lr=0.05)
    batches = [(X, y % 20) for X, y in _batches(n)]
    want = _one_process(model, batches, optimizer)
    with DistributedEmbeddingMLP(
        model,
        client4,
        architecture=arch,
        sparse_partitions=shards,
        machines=machines,
        workers=workers,
        messages=messages,
    ) as dp:
        for X, y in batches:
            dp.train_step(X, y, optimizer=optimizer)
        got = dp.gather()
        report = dp.comm_report()
    _assert_same(got, want, 1e-9)
    for a, b in zip(got.weights + got.biases, want.weights + want.biases, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-9)
    assert got.n_steps_ == want.n_steps_ == STEPS
    assert report.exact, str(report)
    assert 0 < report.details["alpha"]["softmax"] < 1
    assert set(report.by("what")) <= {
        "embedding",
        "softmax",
        "sparse",
        "dense",
        "hidden1.weight",
        "hidden1.bias",
    }
    if arch in ("hybrid", "ps"):  # the servers' rows travel in pull and push only
        assert report.by("phase").keys() <= {
            "pull",
            "push",
            "to-chief",
            "from-chief",
            "reduce-scatter",
            "allgather",
        }


def test_float32_and_fit(client4):
    model = EmbeddingMLP(V, C, D, hidden=(4,), dtype=np.float32, seed=1)
    rng = np.random.default_rng(5)
    X, y = rng.integers(0, V, (40, C)), rng.integers(0, V, 40)
    want = model.copy().fit(X, y, batch_size=9, epochs=1, lr=0.3, seed=2)
    with DistributedEmbeddingMLP(model, client4, architecture="hybrid", sparse_partitions=3) as dp:
        assert dp.fit(X, y, batch_size=9, epochs=1, lr=0.3, seed=2) is dp
        _assert_same(dp.gather(), want, 1e-5)
        assert dp.loss_curve_ == pytest.approx(want.loss_curve_, rel=1e-5)
        assert dp.predict(X).shape == (40,)
        assert dp.score(X, y) == pytest.approx(want.score(X, y))
        assert dp.comm_report().exact


# (architecture, workers, shards, machines of 2 workers each, sampled softmax, messages)
INFERENCE_CASES = [
    ("hybrid", 4, 3, True, False, "posted"),
    ("hybrid", 3, 5, False, True, "tasks"),
    ("ps", 4, 5, True, True, "posted"),
    ("ps", 2, 2, False, False, "tasks"),
    ("ar", 3, None, False, True, "posted"),
    ("ar-dense", 4, None, True, False, "tasks"),
]


# every architecture but ar-dense (which the five-step cases hold), both ways of sending,
# sampled or not, machines or not
INFERENCE_FAST = {
    ("hybrid", 4, 3, True, False, "posted"),
    ("ps", 2, 2, False, False, "tasks"),
    ("ar", 3, None, False, True, "posted"),
}


@pytest.mark.parametrize(
    "arch,n,shards,local,sampled,messages",
    [
        pytest.param(*case, marks=() if case in INFERENCE_FAST else pytest.mark.slow)
        for case in INFERENCE_CASES
    ],
)
def test_inference_on_the_workers_equals_the_gathered_model(
    client4, arch, n, shards, local, sampled, messages
):
    """``predict``, ``predict_proba``, ``decision_function``, ``evaluate``, ``perplexity`` and
    ``score`` run on the workers, ``batch_size`` windows a pass (the last pass leaves a worker
    without windows), and equal the gathered one-process model's; the passes' messages are
    measured and predicted alike, and are no training steps."""
    workers = sorted(scheduler_workers(client4))[:n]
    machines = {w: i // 2 for i, w in enumerate(workers)} if local else None
    classes = {"n_classes": 20, "output": "sampled", "n_sampled": 6} if sampled else {}
    model = EmbeddingMLP(V, C, D, hidden=(4,), dtype=np.float64, seed=n, **classes)
    batches = [(X, y % model.spec.n_classes) for X, y in _batches(n)]
    X = np.concatenate([X for X, _ in batches])
    y = np.concatenate([y for _, y in batches])
    with DistributedEmbeddingMLP(
        model,
        client4,
        architecture=arch,
        sparse_partitions=shards,
        machines=machines,
        workers=workers,
        messages=messages,
    ) as dp:
        for Xb, yb in batches:
            dp.train_step(Xb, yb, optimizer=Adam(lr=0.05))
        batch_size = (X.shape[0] - 1) // 3  # 4 passes, the last of 3 windows
        labels = dp.predict(X, batch_size=batch_size)
        proba = dp.predict_proba(X, batch_size=batch_size)
        logits = dp.decision_function(X, batch_size=batch_size)
        loss = dp.evaluate(X, y, batch_size=batch_size)
        perplexity = dp.perplexity(X, y)
        score = dp.score(X, y, batch_size=batch_size)
        report = dp.comm_report()
        one = dp.gather()
    np.testing.assert_array_equal(labels, one.predict(X))
    assert labels.dtype == np.int64
    np.testing.assert_allclose(proba, one.predict_proba(X), rtol=0, atol=1e-12)
    np.testing.assert_allclose(logits, one.decision_function(X), rtol=0, atol=1e-12)
    assert loss == pytest.approx(one.evaluate(X, y), rel=0, abs=1e-12)
    assert perplexity == pytest.approx(one.perplexity(X, y), rel=1e-12)
    assert score == one.score(X, y)
    assert report.exact, str(report)
    assert report.steps == STEPS
    inference = {p for p in report.by("phase") if p.startswith("predict-")}
    if arch in ("hybrid", "ps"):  # the servers send the rows of the windows, as in a step
        assert "predict-pull" in inference
    else:  # every row is in every worker's replica
        assert not inference


def _forget_sent(client) -> None:
    """Empty the workers' logs of the data they sent (a log of the last few hundred sends)."""
    client.run(lambda dask_worker: dask_worker.transfer_outgoing_log.clear())


def _sent_to_clients(client) -> int:
    """Bytes the workers sent to clients since :func:`_forget_sent` (a worker's own fetches
    name the worker)."""
    return sum(
        client.run(
            lambda dask_worker: sum(
                entry["total"]
                for entry in dask_worker.transfer_outgoing_log
                if entry["who"] is None
            )
        ).values()
    )


def test_inference_pulls_the_rows_of_the_windows_and_never_gathers_the_model(client4):
    """The client receives the per-window results only (labels: 8 bytes a window), and the
    servers send each machine the rows of its windows only, as a training step's pull: far
    less than the model, which is never read whole."""
    vocab, dim, n = 1000, 8, 4
    workers = sorted(scheduler_workers(client4))
    model = EmbeddingMLP(vocab, C, dim, hidden=(4,), n_classes=5, dtype=np.float64, seed=2)
    rng = np.random.default_rng(3)
    X = rng.integers(0, 10, (20, C))  # the windows read 10 of the 1000 rows
    batch_size = 8
    machines = {w: i // 2 for i, w in enumerate(workers)}
    with DistributedEmbeddingMLP(
        model, client4, sparse_partitions=n, machines=machines, messages="tasks"
    ) as dp:
        _forget_sent(client4)
        labels = dp.predict(X, batch_size=batch_size)
        assert _sent_to_clients(client4) == labels.nbytes == 8 * X.shape[0]
        _forget_sent(client4)
        proba = dp.predict_proba(X, batch_size=batch_size)
        assert _sent_to_clients(client4) == proba.nbytes == 8 * 5 * X.shape[0]
        report = dp.comm_report()
        assert dp._gathered is None  # what gather() reads it keeps: nothing was read
        np.testing.assert_array_equal(labels, dp.gather().predict(X))
    assert report.exact, str(report)
    assert report.steps == 0
    assert set(report.by("phase")) == {"predict-pull", "predict-from-chief"}
    # shard p (rows r = p mod 4) on worker p; the chiefs are workers 0 and 2
    pulled = 0
    for start in range(0, X.shape[0], batch_size):
        blocks = np.array_split(X[start : start + batch_size], n)
        for chief in (0, 2):
            union = np.unique(np.concatenate(blocks[chief : chief + 2]))
            pulled += dim * 8 * int(np.count_nonzero(union % n != chief))
    assert report.total(phase="predict-pull") == 2 * pulled  # predict, then predict_proba
    values = sum(v.nbytes for v in model.variables().values())
    assert report.total() + labels.nbytes + proba.nbytes < values / 4


@pytest.mark.parametrize(
    "arch,local,messages",
    _matrix(
        [("hybrid", True), ("ps", False)],
        MESSAGES,
        {("hybrid", True, "posted"), ("ps", False, "tasks")},
    ),
)
def test_fit_prefetching_rows_equals_one_process(client4, arch, local, messages):
    """``fit`` knows each next batch: the servers send the chiefs the next step's rows right
    after stepping them, across epochs too; the steps stay exact (sampled softmax, Adam)."""
    workers = sorted(scheduler_workers(client4))[:3]
    machines = {w: i // 2 for i, w in enumerate(workers)} if local else None
    model = EmbeddingMLP(
        V,
        C,
        D,
        hidden=(4,),
        n_classes=20,
        dtype=np.float64,
        seed=2,
        output="sampled",
        n_sampled=5,
    )
    rng = np.random.default_rng(3)
    X, y = rng.integers(0, V, (23, C)), rng.integers(0, 20, 23)
    optimizer = Adam(lr=0.05)
    want = model.copy().fit(X, y, batch_size=6, epochs=2, seed=4, optimizer=optimizer)
    with DistributedEmbeddingMLP(
        model,
        client4,
        architecture=arch,
        sparse_partitions=3,
        machines=machines,
        workers=workers,
        messages=messages,
    ) as dp:
        dp.fit(X, y, batch_size=6, epochs=2, seed=4, optimizer=optimizer)
        got = dp.gather()
        report = dp.comm_report()
    for a, b in zip(
        [got.embedding, *got.weights, *got.biases],
        [want.embedding, *want.weights, *want.biases],
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-9)
    assert dp.loss_curve_ == pytest.approx(want.loss_curve_, rel=1e-9)
    assert report.exact, str(report)
    # one pull a step per chief and server on another worker (shard p on worker p), carrying
    # every sparse variable's rows
    chiefs = [0, 2] if local else [0, 1, 2]
    remote = sum(1 for c in chiefs for p in range(3) if p != c)
    pulls = [v[1] for k, v in report.measured.items() if k[:2] == ("sparse", "pull")]
    assert sum(pulls) == report.steps * remote


def _fit_equals_one_process(client, arch, n, shards, messages, rows, batch):
    """``fit`` of a sampled-softmax model (Adam, two epochs) on ``n`` workers and in one
    process, the values equal to 1e-9 and every byte predicted; returns the model and the
    distributed fit's report."""
    workers = sorted(scheduler_workers(client))[:n]
    model = EmbeddingMLP(
        V, C, D, hidden=(5,), n_classes=20, dtype=np.float64, seed=n, output="sampled", n_sampled=5
    )
    rng = np.random.default_rng(n)
    X, y = rng.integers(0, V, (rows, C)), rng.integers(0, 20, rows)
    optimizer = Adam(lr=0.05)
    want = model.copy().fit(X, y, batch_size=batch, epochs=2, seed=1, optimizer=optimizer)
    with DistributedEmbeddingMLP(
        model, client, architecture=arch, sparse_partitions=shards, workers=workers,
        messages=messages,
    ) as dp:  # fmt: skip
        dp.fit(X, y, batch_size=batch, epochs=2, seed=1, optimizer=optimizer)
        got = dp.gather()
        report = dp.comm_report()
    for a, b in zip(
        [got.embedding, *got.weights, *got.biases],
        [want.embedding, *want.weights, *want.biases],
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-9)
    assert report.exact, str(report)
    return model, report


@pytest.mark.parametrize(
    "arch,n,shards,messages",
    [("hybrid", 4, 4, "posted"), ("hybrid", 3, 5, "tasks"), ("ps", 3, 3, "posted")],
)
def test_rows_a_step_leaves_unchanged_are_sent_ahead_and_the_steps_stay_exact(
    client4, monkeypatch, arch, n, shards, messages
):
    """The next step's rows that the step under way does not update travel in a message of
    their own before it (phase ``prefetch``; every such message here, the threshold set to 0),
    the rest after the update (with the reduced dense chunk where it rides): the steps are those
    of one process and every byte is predicted."""
    monkeypatch.setattr(_hybrid, "PREFETCH_MIN_BYTES", 0)
    _, report = _fit_equals_one_process(client4, arch, n, shards, messages, 40, 10)
    ahead = sum(v[1] for k, v in report.measured.items() if k[:2] == ("sparse", "prefetch"))
    assert ahead > 0


@pytest.mark.parametrize(
    "n,shards,messages", _matrix([(4, 4), (3, 6)], MESSAGES, {(4, 4, "posted"), (3, 6, "tasks")})
)
def test_dense_gradient_rides_the_sparse_messages(client4, n, shards, messages):
    """``hybrid`` with the servers exactly the chiefs reduces the dense gradient on them inside
    the push and the next step's pull: no reduce-scatter message, the reduced chunks in
    messages of their own only after the last step of ``fit`` (nothing to prefetch), the
    allreduce's bytes 2 (N - 1) n s a step, and the steps those of one process (sampled
    softmax, Adam, across epochs)."""
    model, report = _fit_equals_one_process(client4, "hybrid", n, shards, messages, 26, 7)
    steps = report.steps
    assert steps == 8
    phases = {k[1] for k in report.measured}
    assert "reduce-scatter" not in phases
    dense_items = sum(int(np.prod(s)) for s in model.spec.dense_shapes())
    assert report.by("what")["dense"] == 2 * (n - 1) * dense_items * 8 * steps
    dense_messages = sum(v[1] for k, v in report.measured.items() if k[0] == "dense")
    assert dense_messages == n * (n - 1)  # the last step's reduced chunks
    for phase in ("push", "pull"):
        carried = sum(v[0] for k, v in report.measured.items() if k[:2] == ("dense", phase))
        assert carried > 0


@pytest.mark.parametrize("per_task", [1, 2, 5])
def test_fit_runs_steps_per_task_as_one_process(client4, per_task):
    """``messages="posted"``: each worker's task runs ``steps_per_task`` consecutive steps of
    ``fit`` (5 steps: 5, 3 and 1 submissions), prefetching inside the task and across tasks;
    the steps are those of one process, and the bytes stay per step and equal the prediction."""
    workers = sorted(scheduler_workers(client4))[:3]
    model = EmbeddingMLP(V, C, D, hidden=(4,), combine="sum", dtype=np.float64, seed=7)
    rng = np.random.default_rng(8)
    X, y = rng.integers(0, V, (23, C)), rng.integers(0, V, 23)
    optimizer = SGD(lr=0.3, momentum=0.5)
    want = model.copy().fit(X, y, batch_size=5, seed=3, optimizer=optimizer, record_batches=True)
    with DistributedEmbeddingMLP(
        model, client4, sparse_partitions=3, workers=workers, steps_per_task=per_task
    ) as dp:
        start = time.time()  # the scheduler's clock: it runs in this process
        with get_task_stream(client4) as stream:
            dp.fit(X, y, batch_size=5, seed=3, optimizer=optimizer, record_batches=True)
        _assert_same(dp.gather(), want, 1e-9)
        report = dp.comm_report()
        events = [msg for stamp, msg in client4.get_events(TRANSFER_TOPIC) if stamp >= start]
    # Dask's own fetches (the postbox actors' handles) are reported one an event with a "key"
    posted = [msg for msg in events if "key" not in msg]
    assert dp.batch_loss_curve_ == pytest.approx(want.batch_loss_curve_, rel=1e-9)
    runs = [task for task in stream.data if "'run'" in str(task["key"])]
    assert len(runs) == len(workers) * -(-STEPS // per_task)
    # each task reports the messages its worker received in one event, not one event a message
    assert len(posted) <= len(runs)
    assert sum(len(msg["transfers"]) for msg in posted) == sum(
        count for _, count in report.measured.values()
    )
    assert report.exact, str(report)
    assert report.steps == STEPS
    pushes = [v[1] for k, v in report.measured.items() if k[:2] == ("sparse", "push")]
    assert sum(pushes) == STEPS * len(workers) * (len(workers) - 1)  # one per chief and server


def test_calls_are_sized_by_the_time_a_step_took():
    """``fit`` hands the model about ``CALL_SECONDS`` of steps at once, in whole tasks: one
    task before any step was timed, at least 1 and at most ``MAX_TASKS_PER_CALL``."""
    assert _model.CALL_SECONDS == 3.0
    assert _model._tasks_per_call(20, None) == 1
    assert _model._tasks_per_call(20, 0.05) == 3
    assert _model._tasks_per_call(4, 0.1) == 8  # 7.5, rounded
    assert _model._tasks_per_call(20, 1.0) == 1
    assert _model._tasks_per_call(20, 1e-6) == _model._tasks_per_call(20, 0.0)
    assert _model._tasks_per_call(20, 0.0) == _model.MAX_TASKS_PER_CALL == 10


@pytest.mark.minversions
def test_tasks_of_one_call_wait_for_their_workers_task_before():
    """The run task of each worker in a call's later task depends on that worker's task before
    (a key of an earlier submission), and on nothing else of it."""
    before = [TaskRef(("earlier", w)) for w in range(3)]
    programs = [[WorkerProgram(w, (), {}, ()) for w in range(3)]]
    tasks, outputs = step_tasks("t0ken", [7], programs, ["box0", "box1", "box2"], before)
    assert [parse_dp_key(key).sender for key in outputs] == [0, 1, 2]
    for w, key in enumerate(outputs):
        assert tasks[key].dependencies == {("earlier", w), "box0", "box1", "box2"}
    alone, _ = step_tasks("t0ken", [7], programs, ["box0", "box1", "box2"])
    assert all(task.dependencies == {"box0", "box1", "box2"} for task in alone.values())


@pytest.mark.minversions  # a future of an earlier submission as a task's dependency
@pytest.mark.parametrize("seconds,calls", [(1e9, 2), (1e-9, 4)])
def test_fit_submits_the_tasks_of_a_call_one_behind_the_other(client4, monkeypatch, seconds, calls):
    """``fit`` hands the model one task of steps first, then about ``CALL_SECONDS`` of steps
    (here a lifetime: the 21 steps left in one call, two tasks of 10 and one of 1, submitted
    one behind the other; then a nanosecond: one task a call); ``train_step`` times nothing.
    Every task runs ``steps_per_task`` steps, and the steps are those of one process."""
    monkeypatch.setattr(_model, "CALL_SECONDS", seconds)
    workers = sorted(scheduler_workers(client4))[:2]
    model = EmbeddingMLP(V, C, D, hidden=(4,), dtype=np.float64, seed=5)
    rng = np.random.default_rng(9)
    X, y = rng.integers(0, V, (64, C)), rng.integers(0, V, 64)
    optimizer = SGD(lr=0.2, momentum=0.5)
    want = model.copy()
    want.train_step(X[:2], y[:2], optimizer=optimizer)
    want.fit(X[2:], y[2:], batch_size=2, seed=4, optimizer=optimizer, record_batches=True)
    with DistributedEmbeddingMLP(
        model, client4, sparse_partitions=2, workers=workers, steps_per_task=10
    ) as dp:
        dp.train_step(X[:2], y[:2], optimizer=optimizer)
        counts = {"get": 0, "gather": 0}
        for name in counts:  # count the client's submissions and gathers, then call them
            real = getattr(client4, name)

            def counting(*args, real=real, name=name, **kwargs):
                counts[name] += 1
                return real(*args, **kwargs)

            monkeypatch.setattr(client4, name, counting)
        with get_task_stream(client4) as stream:
            dp.fit(X[2:], y[2:], batch_size=2, seed=4, optimizer=optimizer, record_batches=True)
        monkeypatch.undo()
        _assert_same(dp.gather(), want, 1e-9)
        report = dp.comm_report()
    assert dp.batch_loss_curve_ == pytest.approx(want.batch_loss_curve_, rel=1e-9)
    assert report.exact, str(report)
    assert report.steps == 32
    # the fit's run tasks (step 2 on): the stream's window, taken by the workers' clocks, may
    # also hold train_step's (step 1) that finished just before it opened
    keys = [parse_dp_key(task["key"]) for task in stream.data]
    runs = [key for key in keys if key is not None and key.phase == "run" and key.step >= 2]
    assert len(runs) == len(workers) * 4  # 31 steps: 10, 10, 10, 1
    assert counts == {"get": 4, "gather": calls}  # one submission a task, one gather a call


def test_fit_while_the_client_refreshes_its_scheduler_info(client4):
    """The model looks for lost workers before every step. A client refreshing its cached
    scheduler info every 2 ms (a read of the cache that overlaps a refresh sees no worker, as
    about 1 read in 20,000 does at the default 2 s) still finds every worker each time and
    trains as one process does."""
    workers = sorted(scheduler_workers(client4))
    interval = {"distributed.client.scheduler-info-interval": "2ms"}
    with dask.config.set(interval), Client(client4.scheduler.address) as client:
        assert all(sorted(scheduler_workers(client)) == workers for _ in range(300))
        model = EmbeddingMLP(V, C, D, hidden=(4,), dtype=np.float64, seed=3)
        rng = np.random.default_rng(8)
        X, y = rng.integers(0, V, (30, C)), rng.integers(0, V, 30)
        want = model.copy().fit(X, y, batch_size=5, epochs=2, lr=0.2, seed=1)
        with DistributedEmbeddingMLP(model, client, sparse_partitions=2, workers=workers[:2]) as dp:
            dp.fit(X, y, batch_size=5, epochs=2, lr=0.2, seed=1)
            _assert_same(dp.gather(), want, 1e-9)


def _alpha_batch(n_workers: int, rows: int):
    """Worker i's windows use exactly the consecutive rows i*rows .. (i+1)*rows - 1."""
    rng = np.random.default_rng(0)
    blocks = []
    for i in range(n_workers):
        ids = np.concatenate(
            [np.arange(i * rows, (i + 1) * rows), rng.integers(i * rows, (i + 1) * rows, rows)]
        )
        blocks.append(rng.permutation(ids).reshape(-1, C))
    X = np.concatenate(blocks)
    return X, rng.integers(0, 64, X.shape[0])


@pytest.mark.parametrize("arch", ["hybrid", "ps", "ar", "ar-dense"])
def test_bytes_follow_table_3(client4, arch):
    """Per machine bytes equal Kim et al.'s Table 3 with alpha = 1/4 exactly (N = 4)."""
    n, vocab, dim = 4, 64, 4
    model = EmbeddingMLP(vocab, C, dim, hidden=(8,), dtype=np.float32)
    X, y = _alpha_batch(n, vocab // n)
    with DistributedEmbeddingMLP(model, client4, architecture=arch, sparse_partitions=n) as dp:
        dp.train_step(X, y, lr=0.1)
        report = dp.comm_report()
    assert report.exact
    alpha = 0.25
    assert report.details["alpha"]["embedding"] == pytest.approx(alpha)
    w = vocab * dim * 4
    # the servers' messages carry the rows of every sparse variable: here the embedding only
    emb = machine_bytes(
        report,
        variable="sparse" if arch in ("hybrid", "ps") else "embedding",
        phases=("pull", "push", "allgather", "reduce-scatter"),
    )
    expected = {
        "hybrid": 4 * alpha * w * (n - 1) / n,
        "ps": 4 * alpha * w * (n - 1) / n,
        "ar": 2 * alpha * w * (n - 1),
        "ar-dense": 4 * w * (n - 1) / n,
    }[arch]
    assert emb == {m: expected for m in range(n)}
    sizes = [int(np.prod(shape)) * 4 for shape in model.spec.dense_shapes()]
    if arch == "ps":  # one variable per server: the server 2w(N-1), the others 2w
        for index, (name, wv) in enumerate(zip(model.spec.dense_names(), sizes, strict=True)):
            server = index % n
            got = machine_bytes(report, variable=name)
            assert got == {m: 2 * wv * (n - 1) if m == server else 2 * wv for m in range(n)}
    else:  # m dense variables fused in one allreduce: 4 w m (N - 1) / N
        got = machine_bytes(report, variable="dense")
        assert got == {m: 4 * sum(sizes) * (n - 1) / n for m in range(n)}


@pytest.mark.parametrize(
    "t1,t2,start", [(100.0, 1.0, 1), (400.0, 1.0, 2), (50.0, 2.0, 4), (3.0, 1.0, 2)]
)
def test_search_finds_the_cost_minimum(t1, t2, start):
    calls = []

    def measure(p):
        calls.append(p)
        return 7.0 + t1 / p + t2 * p

    report = search_partitions(measure, start, max_partitions=10_000)
    assert len(calls) <= 5 and len(set(calls)) == len(calls)
    assert abs(report.choice - round(np.sqrt(t1 / t2))) <= 1
    assert report.theta[1] == pytest.approx(t1) and str(report).startswith("shard-count search")


def test_search_chooses_a_count_that_loads_the_servers_evenly():
    # the busiest of 4 servers holds ceil(P / 4) of the P shards: t = 50 + 400 ceil(P/4) / P
    def measure(p):
        return 50.0 + 400.0 * -(-p // 4) / p

    free = search_partitions(measure, 4, max_partitions=64)
    even = search_partitions(measure, 4, max_partitions=64, servers=4)
    assert [p for p, _ in even.samples] == [4, 8, 2] and even.theta == free.theta
    assert 4 < free.choice < 8  # the fit's integer minimum: an imbalanced count
    assert even.choice in (4, 8)
    assert measure(even.choice) < measure(free.choice)
    assert [p for p in range(1, 13) if balanced(p, 4)] == [1, 2, 3, 4, 8, 12]


@pytest.mark.parametrize("messages", MESSAGES)
def test_auto_search_keeps_the_values(client4, messages):
    model = EmbeddingMLP(V, C, D, hidden=(4,), dtype=np.float64)
    X, y = next(iter(_batches(2)))
    want = _one_process(model, [(X, y)], SGD(lr=0.1))
    workers = sorted(scheduler_workers(client4))[:2]
    with DistributedEmbeddingMLP(
        model,
        client4,
        sparse_partitions="auto",
        search_steps=2,
        search_warmup=1,
        workers=workers,
        messages=messages,
    ) as dp:
        dp.train_step(X, y, lr=0.1)
        report = dp.search_report()
        assert 1 <= len(report.samples) <= 5
        assert (
            min(p for p, _ in report.samples) <= report.choice <= max(p for p, _ in report.samples)
        )
        assert dp.n_shards == report.choice
        _assert_same(dp.gather(), want, 1e-12)
        assert dp.comm_report().steps == 1


def test_bad_input_before_anything_is_scheduled(client4):
    model = EmbeddingMLP(V, C, D, hidden=(4,))
    workers = sorted(scheduler_workers(client4))
    bad = [
        ({"architecture": "allreduce"}, "unknown architecture"),
        ({"shard_rows": "hash"}, "shard_rows"),
        ({"sparse_partitions": 0}, "number of shards"),
        ({"sparse_partitions": V + 1}, "number of shards"),
        ({"sparse_partitions": 2.5}, "number of shards"),
        ({"machines": {w: 0 for w in workers[:3]}}, "leaves out"),
        ({"machines": {**{w: 0 for w in workers}, "tcp://10.0.0.1:1": 1}}, "does not train on"),
        ({"workers": ["tcp://10.0.0.1:1"]}, "not workers"),
        ({"search_steps": 2, "search_warmup": 2}, "must exceed"),
        ({"search_mode": "grid"}, "search_mode"),
        ({"messages": "actors"}, "unknown messages"),
        ({"steps_per_task": 0}, "steps_per_task"),
        ({"steps_per_task": 1.5}, "steps_per_task"),
        ({"messages": "tasks", "steps_per_task": 2}, "steps_per_task"),
        ({"reuse_memory": "yes"}, "reuse_memory"),
    ]
    plugins_before = _plugin_names(client4)
    for kwargs, match in bad:
        with pytest.raises(ValueError, match=match):
            DistributedEmbeddingMLP(model, client4, **kwargs)
    assert _plugin_names(client4) == plugins_before
    with DistributedEmbeddingMLP(model, client4) as dp:
        workers = len(scheduler_workers(client4))
        assert key_cache_bound_count(client4, dp.token) == 1 + workers
        # the default holds the workers' malloc setting while placed
        assert f"{REUSE_MEMORY_PLUGIN}-{dp.token}" in _scheduler_plugins(client4)
        for X, y, match in [
            (np.full((3, C), V), np.zeros(3, int), "outside the vocabulary"),
            (np.zeros((3, C + 1), int), np.zeros(3, int), "shape"),
            (np.zeros((3, C), int), np.full(3, -1), "outside the classes"),
            (np.full((3, C), 0.5), np.zeros(3, int), "integers"),
        ]:
            with pytest.raises(ValueError, match=match):
                dp.train_step(X, y, lr=0.1)
        X, y = np.zeros((3, C), int), np.zeros(3, int)
        for call, match in [
            (lambda: dp.predict(np.full((3, C), V)), "outside the vocabulary"),
            (lambda: dp.predict_proba(np.zeros((3, C + 1), int)), "shape"),
            (lambda: dp.decision_function(np.full((3, C), 0.5)), "integers"),
            (lambda: dp.predict(X, batch_size=0), "batch_size"),
            (lambda: dp.score(X, np.full(3, -1)), "outside the classes"),
            (lambda: dp.evaluate(X, y[:2]), "one label per window"),
            (lambda: dp.perplexity(X, y, batch_size=1.5), "batch_size"),
        ]:
            with pytest.raises(ValueError, match=match):
                call()
        # any pass of four workers on four machines has messages (if of no bytes)
        assert dp.comm_report().steps == 0 and dp.comm_report().total() == 0
        assert dp.comm_report().messages() == 0
    assert key_cache_bound_count(client4, dp.token) == 0


def _plugin_names(client):
    return client.run(lambda dask_worker: sorted(dask_worker.plugins))


def _scheduler_plugins(client) -> list[str]:
    """The names of the worker plugins the scheduler gives every (new) worker."""
    return client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.worker_plugins))


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the tuning applies to glibc's malloc"
)
def _buffer_counts(dask_worker, token: str) -> tuple[int, int, int]:
    buffers = ReplicaState.on_worker(token, dask_worker).buffers
    return buffers.taken, buffers.made, buffers.held()


def test_posted_steps_reuse_their_arrays_after_warm_up(client4):
    """``messages="posted"``: the arrays of a step (temporaries and the values it posts) come
    from the worker's step buffers; after a warm-up epoch the same batches again make (almost)
    none anew, though the rows a batch reads change size from step to step, the steps hold
    the arrays of a few steps only, and the values are those of one process."""
    workers = sorted(scheduler_workers(client4))[:3]
    model = EmbeddingMLP(V, C, D, hidden=(4,), combine="sum", dtype=np.float64, seed=7)
    rng = np.random.default_rng(8)
    X, y = rng.integers(0, V, (40, C)), rng.integers(0, V, 40)
    optimizer = SGD(lr=0.3, momentum=0.5)
    want = model.copy()
    with DistributedEmbeddingMLP(
        model, client4, sparse_partitions=3, workers=workers, steps_per_task=4
    ) as dp:
        for epochs in (1, 2):
            want.fit(X, y, batch_size=5, epochs=epochs, seed=3, optimizer=optimizer)
        dp.fit(X, y, batch_size=5, epochs=1, seed=3, optimizer=optimizer)
        warm = client4.run(_buffer_counts, token=dp.token, workers=workers)
        dp.fit(X, y, batch_size=5, epochs=2, seed=3, optimizer=optimizer)
        after = client4.run(_buffer_counts, token=dp.token, workers=workers)
        _assert_same(dp.gather(), want, 1e-9)
    for w in workers:
        taken, made = after[w][0] - warm[w][0], after[w][1] - warm[w][1]
        assert taken >= 16  # 16 steps, each takes arrays on every worker
        assert made <= taken // 4, (w, warm[w], after[w])
        assert after[w][2] <= 3 * warm[w][0] / 8  # at most three steps' arrays held


def test_reuse_memory_is_on_by_default_and_tunes_the_workers_until_close(client4):
    workers = sorted(scheduler_workers(client4))[:2]
    model = EmbeddingMLP(V, C, D, hidden=(4,), dtype=np.float64, seed=7)
    optimizer = SGD(lr=0.4, momentum=0.5)
    batches = _batches(2)[:3]
    want = _one_process(model, batches, optimizer)
    dp = DistributedEmbeddingMLP(model, client4, workers=workers)
    name = f"{REUSE_MEMORY_PLUGIN}-{dp.token}"
    try:
        assert name in _scheduler_plugins(client4)
        tuned = client4.run(lambda dask_worker: dask_worker.dasknn_malloc_tuned, workers=workers)
        assert tuned == {w: True for w in workers}
        for X, y in batches:
            dp.train_step(X, y, optimizer=optimizer)
        _assert_same(dp.gather(), want, 1e-9)
    finally:
        dp.close()
    assert name not in _scheduler_plugins(client4)
    assert all(name not in names for names in _plugin_names(client4).values())
    tuned = client4.run(lambda dask_worker: dask_worker.dasknn_malloc_tuned, workers=workers)
    assert tuned == {w: False for w in workers}  # back to the worker's own thresholds


def _exit_soon():
    """Kill this worker process a moment after answering (as a crash would)."""
    import threading

    threading.Timer(0.2, os._exit, (1,)).start()


@pytest.mark.slow
@pytest.mark.parametrize("messages,per_task", [("tasks", 1), ("posted", 1), ("posted", 5)])
def test_lost_worker_is_named_with_its_shards(messages, per_task):
    """A worker lost during ``train_step`` or, with 5 steps per task, during ``fit``: the
    training calls go on until one ends in the error (a call that starts after the loss names it
    too), failing if none has within a minute."""
    model = EmbeddingMLP(V, C, D, hidden=(4,))
    X, y = next(iter(_batches(2)))
    with local_cluster(2) as cluster, Client(cluster) as client:
        with DistributedEmbeddingMLP(
            model, client, sparse_partitions=4, messages=messages, steps_per_task=per_task
        ) as dp:
            dp.train_step(X, y, lr=0.1)
            victim = dp.workers[1]
            client.run(_exit_soon, workers=[victim])
            deadline = time.monotonic() + 60
            with pytest.raises(
                RuntimeError,
                match=r"worker .*: it held replica \d, shards \[1, 3\] of the embedding",
            ):
                while time.monotonic() < deadline:
                    if per_task == 1:
                        dp.train_step(X, y, lr=0.1)
                    else:
                        dp.fit(np.tile(X, (50, 1)), np.tile(y, 50), batch_size=len(y), lr=0.1)
    # the step's gather was cancelled: distributed's inner wait tasks end later with an error
    # nobody retrieves, logged (with a formatted traceback) when collected; collect them here,
    # not inside some later ast.parse, where CPython 3.11.7's AST converter fails with
    # "SystemError: AST constructor recursion depth mismatch" on the nested parse
    gc.collect()


def _step_keys(dask_scheduler, token: str) -> list:
    keys = (parse_dp_key(key) for key in dask_scheduler.tasks)
    return [key for key in keys if key is not None and key.token == token]


@pytest.mark.slow
def test_stopped_worker_is_named_after_the_step_timeout(client4):
    """A worker stopped (SIGSTOP) and still listed by the scheduler ends the step after
    ``step_timeout`` in a StepTimeoutError naming it, its shards and its state; the step's keys
    leave the scheduler and the model refuses further calls. (The programs of the step end
    within the 10 s each gives every post of its failure, the stopped worker's once it goes on
    and ``close()`` ended its waits.)"""
    model = EmbeddingMLP(V, C, D, hidden=(4,))
    X, y = next(iter(_batches(2)))
    workers = sorted(scheduler_workers(client4))[:2]
    with DistributedEmbeddingMLP(
        model, client4, sparse_partitions=4, workers=workers, step_timeout=3
    ) as dp:
        dp.train_step(X, y, lr=0.1)
        victim = dp.workers[1]
        with stopped(client4, victim):
            start = time.monotonic()
            named = (
                r"^the step did not finish within 3 s \(step_timeout\): .*worker "
                rf"{re.escape(victim)} \(replica 1, shards \[1, 3\] of the embedding\) has "
                "not been heard from for"
            )
            with pytest.raises(StepTimeoutError, match=named):
                dp.train_step(X, y, lr=0.1)
            assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing
            wait_until_empty(
                lambda: client4.run_on_scheduler(_step_keys, token=dp.token),
                30,
                "the step's keys stayed on the scheduler",
            )
            with pytest.raises(RuntimeError, match="unusable after a failed step"):
                dp.train_step(X, y, lr=0.1)
    gc.collect()  # the cancelled gather's inner tasks, as in the lost-worker test


@pytest.mark.slow
def test_a_stopped_worker_is_named_after_the_step_timeout_of_an_inference_pass(client4):
    """A worker stopped (SIGSTOP) during ``predict`` ends the pass after ``step_timeout`` in a
    StepTimeoutError naming it and its shards; the pass's keys leave the scheduler, and once the
    worker goes on the model predicts again (a pass changes no value)."""
    model = EmbeddingMLP(V, C, D, hidden=(4,), dtype=np.float64)
    X, y = next(iter(_batches(2)))
    workers = sorted(scheduler_workers(client4))[:2]
    with DistributedEmbeddingMLP(
        model, client4, sparse_partitions=4, workers=workers, step_timeout=30
    ) as dp:
        dp.train_step(X, y, lr=0.1)
        dp.step_timeout = 3  # placed (within 30 s on a busy machine): the pass's limit
        victim = dp.workers[1]
        with stopped(client4, victim):
            start = time.monotonic()
            named = (
                r"^the inference did not finish within 3 s \(step_timeout\): .*worker "
                rf"{re.escape(victim)} \(replica 1, shards \[1, 3\] of the embedding\) has "
                "not been heard from for"
            )
            with pytest.raises(StepTimeoutError, match=named):
                dp.predict(X)
            assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing
            wait_until_empty(
                lambda: client4.run_on_scheduler(_step_keys, token=dp.token),
                30,
                "the pass's keys stayed on the scheduler",
            )
        np.testing.assert_array_equal(dp.predict(X), dp.gather().predict(X))
    gc.collect()


@pytest.mark.slow
def test_a_stopped_worker_does_not_hold_up_close(client4):
    """A worker stopped (SIGSTOP) after a step, still listed by the scheduler: ``close()`` of a
    model with ``reuse_memory=True`` waits for it at most ``step_timeout`` (the removal of the
    malloc plugin included, not until Dask removes the worker), and no plugin of the model is
    left on the scheduler or any worker once it goes on."""
    model = EmbeddingMLP(V, C, D, hidden=(4,))
    X, y = next(iter(_batches(2)))
    # not the workers the step-timeout test above stopped: their failed step may still run
    workers = sorted(scheduler_workers(client4))[2:]
    dp = DistributedEmbeddingMLP(model, client4, workers=workers, reuse_memory=True, step_timeout=2)
    try:
        dp.train_step(X, y, lr=0.1)
        with stopped(client4, dp.workers[1]):
            start = time.monotonic()
            dp.close()
            assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing
    finally:
        dp.close()

    def held() -> list[str]:
        on_workers = [n for names in _plugin_names(client4).values() for n in names]
        on_scheduler = client4.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))
        names = [*on_scheduler, *_scheduler_plugins(client4), *on_workers]
        return [n for n in names if dp.token in n]

    wait_until_empty(held, 10, "a plugin of the model stayed after the worker went on")


def test_step_timeout_must_be_a_positive_finite_number(client4):
    model = EmbeddingMLP(V, C, D, hidden=(4,))
    for bad in (0, -1, float("nan"), float("inf"), "3", True, None):
        with pytest.raises(ValueError, match="step_timeout must be a number of seconds > 0"):
            DistributedEmbeddingMLP(model, client4, step_timeout=bad)


def _model_plugins(client) -> list[str]:
    """The data-parallel models' plugins and key-cache bounds on the scheduler and the workers."""
    on_workers = [n for ns in _plugin_names(client).values() for n in ns]
    on_scheduler = client.run_on_scheduler(
        lambda dask_scheduler: [*dask_scheduler.worker_plugins, *dask_scheduler.plugins]
    )
    return sorted(
        n
        for n in on_workers + on_scheduler
        if n.startswith(("dasknn-dp-", "dasknn-key-cache-bound-", REUSE_MEMORY_PLUGIN))
    )


@pytest.mark.slow
def test_a_worker_stopped_before_the_constructor_is_named_and_nothing_is_left(client4):
    """A worker stopped (SIGSTOP) before the model is placed: the constructor's registrations
    end after ``step_timeout`` in a StepTimeoutError naming it and what it was to hold, not
    waiting until Dask removes the worker; once it goes on, no plugin of the model
    (nor key-cache bound) is left on the scheduler or a worker."""
    before = _model_plugins(client4)
    workers = sorted(scheduler_workers(client4))[:2]
    named = (
        r"^the workers did not take the model while it was placed within 2 s \(step_timeout\): "
        rf"(.*; )?worker {re.escape(workers[1])} \(replica 1, "
    )
    with stopped(client4, workers[1]):
        start = time.monotonic()
        with pytest.raises(StepTimeoutError, match=named):
            DistributedEmbeddingMLP(
                EmbeddingMLP(V, C, D, hidden=(4,)), client4, workers=workers, step_timeout=2
            )
        took = time.monotonic() - start
    assert took < HANG_GUARD, took  # a hang guard, not a timing
    wait_until_empty(
        lambda: sorted(set(_model_plugins(client4)) - set(before)),
        10,
        "a plugin of the model stayed",
    )


#: The start of the keys of the data-parallel models' postbox actors.
POSTBOX_KEYS = dp_postbox_key("", 0).removesuffix("-0")


def _postbox_keys(dask_scheduler) -> list[str]:
    return [k for k in dask_scheduler.tasks if isinstance(k, str) and k.startswith(POSTBOX_KEYS)]


def _signal_when_postbox_starts(address: str, sent_signal: int) -> SignalOnTransition:
    """A worker plugin that sends its worker ``sent_signal`` as a data-parallel model's postbox
    starts there (the last call of the placement, after the registrations and the values), if it
    is the worker at ``address``."""
    return SignalOnTransition(
        "test-signal-when-postbox-starts", address, "executing", POSTBOX_KEYS, sent_signal
    )


@pytest.mark.slow
def test_a_worker_stopped_while_the_model_is_placed_is_named_and_nothing_is_left(client4):
    """A worker that stops (SIGSTOP) as its postbox starts, after the registrations and the
    values were placed: the constructor ends after ``step_timeout`` (and the bounded close) in
    a StepTimeoutError naming it with its replica, not waiting until Dask removes the
    worker; once it goes on, no plugin, key-cache bound or postbox of the model is left."""
    before = _model_plugins(client4)
    workers = sorted(scheduler_workers(client4))[:2]
    victim = workers[1]
    pid = client4.run(os.getpid, workers=[victim])[victim]
    named = (
        r"^the workers did not take the model while it was placed within 3 s \(step_timeout\): "
        rf"(.*; )?worker {re.escape(victim)} \(replica 1, shards \[1, 3\] of the embedding\) "
    )
    signalling = _signal_when_postbox_starts(victim, signal.SIGSTOP)
    client4.register_plugin(signalling)
    try:
        start = time.monotonic()
        with pytest.raises(StepTimeoutError, match=named):
            DistributedEmbeddingMLP(
                EmbeddingMLP(V, C, D, hidden=(4,)),
                client4,
                workers=workers,
                sparse_partitions=4,
                reuse_memory=True,
                step_timeout=3,
            )
        took = time.monotonic() - start
    finally:
        os.kill(pid, signal.SIGCONT)
        client4.unregister_worker_plugin(signalling.name)
    assert took < HANG_GUARD, took  # the placement, then a bounded close: a hang guard
    wait_until_empty(
        lambda: sorted(set(_model_plugins(client4)) - set(before)),
        10,
        "a plugin of the model stayed",
    )
    wait_until_empty(
        lambda: client4.run_on_scheduler(_postbox_keys), 10, "a postbox stayed on the scheduler"
    )


@pytest.mark.slow
def test_a_worker_stopped_when_the_search_places_the_values_again_is_named(client4):
    """A worker stopped (SIGSTOP) after the constructor, when the shard-count search places
    the values again: the search ends after ``step_timeout`` in a StepTimeoutError naming it
    with its replica and state, the model refuses further calls, closing it waits at most
    ``step_timeout``, and no plugin of the model is left once the worker goes on."""
    before = _model_plugins(client4)
    workers = sorted(scheduler_workers(client4))[:2]
    X, y = next(iter(_batches(2)))
    dp = DistributedEmbeddingMLP(
        EmbeddingMLP(V, C, D, hidden=(4,)),
        client4,
        workers=workers,
        sparse_partitions=4,
        step_timeout=3,
    )
    try:
        dp.gather()  # the search places these values without reading them again
        named = (
            r"^the workers did not take the model while it was placed within 3 s "
            rf"\(step_timeout\): worker {re.escape(workers[1])} \(replica 1, shards \[[0-9, ]+\] "
            r"of the embedding\) has not been heard from for"
        )
        with stopped(client4, workers[1]):
            start = time.monotonic()
            with pytest.raises(StepTimeoutError, match=named):
                dp.search(X, y)
            assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing
            with pytest.raises(RuntimeError, match="unusable after a failed step"):
                dp.train_step(X, y, lr=0.1)
            start = time.monotonic()
            dp.close()
            assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing
    finally:
        dp.close()
    wait_until_empty(
        lambda: sorted(set(_model_plugins(client4)) - set(before)),
        10,
        "a plugin of the model stayed",
    )


@pytest.mark.slow
def test_a_worker_lost_while_the_model_is_placed_is_named_and_nothing_is_left():
    """A worker killed (SIGKILL) as its postbox starts, while the model is placed: the
    constructor ends within a poll and the bounded close in a WorkerLostError naming it with its
    replica and shards, not a wait for ever on the postbox, and no plugin or postbox of the
    model is left."""
    model = EmbeddingMLP(V, C, D, hidden=(4,))
    with local_cluster(2) as cluster, Client(cluster) as client:
        # the workers' first placement imports the model's code, outside the 3 s below
        DistributedEmbeddingMLP(model, client).close()
        before = _model_plugins(client)
        victim = sorted(scheduler_workers(client))[1]
        named = (
            rf"^lost worker {re.escape(victim)}: it held replica 1, shards \[1, 3\] of the "
            r"embedding; the model could not be placed$"
        )
        signalling = _signal_when_postbox_starts(victim, signal.SIGKILL)
        client.register_plugin(signalling)
        try:
            start = time.monotonic()
            with pytest.raises(WorkerLostError, match=named):
                DistributedEmbeddingMLP(model, client, sparse_partitions=4, step_timeout=3)
            assert time.monotonic() - start < HANG_GUARD  # the loss, a bounded close: a hang guard
        finally:
            client.unregister_worker_plugin(signalling.name)
        wait_until_empty(
            lambda: sorted(set(_model_plugins(client)) - set(before)),
            10,
            "a plugin of the model stayed",
        )
        wait_until_empty(
            lambda: client.run_on_scheduler(_postbox_keys), 10, "a postbox stayed on the scheduler"
        )
