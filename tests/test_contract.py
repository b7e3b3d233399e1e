"""The one public contract of the distributed models, checked on every one of them alike (in the
manner of scikit-learn's ``estimator_checks``): a model added later passes by being added to
:data:`CASES`.

Each case builds a small float64 one-process estimator, its data and its distributed model on a
real two-worker LocalCluster. The checks: ``fit`` returns the model and sets the same fitted
attributes; ``gather()`` equals the one-process estimator trained on the same data (float64,
1e-9); ``predict`` and ``score`` equal the gathered model's; the measured traffic equals the
prediction; the parameters are dask arrays held on their workers; ``close()`` leaves no key,
plugin or actor, and a closed model refuses work; ``client`` may be a scheduler address; bad
input is a ``ValueError`` before anything is scheduled, and so are bad workers given to
``rebalance``; ``rebalance`` places the model on a worker that joined and training goes on to
the one-process estimator's values (slow); a SIGKILLed worker is a ``WorkerLostError`` and a
SIGSTOPped one a ``StepTimeoutError`` (in ``fit`` and in ``to_dask()``), both naming the
worker's role, and a worker that closes at the end of its ``--lifetime`` mid-fit is recovered
from the checkpoint, and a worker paused at its memory limit is a ``StepTimeoutError`` naming the
limit (slow).
"""

from __future__ import annotations

import _thread
import gc
import inspect
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from distributed import Client, LocalCluster, wait
from polling import poll, wait_until
from random_layers import random_layers
from retirement import pausing_cluster

from dasknn.data_parallel import DistributedEmbeddingMLP
from dasknn.exceptions import (
    ModelClosedError,
    ModelFailedError,
    NonFiniteLossError,
    StepTimeoutError,
    WorkerLostError,
)
from dasknn.model import CompressedMLP, EmbeddingMLP, SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.pipeline_parallel import DistributedCompressedMLP
from dasknn.pruning import magnitude_masks
from dasknn.runtime.cluster import scheduler_workers
from dasknn.runtime.faults import running_workers
from dasknn.sampled import SampledMLP
from dasknn.sampled_parallel import DistributedSampledMLP

ROWS = 32


@dataclass
class Case:
    """One distributed model under the contract.

    ``estimator()`` makes a fresh one-process estimator, ``data()`` the training rows,
    ``distributed(estimator, client, **options)`` the distributed model on the two workers,
    ``fit`` the keyword arguments of both ``fit`` calls, ``parameters(estimator)`` the arrays
    compared, and ``bad`` the malformed ``(X, y)`` that must be a ``ValueError``."""

    name: str
    estimator: Callable[[], Any]
    data: Callable[[], tuple[Any, Any]]
    distributed: Callable[..., Any]
    fit: dict
    parameters: Callable[[Any], dict[str, np.ndarray]]
    bad: Callable[[Any, Any], list[tuple[Any, Any, str]]]
    options: dict = field(default_factory=dict)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# ------------------------------------------------------------------ model-parallel
def _sparse_estimator() -> SparseMLP:
    weights, biases = random_layers([12, 16, 10], 0.4, seed=1)
    return SparseMLP(
        weights, biases, activation="relu", loss="softmax_cross_entropy", dtype=np.float64
    )


def _dense_rows() -> tuple[np.ndarray, np.ndarray]:
    rng = _rng(2)
    return rng.uniform(0, 1, (ROWS, 12)), rng.integers(0, 10, ROWS)


def _sparse_distributed(estimator, client, **options):
    parts = [np.arange(n) % 2 for n in estimator.layer_sizes]
    return DistributedSparseMLP(estimator, client, partition=parts, **options)


def _sparse_parameters(model) -> dict[str, np.ndarray]:
    out = {f"weights_{k}": w.toarray() for k, w in enumerate(model.weights)}
    out |= {f"bias_{k}": np.asarray(b) for k, b in enumerate(model.biases)}
    return out


def _dense_bad(X, y) -> list[tuple[Any, Any, str]]:
    nan = X.copy()
    nan[3, 2] = np.nan
    return [
        (X[:, :-1], y, "shape|features|columns|width"),
        (nan, y, "finite|NaN|nan"),
        (X, np.where(np.arange(len(y)) == 4, 10, y), "label|class|range"),
        (X[:0], y[:0], "empty|no row|no sample|no window|at least one"),
        (X, y[:-1], "rows|length|shape|labels for"),
    ]


