"""SparseMLP against the independent dense float64 reference: several SGD steps, every activation,
both losses, batch size 1 and > 1, float32 and float64."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import scipy.sparse as sp
from model_reference import DenseReference

from dasknn import SparseMLP

SIZES = [9, 7, 6, 4]


def random_network(seed, dtype, sizes=SIZES, density=0.45):
    """Random sparse layers (some neurons without inputs or outputs) and biases."""
    rng = np.random.default_rng(seed)
    weights, biases = [], []
    for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True):
        mask = rng.random((n_in, n_out)) < density
        values = rng.uniform(-1, 1, (n_in, n_out)) * mask
        weights.append(sp.csr_matrix(values.astype(dtype)))
        biases.append(rng.uniform(-0.5, 0.5, n_out).astype(dtype))
    return weights, biases


def targets(rng, loss, batch, n_out):
    if loss == "mse":
        return rng.random((batch, n_out))
    return np.eye(n_out)[rng.integers(0, n_out, batch)]


def relative_error(actual, expected):
    """Largest entry error relative to the largest magnitude of the expected array."""
    expected = np.asarray(expected, dtype=np.float64)
    return np.max(np.abs(np.asarray(actual, dtype=np.float64) - expected)) / max(
        np.max(np.abs(expected)), 1e-300
    )


TOLERANCE = {np.float64: 1e-10, np.float32: 1e-5}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("loss", ["mse", "softmax_cross_entropy"])
@pytest.mark.parametrize("activation", ["sigmoid", "relu", "clipped_relu", "identity"])
@pytest.mark.parametrize("batch", [1, 5, 13])
def test_steps_match_reference(activation, loss, dtype, batch):
    seed = zlib.crc32(f"{activation}{loss}{batch}".encode())
    weights, biases = random_network(seed, dtype=dtype)
    model = SparseMLP(weights, biases, activation=activation, loss=loss, dtype=dtype)
    out_act = "identity" if loss == "softmax_cross_entropy" else activation
    ref = DenseReference(weights, biases, activation, out_act, loss)
    rng = np.random.default_rng(7)
    # Inputs large enough that the clipped ReLU reaches its cap of 32 somewhere.
    x_scale = 40.0 if activation == "clipped_relu" else 1.0
    lr = {"sigmoid": 0.5, "relu": 0.1, "clipped_relu": 0.002, "identity": 0.05}[activation]
    tol = TOLERANCE[dtype]
    if activation == "clipped_relu":
        z = ref.forward(rng.random((50, SIZES[0])) * x_scale)[0]
        assert any((zk > 32).any() for zk in z[:-1]), "test data never reaches the cap"
    for _ in range(4):
        X = (rng.random((batch, SIZES[0])) * x_scale).astype(dtype)
        Y = targets(rng, loss, batch, SIZES[-1]).astype(dtype)
        expected_loss = ref.loss_value(X, Y)
        got_loss = model.train_step(X, Y, lr=lr)
        ref.step(X, Y, lr)
        assert abs(got_loss - expected_loss) <= tol * max(abs(expected_loss), 1.0)
    for k in range(len(SIZES) - 1):
        w = model.weights[k]
        assert w.dtype == dtype and model.biases[k].dtype == dtype
        assert relative_error(w.toarray(), ref.W[k]) <= tol
        assert relative_error(model.biases[k], ref.b[k]) <= tol
        # The pattern never changes.
        assert (w.toarray() != 0).sum() <= w.nnz == weights[k].nnz
    X = (rng.random((6, SIZES[0])) * x_scale).astype(dtype)
    output = model.predict_proba(X) if loss == "softmax_cross_entropy" else model.predict(X)
    assert relative_error(output, ref.predict(X)) <= tol
    z_refs, a_refs = ref.forward(X)
    for (z, a), z_ref, a_ref in zip(model.forward(X), z_refs, a_refs[1:], strict=True):
        assert relative_error(z, z_ref) <= tol
        assert relative_error(a, a_ref) <= tol


def test_fit_is_shuffled_minibatch_sgd():
    """fit = train steps on the batches of the seeded permutation, the last batch smaller."""
    weights, biases = random_network(seed=3, dtype=np.float64)
    model = SparseMLP(weights, biases, activation="sigmoid", loss="softmax_cross_entropy")
    ref = DenseReference(weights, biases, "sigmoid", "identity", "softmax_cross_entropy")
    rng = np.random.default_rng(0)
    X = rng.random((23, SIZES[0]))
    labels = rng.integers(0, SIZES[-1], 23)
    Y = np.eye(SIZES[-1])[labels]
    assert model.fit(X, labels, batch_size=5, epochs=2, lr=0.5, seed=11, progress=False) is model
    order_rng = np.random.default_rng(11)
    expected = []
    for _ in range(2):
        order = order_rng.permutation(23)
        total = 0.0
        for start in range(0, 23, 5):
            idx = order[start : start + 5]
            total += ref.loss_value(X[idx], Y[idx]) * len(idx)
            ref.step(X[idx], Y[idx], 0.5)
        expected.append(total / 23)
    np.testing.assert_allclose(model.loss_curve_, expected, rtol=1e-12)
    for k in range(3):
        assert relative_error(model.weights[k].toarray(), ref.W[k]) <= 1e-10
        assert relative_error(model.biases[k], ref.b[k]) <= 1e-10


def test_fit_without_shuffle_and_loss_decreases():
    weights, biases = random_network(seed=5, dtype=np.float64)
    model = SparseMLP(weights, biases, activation="relu", loss="mse")
    ref = DenseReference(weights, biases, "relu", "relu", "mse")
    rng = np.random.default_rng(1)
    X, Y = rng.random((12, SIZES[0])), rng.random((12, SIZES[-1]))
    history = model.fit(X, Y, batch_size=4, epochs=8, lr=0.1, shuffle=False, progress=False)
    history = history.loss_curve_
    for _ in range(8):
        for start in range(0, 12, 4):
            ref.step(X[start : start + 4], Y[start : start + 4], 0.1)
    assert relative_error(model.weights[0].toarray(), ref.W[0]) <= 1e-10
    assert history[-1] < history[0]
    assert model.evaluate(X, Y) == pytest.approx(ref.loss_value(X, Y), rel=1e-10)


def test_explicit_zeros_stay_in_the_pattern():
    """A stored zero is a connection: it gets a gradient and may become nonzero."""
    w0 = sp.csr_matrix((np.array([0.0, 0.5]), np.array([0, 1]), np.array([0, 1, 2])), shape=(2, 2))
    w1 = sp.csr_matrix(np.array([[1.0], [-1.0]]))
    model = SparseMLP([w0, w1], activation="identity", loss="mse")
    assert model.weights[0].nnz == 2
    ref = DenseReference([w0, w1], [np.zeros(2), np.zeros(1)], "identity", "identity", "mse")
    X, Y = np.array([[1.0, 2.0]]), np.array([[3.0]])
    model.train_step(X, Y, lr=0.1)
    ref.step(X, Y, 0.1)
    assert model.weights[0][0, 0] != 0
    np.testing.assert_allclose(model.weights[0].toarray(), ref.W[0], rtol=1e-14)
