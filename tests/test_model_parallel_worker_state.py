"""Worker-side state of a distributed model: one owner (its worker plugin), snapshots that Dask
may spill, and nothing left on the cluster after ``close()``."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import sparse
from distributed import futures_of
from random_layers import random_layers
from stopped_workers import wait_until_empty

from dasknn.exceptions import ModelClosedError
from dasknn.model import SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.model_parallel import _layout as layout_module
from dasknn.model_parallel import _model as model_module
from dasknn.model_parallel._worker_state import ModelState
from dasknn.optim import SGD, Adam
from dasknn.runtime.key_cache import key_cache_plugin_name
from dasknn.runtime.measure import read_transfers

pytestmark = pytest.mark.minversions  # also run at the minimum versions (.ci/run)


def _model(seed: int = 0) -> SparseMLP:
    weights, biases = random_layers([30, 60, 50, 40, 12], 0.3, seed)
    return SparseMLP(weights, biases, activation="sigmoid", loss="mse")


def _parts(model: SparseMLP, nparts: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, nparts, size=n) for n in model.layer_sizes]


def _batch(model: SparseMLP, rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.uniform(size=(rows, model.n_inputs)), rng.uniform(size=(rows, model.n_outputs))


def _renumbered(dist, model: SparseMLP, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Layer ``k``'s (1-based) weights and bias of ``model`` in the order of ``dist``."""
    order_in, order_out = dist.plan.orders[k - 1], dist.plan.orders[k]
    weight = model.weights[k - 1].toarray()[order_in][:, order_out]
    return weight, model.biases[k - 1][order_out]


def test_weights_are_snapshots_of_the_last_completed_step(dask_client):
    model = _model(seed=1)
    reference = model.copy()
    optimizer = SGD(lr=0.2, momentum=0.5)
    with DistributedSparseMLP(model, dask_client, partition=_parts(model, 3, seed=1)) as dist:
        first = dist.weights[1]
        first_values = first.compute().todense()
        assert dist.weights[1] is first  # reads between steps share one copy
        for step in range(3):
            x, y = _batch(model, 5, seed=step)
            dist.train_step(x, y, optimizer=optimizer)
            reference.train_step(x, y, optimizer=optimizer)
            for k in range(1, model.n_layers + 1):
                weights, biases = dist.weights[k - 1], dist.biases[k - 1]
                who_has = dask_client.who_has(futures_of(weights))
                for m in range(dist.nparts):
                    assert list(who_has[(weights.name, 0, m)]) == [dist.part_workers[m]]
                block = weights.blocks[0, 0].compute()
                assert isinstance(block, sparse.GCXS)
                want_w, want_b = _renumbered(dist, reference, k)
                got_w = weights.compute().to_scipy_sparse().toarray()
                np.testing.assert_allclose(got_w, want_w, rtol=0, atol=1e-12)
                np.testing.assert_allclose(biases.compute(), want_b, rtol=0, atol=1e-12)
        # the copy read before training was never changed
        np.testing.assert_array_equal(first.compute().todense(), first_values)
        assert not np.array_equal(dist.weights[1].compute().todense(), first_values)


def _spilled_keys(dask_worker) -> list[str]:
    return [str(key) for key in dask_worker.data.slow]


def _installed_layers(dask_worker) -> int:
    """Chunks installed on this worker by every model's plugin."""
    return sum(len(p.layers) for p in dask_worker.plugins.values() if isinstance(p, ModelState))


@pytest.mark.parametrize("budget", [1, None])
def test_the_placement_hands_layers_over_as_the_budget_fills(dask_client, monkeypatch, budget):
    model = _model()
    held = []  # chunks on the workers when each layer is made (beyond other models' chunks)
    before = sum(dask_client.run(_installed_layers).values())

    def counting(weights, orders, offsets):
        for layer in layer_iterator(weights, orders, offsets):
            held.append(sum(dask_client.run(_installed_layers).values()) - before)
            yield layer

    layer_iterator = model_module.iter_layers
    monkeypatch.setattr(model_module, "iter_layers", counting)
    if budget is not None:
        monkeypatch.setattr(layout_module, "PLACEMENT_BYTES", budget)
    dist = DistributedSparseMLP(model, dask_client, partition=_parts(model, 3))
    try:
        assert sum(dask_client.run(_installed_layers).values()) - before == 3 * model.n_layers
        if budget is None:  # the whole small network fits the default budget: one hand-over
            assert held == [0] * model.n_layers
        else:  # a layer is on its way while the next is made, and installed before the one after
            for k, found in enumerate(held):
                assert 3 * max(k - 1, 0) <= found <= 3 * k
        x = _batch(model, 7, 1)[0]
        np.testing.assert_allclose(dist.predict(x), model.predict(x), rtol=1e-5, atol=1e-6)
    finally:
        dist.close()


