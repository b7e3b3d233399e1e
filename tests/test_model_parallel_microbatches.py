"""Microbatched model-parallel steps: the same step as one process, for any number of blocks."""

from __future__ import annotations

import time

import numpy as np
import pytest
import scipy.sparse as sp
from model_reference import assert_same_layers
from random_layers import random_layers
from stopped_workers import wait_until_empty

from dasknn.kernels.training import column_runs, spmm_forward
from dasknn.model import SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.model_parallel._microbatches import (
    AUTO_MAX,
    AUTO_MIN_ROWS,
    auto_microbatches,
    check_microbatches,
    split_rows,
)
from dasknn.model_parallel._taskgraph import StepPriority
from dasknn.optim import SGD, Adam
from dasknn.runtime.keys import phase_names, step_key
from dasknn.runtime.measure import TOPIC as TRANSFER_TOPIC

pytestmark = pytest.mark.minversions


def _model_keys(dask_scheduler, token) -> list[str]:
    return [str(key) for key in dask_scheduler.tasks if token in str(key)]


def _model(loss: str, seed: int) -> SparseMLP:
    """Three layers of different widths, random patterns, weights and biases (float64)."""
    weights, biases = random_layers([18, 30, 26, 12], 0.2, seed)
    return SparseMLP(weights, biases, activation="sigmoid", loss=loss, dtype=np.float64)


def _data(model: SparseMLP, rows: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, size=(rows, model.n_inputs))
    if model.loss.name == "mse":
        return x, rng.uniform(0, 1, size=(rows, model.n_outputs))
    return x, rng.integers(0, model.n_outputs, size=rows)


@pytest.mark.parametrize(
    ("microbatches", "loss", "optimizer", "messages"),
    [
        (1, "mse", SGD(lr=0.3), "tasks"),
        (2, "softmax_cross_entropy", Adam(lr=0.02), "tasks"),
        (3, "mse", Adam(lr=0.02, weight_decay=0.01), "tasks"),
        (3, "softmax_cross_entropy", SGD(lr=0.2, momentum=0.9), "tasks"),
        (1, "softmax_cross_entropy", Adam(lr=0.02), "posted"),
        (3, "mse", SGD(lr=0.2, momentum=0.9), "posted"),
    ],
)
def test_microbatched_steps_equal_the_single_process_steps(
    dask_client, microbatches, loss, optimizer, messages
):
    """``fit`` in batches of 7 rows (blocks of 3+2+2 for m = 3; the last batch has 2 rows, so at
    most 2 blocks), then a ``train_step``: losses, weights and biases equal one process's to
    1e-10, with three parts on two workers (messages through Dask or posted to the workers'
    postbox actors, and through the mailbox); the measured volume equals the prediction."""
    model = _model(loss, seed=microbatches)
    reference = model.copy()
    x, y = _data(model, 23, seed=microbatches)
    rng = np.random.default_rng(microbatches)
    parts = [rng.integers(0, 3, size=n) for n in model.layer_sizes]
    fit = {"batch_size": 7, "epochs": 2, "seed": 3, "progress": False, "optimizer": optimizer}
    options = {"microbatches": microbatches, "messages": messages}
    start = time.time()  # the scheduler's clock: it runs in this process
    with DistributedSparseMLP(model, dask_client, partition=parts, **options) as dist:
        assert dist.step_microbatches(7) == microbatches
        assert dist.step_microbatches(2) == min(microbatches, 2)
        got = dist.fit(x, y, **fit).loss_curve_
        want = reference.fit(x, y, **fit).loss_curve_
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=0)
        step = dist.train_step(x[:5], y[:5], optimizer=optimizer)
        assert step == pytest.approx(
            reference.train_step(x[:5], y[:5], optimizer=optimizer), rel=1e-10
        )
        report = dist.comm_report()
        timings = dist.timings().values()
        trained = dist.gather()
        keys = dask_client.run_on_scheduler(_model_keys, token=dist.token)
        # in both modes: a postbox keeps Dask from retiring a part worker before its parts move
        assert any("postbox" in key for key in keys)
        events = [m for t, m in dask_client.get_events(TRANSFER_TOPIC) if t >= start]
    assert report.exact, report.format()
    # posted messages: each worker's step task reports those its worker received in one event
    # (2 workers, 4 batches x 2 epochs + 1 steps), no event a message
    posted = [m for m in events if "transfers" in m]
    if messages == "posted":
        assert 0 < len(posted) <= 2 * 9
        assert sum(len(m["transfers"]) for m in posted) == report.messages()
    else:
        assert not posted
    # with actors the task thread applies the updates in its waits, else the background thread
    assert all(t["update"] > 0 for t in timings)
    if messages == "posted":
        assert all(t["update_background"] == 0 for t in timings)
    else:
        assert all(t["update_background"] > 0 for t in timings)
    wait_until_empty(  # the scheduler releases them asynchronously on close
        lambda: dask_client.run_on_scheduler(_model_keys, token=dist.token),
        30,
        "keys still held after close",
    )
    assert_same_layers(trained, reference, atol=1e-10)
    assert not np.allclose(trained.weights[1].toarray(), model.weights[1].toarray())


