"""Saving, loading, checkpoints and resuming of the compressed models: the one-process
CompressedMLP and the pipeline model DistributedCompressedMLP (real LocalCluster workers), through
the checkpoint mechanism every model shares. A stage worker killed (SIGKILL) during a fit with a
checkpoint directory is recovered from: the run goes on from the last checkpoint on the workers
there are and ends with the weights of an uninterrupted run; so does a run whose stage worker is
retired, with no checkpoint, its stage handed to a spare worker."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from checkpoint_watch import when_checkpoint
from distributed import Client
from polling import HANG_GUARD, wait_until
from retirement import retire_after_steps

from dasknn.model import CompressedMLP
from dasknn.optim import Adam
from dasknn.pipeline_parallel import DistributedCompressedMLP
from dasknn.pruning import magnitude_masks
from dasknn.runtime.cluster import local_cluster, scheduler_workers

SIZES = (12, 10, 8, 4)
OPTIMIZER = Adam(1e-2)


def _model() -> CompressedMLP:
    rng = np.random.default_rng(0)
    weights = [rng.uniform(-1, 1, (a, b)) for a, b in zip(SIZES[:-1], SIZES[1:], strict=True)]
    return CompressedMLP(weights, magnitude_masks(weights, 0.5), precision="fp64")


def _data(rows: int = 64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.uniform(0, 1, (rows, SIZES[0])), rng.integers(0, SIZES[-1], rows)


def _fit(model, x, y, epochs: int, **options):
    return model.fit(
        x, y, batch_size=8, epochs=epochs, optimizer=OPTIMIZER, progress=False, **options
    )


def _assert_same(trained: CompressedMLP, reference: CompressedMLP) -> None:
    for got, want in zip(trained.weights, reference.weights, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
    for got, want in zip(trained.biases, reference.biases, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
    assert trained.steps_ == reference.steps_


@pytest.fixture(scope="module")
def reference() -> CompressedMLP:
    x, y = _data()
    return _fit(_model(), x, y, 3)


@pytest.fixture(scope="module")
def client():
    with local_cluster(3) as cluster, Client(cluster) as client:
        yield client


def test_compressed_mlp_resumes_from_its_checkpoint_to_an_uninterrupted_run(tmp_path, reference):
    x, y = _data()
    _fit(_model(), x, y, 1, checkpoint=tmp_path, checkpoint_every=3)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-000000008.npz"]
    resumed = _fit(_model(), x, y, 3, resume=tmp_path)
    _assert_same(resumed, reference)
    assert resumed.loss_curve_ == pytest.approx(reference.loss_curve_, abs=1e-12)


def test_a_checkpoint_of_another_compressed_network_is_refused(tmp_path):
    x, y = _data()
    _fit(_model(), x, y, 1, checkpoint=tmp_path)
    rng = np.random.default_rng(5)
    weights = [rng.uniform(-1, 1, (a, b)) for a, b in zip(SIZES[:-1], SIZES[1:], strict=True)]
    other = CompressedMLP(weights, magnitude_masks(weights, 0.7), precision="fp64")
    with pytest.raises(ValueError, match="a checkpoint of another model"):
        _fit(other, x, y, 2, resume=tmp_path)


def test_pipeline_model_saves_loads_and_resumes_to_an_uninterrupted_run(
    client, tmp_path, reference
):
    x, y = _data()
    with DistributedCompressedMLP(_model(), client, stages=2) as dist:
        _fit(dist, x, y, 1, checkpoint=tmp_path / "run", checkpoint_every=3)
        dist.save(tmp_path / "model.npz")
        kept = dist.gather()
    loaded = CompressedMLP.load(tmp_path / "model.npz")
    _assert_same(loaded, kept)
    with DistributedCompressedMLP.load(tmp_path / "model.npz", client, stages=2) as dist:
        assert dist.n_steps_ == kept.steps_ and dist.optimizer_ == OPTIMIZER
        _assert_same(dist.gather(), kept)
        _fit(dist, x, y, 3, resume=tmp_path / "run")
        _assert_same(dist.gather(), reference)
        assert dist.loss_curve_ == pytest.approx(reference.loss_curve_, abs=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("messages", ["posted", "tasks"])
def test_a_killed_stage_worker_is_recovered_from_the_checkpoint(
    client, tmp_path, reference, messages
):
    x, y = _data()
    client.wait_for_workers(3, timeout=30)
    with DistributedCompressedMLP(
        _model(), client, stages=2, messages=messages, step_timeout=30
    ) as dist:
        victim = dist.workers[(1, 0)]
        pid = client.run(os.getpid, workers=[victim])[victim]
        killed = when_checkpoint(tmp_path, 10, lambda: os.kill(pid, signal.SIGKILL))
        _fit(dist, x, y, 3, checkpoint=tmp_path, checkpoint_every=5)
        killed.join()
        assert victim not in dist.workers.values()  # the stage moved
        _assert_same(dist.gather(), reference)
        assert dist.loss_curve_ == pytest.approx(reference.loss_curve_, abs=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("messages", ["posted", "tasks"])
def test_a_retired_stage_worker_hands_its_stage_over_and_fit_goes_on(messages):
    """A stage worker retired mid-fit with no checkpoint: its stage moves to the spare worker
    between two steps, the worker leaves and the run ends as the uninterrupted one."""
    x, y = _data()
    reference = _fit(_model(), x, y, 6)
    with local_cluster(3) as cluster, Client(cluster) as client:
        client.wait_for_workers(3, timeout=30)
        with DistributedCompressedMLP(
            _model(), client, stages=2, messages=messages, step_timeout=30
        ) as dist:
            leaving = dist.workers[(1, 0)]
            retire = retire_after_steps(client, dist, 8, leaving)
            _fit(dist, x, y, 6)  # no checkpoint
            retire.join()
            assert leaving not in dist.workers.values()
            wait_until(lambda: leaving not in scheduler_workers(client), HANG_GUARD, "retired")
            _assert_same(dist.gather(), reference)
            assert dist.loss_curve_ == pytest.approx(reference.loss_curve_, abs=1e-12)
            assert dist.comm_report().steps == reference.steps_  # the traffic of every step
