"""SparseMLP construction, RadiX-Net networks, save/load, and clear errors on bad input."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import dasknn
from dasknn.datasets import radixnet
from dasknn.model import SparseMLP, get_activation, get_loss
from dasknn.model.losses import softmax


def small_model(**kwargs):
    rng = np.random.default_rng(0)
    weights = [sp.random(8, 6, density=0.5, random_state=1, format="csr"),
               sp.random(6, 3, density=0.6, random_state=2, format="csr")]
    biases = [rng.random(6), rng.random(3)]
    return SparseMLP(weights, biases, **kwargs)


def test_package_root_exports_sparse_mlp():
    assert dasknn.SparseMLP is SparseMLP


def test_activation_and_loss_registry():
    for name in ("sigmoid", "relu", "clipped_relu", "identity"):
        a = get_activation(name)
        assert a.name == name
        z32 = np.linspace(-40, 40, 9, dtype=np.float32)
        assert a.forward(z32).dtype == np.float32 and a.derivative(z32).dtype == np.float32
    np.testing.assert_array_equal(get_activation("clipped_relu").forward(np.array([-1.0, 5, 40])),
                                  [0, 5, 32])
    for name in ("mse", "softmax_cross_entropy"):
        assert get_loss(name).name == name
    with pytest.raises(ValueError, match="unknown activation 'tanh'"):
        get_activation("tanh")
    with pytest.raises(ValueError, match="unknown loss 'hinge'"):
        get_loss("hinge")


@pytest.mark.parametrize("name", ["sigmoid", "relu", "clipped_relu", "identity"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_activations_written_into_out_equal_the_new_arrays(name, dtype):
    activation = get_activation(name)
    z = np.linspace(-40, 40, 24, dtype=dtype).reshape(4, 6)
    z[0, :3] = (0, 32, -0.0)  # the kinks
    a = activation.forward(z)
    out = np.full_like(z, np.nan)  # stale values of an earlier step
    assert activation.forward(z, out=out) is out
    np.testing.assert_array_equal(out, a)
    for given in (None, a):
        out = np.full_like(z, np.nan)
        assert activation.derivative(z, given, out=out) is out
        np.testing.assert_array_equal(out, activation.derivative(z, given))


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-15), (np.float32, 1e-6)])
def test_sigmoid_matches_scipy_expit(dtype, rtol):
    from scipy.special import expit

    z = np.linspace(-60, 60, 2001).reshape(-1, 3).astype(dtype)
    sig = get_activation("sigmoid")
    np.testing.assert_allclose(sig.forward(z), expit(z), rtol=rtol)
    np.testing.assert_allclose(sig.forward(z.T), expit(z.T), rtol=rtol)  # a strided view
    expected = expit(z) * (1 - expit(z))  # 1 - a cancels near a = 1: compare absolutely
    for derivative in (sig.derivative(z), sig.derivative(z, sig.forward(z))):
        np.testing.assert_allclose(derivative, expected, rtol=rtol, atol=rtol / 4)


def test_derivative_from_activations_equals_derivative_from_pre_activations():
    z = np.linspace(-40, 40, 161)
    for name in ("sigmoid", "relu", "clipped_relu", "identity"):
        f = get_activation(name)
        np.testing.assert_array_equal(f.derivative(z, f.forward(z)), f.derivative(z))


def test_numerically_stable_sigmoid_and_softmax():
    z = np.array([[-1000.0, 0.0, 1000.0]])
    sig = get_activation("sigmoid")
    assert np.all(np.isfinite(sig.forward(z))) and np.all(np.isfinite(sig.derivative(z)))
    np.testing.assert_allclose(softmax(z), [[0, 0, 1]])
    loss = get_loss("softmax_cross_entropy")
    assert loss.value(z, z, np.array([[0.0, 0.0, 1.0]])) == pytest.approx(0.0)
    assert loss.value(z, z, np.array([[1.0, 0.0, 0.0]])) == pytest.approx(2000.0)


def test_defaults_and_properties():
    model = small_model()
    assert model.layer_sizes == [8, 6, 3] and model.n_layers == 2
    assert model.activation.name == model.output_activation.name == "sigmoid"
    assert model.loss.name == "mse" and model.dtype == np.float64
    sm = small_model(activation="relu", loss="softmax_cross_entropy")
    assert sm.output_activation.name == "identity"
    probs = sm.predict_proba(np.ones((4, 8)))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    # Weights are the model's own sorted copies.
    w = sp.csr_matrix(np.array([[0.0, 2.0, 1.0]]))
    w.indices = w.indices[::-1].copy()
    w.data = w.data[::-1].copy()
    w.has_sorted_indices = False
    model = SparseMLP([w])
    assert model.weights[0].has_sorted_indices and model.weights[0] is not w
    model.train_step(np.ones((1, 1)), np.zeros((1, 3)), lr=1.0)
    np.testing.assert_array_equal(w.toarray(), [[0.0, 2.0, 1.0]])


def test_radixnet_model():
    model = SparseMLP.radixnet(neurons=64, layers=3, seed=2)
    pattern = radixnet(64, 3, seed=2)
    assert model.layer_sizes == [64] * 4
    for w, p in zip(model.weights, pattern, strict=True):
        np.testing.assert_array_equal(w.indptr, p.indptr)
        np.testing.assert_array_equal(w.indices, p.indices)
        assert np.all(np.abs(w.data) <= 1) and w.data.std() > 0.4
    assert all(np.all(b == 0) for b in model.biases)
    again = SparseMLP.radixnet(neurons=64, layers=3, seed=2)
    np.testing.assert_array_equal(again.weights[1].data, model.weights[1].data)
    other = SparseMLP.radixnet(neurons=64, layers=3, seed=3)
    assert not np.array_equal(other.weights[0].data, model.weights[0].data)


def test_radixnet_with_other_input_and_output_widths():
    model = SparseMLP.radixnet(
        neurons=64, layers=2, n_inputs=100, n_outputs=10, activation="relu",
        loss="softmax_cross_entropy", scale="he", bias=0.1, dtype=np.float32,
    )
    assert model.layer_sizes == [100, 64, 64, 10] and model.dtype == np.float32
    assert np.all(np.diff(model.weights[0].indptr) == 32)
    assert model.weights[-1].nnz == 640
    he_hidden = np.sqrt(6 / 32)
    assert np.abs(model.weights[1].data).max() <= he_hidden
    assert np.abs(model.weights[-1].data).max() <= np.sqrt(6 / 64)
    assert all(np.all(b == np.float32(0.1)) for b in model.biases)
    assert model.output_activation.name == "identity"


def test_save_load_round_trip(tmp_path):
    model = small_model(activation="clipped_relu", output_activation="sigmoid", dtype=np.float32)
    model.train_step(np.ones((2, 8)), np.zeros((2, 3)), lr=0.1)
    path = tmp_path / "model.npz"
    model.save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.npz"]
    loaded = SparseMLP.load(path)
    assert loaded.dtype == np.float32 and loaded.activation.name == "clipped_relu"
    assert loaded.output_activation.name == "sigmoid" and loaded.loss.name == "mse"
    for a, b in zip(model.weights, loaded.weights, strict=True):
        assert (a != b).nnz == 0 and a.nnz == b.nnz
    X = np.random.default_rng(0).random((3, 8))
    np.testing.assert_array_equal(model.predict(X), loaded.predict(X))


def test_save_into_missing_folder_leaves_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        small_model().save(tmp_path / "absent" / "m.npz")
    assert list(tmp_path.iterdir()) == []


def test_load_rejects_bad_files(tmp_path):
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="not a readable"):
        SparseMLP.load(garbage)
    partial = tmp_path / "partial.npz"
    with open(partial, "wb") as fh:
        np.savez(fh, format=np.array(1), n_layers=np.array(1))
    with pytest.raises(ValueError, match="lacks the entry"):
        SparseMLP.load(partial)
    with pytest.raises(FileNotFoundError):
        SparseMLP.load(tmp_path / "missing.npz")


@pytest.mark.parametrize(
    "X, message",
    [
        (np.ones((2, 7)), "7 features per sample but the network's input layer has 8"),
        (np.ones(8), "must be a 2-D array"),
        (np.ones((0, 8)), "no samples"),
        (np.where(np.eye(2, 8) > 0, np.nan, 1.0), "NaN or infinite"),
        (np.full((2, 8), np.inf), "NaN or infinite"),
        (np.array([["a"] * 8]), "real numbers"),
    ],
)
def test_bad_inputs_are_rejected_before_any_update(X, message):
    model = small_model()
    before = [w.data.copy() for w in model.weights]
    for call in (lambda: model.train_step(X, np.zeros((len(X), 3)), lr=0.1),
                 lambda: model.predict(X), lambda: model.forward(X),
                 lambda: model.fit(X, np.zeros((len(X), 3)), progress=False)):
        with pytest.raises(ValueError, match=message):
            call()
    for w, b in zip(model.weights, before, strict=True):
        np.testing.assert_array_equal(w.data, b)


@pytest.mark.parametrize(
    "loss, Y, message",
    [
        ("mse", np.zeros((2, 4)), r"Y must have shape \(2, 3\), got \(2, 4\)"),
        ("mse", np.zeros(2, dtype=int), r"Y must have shape \(2, 3\)"),
        ("mse", np.array([[0.0, np.nan, 0.0]] * 2), "Y contains NaN"),
        ("softmax_cross_entropy", np.array([0, 3]), r"labels must lie in \[0, 3\)"),
        ("softmax_cross_entropy", np.array([0, -1]), r"labels must lie in \[0, 3\)"),
        ("softmax_cross_entropy", np.array([0.0, 1.0]), "must be integers"),
        ("softmax_cross_entropy", np.array([0, 1, 2]), "got 3 labels for 2 samples"),
        ("softmax_cross_entropy", np.zeros((3, 3)), r"or integer labels of shape \(2,\)"),
    ],
)
def test_bad_targets(loss, Y, message):
    model = small_model(loss=loss)
    with pytest.raises(ValueError, match=message):
        model.train_step(np.ones((2, 8)), Y, lr=0.1)


def test_integer_labels_equal_one_hot_targets():
    a = small_model(loss="softmax_cross_entropy")
    b = a.copy()
    X = np.random.default_rng(1).random((4, 8))
    a.train_step(X, np.array([0, 2, 1, 2]), lr=0.3)
    b.train_step(X, np.eye(3)[[0, 2, 1, 2]], lr=0.3)
    np.testing.assert_array_equal(a.weights[0].data, b.weights[0].data)


def test_bad_construction_and_arguments():
    w = sp.random(4, 3, density=0.5, random_state=0, format="csr")
    with pytest.raises(ValueError, match="at least one weight"):
        SparseMLP([])
    with pytest.raises(ValueError, match=r"weights\[1\] has 4 input neurons but weights\[0\]"):
        SparseMLP([w, w])
    with pytest.raises(ValueError, match=r"biases\[0\] must have shape \(3,\)"):
        SparseMLP([w], [np.zeros(4)])
    with pytest.raises(ValueError, match="got 2 biases for 1 layers"):
        SparseMLP([w], [np.zeros(3), np.zeros(3)])
    bad = w.copy()
    bad.data[0] = np.nan
    with pytest.raises(ValueError, match=r"weights\[0\] contains NaN"):
        SparseMLP([bad])
    with pytest.raises(ValueError, match="float32 or float64"):
        SparseMLP([w], dtype=np.int32)
    with pytest.raises(ValueError, match="needs a linear output layer"):
        SparseMLP([w], loss="softmax_cross_entropy", output_activation="sigmoid")
    model = SparseMLP([w])
    X, Y = np.ones((2, 4)), np.zeros((2, 3))
    with pytest.raises(ValueError, match="learning rate"):
        model.train_step(X, Y, lr=np.nan)
    with pytest.raises(ValueError, match="learning rate"):
        model.fit(X, Y, lr=-1.0, progress=False)
    for call in (
        lambda: model.fit(X, Y, batch_size=0, progress=False),
        lambda: model.predict(X, batch_size=0),
        lambda: model.evaluate(X, Y, batch_size=0),
    ):
        with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
            call()
    with pytest.raises(ValueError, match="epochs must be an integer >= 0"):
        model.fit(X, Y, epochs=-1, progress=False)
    with pytest.raises(ValueError, match="scale must be"):
        SparseMLP.radixnet(64, 1, scale="lecun")
    with pytest.raises(ValueError, match="neurons must be"):
        SparseMLP.radixnet(100, 1)


def test_fit_progress_bar_writes_to_stderr(capsys):
    model = small_model()
    history = model.fit(np.ones((6, 8)), np.zeros((6, 3)), batch_size=2, epochs=2, lr=0.1)
    assert history is model
    assert len(model.loss_curve_) == 2 and model.loss_curve_[1] < model.loss_curve_[0]
    assert "epoch" in capsys.readouterr().err
