"""Saving, loading, checkpoints and resuming: a documented format that runs no code on load, clear
errors for files it cannot take, and resumed runs that end with the weights of uninterrupted ones.
"""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest
from random_layers import random_layers

from dasknn.cli import main
from dasknn.model import SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.optim import SGD, Adam

FIT = {"batch_size": 8, "epochs": 2, "progress": False, "record_batches": True}


def _model(seed: int = 0, dtype=np.float64) -> SparseMLP:
    weights, biases = random_layers([20, 40, 30, 6], 0.3, seed)
    return SparseMLP(weights, biases, activation="sigmoid", loss="mse", dtype=dtype)


def _data(seed: int = 1, rows: int = 60) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.uniform(size=(rows, 20)), rng.uniform(size=(rows, 6))


def _parts(model: SparseMLP, nparts: int = 2) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [rng.integers(0, nparts, size=n) for n in model.layer_sizes]


class _Interrupted(Exception):
    pass


def _interrupt_after(cls, batches: int):
    """``cls`` whose training stops (an exception, as a Ctrl-C would) after ``batches`` batches."""

    class Interrupted(cls):
        left = batches

        def _train_batches(self, data, rows, optimizer):
            for loss in super()._train_batches(data, rows, optimizer):
                if Interrupted.left == 0:
                    raise _Interrupted
                Interrupted.left -= 1
                yield loss

    return Interrupted


def _assert_same_weights(got: SparseMLP, want: SparseMLP, atol: float) -> None:
    for k in range(want.n_layers):
        np.testing.assert_array_equal(got.weights[k].indices, want.weights[k].indices)
        np.testing.assert_allclose(got.weights[k].data, want.weights[k].data, rtol=0, atol=atol)
        np.testing.assert_allclose(got.biases[k], want.biases[k], rtol=0, atol=atol)


