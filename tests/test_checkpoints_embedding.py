"""Saving, loading, checkpoints and resuming of the embedding models: the one-process
EmbeddingMLP (its own file format, npz with a JSON header) and the data-parallel
DistributedEmbeddingMLP (real LocalCluster workers, every architecture), through the checkpoint
mechanism every model shares. A resumed run ends with the values of an uninterrupted one, its
optimizer state included (Adam), with the full and with the sampled softmax; so does a run whose
worker is killed (SIGKILL) with a checkpoint directory set, recovered on the workers there are,
and a run whose worker is retired, with no checkpoint, its values handed to a spare worker."""

from __future__ import annotations

import json
import os
import signal
import zipfile

import numpy as np
import pytest
from checkpoint_watch import when_checkpoint
from distributed import Client, LocalCluster
from polling import HANG_GUARD, wait_until
from retirement import fill_memory_to, retire_between_fits

from dasknn.data_parallel import DistributedEmbeddingMLP
from dasknn.model import EmbeddingMLP
from dasknn.optim import Adam
from dasknn.runtime.cluster import scheduler_workers

VOCAB, CONTEXT = 30, 3
OPTIMIZER = Adam(1e-2)
OUTPUTS = [{}, {"output": "sampled", "n_sampled": 5}]


def _model(**options) -> EmbeddingMLP:
    return EmbeddingMLP(VOCAB, CONTEXT, embed_dim=4, hidden=(8,), dtype=np.float64, seed=1,
                        **options)  # fmt: skip