@pytest.mark.slow
def test_training_while_dask_spills_the_weights(tmp_path):
    """Workers whose memory limit makes Dask spill almost all of their data to disk (the weight
    chunks read between epochs among them) train to the single-process weights."""
    from distributed import Client, LocalCluster

    model = _model(seed=2)
    reference = model.copy()
    optimizer = Adam(lr=0.01)
    limits = {
        "distributed.worker.memory.target": 1e-6,  # spill managed data beyond ~130 bytes
        "distributed.worker.memory.spill": False,
        "distributed.worker.memory.pause": False,
        "distributed.worker.memory.terminate": False,
    }
    spilled = set()
    with dask.config.set(limits), LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=":0",
        memory_limit="128 MiB",
        local_directory=tmp_path,
    ) as cluster, Client(cluster) as client:
        with DistributedSparseMLP(model, client, partition=_parts(model, 2, seed=2)) as dist:
            x, y = _batch(model, 60, seed=2)
            for epoch in range(3):
                fit = {"batch_size": 8, "seed": epoch, "progress": False, "optimizer": optimizer}
                dist.fit(x, y, **fit)
                reference.fit(x, y, **fit)
                assert len(dist.weights) == model.n_layers  # a new copy, which Dask may spill
                for keys in client.run(_spilled_keys).values():
                    spilled.update(keys)
                for k in range(1, model.n_layers + 1):
                    want_w, _ = _renumbered(dist, reference, k)
                    got_w = dist.weights[k - 1].compute().to_scipy_sparse().toarray()
                    np.testing.assert_allclose(got_w, want_w, rtol=0, atol=1e-12)
            trained = dist.gather()
    assert any(f"dasknn-weight-{dist.token}" in key for key in spilled), sorted(spilled)[:10]
    for k in range(model.n_layers):
        np.testing.assert_allclose(
            trained.weights[k].toarray(), reference.weights[k].toarray(), rtol=0, atol=1e-12
        )
        np.testing.assert_allclose(trained.biases[k], reference.biases[k], rtol=0, atol=1e-12)


def _model_keys(dask_scheduler, token) -> list[str]:
    return [str(key) for key in dask_scheduler.tasks if token in str(key)]


def _scheduler_plugins(dask_scheduler) -> list[str]:
    return list(dask_scheduler.plugins)


def test_close_removes_every_plugin_and_key(dask_client):
    model = _model(seed=3)
    x, y = _batch(model, 12, seed=3)
    with DistributedSparseMLP(
        model, dask_client, partition=_parts(model, 3), reuse_memory=True
    ) as dist:
        token = dist.token
        dist.fit(x, y, batch_size=4, optimizer=Adam(), progress=False)
        dist.predict(x, batch_size=5)
        assert dist.gather().n_layers == model.n_layers
        plugins = dask_client.run(lambda dask_worker: [n for n in dask_worker.plugins])
        for names in plugins.values():
            assert dist.plugin_name in names
            # the state, the malloc tuning and the bound on Dask's key cache
            assert sum(token in name for name in names) == 3
        assert key_cache_plugin_name(token) in dask_client.run_on_scheduler(_scheduler_plugins)
        assert dask_client.run_on_scheduler(_model_keys, token=token)
        assert read_transfers(dask_client, token)
    plugins = dask_client.run(lambda dask_worker: [n for n in dask_worker.plugins])
    assert not [n for names in plugins.values() for n in names if token in n]
    assert not [n for n in dask_client.run_on_scheduler(_scheduler_plugins) if token in n]
    wait_until_empty(
        lambda: dask_client.run_on_scheduler(_model_keys, token=token),
        30,
        "the closed model's keys stayed on the scheduler",
    )
    assert read_transfers(dask_client, token) == []
    with pytest.raises(ModelClosedError, match="closed"):
        dist.train_step(x, y)
    with pytest.raises(ModelClosedError, match="closed"):
        dist.gather()
    dist.close()  # a second close does nothing


