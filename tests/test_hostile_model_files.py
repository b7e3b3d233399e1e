"""Model files and checkpoints edited by hand or damaged: every one is a ``ValueError`` naming
the file and what is wrong, before a model is built from it; nothing is unpickled."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from random_layers import random_layers

from dasknn.model import CompressedMLP, SparseMLP
from dasknn.optim import Adam
from dasknn.pruning import magnitude_masks

FIT = {"batch_size": 8, "epochs": 2, "progress": False}


def _sparse(tmp_path):
    weights, biases = random_layers([12, 16, 6], 0.4, seed=0)
    model = SparseMLP(weights, biases, activation="sigmoid", loss="mse", dtype=np.float64)
    rng = np.random.default_rng(1)
    x, y = rng.uniform(size=(40, 12)), rng.uniform(size=(40, 6))
    model.fit(x, y, optimizer=Adam(lr=0.01), checkpoint=tmp_path / "ckpt", **FIT)
    model.save(tmp_path / "model.npz")
    return model, x, y


def _compressed(tmp_path):
    rng = np.random.default_rng(2)
    weights = [rng.uniform(-1, 1, (12, 10)), rng.uniform(-1, 1, (10, 5))]
    biases = [rng.uniform(-0.1, 0.1, 10), rng.uniform(-0.1, 0.1, 5)]
    model = CompressedMLP(weights, magnitude_masks(weights, 0.6), biases, precision="fp64")
    x, y = rng.uniform(size=(16, 12)), rng.integers(0, 5, 16)
    model.fit(x, y, optimizer=Adam(lr=0.01), **FIT)
    model.save(tmp_path / "compressed.npz")
    return model


def _edit(source, target, change):
    stored = dict(np.load(source, allow_pickle=False))
    change(stored)
    np.savez(target, **stored)
    return target


def _edit_header(source, target, change):
    def edit(stored):
        header = json.loads(str(stored["header"]))
        change(header)
        stored["header"] = np.array(json.dumps(header))

    return _edit(source, target, edit)


def test_a_checkpoint_whose_position_lies_beyond_its_epoch_is_refused(tmp_path):
    _, x, y = _sparse(tmp_path)
    [checkpoint] = (tmp_path / "ckpt").glob("checkpoint-*.npz")

    def skip_ahead(header):
        header["progress"]["batch"] = 10**6

    edited = tmp_path / "edited"
    edited.mkdir()
    _edit_header(checkpoint, edited / checkpoint.name, skip_ahead)
    fresh = SparseMLP(*random_layers([12, 16, 6], 0.4, seed=0), activation="sigmoid", loss="mse")
    with pytest.raises(ValueError, match=r"checkpoint-.*batch 1000000.*5 batches an epoch"):
        fresh.fit(x, y, optimizer=Adam(lr=0.01), resume=edited, **FIT)


def test_a_resume_with_another_batch_size_names_the_argument(tmp_path):
    _, x, y = _sparse(tmp_path)
    fresh = SparseMLP(*random_layers([12, 16, 6], 0.4, seed=0), activation="sigmoid", loss="mse")
    with pytest.raises(ValueError, match="other arguments.*batch_size=4") as refused:
        fresh.fit(
            x, y, optimizer=Adam(lr=0.01), resume=tmp_path / "ckpt", **{**FIT, "batch_size": 4}
        )
    assert "other call" not in str(refused.value)


def test_negative_adam_second_moments_are_refused(tmp_path):
    _sparse(tmp_path)

    def negative(stored):
        stored["opt_w0_exp_avg_sq"] = -np.abs(stored["opt_w0_exp_avg_sq"]) - 1.0

    bad = _edit(tmp_path / "model.npz", tmp_path / "negative.npz", negative)
    with pytest.raises(ValueError, match=r"negative.npz: .*opt_w0_exp_avg_sq.*negative"):
        SparseMLP.load(bad)


def test_a_compressed_layer_shape_or_index_edited_is_refused(tmp_path):
    _compressed(tmp_path)
    source = tmp_path / "compressed.npz"
    wider = _edit(source, tmp_path / "wider.npz", lambda s: s.update(w0_shape=np.array([13, 10])))
    with pytest.raises(ValueError, match=r"wider.npz: .*pattern"):
        CompressedMLP.load(wider)

    def other_pattern(stored):
        index = stored["w0_index"]
        free = np.setdiff1d(np.arange(120, dtype=index.dtype), index)
        stored["w0_index"] = np.sort(np.concatenate([index[:-1], free[:1]]))

    moved = _edit(source, tmp_path / "moved.npz", other_pattern)
    with pytest.raises(ValueError, match=r"moved.npz: .*pattern"):
        CompressedMLP.load(moved)


def test_damaged_archives_are_value_errors_naming_the_file(tmp_path):
    _sparse(tmp_path)
    good = (tmp_path / "model.npz").read_bytes()
    central = good.index(b"PK\x01\x02")  # the first entry of the central directory
    encrypted = bytearray(good)
    encrypted[central + 8] |= 0x1  # its general purpose flags: encrypted
    (tmp_path / "encrypted.npz").write_bytes(bytes(encrypted))
    future = bytearray(good)
    future[central + 6] = 99  # the zip version needed to extract it: a future one
    (tmp_path / "future.npz").write_bytes(bytes(future))
    for name in ("encrypted.npz", "future.npz"):
        with pytest.raises(ValueError, match=name):
            SparseMLP.load(tmp_path / name)
        with pytest.raises(ValueError, match=name):
            CompressedMLP.load(tmp_path / name)


def test_a_deeply_nested_header_is_a_value_error(tmp_path):
    _sparse(tmp_path)
    nested = _edit(
        tmp_path / "model.npz",
        tmp_path / "nested.npz",
        lambda s: s.update(header=np.array("[" * 100_000 + "]" * 100_000)),
    )
    with pytest.raises(ValueError, match="nested.npz: .*header"):
        SparseMLP.load(nested)


def test_a_pickle_is_refused_without_numpy_s_advice(tmp_path):
    path = tmp_path / "pickled.npz"
    path.write_bytes(pickle.dumps({"weights": [1, 2, 3]}))
    with pytest.raises(ValueError, match="pickled.npz") as refused:
        SparseMLP.load(path)
    assert "allow_pickle" not in str(refused.value)
    assert "pickle" in str(refused.value)
    objects = _edit(
        _sparse_path(tmp_path),
        tmp_path / "objects.npz",
        lambda s: s.update(b0=np.array([{}, 1], dtype=object)),
    )
    with pytest.raises(ValueError, match="objects.npz") as refused:
        SparseMLP.load(objects)
    assert "allow_pickle" not in str(refused.value)


def _sparse_path(tmp_path):
    _sparse(tmp_path)
    return tmp_path / "model.npz"
