"""The distributed sampled network on a real LocalCluster (P = 1, 2, 3): against the numpy
float64 Adam reference with every neuron active, against the one-process model simulating the
same shards, exact predictions, and the bytes between workers against the formula."""

from __future__ import annotations

import os
import re
import signal
import sys
import time

import numpy as np
import pytest
import scipy.sparse as sp
from distributed import Client, LocalCluster
from plugin_checks import key_cache_bound_count
from polling import HANG_GUARD
from sampled_reference import AdamReference, reference_step, targets
from stopped_workers import (
    SignalOnTransition,
    keys_on_scheduler,
    keys_on_workers,
    stopped,
    wait_until_empty,
)

from dasknn.datasets import make_extreme_classification
from dasknn.exceptions import (
    ModelClosedError,
    ModelFailedError,
    StepTimeoutError,
    WorkerLostError,
)
from dasknn.optim import Adam
from dasknn.runtime.cluster import local_cluster, scheduler_workers
from dasknn.runtime.keys import parse_sampled_key
from dasknn.runtime.worker_memory import PLUGIN_NAME as REUSE_MEMORY_PLUGIN
from dasknn.sampled import SampledMLP
from dasknn.sampled_parallel import DistributedSampledMLP
from dasknn.sampled_parallel._worker_state import ShardState