def test_split_rows_cuts_consecutive_uneven_blocks():
    rows = np.array([9, 4, 7, 1, 0, 3, 8])
    blocks = split_rows(rows, 7, 3)
    assert [b.tolist() for b in blocks] == [[9, 4, 7], [1, 0], [3, 8]]
    assert split_rows(None, 7, 3) == [slice(0, 3), slice(3, 5), slice(5, 7)]
    assert split_rows(None, 2, 5) == [slice(0, 1), slice(1, 2)]  # at most one block per row
    assert split_rows(rows, 7, 1) == [rows]
    assert split_rows(None, 7, 1) == [None]


def test_automatic_choice():
    assert auto_microbatches(batch=4096, workers=1) == 1
    assert auto_microbatches(batch=AUTO_MIN_ROWS - 1, workers=2) == 1
    assert auto_microbatches(batch=2 * AUTO_MIN_ROWS + 1, workers=2) == 2
    assert auto_microbatches(batch=4096, workers=4) == AUTO_MAX


def test_priorities_run_layer_steps_in_order_and_microbatches_within_them():
    names = phase_names("t")
    order = [
        ("fwd", 0, 0),
        ("fwd", 0, 1),
        ("fwd", 1, 0),
        ("fwd", 1, 1),
        ("fwd", 2, 0),
        ("bwd", 2, 0),
        ("bwd", 2, 1),
        ("bwd", 1, 0),
        ("bwd", 1, 1),
    ]
    priority = StepPriority("t", n_layers=2)
    values = [priority(step_key(names[p], 5, k, 0, -1, i)) for p, k, i in order]
    assert values == sorted(values, reverse=True)  # higher runs first
    assert len(set(values)) == len(values)


def _plugin_names(dask_worker) -> list[str]:
    return sorted(dask_worker.plugins)


@pytest.mark.parametrize(
    ("options", "message"),
    [({"microbatches": bad}, "microbatches") for bad in (0, -1, 1.5, "2", True)]
    + [({"messages": "mpi"}, "messages must be")]
    + [({flag: bad}, f"{flag} must be True or False") for flag in ("reuse_memory",
                                                                   "separate_packing")
       for bad in (1, "yes", None)],
)
def test_bad_options_raise_before_anything_is_scheduled(dask_client, options, message):
    model = _model("mse", seed=0)
    parts = [np.zeros(n, dtype=int) for n in model.layer_sizes]
    before = dask_client.run(_plugin_names)
    with pytest.raises(ValueError, match=message):
        DistributedSparseMLP(model, dask_client, partition=parts, **options)
    assert dask_client.run(_plugin_names) == before
    assert check_microbatches(None) is None


def test_forward_product_over_row_ranges_adds_up_to_the_whole():
    """The posted-messages forward computes a part's own input rows first and adds the others'
    as they arrive: ``spmm_forward`` over row ranges with ``accumulate``, against scipy."""
    rng = np.random.default_rng(5)
    w = sp.random(30, 17, density=0.3, format="csr", random_state=rng)
    w.data = rng.uniform(-1, 1, size=w.nnz)
    x = rng.uniform(-1, 1, size=(30, 6))  # feature-major inputs, 6 samples
    z = np.full((17, 6), np.nan)
    bounds, rows, order = column_runs(w.indptr, w.indices, 17, np.array([0, 10, 22, 30]))
    for g, accumulate in [(1, False), (0, True), (2, True)]:
        spmm_forward(x, bounds[g], bounds[g + 1], rows, order, w.data, z, accumulate)
    np.testing.assert_allclose(z, w.T @ x, rtol=1e-12, atol=1e-12)
