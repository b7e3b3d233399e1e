"""Independent float64 numpy implementation of the embedding MLP, for the embedding tests.

It shares no code with ``dasknn``: the embedding lookup is numpy fancy indexing, the gradient of
the table is a dense (V, d) array built with ``np.add.at``, and the optimizers are written out
again from torch.optim's formulas (the sparse variable is stepped on the rows its batch names,
as torch.optim.SparseAdam does).
"""

from __future__ import annotations

import numpy as np


def relu(z):
    return np.where(z > 0, z, 0.0)


class EmbeddingReference:
    """Embedding -> ReLU layers -> softmax cross-entropy, all in float64."""

    def __init__(self, embedding, weights, biases, combine):
        self.E = np.array(embedding, dtype=np.float64)
        self.W = [np.array(w, dtype=np.float64) for w in weights]
        self.b = [np.array(b, dtype=np.float64) for b in biases]
        self.combine = combine
        self.state: dict = {}
        self.t = 0

    def _h0(self, X):
        g = self.E[X]  # (B, c, d)
        if self.combine == "concat":
            return g.reshape(X.shape[0], -1)
        s = g.sum(axis=1)
        return s / X.shape[1] if self.combine == "mean" else s

    def logits(self, X):
        h = self._h0(X)
        for k in range(len(self.W)):
            z = h @ self.W[k] + self.b[k]
            h = z if k == len(self.W) - 1 else relu(z)
        return h

    def loss(self, X, y):
        z = self.logits(X)
        m = z.max(axis=1, keepdims=True)
        lse = np.log(np.exp(z - m).sum(axis=1)) + m[:, 0]
        return float(np.mean(lse - z[np.arange(len(y)), y]))

    def gradients(self, X, y):
        """``(grad E dense (V, d), [grad W_k], [grad b_k])`` of the mean loss."""
        hs, zs = [self._h0(X)], []
        for k in range(len(self.W)):
            z = hs[-1] @ self.W[k] + self.b[k]
            zs.append(z)
            hs.append(z if k == len(self.W) - 1 else relu(z))
        p = np.exp(zs[-1] - zs[-1].max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        delta = p.copy()
        delta[np.arange(len(y)), y] -= 1.0
        delta /= len(y)
        gW, gb = [None] * len(self.W), [None] * len(self.W)
        for k in range(len(self.W) - 1, -1, -1):
            gW[k] = hs[k].T @ delta
            gb[k] = delta.sum(axis=0)
            delta = delta @ self.W[k].T
            if k > 0:
                delta = delta * (zs[k - 1] > 0)
        gE = np.zeros_like(self.E)
        B, c = X.shape
        d = self.E.shape[1]
        if self.combine == "concat":
            np.add.at(gE, X.reshape(-1), delta.reshape(B * c, d))
        else:
            scale = 1.0 / c if self.combine == "mean" else 1.0
            np.add.at(gE, X.reshape(-1), np.repeat(delta * scale, c, axis=0))
        return gE, gW, gb

    # -------------------------------------------------------------- optimizers
    def _sgd(self, p, g, key, lr, momentum):
        if momentum:
            buf = self.state.get(key)
            buf = g.copy() if buf is None else momentum * buf + g
            self.state[key] = buf
            g = buf
        return p - lr * g

    def _adam(self, p, g, key, lr, beta1=0.9, beta2=0.999, eps=1e-8):
        m, v = self.state.get(key, (np.zeros_like(p), np.zeros_like(p)))
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        self.state[key] = (m, v)
        mhat = m / (1 - beta1**self.t)
        return p - lr * mhat / (np.sqrt(v) / np.sqrt(1 - beta2**self.t) + eps)

    def step(self, X, y, lr, optimizer="sgd", momentum=0.0):
        """One step; ``optimizer`` is ``"sgd"`` (with ``momentum``) or ``"adam"``."""
        self.t += 1
        gE, gW, gb = self.gradients(X, y)
        rows = np.unique(X)

        def update(p, g, key):
            if optimizer == "adam":
                return self._adam(p, g, key, lr)
            return self._sgd(p, g, key, lr, momentum)

        if optimizer == "adam":
            m, v = self.state.get("E", (np.zeros_like(self.E), np.zeros_like(self.E)))
            self.state["E"] = (m, v)
            sub = {"E": (m[rows], v[rows])}
            saved, self.state = self.state, sub
            self.E[rows] = update(self.E[rows], gE[rows], "E")
            m[rows], v[rows] = self.state["E"]
            self.state = saved
        else:
            buf = self.state.get("E")
            if momentum:
                full = np.zeros_like(self.E) if buf is None else buf
                first = buf is None
                full[rows] = gE[rows] if first else momentum * full[rows] + gE[rows]
                self.state["E"] = full
                self.E[rows] -= lr * full[rows]
            else:
                self.E[rows] -= lr * gE[rows]
        for k in range(len(self.W)):
            self.W[k] = update(self.W[k], gW[k], ("W", k))
            self.b[k] = update(self.b[k], gb[k], ("b", k))