# ------------------------------------------------------------------ data-parallel
VOCAB, CONTEXT = 24, 2


def _embedding_estimator() -> EmbeddingMLP:
    return EmbeddingMLP(VOCAB, CONTEXT, embed_dim=3, hidden=(4,), dtype=np.float64, seed=3)


def _windows() -> tuple[np.ndarray, np.ndarray]:
    rng = _rng(4)
    return rng.integers(0, VOCAB, (ROWS, CONTEXT)), rng.integers(0, VOCAB, ROWS)


def _embedding_distributed(estimator, client, **options):
    return DistributedEmbeddingMLP(
        estimator, client, architecture="hybrid", sparse_partitions=2, **options
    )


def _embedding_parameters(model) -> dict[str, np.ndarray]:
    out = {"embedding": np.asarray(model.embedding)}
    out |= {f"dense_{i}": np.asarray(v) for i, v in enumerate(model.dense_variables())}
    return out


def _windows_bad(X, y) -> list[tuple[Any, Any, str]]:
    return [
        (X[:, :-1], y, "context|shape|columns"),
        (np.where(X == X[0, 0], VOCAB, X), y, "id|vocab|range"),
        (X, np.where(np.arange(len(y)) == 4, VOCAB, y), "label|class|range"),
        (X.astype(float) + 0.5, y, "integer|int"),
        (X[:0], y[:0], "empty|no window|at least one"),
    ]


# ------------------------------------------------------------------ pipeline / compressed
def _compressed_estimator() -> CompressedMLP:
    rng = _rng(5)
    sizes = (12, 16, 14, 10)
    weights = [rng.uniform(-1, 1, (a, b)) for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
    biases = [rng.uniform(-0.1, 0.1, b) for b in sizes[1:]]
    return CompressedMLP(weights, magnitude_masks(weights, 0.6), biases, precision="fp64")


def _compressed_distributed(estimator, client, **options):
    return DistributedCompressedMLP(estimator, client, stages=2, microbatches=2, **options)


def _compressed_parameters(model) -> dict[str, np.ndarray]:
    out = {f"weights_{k}": np.asarray(w) for k, w in enumerate(model.weights)}
    out |= {f"bias_{k}": np.asarray(b) for k, b in enumerate(model.biases)}
    return out


# ------------------------------------------------------------------ LSH-sampled
def _sampled_estimator() -> SampledMLP:
    # the learning rate decays over the model's first 8 steps, not over each fit call's own
    # steps, so that a call resumed with more epochs takes the steps of the longer call
    return SampledMLP(
        hidden=6, active_fraction=1.0, k=3, n_tables=4, shards=2, hogwild=False,
        dtype="float64", seed=6, decay_horizon=8,
    ).initialize(12, 10)  # fmt: skip


def _sampled_rows() -> tuple[sp.csr_matrix, sp.csr_matrix]:
    rng = _rng(7)
    X = sp.csr_matrix(rng.uniform(0.1, 1.0, (ROWS, 12)) / 3)
    labels = sp.lil_matrix((ROWS, 10), dtype=np.float32)
    for i in range(ROWS):
        labels[i, rng.choice(10, rng.integers(1, 4), replace=False)] = 1
    return X, labels.tocsr()


def _sampled_distributed(estimator, client, **options):
    return DistributedSampledMLP(estimator, client, **options)


def _sampled_parameters(model) -> dict[str, np.ndarray]:
    return {name: np.asarray(value) for name, value in model.parameters().items()}


def _sampled_bad(X, Y) -> list[tuple[Any, Any, str]]:
    nan = X.toarray()
    nan[3, 2] = np.nan
    wide = sp.hstack([Y, sp.csr_matrix((ROWS, 1))]).tolil()
    wide[4, 10] = 1
    wide = wide.tocsr()
    return [
        (X[:, :-1], Y, "features|shape|columns"),
        (sp.csr_matrix(nan), Y, "finite|NaN|nan"),
        (X, wide, "label|range|columns"),
        (X[:0], Y[:0], "empty|no row|no sample|no window|at least one"),
        (X, Y[:-1], "rows|length|shape"),
    ]


CASES = [
    Case(
        "model-parallel", _sparse_estimator, _dense_rows, _sparse_distributed,
        {"batch_size": 8, "epochs": 2, "lr": 0.1, "seed": 0}, _sparse_parameters, _dense_bad,
    ),
    Case(
        "data-parallel", _embedding_estimator, _windows, _embedding_distributed,
        {"batch_size": 8, "epochs": 2, "lr": 0.1, "seed": 0}, _embedding_parameters,
        _windows_bad,
    ),
    Case(
        "pipeline", _compressed_estimator, _dense_rows, _compressed_distributed,
        {"batch_size": 8, "epochs": 2, "lr": 0.1, "seed": 0}, _compressed_parameters,
        _dense_bad,
    ),
    Case(
        "sampled", _sampled_estimator, _sampled_rows, _sampled_distributed,
        {"batch_size": 8, "epochs": 2, "lr": 0.01, "seed": 0}, _sampled_parameters,
        _sampled_bad,
    ),
]  # fmt: skip
IDS = [case.name for case in CASES]


@pytest.fixture(scope="module")
def client(dask_client):
    """The two-worker LocalCluster every test module shares (conftest's ``dask_client``)."""
    return dask_client


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def trained(request, client):
    """``(case, distributed model fitted once, its fit's return value, X, y)``, closed after the
    module's checks of the case."""
    case = request.param
    X, y = case.data()
    dist = case.distributed(case.estimator(), client)
    returned = dist.fit(X, y, **case.fit, progress=False)
    try:
        yield case, dist, returned, X, y
    finally:
        dist.close()


def _one_process(case: Case, X, y):
    """The case's estimator trained in this process with the arguments of the distributed
    ``fit`` that its own ``fit`` takes."""
    reference = case.estimator()
    accepted = inspect.signature(reference.fit).parameters
    reference.fit(X, y, **{k: v for k, v in case.fit.items() if k in accepted})
    return reference


def _transitions(client) -> int:
    return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.transition_counter)


