"""Independent float64 references for the sampled network's tests (numpy only, no dasknn)."""

from __future__ import annotations

import numpy as np


def targets(labels, n):
    """Dense targets: ``1 / |labels|`` on each label of a row."""
    y = np.zeros((len(labels), n))
    for i, row in enumerate(labels):
        y[i, row] = 1.0 / len(row)
    return y


class AdamReference:
    """torch.optim.Adam's formulas on one float64 array (written out here)."""

    def __init__(self, lr, b1=0.9, b2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps, self.t = lr, b1, b2, eps, 0
        self.m: dict = {}
        self.v: dict = {}

    def step(self, params: dict, grads: dict) -> None:
        self.t += 1
        for name, g in grads.items():
            m = self.m.get(name, 0.0) * self.b1 + (1 - self.b1) * g
            v = self.v.get(name, 0.0) * self.b2 + (1 - self.b2) * g * g
            self.m[name], self.v[name] = m, v
            denom = np.sqrt(v) / np.sqrt(1 - self.b2**self.t) + self.eps
            params[name] = params[name] - self.lr / (1 - self.b1**self.t) * m / denom


def reference_step(params: dict, X: np.ndarray, y: np.ndarray) -> tuple[float, dict]:
    """Full-softmax loss and gradients of the network, dense float64."""
    z1 = X @ params["hidden_weights"] + params["hidden_bias"]
    h = np.maximum(z1, 0)
    z = h @ params["output_weights"].T + params["output_bias"]
    top = z.max(1, keepdims=True)
    lse = top + np.log(np.exp(z - top).sum(1, keepdims=True))
    loss = float(np.mean((y * (lse - z)).sum(1)))
    delta = (np.exp(z - lse) - y) / X.shape[0]
    dh = delta @ params["output_weights"] * (z1 > 0)
    grads = {
        "output_weights": delta.T @ h,
        "output_bias": delta.sum(0),
        "hidden_weights": X.T @ dh,
        "hidden_bias": dh.sum(0),
    }
    return loss, grads
