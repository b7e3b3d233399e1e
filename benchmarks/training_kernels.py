"""Time the training kernels and the single-process SparseMLP step against scipy.sparse.

Run: ``flock /tmp/dasknn-bench.lock python benchmarks/training_kernels.py``. For each RadiX-Net
layer size, batch size and dtype it prints the best-of-N wall time of

- ``spmm_forward`` (``x @ W``), ``spmm_backward`` (``delta @ W.T``) and ``masked_outer_grad``
  (``x.T @ delta`` on the pattern), on the feature-major arrays the training paths keep
  (``x.T``, ``delta.T``), beside the scipy.sparse way to get the same result from row blocks
  (``x @ W``, ``delta @ W.T``, and the dense ``x.T @ delta`` read at the pattern);
- a full ``SparseMLP.train_step`` (sigmoid + MSE, 4 layers) beside the same step written with
  scipy.sparse and numpy;

and the ratio scipy / dasknn (> 1: dasknn faster). Best-of-N filters out the load of a shared
machine; the kernels are single-threaded, scipy's sparse products too (the dense ``x.T @ delta``
may use several BLAS threads).
"""

from __future__ import annotations

import platform
import time
from functools import partial

import numpy as np
from harness import describe

from dasknn import SparseMLP
from dasknn.datasets import radixnet
from dasknn.kernels.training import masked_outer_grad, spmm_backward, spmm_forward


def best_time(func, repeats: int) -> float:
    func()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        func()
        best = min(best, time.perf_counter() - start)
    return best


def scipy_forward(x, w):
    return x @ w


def scipy_backward(delta, w):
    return delta @ w.T


def scipy_grad(x, delta, rows, cols):
    return (x.T @ delta)[rows, cols]


def scipy_step(weights, biases, x, y, lr):
    """One SGD step of the sigmoid + MSE network with scipy.sparse products (reference baseline)."""
    acts = [x]
    for w, b in zip(weights, biases, strict=True):
        acts.append(1.0 / (1.0 + np.exp(-(np.asarray(acts[-1] @ w) + b))))
    delta = (acts[-1] - y) * acts[-1] * (1 - acts[-1]) / x.shape[0]
    for k in range(len(weights) - 1, -1, -1):
        w = weights[k]
        rows = np.repeat(np.arange(w.shape[0]), np.diff(w.indptr))
        grad = (acts[k].T @ delta)[rows, w.indices]
        grad_b = delta.sum(0)
        if k > 0:
            delta = np.asarray(delta @ w.T) * acts[k] * (1 - acts[k])
        w.data -= lr * grad
        biases[k] -= lr * grad_b


def main() -> None:
    print(f"machine: {describe()}, python "
          f"{platform.python_version()}; times are best-of-N wall seconds")
    print(f"{'n':>5} {'B':>4} {'dtype':>7} {'op':<10} {'dasknn ms':>10} {'scipy ms':>9} "
          f"{'ratio':>6}")
    for n in (1024, 4096):
        for dtype in (np.float32, np.float64):
            w = radixnet(n, 1, dtype=dtype)[0]
            rows = np.repeat(np.arange(n), np.diff(w.indptr))
            for batch in (1, 32, 256):
                rng = np.random.default_rng(0)
                x = rng.random((batch, n)).astype(dtype)
                delta = rng.standard_normal((batch, n)).astype(dtype)
                xt, deltat = np.ascontiguousarray(x.T), np.ascontiguousarray(delta.T)
                out = np.empty((n, batch), dtype=dtype)
                grad = np.empty(w.nnz, dtype=dtype)
                repeats = max(5, int(2e7 / (batch * w.nnz)))
                csr = (w.indptr, w.indices, w.data)
                cases = [
                    ("forward", partial(spmm_forward, xt, *csr, out),
                     partial(scipy_forward, x, w)),
                    ("backward", partial(spmm_backward, deltat, *csr, out),
                     partial(scipy_backward, delta, w)),
                    ("grad", partial(masked_outer_grad, xt, deltat, *csr[:2], 1.0, grad),
                     partial(scipy_grad, x, delta, rows, w.indices)),
                ]
                for name, ours, theirs in cases:
                    t_ours, t_theirs = best_time(ours, repeats), best_time(theirs, repeats)
                    print(f"{n:>5} {batch:>4} {np.dtype(dtype).name:>7} {name:<10} "
                          f"{t_ours * 1e3:>10.3f} {t_theirs * 1e3:>9.3f} {t_theirs / t_ours:>6.2f}",
                          flush=True)
    for n, batch in ((1024, 64), (4096, 256)):
        model = SparseMLP.radixnet(n, 4, seed=0, activation="sigmoid", loss="mse", scale=0.1)
        weights = [w.copy() for w in model.weights]
        biases = [b.copy() for b in model.biases]
        rng = np.random.default_rng(1)
        x, y = rng.random((batch, n)), rng.random((batch, n))
        t_ours = best_time(partial(model.train_step, x, y, 0.01), 5)
        t_theirs = best_time(partial(scipy_step, weights, biases, x, y, 0.01), 5)
        print(f"train_step 4 x {n}, B={batch}, float64: dasknn {t_ours * 1e3:.1f} ms, scipy "
              f"{t_theirs * 1e3:.1f} ms, ratio {t_theirs / t_ours:.2f} "
              f"({batch / t_ours:,.0f} vs {batch / t_theirs:,.0f} samples/s)")


if __name__ == "__main__":
    main()