def _quiet_transitions(client, still: float = 0.3, seconds: float = 30) -> int:
    """The scheduler's transition count once it has not moved for ``still`` seconds (releases
    of an earlier check end asynchronously)."""
    deadline = time.monotonic() + seconds
    count, since = _transitions(client), time.monotonic()
    while time.monotonic() - since < still:
        assert time.monotonic() < deadline, "the scheduler did not come to rest"
        time.sleep(0.05)
        now = _transitions(client)
        if now != count:
            count, since = now, time.monotonic()
    return count


def _held_by(client, token: str) -> dict:
    """What of the model ``token`` the cluster still holds: keys and holds on shared plugins on
    the scheduler, plugins and actors on the workers."""

    def on_workers(dask_worker):
        return {
            "plugins": [name for name in dask_worker.plugins if token in name],
            "data": [str(k) for k in dask_worker.data if token in str(k)],
            "actors": [str(k) for k in dask_worker.state.actors if token in str(k)],
        }

    keys = client.run_on_scheduler(
        lambda dask_scheduler: [str(k) for k in dask_scheduler.tasks if token in str(k)]
    )
    holds = client.run_on_scheduler(
        lambda dask_scheduler: [
            name for name, p in dask_scheduler.plugins.items() if token in getattr(p, "users", ())
        ]
    )
    workers = client.run(on_workers)
    return {"scheduler": keys, "scheduler plugins held": holds} | {
        f"{addr} {what}": names for addr, held in workers.items() for what, names in held.items()
    }


# ------------------------------------------------------------------ the checks
def test_fit_returns_the_model_and_sets_the_fitted_attributes(trained):
    case, dist, returned, X, y = trained
    assert returned is dist
    batches = -(-X.shape[0] // case.fit["batch_size"])
    assert len(dist.loss_curve_) == case.fit["epochs"]
    assert all(np.isfinite(dist.loss_curve_))
    assert dist.n_steps_ == case.fit["epochs"] * batches
    assert dist.optimizer_ is not None


def test_gather_equals_the_one_process_estimator_trained_alike(trained):
    case, dist, _, X, y = trained
    gathered = dist.gather()
    assert type(gathered) is type(case.estimator())
    reference = _one_process(case, X, y)
    got, want = case.parameters(gathered), case.parameters(reference)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-9, err_msg=name)
    np.testing.assert_allclose(dist.loss_curve_, reference.loss_curve_, rtol=1e-9)


