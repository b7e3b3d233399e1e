"""EmbeddingMLP with the sampled softmax against an independent float64 reference (the same
candidate classes), the candidate sampler's distribution, and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.model.embedding_mlp import EmbeddingMLP
from dasknn.optim import SGD

V, C, D, K = 30, 3, 4, 50


def _log_expected(classes, n_classes, n_sampled, sampler):
    """log(S q(k)), written out again: q is Zipf-like log((k+2)/(k+1)) / log(C+1), or 1/C."""
    out = []
    for k in classes:
        q = (
            1.0 / n_classes
            if sampler == "uniform"
            else np.log((k + 2) / (k + 1)) / np.log(n_classes + 1)
        )
        out.append(np.log(n_sampled * q))
    return np.array(out)


def _reference_loss_and_grads(E, Ws, bs, X, y, sampled, sampler, combine):
    """Mean sampled-softmax loss and dense gradients of every variable, by loops (float64)."""
    B = len(y)
    n_classes = Ws[-1].shape[1]
    g = E[X]
    h = g.reshape(B, -1) if combine == "concat" else g.mean(axis=1)
    hs, zs = [h], []
    for W, b in zip(Ws[:-1], bs[:-1], strict=True):
        zs.append(hs[-1] @ W + b)
        hs.append(np.maximum(zs[-1], 0.0))
    top = hs[-1]
    W_out, b_out = Ws[-1], bs[-1]
    gW_out, gb_out = np.zeros_like(W_out), np.zeros_like(b_out)
    dtop = np.zeros_like(top)
    loss = 0.0
    for i in range(B):
        classes = [y[i]] + [s for s in sampled if s != y[i]]
        logq = _log_expected(classes, n_classes, len(sampled), sampler)
        z = np.array([top[i] @ W_out[:, k] + b_out[k] for k in classes]) - logq
        m = z.max()
        p = np.exp(z - m) / np.exp(z - m).sum()
        loss += np.log(np.exp(z - m).sum()) + m - z[0]
        dz = p.copy()
        dz[0] -= 1.0
        for k, d in zip(classes, dz, strict=True):
            gW_out[:, k] += d * top[i] / B
            gb_out[k] += d / B
            dtop[i] += d * W_out[:, k] / B
    gWs, gbs = [None] * len(Ws), [None] * len(Ws)
    gWs[-1], gbs[-1] = gW_out, gb_out
    delta = dtop
    for k in range(len(Ws) - 2, -1, -1):
        delta = delta * (zs[k] > 0)
        gWs[k], gbs[k] = hs[k].T @ delta, delta.sum(axis=0)
        delta = delta @ Ws[k].T
    gE = np.zeros_like(E)
    for i in range(B):
        for j in range(X.shape[1]):
            part = (
                delta[i, j * E.shape[1] : (j + 1) * E.shape[1]]
                if combine == "concat"
                else (delta[i] / X.shape[1])
            )
            gE[X[i, j]] += part
    return loss / B, gE, gWs, gbs


@pytest.mark.parametrize(
    "combine,sampler,hidden", [("concat", "log-uniform", (6,)), ("mean", "uniform", ())]
)
def test_sgd_steps_match_reference(combine, sampler, hidden):
    model = EmbeddingMLP(
        V,
        C,
        D,
        hidden=hidden,
        n_classes=K,
        combine=combine,
        dtype=np.float64,
        seed=4,
        output="sampled",
        n_sampled=9,
        sampler=sampler,
    )
    E = model.embedding.copy()
    Ws = [w.copy() for w in model.weights]
    bs = [b.copy() for b in model.biases]
    rng = np.random.default_rng(1)
    lr = 0.5
    for step in range(4):
        X, y = rng.integers(0, V, (8, C)), rng.integers(0, K, 8)
        y[:3] = model.candidates(step)[:3]  # accidental hits: labels among the candidates
        loss, gE, gWs, gbs = _reference_loss_and_grads(
            E, Ws, bs, X, y, model.candidates(step), sampler, combine
        )
        assert model.train_step(X, y, optimizer=SGD(lr=lr)) == pytest.approx(loss, rel=1e-12)
        E -= lr * gE
        Ws = [w - lr * g for w, g in zip(Ws, gWs, strict=True)]
        bs = [b - lr * g for b, g in zip(bs, gbs, strict=True)]
    np.testing.assert_allclose(model.embedding, E, rtol=0, atol=1e-12)
    for got, want in zip(model.weights + model.biases, Ws + bs, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert model.n_steps_ == 4
    # predictions use the full softmax over every class
    X = rng.integers(0, V, (5, C))
    h = E[X].reshape(5, -1) if combine == "concat" else E[X].mean(axis=1)
    for W, b in zip(Ws[:-1], bs[:-1], strict=True):
        h = np.maximum(h @ W + b, 0.0)
    np.testing.assert_allclose(model.decision_function(X), h @ Ws[-1] + bs[-1], atol=1e-12)


def test_untouched_output_rows_stay_and_log_uniform_frequencies():
    model = EmbeddingMLP(V, C, D, n_classes=K, dtype=np.float64, output="sampled", n_sampled=5)
    before = model.output_table()
    X, y = np.zeros((2, C), int), np.array([7, 7])
    model.train_step(X, y, lr=0.1)
    touched = np.unique(np.concatenate([y, model.candidates(0)]))
    changed = np.flatnonzero(np.any(model.output_table() != before, axis=1))
    np.testing.assert_array_equal(changed, touched)
    draws = np.concatenate([model.candidates(t) for t in range(4000)])
    freq = np.bincount(draws, minlength=K) / len(draws)
    q = np.exp(_log_expected(range(K), K, 1, "log-uniform"))
    assert q.sum() == pytest.approx(1.0)
    sigma = np.sqrt(q * (1 - q) / len(draws))
    assert np.all(np.abs(freq - q) < 5 * sigma)


def test_bad_sampled_options():
    for kwargs, match in [
        ({"output": "nce"}, "output must be"),
        ({"output": "sampled", "sampler": "zipf"}, "sampler must be"),
        ({"output": "sampled", "n_sampled": 0}, "n_sampled"),
    ]:
        with pytest.raises(ValueError, match=match):
            EmbeddingMLP(V, C, D, **kwargs)