def _data(rows: int = 64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.integers(0, VOCAB, (rows, CONTEXT)), rng.integers(0, VOCAB, rows)


def _fit(model, epochs: int, **options):
    x, y = _data()
    return model.fit(x, y, batch_size=8, epochs=epochs, optimizer=OPTIMIZER, **options)


def _epochs(model, epochs: int):
    """A call of ``_fit`` of ``epochs`` more epochs in row order (calls one after another
    train as one call of all their epochs)."""
    return lambda: _fit(model, epochs, shuffle=False)


def _values(model: EmbeddingMLP) -> list[np.ndarray]:
    return [model.embedding, *model.weights, *model.biases]


def _assert_same(got: EmbeddingMLP, want: EmbeddingMLP) -> None:
    for a, b in zip(_values(got), _values(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-9)
    assert got.n_steps_ == want.n_steps_


@pytest.mark.parametrize("options", OUTPUTS, ids=["softmax", "sampled"])
def test_embedding_mlp_resumes_from_its_checkpoint_to_an_uninterrupted_run(tmp_path, options):
    reference = _fit(_model(**options), 3)
    _fit(_model(**options), 1, checkpoint=tmp_path, checkpoint_every=3)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-000000008.npz"]
    resumed = _fit(_model(**options), 3, resume=tmp_path)
    _assert_same(resumed, reference)
    assert resumed.loss_curve_ == pytest.approx(reference.loss_curve_, rel=0, abs=1e-12)


@pytest.mark.parametrize("options", OUTPUTS, ids=["softmax", "sampled"])
def test_a_loaded_embedding_mlp_trains_on_as_the_saved_one(tmp_path, options):
    saved = _fit(_model(**options), 1)
    saved.save(tmp_path / "model.npz")
    loaded = EmbeddingMLP.load(tmp_path / "model.npz")
    assert loaded.spec == saved.spec and loaded.optimizer == OPTIMIZER
    _assert_same(loaded, saved)
    _assert_same(_fit(loaded, 1), _fit(saved, 1))


def test_malformed_or_foreign_files_are_value_errors_naming_them(tmp_path):
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip archive")
    with pytest.raises(ValueError, match="garbage.npz"):
        EmbeddingMLP.load(garbage)
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, header=np.array(json.dumps({"format": "dasknn-model", "version": 2})))
    with pytest.raises(ValueError, match="foreign.npz.*does not describe a dasknn embedding"):
        EmbeddingMLP.load(foreign)
    good = tmp_path / "good.npz"
    _fit(_model(), 1).save(good)
    with np.load(good) as npz:
        arrays = {name: npz[name] for name in npz.files}
    arrays["embedding"] = arrays["embedding"][:-1]
    edited = tmp_path / "edited.npz"
    np.savez(edited, **arrays)
    with pytest.raises(ValueError, match="edited.npz.*embedding has shape"):
        EmbeddingMLP.load(edited)
    arrays["embedding"] = np.full((VOCAB, 4), np.nan)
    np.savez(edited, **arrays)
    with pytest.raises(ValueError, match="NaN"):
        EmbeddingMLP.load(edited)
    with zipfile.ZipFile(good) as archive:
        assert "header.npy" in archive.namelist()  # one archive of plain arrays


@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        yield client


@pytest.mark.parametrize(
    ("architecture", "options"),
    [("hybrid", {}), ("ps", {}), ("ar", {}), ("hybrid", OUTPUTS[1])],
    ids=["hybrid", "ps", "ar", "hybrid-sampled"],
)
def test_data_parallel_model_saves_loads_and_resumes_to_an_uninterrupted_run(
    client, tmp_path, architecture, options
):
    reference = _fit(_model(**options), 3)
    config = {"architecture": architecture, "sparse_partitions": 2}
    with DistributedEmbeddingMLP(_model(**options), client, **config) as dist:
        _fit(dist, 1, checkpoint=tmp_path / "run", checkpoint_every=3)
        dist.save(tmp_path / "model.npz")
        kept = dist.gather()
    loaded = EmbeddingMLP.load(tmp_path / "model.npz")
    _assert_same(loaded, kept)
    assert loaded.optimizer == OPTIMIZER
    with DistributedEmbeddingMLP.load(tmp_path / "model.npz", client, **config) as dist:
        assert dist.n_steps_ == kept.n_steps_ and dist.optimizer_ == OPTIMIZER
        _fit(dist, 3, resume=tmp_path / "run")
        _assert_same(dist.gather(), reference)
        assert dist.loss_curve_ == pytest.approx(reference.loss_curve_, rel=0, abs=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("messages", ["posted", "tasks"])
def test_a_killed_worker_is_recovered_from_the_checkpoint(client, tmp_path, messages):
    reference = _fit(_model(), 3)
    client.wait_for_workers(2, timeout=30)
    with DistributedEmbeddingMLP(
        _model(), client, sparse_partitions=2, messages=messages, step_timeout=30
    ) as dist:
        victim = dist.workers[1]
        pid = client.run(os.getpid, workers=[victim])[victim]
        killed = when_checkpoint(tmp_path, 10, lambda: os.kill(pid, signal.SIGKILL))
        _fit(dist, 3, checkpoint=tmp_path, checkpoint_every=5)
        killed.join()
        assert victim not in dist.workers  # its number went to the worker that replaced it
        _assert_same(dist.gather(), reference)
        assert dist.loss_curve_ == pytest.approx(reference.loss_curve_, rel=0, abs=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("messages", ["posted", "tasks"])
def test_a_retired_worker_hands_its_values_over_and_fit_goes_on(messages):
    """A worker of the model retired mid-fit with no checkpoint: its values move to the spare
    worker between two tasks, the worker leaves and the run ends as the uninterrupted one."""
    reference = _fit(_model(), 6, shuffle=False)
    with (
        LocalCluster(n_workers=3, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        workers = sorted(scheduler_workers(client))[:2]  # the third is the spare
        with DistributedEmbeddingMLP(
            _model(), client, workers=workers, sparse_partitions=2, messages=messages,
            step_timeout=30,
        ) as dist:  # fmt: skip
            leaving = dist.workers[1]
            retire = retire_between_fits(client, dist, leaving, _epochs(dist, 1), _epochs(dist, 5))
            retire.join()  # no checkpoint
            assert leaving not in dist.workers
            wait_until(lambda: leaving not in scheduler_workers(client), HANG_GUARD, "retired")
            _assert_same(dist.gather(), reference)
            assert dist.loss_curve_ == pytest.approx(reference.loss_curve_, rel=0, abs=1e-9)
            assert dist.comm_report().steps == reference.n_steps_  # the traffic of every step


@pytest.mark.slow
def test_a_retired_worker_with_no_spare_leaves_the_model_on_the_workers_that_stay(caplog):
    """With no spare worker, the model is laid out on the worker that stays between two tasks
    (its shard count kept), the retired one leaves and the run ends as the uninterrupted one;
    the traffic is counted again from the new layout."""
    reference = _fit(_model(), 6, shuffle=False)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        with DistributedEmbeddingMLP(
            _model(), client, sparse_partitions=2, step_timeout=30
        ) as dist:  # fmt: skip
            staying, leaving = dist.workers
            retire = retire_between_fits(client, dist, leaving, _epochs(dist, 1), _epochs(dist, 5))
            retire.join()  # no checkpoint
            assert dist.workers == [staying]
            wait_until(lambda: leaving not in scheduler_workers(client), HANG_GUARD, "retired")
            _assert_same(dist.gather(), reference)
            assert dist.loss_curve_ == pytest.approx(reference.loss_curve_, rel=0, abs=1e-9)
            report = dist.comm_report()
            assert report.exact and 0 < report.steps < reference.n_steps_
    assert not [r for r in caplog.records if r.levelname == "WARNING" and "dasknn" in r.name]


@pytest.mark.slow
def test_a_retirement_is_refused_where_the_worker_that_stays_lacks_the_memory(caplog):
    """With no spare, the model would be laid out on the worker that stays, but that one is at
    75 % of its memory limit: the values of the leaving one would take it past Dask's pause
    threshold, so the retirement is refused, a warning says why, and the run goes on on both
    workers to the values of the uninterrupted one."""
    reference = _fit(_model(), 6, shuffle=False)
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, memory_limit="3GiB", dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        with DistributedEmbeddingMLP(
            _model(), client, sparse_partitions=2, step_timeout=30
        ) as dist:  # fmt: skip
            staying, leaving = kept = list(dist.workers)
            fill_memory_to(client, staying, 0.75)
            retire = retire_between_fits(client, dist, leaving, _epochs(dist, 1), _epochs(dist, 5))
            retire.join()
            assert dist.workers == kept
            _assert_same(dist.gather(), reference)
    [warning] = [r.getMessage() for r in caplog.records if r.name.startswith("dasknn")]
    assert f"keeps the workers ['{leaving}']" in warning and "lack the memory" in warning