def test_predict_and_score_run_on_the_workers_and_equal_the_gathered_model(trained):
    case, dist, _, X, y = trained
    gathered = dist.gather()
    np.testing.assert_array_equal(dist.predict(X), gathered.predict(X))
    assert dist.score(X, y) == pytest.approx(gathered.score(X, y), abs=1e-12)
    if hasattr(gathered, "predict_proba"):
        np.testing.assert_allclose(dist.predict_proba(X), gathered.predict_proba(X), atol=1e-12)


def test_the_measured_traffic_equals_the_prediction(trained):
    case, dist, _, X, y = trained
    report = dist.comm_report()
    assert report.total() > 0
    assert report.exact, report.format()
    dist.reset_comm()
    assert dist.comm_report().total() == 0


def test_the_parameters_are_dask_arrays_held_by_their_workers(trained, client):
    case, dist, _, X, y = trained
    arrays = dist.to_dask()
    assert arrays and all(isinstance(a, da.Array) for a in arrays.values())
    workers = set(scheduler_workers(client))
    for name, array in arrays.items():
        value = array.compute()
        dense = value.todense() if hasattr(value, "todense") else np.asarray(value)
        assert dense.shape == array.shape, name
        assert np.isfinite(np.asarray(dense, dtype=float)).all(), name
        held = client.persist(array)
        wait(held)
        locations = client.who_has(held)
        assert locations and all(
            places and set(places) <= workers for places in locations.values()
        ), name
        del held


def _computed(arrays: dict[str, da.Array]) -> dict[str, np.ndarray]:
    values = {}
    for name, array in arrays.items():
        value = array.compute()
        values[name] = np.asarray(value.todense() if hasattr(value, "todense") else value)
    return values


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_to_dask_is_a_snapshot_taken_when_it_is_called(case, client):
    """The arrays of ``to_dask()`` hold the values of the call: a ``fit`` right after it does
    not reach them, and those of a call right before ``close()`` are readable after it while
    the client holds them. The values of each call are those of a twin model trained alike."""
    X, y = case.data()
    once = case.fit | {"epochs": 1}
    with case.distributed(case.estimator(), client) as twin:
        twin.fit(X, y, **once, progress=False)
        first = _computed(twin.to_dask())
        twin.fit(X, y, **once, progress=False)
        second = _computed(twin.to_dask())
    assert any(
        not np.allclose(second[name], value, rtol=0, atol=1e-6) for name, value in first.items()
    ), "the second fit changed nothing"
    with case.distributed(case.estimator(), client) as dist:
        dist.fit(X, y, **once, progress=False)
        taken = dist.to_dask()
        dist.fit(X, y, **once, progress=False)
        last = dist.to_dask()
    for arrays, values in ((taken, first), (last, second)):
        for name, value in _computed(arrays).items():
            np.testing.assert_allclose(value, values[name], rtol=0, atol=1e-9, err_msg=name)


def test_bad_input_is_a_value_error_before_anything_is_scheduled(trained, client):
    case, dist, _, X, y = trained
    steps = dist.n_steps_
    for bad_X, bad_y, match in case.bad(X, y):
        before = _quiet_transitions(client)
        with pytest.raises(ValueError, match=match):
            dist.fit(bad_X, bad_y, **case.fit, progress=False)
        assert _transitions(client) == before, match
    with pytest.raises(ValueError, match="batch_size"):
        dist.fit(X, y, **(case.fit | {"batch_size": 0}), progress=False)
    assert dist.n_steps_ == steps


def test_rebalance_refuses_bad_workers_before_anything_is_done(trained, client):
    case, dist, _, X, y = trained
    roles = dist._worker_roles()
    worker = sorted(scheduler_workers(client))[0]
    bads = [
        ([], "at least one"),
        (["tcp://127.0.0.1:9"], "not running workers"),
        ([worker, worker], "distinct"),
        (worker, "list of worker addresses"),
    ]
    if case.name in ("pipeline", "sampled"):  # layouts of two workers
        bads.append(([worker], "2 workers needed|2 shards"))
    for bad, match in bads:
        before = _quiet_transitions(client)
        with pytest.raises(ValueError, match=match):
            dist.rebalance(bad)
        assert _transitions(client) == before, match
    assert dist._worker_roles() == roles


