"""Independent float64 dense-numpy implementation of the sparse MLP maths, for the model tests.

It shares no code with ``dasknn``: dense matrices, an explicit 0/1 mask for the pattern, and the
activations and losses written out again from their definitions.
"""

from __future__ import annotations

import numpy as np


def act(name: str, z: np.ndarray) -> np.ndarray:
    if name == "sigmoid":
        return 1.0 / (1.0 + np.exp(-z))
    if name == "relu":
        return np.where(z > 0, z, 0.0)
    if name == "clipped_relu":
        return np.where(z > 32, 32.0, np.where(z > 0, z, 0.0))
    if name == "identity":
        return z.copy()
    raise AssertionError(name)


def act_derivative(name: str, z: np.ndarray) -> np.ndarray:
    if name == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-z))
        return s * (1.0 - s)
    if name == "relu":
        return (z > 0).astype(float)
    if name == "clipped_relu":
        return ((z > 0) & (z < 32)).astype(float)
    if name == "identity":
        return np.ones_like(z)
    raise AssertionError(name)


class DenseReference:
    """Dense masked MLP in float64, updated by plain SGD on the batch-mean loss."""

    def __init__(self, weights, biases, activation, output_activation, loss):
        self.W = [np.asarray(w.toarray(), dtype=np.float64) for w in weights]
        self.mask = [stored_mask(w) for w in weights]
        self.b = [np.asarray(b, dtype=np.float64).copy() for b in biases]
        self.activation = activation
        self.output_activation = output_activation
        self.loss = loss

    def _act_name(self, k):
        return self.output_activation if k == len(self.W) - 1 else self.activation

    def forward(self, X):
        zs, acts = [], [np.asarray(X, dtype=np.float64)]
        for k, (W, b) in enumerate(zip(self.W, self.b, strict=True)):
            z = acts[-1] @ W + b
            zs.append(z)
            acts.append(act(self._act_name(k), z))
        return zs, acts

    def loss_value(self, X, Y):
        return self._loss(*self.forward(X), Y)

    def _loss(self, zs, acts, Y):
        batch = Y.shape[0]
        if self.loss == "mse":
            return 0.5 * np.sum((acts[-1] - Y) ** 2) / batch
        z = zs[-1]
        logp = z - np.log(np.sum(np.exp(z - z.max(1, keepdims=True)), 1, keepdims=True)) - z.max(
            1, keepdims=True
        )
        return -np.sum(Y * logp) / batch

    def predict(self, X):
        zs, acts = self.forward(X)
        if self.loss == "mse":
            return acts[-1]
        e = np.exp(zs[-1] - zs[-1].max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    def step(self, X, Y, lr):
        """One SGD step; returns the batch's loss before the update."""
        zs, acts = self.forward(X)
        value = self._loss(zs, acts, Y)
        batch = X.shape[0]
        if self.loss == "mse":
            delta = (acts[-1] - Y) * act_derivative(self.output_activation, zs[-1]) / batch
        else:
            e = np.exp(zs[-1] - zs[-1].max(1, keepdims=True))
            p = e / e.sum(1, keepdims=True)
            delta = (p * Y.sum(1, keepdims=True) - Y) / batch
        grads_w, grads_b = [None] * len(self.W), [None] * len(self.W)
        for k in range(len(self.W) - 1, -1, -1):
            grads_w[k] = (acts[k].T @ delta) * self.mask[k]
            grads_b[k] = delta.sum(0)
            if k > 0:
                delta = (delta @ self.W[k].T) * act_derivative(self.activation, zs[k - 1])
        for k in range(len(self.W)):
            self.W[k] -= lr * grads_w[k]
            self.b[k] -= lr * grads_b[k]
        return value


def stored_mask(w):
    """Mask of stored entries of a scipy sparse matrix, explicit zeros included."""
    coo = w.tocoo()
    mask = np.zeros(w.shape, dtype=bool)
    mask[coo.row, coo.col] = True
    return mask


def assert_same_layers(trained, reference, atol: float) -> None:
    """Two networks of scipy sparse layers hold the same stored entries, values and biases."""
    assert len(trained.weights) == len(reference.weights)
    for k, (w, ref) in enumerate(zip(trained.weights, reference.weights, strict=True)):
        np.testing.assert_allclose(w.toarray(), ref.toarray(), rtol=0, atol=atol, err_msg=k)
        np.testing.assert_array_equal(stored_mask(w), stored_mask(ref), err_msg=k)
        np.testing.assert_allclose(
            trained.biases[k], reference.biases[k], rtol=0, atol=atol, err_msg=k
        )
