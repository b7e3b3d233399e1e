"""The SGD step of SparseMLP follows the true gradient: central finite differences of the loss with
respect to every stored weight and every bias of a tiny network."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn import SparseMLP


def tiny_network(seed):
    rng = np.random.default_rng(seed)
    sizes = [5, 4, 4, 3]
    weights = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True):
        mask = rng.random((n_in, n_out)) < 0.6
        weights.append(sp.csr_matrix(rng.uniform(-1, 1, (n_in, n_out)) * mask))
    biases = [rng.uniform(-0.3, 0.3, n) for n in sizes[1:]]
    return weights, biases


def numerical_gradient(model, X, Y, eps=1e-6):
    grads_w, grads_b = [], []
    for w, b in zip(model.weights, model.biases, strict=True):
        for params, grads in ((w.data, grads_w), (b, grads_b)):
            g = np.empty_like(params)
            for p in range(params.size):
                saved = params[p]
                params[p] = saved + eps
                up = model.evaluate(X, Y)
                params[p] = saved - eps
                down = model.evaluate(X, Y)
                params[p] = saved
                g[p] = (up - down) / (2 * eps)
            grads.append(g)
    return grads_w, grads_b


@pytest.mark.parametrize(
    "activation, output_activation, loss",
    [
        ("sigmoid", None, "mse"),
        ("sigmoid", "identity", "mse"),
        ("sigmoid", None, "softmax_cross_entropy"),
        ("identity", None, "softmax_cross_entropy"),
    ],
)
def test_step_is_minus_lr_times_gradient(activation, output_activation, loss):
    weights, biases = tiny_network(seed=1)
    model = SparseMLP(
        weights, biases, activation=activation, output_activation=output_activation, loss=loss
    )
    rng = np.random.default_rng(2)
    X = rng.standard_normal((4, 5))
    Y = rng.random((4, 3)) if loss == "mse" else np.eye(3)[[0, 2, 1, 2]]
    grads_w, grads_b = numerical_gradient(model, X, Y)
    before_w = [w.data.copy() for w in model.weights]
    before_b = [b.copy() for b in model.biases]
    lr = 0.5
    model.train_step(X, Y, lr=lr)
    for k in range(model.n_layers):
        np.testing.assert_allclose((before_w[k] - model.weights[k].data) / lr, grads_w[k],
                                   rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose((before_b[k] - model.biases[k]) / lr, grads_b[k],
                                   rtol=1e-6, atol=1e-9)


def test_relu_gradient_away_from_kinks():
    """ReLU and clipped ReLU: finite differences hold where no pre-activation sits at a kink."""
    weights, biases = tiny_network(seed=4)
    for activation in ("relu", "clipped_relu"):
        model = SparseMLP(weights, biases, activation=activation, loss="softmax_cross_entropy")
        X = np.random.default_rng(5).standard_normal((3, 5)) * 3
        for z, _ in model.forward(X)[:-1]:
            assert np.min(np.abs(z)) > 1e-3 and np.min(np.abs(z - 32)) > 1e-3
        Y = np.eye(3)[[1, 0, 2]]
        grads_w, _ = numerical_gradient(model, X, Y)
        before = [w.data.copy() for w in model.weights]
        model.train_step(X, Y, lr=1.0)
        for k in range(model.n_layers):
            np.testing.assert_allclose(before[k] - model.weights[k].data, grads_w[k],
                                       rtol=1e-6, atol=1e-9)