def _take_with_idle_work(token: str) -> dict:
    """Task: exercise the mailbox's idle work on this worker's :class:`ModelState`."""
    import threading

    from dasknn.model_parallel._worker_state import ModelState

    owner = ModelState.on_worker(token)
    ran: list[str] = []
    seen = {}
    owner.mailbox.queue_idle(ran.append, "first")
    owner.deliver(("ready",), np.zeros(1))
    seen["ready"] = (owner.take(("ready",), timeout=30).tolist(), list(ran))
    # the message is missing: the queued jobs run, in order, then the task thread waits
    owner.mailbox.queue_idle(ran.append, "second")
    timer = threading.Timer(0.2, owner.deliver, args=(("late",), np.ones(2)))
    timer.start()
    seen["late"] = (owner.take(("late",), timeout=30).tolist(), list(ran))
    timer.join()
    # a job that delivers the message ends the idle work: the next job stays queued
    owner.mailbox.queue_idle(owner.deliver, ("during",), np.full(3, 2.0))
    owner.mailbox.queue_idle(ran.append, "third")
    seen["during"] = (owner.take(("during",), timeout=30).tolist(), list(ran))
    owner.mailbox.run_idle()
    seen["run_idle"] = list(ran)
    owner.mailbox.queue_idle(ran.append, "dropped")
    owner.clear_steps()
    owner.mailbox.run_idle()
    seen["cleared"] = list(ran)
    return seen


def _on_a_model_state(client, token: str, task):
    """The result of ``task(token)`` run on a worker of ``client`` while a :class:`ModelState`
    plugin of ``token`` is registered (removed again afterwards)."""
    from dasknn.model_parallel._worker_state import ModelState

    client.register_plugin(ModelState(token), name=ModelState.plugin_name(token))
    try:
        return client.submit(task, token, pure=False).result(timeout=60)
    finally:
        client.unregister_worker_plugin(ModelState.plugin_name(token))


def test_idle_work_runs_while_a_message_is_missing(dask_client):
    """``take`` runs the queued jobs (the weight updates of ``messages="posted"``) only while the
    message it needs has not arrived, one at a time and in order; ``run_idle`` runs what is left;
    ``clear_steps`` drops them."""
    token = "idle-work-test"
    seen = _on_a_model_state(dask_client, token, _take_with_idle_work)
    assert seen["ready"] == ([0.0], [])
    assert seen["late"] == ([1.0, 1.0], ["first", "second"])
    assert seen["during"] == ([2.0, 2.0, 2.0], ["first", "second"])
    assert seen["run_idle"] == ["first", "second", "third"]
    assert seen["cleared"] == ["first", "second", "third"]


def _drop_steps_between_two_layers(token: str) -> dict:
    """Task: begin two steps on this worker's :class:`ModelState`, drop the steps in flight
    (as a failed step or a closing model does), then ask for their values again."""
    from dasknn.model_parallel._worker_state import ModelState

    owner = ModelState.on_worker(token)
    owner.part_step(7, 0).microbatch(0).forward[2] = (None, None, np.ones(1))
    owner.part_step(8, 1)
    seen = {"dropped": owner.clear_steps()}
    for step in (7, 8, 9):
        try:
            owner.part_step(step, 0)
            seen[step] = "started"
        except RuntimeError as error:
            seen[step] = str(error)
    return seen


def test_a_dropped_step_is_refused_instead_of_started_afresh(dask_client):
    """A task of a step whose values were dropped on its worker (``clear_steps``: a failed step,
    or the model's plugin closing) fails with a ``RuntimeError`` saying so, instead of finding
    empty values and failing on a missing layer (``KeyError(2)`` in the soak); a later step runs.
    Once the plugin is removed, a step task is told the model is not on its worker."""
    from dasknn.model_parallel._worker_state import ModelState

    token = "dropped-step-test"
    seen = _on_a_model_state(dask_client, token, _drop_steps_between_two_layers)
    assert seen["dropped"] == 2
    for step in (7, 8):
        assert seen[step].startswith(f"step {step} was dropped on this worker"), seen[step]
    assert seen[9] == "started"
    with pytest.raises(ModelClosedError, match="holds no state of model"):
        dask_client.submit(ModelState.on_worker, token, pure=False).result(60)


def _posted_arrays_of_two_tasks(token: str) -> dict:
    """Task: two step tasks' posted arrays on this worker's :class:`ModelState`, the first
    delivered, the second failed."""
    from dasknn.model_parallel._worker_state import ModelState

    owner = ModelState.on_worker(token)
    first = owner.posted_array((4, 3), np.float32)
    owner.end_posting(delivered=True)
    again = owner.posted_array((4, 3), np.float32)
    owner.end_posting(delivered=False)
    after_failure = owner.posted_array((4, 3), np.float32)
    return {"reused": again is first, "kept_after_failure": after_failure is again}


def test_posted_arrays_are_reused_only_after_their_posts_are_delivered(dask_client):
    """The arrays whose rows a posted step task sends go back to the worker's pool when every
    post was acknowledged; a failed task's are left to Python (a post may still be read)."""
    token = "posted-arrays-test"
    seen = _on_a_model_state(dask_client, token, _posted_arrays_of_two_tasks)
    assert seen == {"reused": True, "kept_after_failure": False}