def test_client_may_be_a_scheduler_address(client):
    for case in CASES:
        X, y = case.data()
        with case.distributed(case.estimator(), client.scheduler.address) as dist:
            assert dist.client is not client
            dist.fit(X[:8], y[:8], batch_size=8, epochs=1, progress=False)
            assert dist.n_steps_ == 1
        assert dist.client.status == "closed", case.name


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_close_leaves_nothing_on_the_cluster_and_a_closed_model_refuses_work(case, client):
    X, y = case.data()
    dist = case.distributed(case.estimator(), client)
    dist.fit(X, y, **case.fit, progress=False)
    dist.predict(X)
    token = dist.token
    dist.close()
    dist.close()  # twice does nothing
    wait_until(
        lambda: not any(_held_by(client, token).values()),
        30,
        lambda: f"the closed model is still held: {_held_by(client, token)}",
    )
    with pytest.raises(ModelClosedError):
        dist.fit(X, y, **case.fit, progress=False)
    with pytest.raises(ModelClosedError):
        dist.gather()
    with pytest.raises(ModelClosedError):
        dist.rebalance()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_loss_that_is_not_finite_is_an_error_naming_its_step(case, client):
    X, y = case.data()
    fit = case.fit | {"epochs": 2, "lr": 1e300}
    with np.errstate(all="ignore"), case.distributed(case.estimator(), client) as dist:
        with pytest.raises(NonFiniteLossError, match=r"step 2: the loss is (nan|inf)"):
            dist.fit(X, y, **fit, progress=False)
    with np.errstate(all="ignore"), pytest.raises(NonFiniteLossError, match="step 2:"):
        case.estimator().fit(X, y, **fit)