@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(
            n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


def _workers(client, count: int) -> list[str]:
    return sorted(scheduler_workers(client))[:count]


@pytest.mark.slow
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_every_neuron_active_equals_numpy_adam(client, shards):
    rng = np.random.default_rng(shards)
    X = sp.csr_matrix(rng.uniform(0.1, 1.0, (40, 12)) / 3)
    labels = [list(rng.choice(10, rng.integers(1, 4), replace=False)) for _ in range(40)]
    model = SampledMLP(
        hidden=6,
        active_fraction=1.0,
        k=3,
        n_tables=4,
        shards=shards,
        hogwild=False,
        dtype="float64",
        optimizer=Adam(lr=0.01),
        seed=shards,
    ).initialize(12, 10)
    params = model.parameters()
    adam = AdamReference(0.01)
    dense, y = X.toarray(), targets(labels, 10)
    with DistributedSampledMLP(model, client, workers=_workers(client, shards)) as dist:
        for step in range(20):
            rows = slice((step % 2) * 20, (step % 2 + 1) * 20)
            loss = dist.train_step(X[rows], labels[rows])
            ref_loss, grads = reference_step(params, dense[rows], y[rows])
            adam.step(params, grads)
            assert loss == pytest.approx(ref_loss, rel=1e-10)
        for name, value in dist.gather().parameters().items():
            np.testing.assert_allclose(value, params[name], rtol=1e-9, atol=1e-9, err_msg=name)


# 3 batches of 50 an epoch, 2 epochs: the 6 steps rehash 3 times and redraw the tables once;
# predict in batches of 128 takes a whole and a partial batch
ROWS = 150


@pytest.mark.minversions  # also at the minimum versions (.ci/run)
@pytest.mark.parametrize(
    ("shards", "options"),
    [
        # SLIDE's sampled softmax
        (
            2,
            {
                "underflow": "stop",
                "correction": "none",
                "hashing": "plain",
                "uniform_fraction": 0.0,
                "hidden_update": "rows",
            },
        ),
        # the defaults, with no uniform share (which "stop" cannot draw)
        (3, {"underflow": "stop", "uniform_fraction": 0.0}),
        # bucket cap 6 of the layer, 3 a shard: the 45 neurons of a shard overflow 3-bit buckets
        (
            2,
            {"correction": "logq", "hashing": "mips", "uniform_fraction": 0.4, "bucket_size": 6},
        ),
        pytest.param(
            2,
            {
                "correction": "logq",
                "hashing": "mips",
                "uniform_fraction": 0.3,
                "hidden_update": "all",
            },
            marks=pytest.mark.slow,
        ),
    ],
)
def test_distributed_equals_the_local_model_simulating_its_shards(client, shards, options):
    data = make_extreme_classification(n_samples=ROWS, n_features=200, n_labels=90, seed=shards)
    local = SampledMLP(
        hidden=8,
        active_fraction=0.2,
        k=3,
        n_tables=4,
        shards=shards,
        hogwild=False,
        rehash_every=2,
        rebuild_every=5,
        seed=7,
        **options,
    ).initialize(200, 90)
    batch, hidden, itemsize = 50, 8, 4
    with DistributedSampledMLP(local, client, workers=_workers(client, shards)) as dist:
        local.fit(data.X, data.Y, epochs=2, batch_size=batch)
        dist.fit(data.X, data.Y, epochs=2, batch_size=batch)
        np.testing.assert_allclose(dist.loss_curve_, local.loss_curve_, rtol=1e-5)
        theirs = dist.gather().parameters()
        for name, value in local.parameters().items():
            np.testing.assert_allclose(theirs[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
        # bytes: the formula per phase, exactly; nothing else (no weight) moved
        steps = 2 * (ROWS // batch)
        report = dist.comm_report()
        measured = report.by("phase")
        per_step = {
            "hidden": (shards - 1) * batch * hidden * itemsize,
            "stats": shards * (shards - 1) * 2 * batch * itemsize,
            "grad": (shards - 1) * batch * hidden * itemsize,
        }
        assert measured == {phase: steps * b for phase, b in per_step.items()}
        assert report.exact and report.steps == steps
        assert report.messages() == 3 * steps * shards * (shards - 1)
        assert dist.predicted_bytes(batch) == per_step
        # to_dask: the gathered parameters (output rows in shard order), one chunk a shard
        arrays = dist.to_dask()
        order = np.concatenate([local.shard_map_.ids(p) for p in range(shards)])
        for name, value in theirs.items():
            expected = value[order] if name.startswith("output") else value
            np.testing.assert_array_equal(arrays[name].compute(), expected, err_msg=name)
            assert arrays[name].numblocks[0 if name.startswith("output") else -1] == shards
        # predictions: exact top-k over all neurons, from the gathered parameters in numpy
        dist.reset_comm()
        top = dist.predict(data.X, k=3, batch_size=128)
        h = np.maximum(data.X.toarray() @ theirs["hidden_weights"] + theirs["hidden_bias"], 0)
        scores = h @ theirs["output_weights"].T + theirs["output_bias"]
        expected = np.argsort(-scores, axis=1, kind="stable")[:, :3]
        np.testing.assert_array_equal(top, expected)
        report = dist.comm_report()
        assert report.by("phase") == {"predict-hidden": (shards - 1) * ROWS * hidden * itemsize}
        assert report.exact
        np.testing.assert_array_equal(local.predict(data.X, k=3), top)
        hits = [len(set(expected[i, :2]) & set(data.Y[i].indices)) for i in range(ROWS)]
        assert dist.precision_at_k(data.X, data.Y, k=2) == pytest.approx(np.mean(hits) / 2)


def test_bad_input_fails_before_anything_is_scheduled(client):
    model = SampledMLP(hidden=4, active_fraction=0.2, k=2, n_tables=2, shards=2).initialize(6, 20)
    with pytest.raises(ValueError, match="2 shards but 3 distinct workers"):
        DistributedSampledMLP(model, client, workers=_workers(client, 3))
    with pytest.raises(ValueError, match="messages must be one of"):
        DistributedSampledMLP(model, client, messages="posted")
    with DistributedSampledMLP(model, client, workers=_workers(client, 2)) as dist:
        workers = len(scheduler_workers(client))
        assert key_cache_bound_count(client, dist.token) == 1 + workers
        X = sp.csr_matrix(np.ones((3, 6), dtype=np.float32))
        for bad_x, bad_y, message in [
            (sp.csr_matrix(np.ones((3, 5))), [[0], [1], [2]], "5 features, the model expects 6"),
            (X, [[0], [], [2]], "training row 1 has no label"),
            (X, [[0], [25], [2]], "labels out of range"),
            (X.multiply(np.nan).tocsr(), [[0], [1], [2]], "NaN or infinite"),
            (X, [[0, 1, 2, 3, 4, 5, 6], [1], [2]], "more than its budget"),
            (X, [[0], [1.5], [2]], "row 1 of Y holds labels that are not integers"),
        ]:
            with pytest.raises(ValueError, match=message):
                dist.train_step(bad_x, bad_y)
        assert dist.n_steps_ == 0 and dist.comm_report().total() == 0
        with pytest.raises(ValueError, match="k must be"):
            dist.predict(X, k=0)
        with pytest.raises(ValueError, match="k is 21, but the model has only 20 labels"):
            dist.predict(X, k=21)
        with pytest.raises(ValueError, match="batch_size"):
            dist.fit(X, [[0], [1], [2]], batch_size=0)
    with pytest.raises(ModelClosedError, match="closed"):
        dist.predict(X)
    assert key_cache_bound_count(client, dist.token) == 0


def test_sampled_keys_are_built_parsed_and_described():
    from dasknn.runtime.keys import (
        describe,
        parse_sampled_key,
        phase_names,
        sampled_key,
        step_key,
    )

    key = sampled_key("abc", 7, "grad", 1, 0)
    assert key == ("dasknn-slide-abc", 7, "grad", 1, 0)
    assert parse_sampled_key(key) == ("abc", 7, "grad", 1, 0)
    assert describe(key) == ("abc", "grad", None)
    step = step_key(phase_names("abc")["fwd"], 7, 0, 1, 0, 0)
    assert parse_sampled_key(step) is None and describe(step) == ("abc", "forward", 1)
    assert parse_sampled_key(("dasknn-slide-abc", 1, "grad", 0)) is None


def _exit_soon():
    """Kill this worker process a moment after answering (as a crash would)."""
    import threading

    threading.Timer(0.2, os._exit, (1,)).start()


@pytest.mark.slow
def test_lost_worker_ends_training_with_an_error_naming_it():
    data = make_extreme_classification(n_samples=200, n_features=60, n_labels=40, seed=1)
    model = SampledMLP(hidden=4, active_fraction=0.2, k=2, n_tables=2, shards=2, seed=3)
    model.initialize(60, 40)
    with local_cluster(2) as cluster, Client(cluster) as client:
        with DistributedSampledMLP(model, client, workers=_workers(client, 2)) as dist:
            dist.train_step(data.X[:50], data.Y[:50])
            victim = dist.workers[1]
            client.run(_exit_soon, workers=[victim])
            lost = f"lost worker {re.escape(victim)}: it held shard 1 of the model"
            with pytest.raises(RuntimeError, match=lost):
                for _ in range(100):
                    dist.train_step(data.X[:50], data.Y[:50])


def _model_keys(dask_scheduler, token: str) -> list:
    keys = (parse_sampled_key(key) for key in dask_scheduler.tasks)
    return [key for key in keys if key is not None and key.token == token]


@pytest.mark.slow
def test_stopped_worker_is_named_after_the_step_timeout(client):
    """A shard worker stopped (SIGSTOP) and still listed by the scheduler ends ``fit`` after
    ``step_timeout`` in a StepTimeoutError naming it, its shard and its state; the steps' keys
    (the one queued behind included) leave the scheduler and the model refuses further calls."""
    data = make_extreme_classification(n_samples=200, n_features=60, n_labels=40, seed=1)
    model = SampledMLP(hidden=6, active_fraction=0.2, k=2, n_tables=2, shards=3, seed=3)
    model.initialize(60, 40)
    with DistributedSampledMLP(model, client, workers=_workers(client, 3), step_timeout=3) as dist:
        dist.train_step(data.X[:50], data.Y[:50])
        victim = dist.workers[1]
        with stopped(client, victim):
            start = time.monotonic()
            named = (
                r"^the shards' results did not arrive within 3 s \(step_timeout\): .*worker "
                rf"{re.escape(victim)} \(shard 1\) has not been heard from for"
            )
            with pytest.raises(StepTimeoutError, match=named):
                dist.fit(data.X, data.Y, batch_size=50)
            assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing
            wait_until_empty(
                lambda: client.run_on_scheduler(_model_keys, token=dist.token),
                30,
                "the steps' keys stayed on the scheduler",
            )
            with pytest.raises(ModelFailedError, match="unusable after a failed step"):
                dist.predict(data.X[:10])


def test_step_timeout_must_be_a_positive_finite_number(client):
    model = SampledMLP(hidden=4, shards=1, seed=3).initialize(12, 10)
    for bad in (0, -2, float("nan"), float("inf"), "3", True, None):
        with pytest.raises(ValueError, match="step_timeout must be a number of seconds > 0"):
            DistributedSampledMLP(model, client, workers=_workers(client, 1), step_timeout=bad)


def _malloc(dask_worker) -> tuple[bool, bool]:
    """Whether the worker's malloc setting is on, and whether a model holds it by plugin."""
    held = any(n.startswith(REUSE_MEMORY_PLUGIN) for n in dask_worker.plugins)
    return dask_worker.__dict__.get("dasknn_malloc_tuned", False), held


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the tuning applies to glibc's malloc"
)
def _arrays_made(dask_worker, token: str) -> int:
    return ShardState.on_worker(token, dask_worker).buffers.made


def test_steps_reuse_the_arrays_of_their_forward_pass(client):
    """A shard's forward values of a step (the batch's hidden activation, active set, logits)
    and a rehash's projections come from the worker's buffers and go back after its backward
    pass or the rehash: after a warm-up epoch (with rehashes) the steps make none anew, and
    they are the local model's steps."""
    data = make_extreme_classification(n_samples=100, n_features=60, n_labels=40, seed=1)
    local = SampledMLP(
        hidden=8, active_fraction=0.3, shards=2, hogwild=False, seed=7, rehash_every=2
    )
    local.initialize(60, 40)
    with DistributedSampledMLP(local, client, workers=_workers(client, 2)) as dist:
        local.fit(data.X, data.Y, epochs=1, batch_size=25)
        dist.fit(data.X, data.Y, epochs=1, batch_size=25)
        made = client.run(_arrays_made, token=dist.token, workers=_workers(client, 2))
        local.fit(data.X, data.Y, epochs=2, batch_size=25)
        dist.fit(data.X, data.Y, epochs=2, batch_size=25)
        again = client.run(_arrays_made, token=dist.token, workers=_workers(client, 2))
        np.testing.assert_allclose(dist.loss_curve_, local.loss_curve_, rtol=1e-5)
    assert min(made.values()) > 0 and again == made


def test_reuse_memory_is_on_by_default_until_close(client):
    model = SampledMLP(hidden=4, shards=2, seed=3).initialize(12, 10)
    workers = _workers(client, 2)
    with pytest.raises(ValueError, match="reuse_memory must be True or False, got 1"):
        DistributedSampledMLP(model, client, workers=workers, reuse_memory=1)
    with DistributedSampledMLP(model, client, workers=workers, reuse_memory=False):
        assert set(client.run(_malloc, workers=workers).values()) == {(False, False)}
    with DistributedSampledMLP(model, client, workers=workers):
        assert set(client.run(_malloc, workers=workers).values()) == {(True, True)}
    assert set(client.run(_malloc, workers=workers).values()) == {(False, False)}


def _sampled_plugins(client) -> list[str]:
    """The names of sampled models' plugins and key-cache bounds on the workers and the
    scheduler (worker plugins it hands to new workers, and its own plugins)."""

    def on_scheduler(dask_scheduler) -> list[str]:
        return [*dask_scheduler.worker_plugins, *dask_scheduler.plugins]

    held = client.run(lambda dask_worker: list(dask_worker.plugins))
    names = [n for ns in held.values() for n in ns] + client.run_on_scheduler(on_scheduler)
    return sorted(n for n in names if n.startswith(("dasknn-sampled-", "dasknn-key-cache-bound-")))


@pytest.mark.slow
def test_a_worker_stopped_before_the_constructor_is_named_and_nothing_is_left(client):
    """A shard worker stopped (SIGSTOP) before the model is placed: the constructor ends after
    ``step_timeout`` in a StepTimeoutError naming it and its shard, not waiting until
    Dask removes the worker; once it goes on, no plugin of the model is left."""
    model = SampledMLP(hidden=6, active_fraction=0.5, k=2, n_tables=2, shards=3, seed=3)
    model.initialize(12, 10)
    before = _sampled_plugins(client)
    workers = _workers(client, 3)
    named = (
        r"^the workers did not take the model while it was placed within 2 s \(step_timeout\): "
        rf"(.*; )?worker {re.escape(workers[1])} \(shard 1\) "
    )
    with stopped(client, workers[1]):
        start = time.monotonic()
        with pytest.raises(StepTimeoutError, match=named):
            DistributedSampledMLP(model, client, workers=workers, step_timeout=2)
        took = time.monotonic() - start
    assert took < HANG_GUARD, took  # a hang guard, not a timing
    wait_until_empty(
        lambda: sorted(set(_sampled_plugins(client)) - set(before)),
        10,
        "a plugin of the model stayed",
    )


@pytest.mark.slow
def test_a_shard_worker_lost_while_the_model_is_placed_is_named_and_nothing_is_left():
    """A shard worker killed (SIGKILL) as its shard is installed: the constructor ends within a
    poll and the bounded close in a WorkerLostError naming it, and no plugin or key of the model
    (payload or install) is left."""
    model = SampledMLP(hidden=4, active_fraction=0.2, k=2, n_tables=2, shards=2, seed=3)
    model.initialize(60, 40)
    with local_cluster(2) as cluster, Client(cluster) as client:
        workers = _workers(client, 2)
        # the workers' first placement imports the model's code, outside the 3 s below
        DistributedSampledMLP(model, client, workers=workers).close()
        before = _sampled_plugins(client)
        named = (
            rf"^lost worker {re.escape(workers[1])}: its shard of the model could not be placed$"
        )
        # kills its worker as the shard install starts there (the placement's last call)
        kill = SignalOnTransition(
            "test-kill-when-shard-installs", workers[1], "executing", "install_shard-",
            signal.SIGKILL,
        )
        client.register_plugin(kill)
        try:
            start = time.monotonic()
            with pytest.raises(WorkerLostError, match=named):
                DistributedSampledMLP(model, client, workers=workers, step_timeout=3)
            assert time.monotonic() - start < HANG_GUARD  # the loss, a bounded close: a hang guard
        finally:
            client.unregister_worker_plugin(kill.name)
        wait_until_empty(
            lambda: sorted(set(_sampled_plugins(client)) - set(before)),
            10,
            "a plugin of the model stayed",
        )
        wait_until_empty(
            lambda: client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.tasks)),
            10,
            "a key of the model stayed on the scheduler",
        )


def _payload_keys(client) -> list[str]:
    """The shard payloads' keys (``dict-``) the scheduler or a worker holds, or of which the
    client holds a future."""
    on_client = [str(key) for key in client.futures if str(key).startswith("dict-")]
    return sorted([*keys_on_scheduler(client, "dict-"), *keys_on_workers(client, "dict-"),
                   *on_client])


@pytest.mark.slow
def test_a_shard_scatter_given_up_at_a_stopped_worker_leaves_nothing_once_it_goes_on(client):
    """The second shard worker stopped (SIGSTOP) as the first one takes its shard, so that the
    second shard's scatter waits for it: the constructor ends after ``step_timeout`` in a
    StepTimeoutError naming it and its shard, and once the worker goes on (and takes the payload
    the scheduler still sends it) no key of a payload is left, on the scheduler, on a worker or
    on the client."""
    model = SampledMLP(hidden=6, active_fraction=0.5, k=2, n_tables=2, shards=2, seed=3)
    model.initialize(12, 10)
    workers = _workers(client, 2)
    # the workers' first placement imports the model's code, outside the 2 s below
    DistributedSampledMLP(model, client, workers=workers).close()
    pid = client.run(os.getpid, workers=[workers[1]])[workers[1]]
    named = (
        r"^the workers did not take the model while it was placed within 2 s \(step_timeout\): "
        rf"(.*; )?worker {re.escape(workers[1])} \(shard 1\) "
    )
    # stops the second worker, once, as a shard's payload (a scattered dict-) reaches the first
    stop = SignalOnTransition(
        "test-stop-another-when-scattered", workers[0], "memory", "dict-", signal.SIGSTOP,
        pid=pid, once=True,
    )
    client.register_plugin(stop)
    try:
        with pytest.raises(StepTimeoutError, match=named):
            DistributedSampledMLP(model, client, workers=workers, step_timeout=2)
    finally:
        os.kill(pid, signal.SIGCONT)
        client.unregister_worker_plugin(stop.name)
    wait_until_empty(lambda: _payload_keys(client), 10, "a shard's payload stayed")
