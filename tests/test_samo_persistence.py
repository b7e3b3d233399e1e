"""The compressed model file: a saved and loaded CompressedMLP continues training exactly as the
original, the file holds the documented arrays, and hostile or corrupted files are refused with
an error naming the file."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest

from dasknn.model import CompressedMLP
from dasknn.optim import Adam
from dasknn.pruning import magnitude_masks

SIZES = (12, 9, 4)


def trained(precision="fp32", compute="sparse", steps=3):
    rng = np.random.default_rng(3)
    weights = [rng.uniform(-1, 1, (a, b)) for a, b in zip(SIZES[:-1], SIZES[1:], strict=True)]
    biases = [rng.uniform(-0.1, 0.1, b) for b in SIZES[1:]]
    model = CompressedMLP(
        weights, magnitude_masks(weights, 0.7), biases, precision=precision, compute=compute
    )
    x, y = rng.uniform(0, 1, (8, SIZES[0])), rng.integers(0, SIZES[-1], 8)
    for _ in range(steps):
        model.train_step(x, y, optimizer=Adam(lr=0.05))
    return model, x, y


PRECISIONS = [("fp32", "sparse"), ("fp64", "dense"), ("fp16", "dense"), ("bf16", "sparse")]


@pytest.mark.parametrize(("precision", "compute"), PRECISIONS)
def test_a_loaded_model_continues_training_exactly_as_the_saved_one(tmp_path, precision, compute):
    if precision == "bf16":
        pytest.importorskip("ml_dtypes")
    model, x, y = trained(precision, compute)
    path = tmp_path / "model.npz"
    model.save(path)
    loaded = CompressedMLP.load(path)
    assert (loaded.precision.name, loaded.compute) == (precision, compute)
    assert loaded.steps_ == model.steps_ == 3 and loaded.optimizer == Adam(lr=0.05)
    if precision == "fp16":
        assert vars(loaded.scaler) == vars(model.scaler)
    for a, b in zip(loaded.stack.layers, model.stack.layers, strict=True):
        np.testing.assert_array_equal(a.index, b.index)
        np.testing.assert_array_equal(a.master, b.master)
        assert a.master.dtype == b.master.dtype
        a_w, b_w = a.optimizer_state[0], b.optimizer_state[0]
        for name in b_w.arrays:
            np.testing.assert_array_equal(a_w.arrays[name], b_w.arrays[name])
    np.testing.assert_array_equal(loaded.predict_proba(x), model.predict_proba(x))
    for _ in range(2):
        assert loaded.train_step(x, y, optimizer=Adam(lr=0.05)) == model.train_step(
            x, y, optimizer=Adam(lr=0.05)
        )
    for a, b in zip(loaded.weights + loaded.biases, model.weights + model.biases, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_file_holds_the_index_values_and_biases_as_documented(tmp_path):
    model, _, _ = trained(steps=0)
    model.save(tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz", allow_pickle=False) as npz:
        header = json.loads(str(npz["header"]))
        assert header["format"] == "dasknn-compressed-model" and header["version"] == 2
        assert header["n_layers"] == 2 and header["precision"] == "fp32"
        assert header["optimizer"] is None  # no step taken: no optimizer state
        for k, w in enumerate(model.weights):
            index = npz[f"w{k}_index"]
            assert index.dtype == np.int32 and (np.diff(index) > 0).all()
            assert list(npz[f"w{k}_shape"]) == list(w.shape)
            dense = np.zeros(w.size)
            dense[index] = npz[f"w{k}_values"]
            np.testing.assert_array_equal(dense.reshape(w.shape), w)
            np.testing.assert_array_equal(npz[f"b{k}"], model.biases[k])


def _stored(path):
    with np.load(path, allow_pickle=False) as npz:
        return {key: npz[key] for key in npz.files}


def _header_with(stored, **changes):
    header = json.loads(str(stored["header"])) | changes
    stored["header"] = np.array(json.dumps(header))


def _swap(a):
    a = a.copy()
    a[[0, 1]] = a[[1, 0]]
    return a


CORRUPTIONS = {
    "unsorted index": (lambda s: s.update(w0_index=_swap(s["w0_index"])), "unsorted positions"),
    "duplicate index": (
        lambda s: s.update(w0_index=np.r_[s["w0_index"][:1], s["w0_index"][:-1]]),
        "a duplicate",
    ),
    "index out of range": (
        lambda s: s.update(w1_index=np.r_[s["w1_index"][:-1], 9 * 4].astype(np.int32)),
        r"positions outside \[0, 36\)",
    ),
    "a layer of 2**31 entries": (
        lambda s: s.update(w0_shape=np.array([2**16, 2**15], dtype=np.int64)),
        r"2\*\*31 - 1",
    ),
    "values shorter than the index": (
        lambda s: s.update(w0_values=s["w0_values"][:-1]),
        "one value per index entry",
    ),
    "values of another dtype": (
        lambda s: s.update(w0_values=s["w0_values"].astype(np.float64)),
        "w0_values must be float32",
    ),
    "a NaN weight": (
        lambda s: s["w1_values"].__setitem__(0, np.nan),
        "w1_values holds NaN",
    ),
    "a bias of the wrong length": (lambda s: s.update(b1=s["b1"][:-1]), r"b1 must be float32"),
    "layers that do not chain": (
        lambda s: s.update(w1_shape=np.array([10, 4], dtype=np.int64)),
        "layer 2 has 10 inputs, layer 1 9 outputs",
    ),
    "a missing entry": (lambda s: s.pop("w1_values"), "lacks the entry 'w1_values'"),
    "a pickled object array": (
        lambda s: s.update(w0_index=np.array([object()], dtype=object)),
        "not a readable",
    ),
    "a newer version": (lambda s: _header_with(s, version=3), "newer than this dasknn reads"),
    "another format": (lambda s: _header_with(s, format="dasknn-model"), "does not describe"),
    "an unknown precision": (lambda s: _header_with(s, precision="fp8"), "unknown precision"),
    "an unknown activation": (lambda s: _header_with(s, activation="tanh2"), "tanh2"),
    "too many layers": (lambda s: _header_with(s, n_layers=10**9), "cannot hold that"),
    "fp16 without its loss scale": (
        lambda s: _header_with(s, loss_scaler=None),
        "fp16 needs its loss scaler",
    ),
    "optimizer state of the wrong length": (
        lambda s: s.update({k: s[k][:-1] for k in s if k.startswith("opt_w0_")}),
        "optimizer state opt_w0_",
    ),
    "a negative optimizer step count": (
        lambda s: _header_with(
            s, optimizer=json.loads(str(s["header"]))["optimizer"] | {"steps": [[-1, 3], [3, 3]]}
        ),
        "bad optimizer step count -1",
    ),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_corrupted_file_is_refused_naming_it(tmp_path, corruption):
    model, _, _ = trained("fp16", "dense")
    path = tmp_path / "model.npz"
    model.save(path)
    stored = _stored(path)
    change, message = CORRUPTIONS[corruption]
    change(stored)
    np.savez(path, **stored)
    with pytest.raises(ValueError, match=message) as error:
        CompressedMLP.load(path)
    assert str(path) in str(error.value)


def test_a_truncated_or_missing_file_is_refused(tmp_path):
    model, _, _ = trained()
    path = tmp_path / "model.npz"
    model.save(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a readable .npz"):
        CompressedMLP.load(path)
    with pytest.raises(FileNotFoundError):
        CompressedMLP.load(tmp_path / "absent.npz")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        model.save(tmp_path / "no" / "dir.npz")


@pytest.mark.parametrize("compute", ["dense", "sparse"])
def test_a_shape_its_arrays_do_not_back_is_refused_before_allocating(tmp_path, compute):
    # the first layer's header claims 238,609,294 x 9 = 2**31 - 2 entries: every array still
    # fits it (the flat positions of a 12 x 9 layer are those of any n x 9 layer, the bias has
    # 9 entries, the second layer has 9 inputs), but building it would allocate 8.6 GB of dense
    # float32 weights (compute="dense") or 1.9 GB of row pointers
    model, _, _ = trained("fp32", compute)
    path = tmp_path / "hostile.npz"
    model.save(path)
    stored = _stored(path)
    n_in = (2**31 - 1) // SIZES[1]
    stored["w0_shape"] = np.array([n_in, SIZES[1]], dtype=np.int64)
    np.savez(path, **stored)
    held = sum(stored[name].nbytes for name in ("w0_index", "w0_values", "b0"))
    needed = 8 * (n_in + 1) + (n_in * SIZES[1] * 4 if compute == "dense" else 0)
    assert needed > 1024 * held
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=rf"w0_shape \({n_in}, 9\) would allocate") as error:
            CompressedMLP.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(path) in str(error.value) and f"{needed:,} bytes" in str(error.value)
    assert peak < 2**24  # refused before the layer's memory was allocated


def test_a_layer_pruned_to_99_9_percent_still_loads(tmp_path):
    # 1,000 x 1,000 at 99.9%: 1,000 weights; its dense float16 compute weights are 2 MB for 12 kB
    # of arrays (index, values, bias), within the bound
    rng = np.random.default_rng(5)
    weights = [rng.uniform(-1, 1, (1000, 1000)), rng.uniform(-1, 1, (1000, 3))]
    masks = magnitude_masks(weights, 0.999, scope="layer")
    model = CompressedMLP(weights, masks, precision="fp16", compute="dense")
    model.save(tmp_path / "sparse.npz")
    loaded = CompressedMLP.load(tmp_path / "sparse.npz")
    for a, b in zip(loaded.weights, model.weights, strict=True):
        np.testing.assert_array_equal(a, b)