@pytest.fixture
def sigint_raises():
    """Ctrl-C raises ``KeyboardInterrupt`` in the main thread for the test, as in an interactive
    session: a process started in the background by a shell without job control ignores SIGINT
    (``SIG_IGN`` from its start), where ``_thread.interrupt_main`` does nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_an_interrupted_fit_leaves_a_model_that_refuses_further_use(case, client, sigint_raises):
    X, y = case.data()
    with case.distributed(case.estimator(), client) as dist:

        raised, unheard = threading.Event(), threading.Event()

        def interrupt() -> None:  # Ctrl-C once two steps are done
            poll(lambda: dist.n_steps_ >= 2, 60, interval=0.01)
            # Python drops an interrupt that lands where exceptions are ignored (a finalizer or
            # a gc callback), as it drops a user's Ctrl-C there: press again once the fit has
            # gone on by two steps; after three presses unheard, the next epoch's end raises it
            # (the hang guard of a suite on a loaded machine)
            for _ in range(3):
                pressed_at = dist.n_steps_
                _thread.interrupt_main()
                deadline = time.monotonic() + 60
                while dist.n_steps_ < pressed_at + 2 and time.monotonic() < deadline:
                    if raised.wait(0.01):
                        return
            unheard.set()

        def at_epoch_end(epoch: int, loss: float) -> None:
            if unheard.is_set():
                raise KeyboardInterrupt

        thread = threading.Thread(target=interrupt)
        thread.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                dist.fit(X, y, **(case.fit | {"epochs": 100_000}), progress=False,
                         on_epoch=at_epoch_end)  # fmt: skip
        finally:
            raised.set()
            thread.join()
        with pytest.raises(ModelFailedError, match="interrupted"):
            dist.gather()
        with pytest.raises(ModelFailedError, match="interrupted"):
            dist.fit(X, y, **case.fit, progress=False)
        with pytest.raises(ModelFailedError, match="interrupted"):
            dist.rebalance()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_model_dropped_without_close_releases_its_plugins(case, client):
    X, y = case.data()
    dist = case.distributed(case.estimator(), client)
    dist.fit(X, y, **case.fit, progress=False)
    token = dist.token
    assert any(_held_by(client, token).values())
    del dist
    gc.collect()
    wait_until(
        lambda: not any(_held_by(client, token).values()),
        30,
        lambda: f"the dropped model is still held: {_held_by(client, token)}",
    )


def test_save_and_load_round_trip(trained, tmp_path, client):
    case, dist, _, X, y = trained
    path = tmp_path / f"{case.name}.npz"
    dist.save(path)
    with type(dist).load(path, client) as loaded:
        got, want = case.parameters(loaded.gather()), case.parameters(dist.gather())
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_a_resumed_checkpoint_ends_as_the_uninterrupted_run(trained, tmp_path, client):
    case, dist, _, X, y = trained
    first = {**case.fit, "epochs": 1}
    with case.distributed(case.estimator(), client) as part:
        part.fit(X, y, **first, progress=False, checkpoint=tmp_path, checkpoint_every=3)
    with case.distributed(case.estimator(), client) as resumed:
        resumed.fit(X, y, **case.fit, progress=False, resume=tmp_path)
        got, want = case.parameters(resumed.gather()), case.parameters(dist.gather())
        assert resumed.loss_curve_ == pytest.approx(dist.loss_curve_, rel=0, abs=1e-9)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-9, err_msg=name)


# ------------------------------------------------------------------ elastic (slow)
@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_worker_joining_mid_fit_changes_nothing(case):
    X, y = case.data()
    fit = case.fit | {"epochs": 20}
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
        case.distributed(case.estimator(), client, step_timeout=60) as dist,
    ):
        grow = threading.Timer(0.2, cluster.scale, [3])
        grow.start()
        try:
            dist.fit(X, y, **fit, progress=False)
        finally:
            grow.join()
        client.wait_for_workers(3, timeout=60)
        dist.fit(X, y, **(fit | {"epochs": 1}), progress=False)  # a call after the join
        gathered = dist.gather()
    reference = case.estimator()
    accepted = inspect.signature(reference.fit).parameters
    for one in (fit, fit | {"epochs": 1}):
        reference.fit(X, y, **{k: v for k, v in one.items() if k in accepted})
    got, want = case.parameters(gathered), case.parameters(reference)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-9, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_rebalance_places_the_model_on_a_worker_that_joined_and_changes_nothing(case):
    X, y = case.data()
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
        case.distributed(case.estimator(), client, step_timeout=60) as dist,
    ):
        dist.fit(X, y, **case.fit, progress=False)
        old = running_workers(client)
        cluster.scale(3)
        joined = wait_until(
            lambda: [w for w in running_workers(client) if w not in old], 60,
            "the third worker did not join",
        )  # fmt: skip
        assert dist.rebalance() is dist  # every running worker, sorted
        assert set(dist._worker_roles()) <= set(running_workers(client))
        dist.fit(X, y, **case.fit, progress=False)
        assert dist.rebalance([*joined, *old]) is dist
        assert joined[0] in dist._worker_roles()
        assert dist.comm_report().total() == 0  # the counts start again
        dist.fit(X, y, **case.fit, progress=False)
        report = dist.comm_report()
        assert report.total() > 0 and report.exact, report.format()
        gathered = dist.gather()
    reference = case.estimator()
    accepted = inspect.signature(reference.fit).parameters
    for _ in range(3):
        reference.fit(X, y, **{k: v for k, v in case.fit.items() if k in accepted})
    got, want = case.parameters(gathered), case.parameters(reference)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-9, err_msg=name)


# ------------------------------------------------------------------ faults (slow)
def _fault_cluster():
    return LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0")


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_killed_worker_is_a_worker_lost_error_naming_its_role(case):
    X, y = case.data()
    with _fault_cluster() as cluster, Client(cluster) as client:
        with case.distributed(case.estimator(), client, step_timeout=30) as dist:
            dist.fit(X, y, **case.fit, progress=False)
            victim = sorted(scheduler_workers(client))[1]
            pid = client.run(os.getpid, workers=[victim])[victim]
            os.kill(pid, signal.SIGKILL)
            started = time.monotonic()
            with pytest.raises(WorkerLostError) as lost:
                for _ in range(50):
                    dist.fit(X, y, **case.fit, progress=False)
            assert time.monotonic() - started < 30  # below step_timeout: a hang guard
            assert victim in str(lost.value)
            assert dist._worker_roles()[victim] in str(lost.value)


#: The calls a stopped worker holds up: a training step, and the copies of a snapshot.
STOPPED_CALLS = {
    "fit": (lambda dist, case, X, y: dist.fit(X, y, **case.fit, progress=False), None),
    "to_dask": (lambda dist, case, X, y: dist.to_dask(), "copies were not made"),
}


@pytest.mark.slow
@pytest.mark.parametrize("call", list(STOPPED_CALLS))
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_stopped_worker_is_a_step_timeout_error_naming_its_role(case, call):
    """A worker stopped between two calls: the next ``fit``, or the copies of a ``to_dask()``
    snapshot, give up after ``step_timeout`` with a StepTimeoutError naming it and its role."""
    X, y = case.data()
    run, match = STOPPED_CALLS[call]
    with _fault_cluster() as cluster, Client(cluster) as client:
        dist = case.distributed(case.estimator(), client, step_timeout=10)
        dist.fit(X, y, **case.fit, progress=False)
        victim = sorted(scheduler_workers(client))[1]
        pid = client.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(StepTimeoutError, match=match) as stopped:
                run(dist, case, X, y)
            assert time.monotonic() - started < 10 + 30  # a hang guard, not a timing
            assert victim in str(stopped.value)
            assert dist._worker_roles()[victim] in str(stopped.value)
        finally:
            os.kill(pid, signal.SIGCONT)
            dist.close()


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_paused_worker_is_a_step_timeout_error_naming_its_memory_limit(case, tmp_path):
    """Workers whose memory limit lies below what a worker process with dasknn loaded takes:
    Dask pauses them, and placing the model or its first step stops with an error naming the
    limit, within the step timeout."""
    X, y = case.data()
    with pausing_cluster(tmp_path) as cluster, Client(cluster) as client:
        started = time.monotonic()
        with pytest.raises(StepTimeoutError, match="paused at its memory limit: .* of 200 MiB"):
            with case.distributed(case.estimator(), client, step_timeout=3) as dist:
                dist.fit(X, y, **case.fit, progress=False)
        assert time.monotonic() - started < 60  # a hang guard, not a timing


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_worker_at_the_end_of_its_lifetime_is_recovered_from_the_checkpoint(
    case, tmp_path, caplog
):
    """A batch job's worker given dask-jobqueue's advice (``--lifetime`` shorter than the
    walltime) closes itself between two epochs of ``fit``, its retirement refused or not: the
    model is restored from its checkpoint on the workers there are then (the spare taking the
    mortal worker's place where the layout needs one), the recovery logged, and ends equal to
    the one-process estimator."""
    X, y = case.data()
    with _fault_cluster() as cluster, Client(cluster) as client:
        survivor = sorted(scheduler_workers(client))[0]
        mortal = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", cluster.scheduler_address,
             "--nthreads", "1", "--no-dashboard", "--lifetime", "20s"],
        )  # fmt: skip
        try:
            old = set(scheduler_workers(client))
            [victim] = wait_until(
                lambda: [w for w in scheduler_workers(client) if w not in old], 60,
                "the worker with a lifetime did not join",
            )  # fmt: skip
            with case.distributed(
                case.estimator(), client, workers=[victim, survivor], step_timeout=30
            ) as dist:

                def at_its_end(epoch: int, loss: float) -> None:
                    if epoch == 1:  # the checkpoint of the epoch is read after this returns
                        wait_until(
                            lambda: victim not in scheduler_workers(client), 120,
                            "the worker did not close at the end of its lifetime", 0.5,
                        )  # fmt: skip

                dist.fit(X, y, **case.fit, progress=False, checkpoint=tmp_path,
                         on_epoch=at_its_end)  # fmt: skip
                assert victim not in dist._worker_roles()
                logged = [r.getMessage() for r in caplog.records if r.name.startswith("dasknn")]
                assert any("restoring the newest checkpoint" in m for m in logged), logged
                got = case.parameters(dist.gather())
            assert mortal.wait(timeout=60) == 0  # it closed by itself
        finally:
            if mortal.poll() is None:
                mortal.kill()
                mortal.wait()
    want = case.parameters(_one_process(case, X, y))
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-9, err_msg=name)


def test_every_distributed_model_is_public_and_shares_the_base():
    import dasknn
    from dasknn.runtime.distributed_model import DistributedModel

    for name in (
        "DistributedSparseMLP",
        "DistributedEmbeddingMLP",
        "DistributedCompressedMLP",
        "DistributedSampledMLP",
    ):
        assert name in dasknn.__all__
        assert issubclass(getattr(dasknn, name), DistributedModel), name
