"""One Dask span for a model's tasks: scattered values held by tasks of the span stay on their
worker, and a model-parallel training step adds one entry to Dask's span metadata (it added
three: one per span its graph touched)."""

from __future__ import annotations

import numpy as np
from polling import wait_until
from random_layers import random_layers

from dasknn.model import SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.runtime.cluster import scheduler_workers
from dasknn.runtime.model_span import held_in_span, new_span


def _span_records(dask_scheduler) -> dict:
    """``{span id: (name, metadata entries, task group names)}`` of every span the scheduler has
    (read only)."""
    spans = dask_scheduler.extensions["spans"].spans
    return {
        span_id: (
            span.name,
            len(span.metadata["collections"]) if span.metadata else 0,
            sorted(group.name for group in span.groups),
        )
        for span_id, span in spans.items()
    }


def _entries(client) -> int:
    return sum(entries for _, entries, _ in client.run_on_scheduler(_span_records).values())


def _known(dask_scheduler, key) -> bool:
    return key in dask_scheduler.tasks


def test_held_values_stay_on_their_worker_in_the_model_span(dask_client):
    workers = sorted(scheduler_workers(dask_client))[:2]
    values = {m: np.arange(5.0) + 10 * m for m in range(len(workers))}
    scattered = {}
    for m, address in enumerate(workers):
        key = ("dasknn-test-held", 0, m)
        scattered[m] = dask_client.scatter({key: values[m]}, workers=[address], hash=False)[key]
    span = new_span("dasknn-test-held")
    held = held_in_span(dask_client, scattered, dict(enumerate(workers)), span)
    scattered_keys = [future.key for future in scattered.values()]
    del scattered
    for m, future in held.items():
        assert future.key == ("dasknn-test-held-held", 0, m)
        np.testing.assert_array_equal(future.result(), values[m])
        assert dask_client.who_has([future])[future.key] == (workers[m],)
    name, _, groups = dask_client.run_on_scheduler(_span_records)[span["ids"][-1]]
    assert name == ("dasknn-test-held",) and groups == ["dasknn-test-held-held"]
    # the scattered values are freed once their holders ran
    wait_until(
        lambda: not any(dask_client.run_on_scheduler(_known, key=key) for key in scattered_keys),
        30,
        "the scattered values were not released",
    )


def _model() -> SparseMLP:
    weights, biases = random_layers([12, 16, 16, 6], 0.4, 3)
    return SparseMLP(weights, biases, activation="sigmoid", loss="mse")


def test_a_training_step_adds_one_span_entry(dask_client):
    model = _model()
    rng = np.random.default_rng(4)
    parts = [rng.integers(0, 2, size=n) for n in model.layer_sizes]
    batches, batch_size = 12, 4
    x = rng.uniform(size=(batches * batch_size, model.n_inputs))
    y = rng.uniform(size=(batches * batch_size, model.n_outputs))
    with DistributedSparseMLP(model, dask_client, partition=parts) as dist:
        dist.fit(x, y, batch_size=batch_size, lr=0.1, progress=False, shuffle=False)
        before = _entries(dask_client)
        dist.fit(x, y, batch_size=batch_size, lr=0.1, progress=False, shuffle=False)
        added = _entries(dask_client) - before
        records = dask_client.run_on_scheduler(_span_records)
    # one entry a step, and two for the call's data (its graph touches the model's span and the
    # default span its scattered values join); three entries a step before
    assert added == batches + 2, added
    model_spans = [r for r in records.values() if r[0] == (f"dasknn-{dist.token}",)]
    assert len(model_spans) == 1
    groups = model_spans[0][2]
    assert f"dasknn-run-{dist.token}" in groups
    assert any(group.startswith("dasknn-postbox") for group in groups)
    assert f"dasknn-plan-{dist.token}-1-g0-held" in groups