def test_saved_file_is_an_npz_with_a_json_header_and_no_pickle(tmp_path):
    model = _model()
    x, y = _data()
    model.fit(x, y, optimizer=Adam(lr=0.01), **FIT)
    model.save(tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz", allow_pickle=False) as npz:  # nothing needs pickle
        header = json.loads(str(npz["header"]))
        names = set(npz.files)
    assert header["format"] == "dasknn-model" and header["version"] == 2
    assert header["optimizer"]["name"] == "Adam" and header["optimizer"]["steps"][0] == [16, 16]
    assert {"w0_indptr", "w0_data", "b0", "opt_w0_exp_avg", "opt_b2_exp_avg_sq"} <= names
    # The state travels: the loaded model goes on exactly as the saved one.
    loaded = SparseMLP.load(tmp_path / "m.npz")
    assert loaded.optimizer == Adam(lr=0.01)
    model.fit(x, y, optimizer=Adam(lr=0.01), **FIT)
    loaded.fit(x, y, optimizer=Adam(lr=0.01), **FIT)
    _assert_same_weights(loaded, model, atol=0)


def test_pattern_is_the_sha256_of_every_layers_shape_indptr_and_indices_as_int64(tmp_path):
    model = _model()
    model.save(tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz", allow_pickle=False) as npz:
        header = json.loads(str(npz["header"]))
    want = hashlib.sha256()  # the documented format, written out independently
    for w in model.weights:
        for array in (w.shape, w.indptr, w.indices):
            want.update(struct.pack(f"<{len(array)}q", *(int(v) for v in array)))
    assert header["pattern"] == want.hexdigest()


def _rewrite(path, target, change):
    stored = dict(np.load(path, allow_pickle=False))
    change(stored)
    np.savez(target, **stored)
    return target


def test_unreadable_files_are_clear_errors(tmp_path):
    model = _model()
    model.fit(*_data(), optimizer=SGD(lr=0.1, momentum=0.9), **FIT)
    good = tmp_path / "good.npz"
    model.save(good)

    def newer(stored):
        header = json.loads(str(stored["header"]))
        stored["header"] = np.array(json.dumps({**header, "version": 3}))

    with pytest.raises(ValueError, match="newer.npz: .*format version 3 is newer"):
        SparseMLP.load(_rewrite(good, tmp_path / "newer.npz", newer))
    with pytest.raises(ValueError, match="short.npz: .*momentum_buffer has shape"):
        SparseMLP.load(
            _rewrite(
                good,
                tmp_path / "short.npz",
                lambda s: s.update(opt_w1_momentum_buffer=s["opt_w1_momentum_buffer"][:-1]),
            )
        )
    with pytest.raises(ValueError, match="object.npz: not a readable"):  # would need pickle
        SparseMLP.load(
            _rewrite(good, tmp_path / "object.npz", lambda s: s.update(b0=np.array([{}, 1])))
        )
    payload = good.read_bytes()
    (tmp_path / "cut.npz").write_bytes(payload[: len(payload) // 2])
    with pytest.raises(ValueError, match="cut.npz"):
        SparseMLP.load(tmp_path / "cut.npz")
    corrupt = bytearray(payload)
    corrupt[len(payload) // 3 : len(payload) // 3 + 64] = bytes(64)
    (tmp_path / "corrupt.npz").write_bytes(bytes(corrupt))
    with pytest.raises(ValueError, match="corrupt.npz"):
        SparseMLP.load(tmp_path / "corrupt.npz")


def test_local_resume_ends_with_the_uninterrupted_weights(tmp_path):
    x, y = _data()
    uninterrupted = _model()
    uninterrupted.fit(x, y, optimizer=Adam(lr=0.02), **FIT)

    interrupted = _interrupt_after(SparseMLP, 11)(_model().weights, _model().biases)
    with pytest.raises(_Interrupted):
        interrupted.fit(
            x, y, optimizer=Adam(lr=0.02), checkpoint=tmp_path, checkpoint_every=3, **FIT
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-000000009.npz"]

    resumed = _model()
    resumed.fit(x, y, optimizer=Adam(lr=0.02), resume=tmp_path, **FIT)
    _assert_same_weights(resumed, uninterrupted, atol=0)
    assert resumed.loss_curve_ == uninterrupted.loss_curve_
    assert resumed.batch_loss_curve_ == uninterrupted.batch_loss_curve_

    # A checkpoint is refused by another model, other data, other batches or another optimizer.
    with pytest.raises(ValueError, match="a checkpoint of another model"):
        _model(seed=3).fit(x, y, optimizer=Adam(lr=0.02), resume=tmp_path, **FIT)
    with pytest.raises(ValueError, match="a checkpoint of another model .*dtype"):
        _model(dtype=np.float32).fit(x, y, optimizer=Adam(lr=0.02), resume=tmp_path, **FIT)
    with pytest.raises(ValueError, match="other data"):
        _model().fit(x + 1, y, optimizer=Adam(lr=0.02), resume=tmp_path, **FIT)
    with pytest.raises(ValueError, match="batch_size=4"):
        _model().fit(x, y, optimizer=Adam(lr=0.02), resume=tmp_path, **{**FIT, "batch_size": 4})
    with pytest.raises(ValueError, match="same optimizer"):
        _model().fit(x, y, optimizer=Adam(lr=0.5), resume=tmp_path, **FIT)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        _model().fit(x, y, resume=tmp_path / "empty")


def test_distributed_checkpoints_resume_on_a_new_model(dask_client, tmp_path):
    """A distributed run interrupted after 7 batches, resumed on a new distributed model, and its
    checkpoint read by the one-process model: the weights of an uninterrupted run."""
    x, y = _data()
    uninterrupted = _model()
    uninterrupted.fit(x, y, optimizer=Adam(lr=0.02), **FIT)
    model = _model()
    cls = _interrupt_after(DistributedSparseMLP, 7)
    with cls(model, dask_client, partition=_parts(model)) as dist:
        with pytest.raises(_Interrupted):
            dist.fit(x, y, optimizer=Adam(lr=0.02), checkpoint=tmp_path, checkpoint_every=5, **FIT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-000000005.npz"]
    local = _model()
    local.fit(x, y, optimizer=Adam(lr=0.02), resume=tmp_path, **FIT)
    _assert_same_weights(local, uninterrupted, atol=1e-12)
    with DistributedSparseMLP(model, dask_client, partition=_parts(model, 3)) as dist:
        dist.fit(x, y, optimizer=Adam(lr=0.02), resume=tmp_path, checkpoint=tmp_path, **FIT)
        np.testing.assert_allclose(dist.loss_curve_, uninterrupted.loss_curve_, rtol=1e-12)
        _assert_same_weights(dist.gather(), uninterrupted, atol=1e-12)
        dist.save(tmp_path / "dist.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-000000016.npz", "dist.npz"]
    saved = SparseMLP.load(tmp_path / "dist.npz")
    final = SparseMLP.load(tmp_path / "checkpoint-000000016.npz")
    _assert_same_weights(saved, uninterrupted, atol=1e-12)
    _assert_same_weights(final, uninterrupted, atol=1e-12)
    for (w_got, b_got), (w_want, b_want) in zip(
        saved._optimizer_state, uninterrupted._optimizer_state, strict=True
    ):
        assert w_got.step == w_want.step == 16
        for name in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_allclose(w_got.arrays[name], w_want.arrays[name], atol=1e-12)
            np.testing.assert_allclose(b_got.arrays[name], b_want.arrays[name], atol=1e-12)


def test_cli_checkpoint_resume_and_save(dask_client, tmp_path, capsys):
    common = [
        "train", "radixnet:32:2", "--parts", "2", "--partition", "random", "--samples", "48",
        "--batch-size", "8", "--lr", "0.1", "--scheduler", dask_client.scheduler.address,
    ]  # fmt: skip
    checkpoints = tmp_path / "checkpoints"
    assert main([*common, "--epochs", "1", "--checkpoint-dir", str(checkpoints)]) == 0
    assert [p.name for p in checkpoints.iterdir()] == ["checkpoint-000000006.npz"]
    resumed, whole = tmp_path / "resumed.npz", tmp_path / "whole.npz"
    argv = [*common, "--epochs", "2", "--resume", str(checkpoints), "--save", str(resumed)]
    assert main(argv) == 0
    assert "partition: that of the checkpoint" in capsys.readouterr().out
    argv = [*common, "--epochs", "2", "--checkpoint-dir", str(tmp_path), "--save", str(whole)]
    assert main(argv) == 0
    _assert_same_weights(SparseMLP.load(resumed), SparseMLP.load(whole), atol=1e-12)
    capsys.readouterr()
    assert main([*common, "--resume", str(tmp_path / "absent")]) == 2
    assert "absent' does not exist" in capsys.readouterr().err
