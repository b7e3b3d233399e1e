"""Saving, loading, checkpoints and resuming of the LSH-sampled models: the one-process
SampledMLP (its own file format, npz with a JSON header: weights, Adam state, hash tables,
counts) and the distributed DistributedSampledMLP (real LocalCluster workers), through the
checkpoint mechanism every model shares. A resumed or loaded model takes the steps of the
uninterrupted one, its active sets included (float64, to 1e-12 or exactly); so does a run whose
worker is killed (SIGKILL) with a checkpoint directory set, recovered on the workers there are,
and a run whose worker is retired, with no checkpoint: its shard handed to a spare worker, or
the retirement refused when there is none."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
import scipy.sparse as sp
from checkpoint_watch import when_checkpoint
from distributed import Client, LocalCluster
from polling import HANG_GUARD, wait_until
from retirement import fill_memory_to, retire_after_steps

from dasknn.runtime.cluster import scheduler_workers
from dasknn.sampled import SampledMLP
from dasknn.sampled_parallel import DistributedSampledMLP

ROWS, FEATURES, LABELS, BATCH = 40, 12, 20, 8


def _model(**options) -> SampledMLP:
    """Sampling that matters (30 % of a shard active, candidates from the tables, a uniform
    share), tables rehashed every 3 steps and redrawn every 7, so that a checkpoint falls
    between two rehashes."""
    settings = dict(
        hidden=6, active_fraction=0.3, k=3, n_tables=4, shards=2, hogwild=False,
        dtype="float64", seed=6, rehash_every=3, rebuild_every=7,
    )  # fmt: skip
    return SampledMLP(**(settings | options)).initialize(FEATURES, LABELS)


def _data() -> tuple[sp.csr_matrix, list[list[int]]]:
    rng = np.random.default_rng(7)
    X = sp.csr_matrix(rng.uniform(0.1, 1.0, (ROWS, FEATURES)) / 3)
    labels = [list(rng.choice(LABELS, rng.integers(1, 3), replace=False)) for _ in range(ROWS)]
    return X, labels


def _fit(model, epochs: int, **options):
    X, labels = _data()
    return model.fit(X, labels, batch_size=BATCH, epochs=epochs, **options)


def _assert_same(got, want) -> None:
    for name, value in want.parameters().items():
        np.testing.assert_allclose(got.parameters()[name], value, rtol=0, atol=1e-12, err_msg=name)
    assert got.n_steps_ == want.n_steps_ and got.epochs_ == want.epochs_
    assert got.loss_curve_ == pytest.approx(want.loss_curve_, rel=0, abs=1e-12)


class _Stop(Exception):
    """Ends a fit call from its on_epoch callback (a run that stops part-way)."""


def _stop_after_first_epoch(epoch: int, loss: float) -> None:
    raise _Stop


def test_a_resumed_run_ends_as_the_uninterrupted_one_with_the_schedule_of_its_call(tmp_path):
    # lr_decay over the call's own 15 steps: the checkpoint of batch 3 (between two rehashes)
    # of a call that stopped after its first epoch, resumed by the same call
    reference = _fit(_model(), 3)
    with pytest.raises(_Stop):
        _fit(_model(), 3, checkpoint=tmp_path, checkpoint_every=3,
             on_epoch=_stop_after_first_epoch)  # fmt: skip
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-000000003.npz"]
    _assert_same(_fit(_model(), 3, resume=tmp_path), reference)
    with pytest.raises(ValueError, match="schedule_steps"):  # another call: other steps
        _fit(_model(), 4, resume=tmp_path)


def test_a_call_resumed_with_more_epochs_takes_the_longer_calls_steps(tmp_path):
    reference = _fit(_model(decay_horizon=15), 3)
    _fit(_model(decay_horizon=15), 1, checkpoint=tmp_path, checkpoint_every=2)
    _assert_same(_fit(_model(decay_horizon=15), 3, resume=tmp_path), reference)


def test_a_loaded_model_trains_on_as_the_saved_one(tmp_path):
    saved = _fit(_model(), 1)
    saved.save(tmp_path / "model.npz")
    loaded = SampledMLP.load(tmp_path / "model.npz")
    assert loaded.optimizer_ == saved.optimizer_
    for mine, theirs in zip(loaded.shards_, saved.shards_, strict=True):
        assert mine.rebuilds == theirs.rebuilds
        for a, b in zip(mine.tables.arrays(), theirs.tables.arrays(), strict=True):
            np.testing.assert_array_equal(a, b)
    _assert_same(loaded, saved)
    X, labels = _data()
    np.testing.assert_array_equal(
        np.concatenate(loaded.active_sets(X, labels)), np.concatenate(saved.active_sets(X, labels))
    )
    _assert_same(_fit(loaded, 2), _fit(saved, 2))


def _arrays(path) -> dict[str, np.ndarray]:
    with np.load(path) as npz:
        return {name: npz[name] for name in npz.files}


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda a: a.update(shard1_weights=a["shard1_weights"][:-1]), "shard1_weights has shape"),
        (lambda a: a["hidden_weights"].__setitem__((0, 0), np.nan), "NaN"),
        (lambda a: a["shard0_weights_exp_avg_sq"].__setitem__((0, 0), -1.0), "bad values"),
        (lambda a: a["shard0_items"].__setitem__(0, 10**6), "outside its"),
        (lambda a: a["shard1_key_ptr"].__setitem__(-1, 0), "pointers"),
        (lambda a: a.pop("shard0_keys"), "lacks the entry 'shard0_keys'"),
    ],
    ids=["shape", "nan", "moment", "table-item", "table-pointer", "missing"],
)
def test_a_damaged_file_is_a_value_error_naming_it(tmp_path, edit, match):
    good = tmp_path / "good.npz"
    _fit(_model(), 1).save(good)
    arrays = _arrays(good)
    edit(arrays)
    edited = tmp_path / "edited.npz"
    np.savez(edited, **arrays)
    with pytest.raises(ValueError, match=f"edited.npz.*{match}"):
        SampledMLP.load(edited)


def test_foreign_and_malformed_files_are_value_errors_naming_them(tmp_path):
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip archive")
    with pytest.raises(ValueError, match="garbage.npz"):
        SampledMLP.load(garbage)
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, header=np.array(json.dumps({"format": "dasknn-model", "version": 2})))
    with pytest.raises(ValueError, match="foreign.npz.*does not describe a dasknn sampled"):
        SampledMLP.load(foreign)
    good = tmp_path / "good.npz"
    _fit(_model(), 1).save(good)
    arrays = _arrays(good)
    header = json.loads(str(arrays["header"]))
    for change, match in [
        ({"version": 2}, "newer"),
        ({"params": {**header["params"], "k": 0}}, "k must be an integer"),
        ({"params": {**header["params"], "colour": 1}}, "hyperparameters must be"),
        ({"optimizer": {"name": "SGD", "params": {"lr": 0.1}}}, "Adam"),
    ]:
        arrays["header"] = np.array(json.dumps(header | change))
        np.savez(tmp_path / "edited.npz", **arrays)
        with pytest.raises(ValueError, match=f"edited.npz.*{match}"):
            SampledMLP.load(tmp_path / "edited.npz")
    with pytest.raises(ValueError, match="no parameters"):
        SampledMLP().save(tmp_path / "unfitted.npz")


def test_a_checkpoint_of_another_network_or_other_data_is_refused(tmp_path):
    _fit(_model(), 1, checkpoint=tmp_path)
    with pytest.raises(ValueError, match="another model.*n_tables"):
        _fit(_model(n_tables=5), 1, resume=tmp_path)
    X, labels = _data()
    with pytest.raises(ValueError, match="other data"):
        _model().fit(X[::-1], labels[::-1], batch_size=BATCH, epochs=1, resume=tmp_path)


@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        yield client


def test_distributed_model_saves_loads_and_resumes_to_an_uninterrupted_run(client, tmp_path):
    reference = _fit(_model(), 3)
    with DistributedSampledMLP(_model(), client) as dist:
        with pytest.raises(_Stop):
            _fit(dist, 3, checkpoint=tmp_path / "run", checkpoint_every=4,
                 on_epoch=_stop_after_first_epoch)  # fmt: skip
        dist.save(tmp_path / "model.npz")
        kept = dist.gather()
    loaded = SampledMLP.load(tmp_path / "model.npz")
    _assert_same(loaded, kept)
    with DistributedSampledMLP.load(tmp_path / "model.npz", client) as dist:
        assert dist.n_steps_ == kept.n_steps_ and dist.optimizer_ == kept.optimizer_
        _assert_same(dist.gather(), kept)
        _fit(dist, 3, resume=tmp_path / "run")
        _assert_same(dist.gather(), reference)


@pytest.mark.slow
def test_a_killed_worker_is_recovered_from_the_checkpoint(client, tmp_path):
    X, labels = _data()
    reference = _model().fit(X, labels, batch_size=4, epochs=8)
    client.wait_for_workers(2, timeout=30)
    with DistributedSampledMLP(_model(), client, step_timeout=30) as dist:
        victim = dist.workers[1]
        pid = client.run(os.getpid, workers=[victim])[victim]
        killed = when_checkpoint(tmp_path, 20, lambda: os.kill(pid, signal.SIGKILL))
        dist.fit(X, labels, batch_size=4, epochs=8, checkpoint=tmp_path, checkpoint_every=5)
        killed.join()
        assert victim not in dist.workers  # its shard went to the worker that replaced it
        _assert_same(dist.gather(), reference)


@pytest.mark.slow
def test_a_retired_worker_hands_its_shard_over_and_fit_goes_on():
    """A shard worker retired mid-fit with no checkpoint: its shard moves to the spare worker
    between two steps, the worker leaves and the run ends as the uninterrupted one."""
    X, labels = _data()
    reference = _model().fit(X, labels, batch_size=4, epochs=8)
    with (
        LocalCluster(n_workers=3, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        workers = sorted(scheduler_workers(client))[:2]  # the third is the spare
        with DistributedSampledMLP(_model(), client, workers=workers, step_timeout=30) as dist:
            leaving = dist.workers[1]
            retire = retire_after_steps(client, dist, 20, leaving)
            dist.fit(X, labels, batch_size=4, epochs=8)  # no checkpoint
            retire.join()
            assert leaving not in dist.workers
            wait_until(lambda: leaving not in scheduler_workers(client), HANG_GUARD, "retired")
            _assert_same(dist.gather(), reference)
            assert dist.comm_report().steps == reference.n_steps_  # the traffic of every step


@pytest.mark.slow
def test_a_spare_worker_without_the_memory_for_a_shard_is_not_used(caplog):
    """The only spare worker is at 75 % of its memory limit: a shard worker's values would take
    it past Dask's pause threshold (80 %), so it is no spare; the retirement is refused, a
    warning names the worker, and the run goes on to the values of the uninterrupted one."""
    X, labels = _data()
    reference = _model().fit(X, labels, batch_size=4, epochs=8)
    with (
        LocalCluster(
            n_workers=3, threads_per_worker=1, memory_limit="3GiB", dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        *workers, spare = sorted(scheduler_workers(client))
        with DistributedSampledMLP(_model(), client, workers=workers, step_timeout=30) as dist:
            fill_memory_to(client, spare, 0.75)
            kept = list(dist.workers)
            retire = retire_after_steps(client, dist, 20, kept[1])
            dist.fit(X, labels, batch_size=4, epochs=8)
            retire.join()
            assert dist.workers == kept
            _assert_same(dist.gather(), reference)
    [warning] = [r.getMessage() for r in caplog.records if r.name.startswith("dasknn")]
    assert f"keeps the workers ['{kept[1]}']" in warning and "memory" in warning


@pytest.mark.slow
def test_a_retirement_with_no_spare_worker_is_refused_and_fit_goes_on(client, caplog):
    """With every worker holding a shard, a retired one has no worker to take its shard: Dask's
    retirement is refused (the worker holds an actor of the model), a warning names it and the
    run goes on with it to the values of the uninterrupted one."""
    X, labels = _data()
    reference = _model().fit(X, labels, batch_size=4, epochs=8)
    client.wait_for_workers(2, timeout=30)
    with DistributedSampledMLP(_model(), client, step_timeout=30) as dist:
        kept = list(dist.workers)
        retire = retire_after_steps(client, dist, 20, kept[1])
        dist.fit(X, labels, batch_size=4, epochs=8)
        retire.join()
        assert dist.workers == kept
        assert kept[1] in scheduler_workers(client)
        _assert_same(dist.gather(), reference)
    [warning] = [r.getMessage() for r in caplog.records if r.name.startswith("dasknn")]
    assert f"keeps the workers ['{kept[1]}']" in warning and "2 shards" in warning
