"""The sampled-softmax correction (``correction="logq"``), the uniform share of the budget and
the MIPS hashing of the output layer: inclusion probabilities against the selection rule
recomputed from the tables, the corrected loss and gradients against an independent float64
numpy reference on the same active sets, the corrected normaliser as an unbiased estimate of the
full softmax's, and the MIPS transform against the logits."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sampled_reference import AdamReference, reference_step, targets

from dasknn.lsh import mips_items, mips_queries
from dasknn.optim import Adam
from dasknn.sampled import ActiveSet, SampledMLP

N_FEATURES, HIDDEN, N_LABELS, ROWS = 12, 6, 80, 24


def _problem(seed: int):
    rng = np.random.default_rng(seed)
    X = sp.csr_matrix(rng.uniform(0.1, 1.0, (ROWS, N_FEATURES)) / 3)
    labels = [list(rng.choice(N_LABELS, rng.integers(1, 3), replace=False)) for _ in range(ROWS)]
    return X, labels


def _model(**kw) -> SampledMLP:
    options = {
        "hidden": HIDDEN,
        "active_fraction": 0.25,
        "k": 2,
        "n_tables": 3,
        "bucket_size": 6,
        "shards": 2,
        "hogwild": False,
        "dtype": "float64",
        "correction": "logq",
        "hashing": "plain",
        "uniform_fraction": 0.0,
        "hidden_update": "rows",
        "optimizer": Adam(lr=0.05),
        "seed": 11,
        **kw,
    }
    return SampledMLP(**options)


def _ptr(labels) -> np.ndarray:
    return np.concatenate([[0], np.cumsum([len(r) for r in labels])]).astype(np.int64)


@pytest.mark.parametrize(
    ("uniform_fraction", "hashing", "bucket_size", "expected_regimes"),
    [
        (0.0, "plain", 4, {False}),  # a cap of 2 a shard
        (0.0, "plain", 40, {True}),
        (0.5, "mips", 40, {False, True}),
        (0.3, "plain", 40, {True}),
        (0.3, "plain", 4, {False, True}),
    ],
)
def test_log_q_follows_the_selection_rule(uniform_fraction, hashing, bucket_size, expected_regimes):
    """Regimes: whether the candidates outnumbered their slots (a reservoir sample was kept)."""
    X, labels = _problem(1)
    model = _model(uniform_fraction=uniform_fraction, hashing=hashing, bucket_size=bucket_size)
    model.fit(X, labels, batch_size=8)  # trained weights, rehashed tables
    hidden = model.hidden_layer_.forward(X)
    split = model.shard_map_.split_labels(_ptr(labels), np.concatenate(labels))
    regimes = set()
    for p, shard in enumerate(model.shards_):
        chosen = shard.select(hidden, *split[p], step=3)
        queries = mips_queries(hidden) if hashing == "mips" else hidden
        codes = shard.family.codes(queries)
        n = len(shard.ids)
        for b in range(ROWS):
            smap = model.shard_map_
            mine = [smap.local_of[g] for g in labels[b] if smap.shard_of[g] == p]
            cands = set()
            for t in range(shard.tables.n_tables):
                cands |= set(shard.tables.bucket(t, codes[b, t]).tolist())
            cands -= set(mine)
            room = max(0, shard.budget - len(mine) - int(uniform_fraction * shard.budget))
            kept = min(len(cands), room)
            need = shard.budget - len(mine) - kept
            fill_q = need / (n - len(mine) - kept)
            share = kept / len(cands) if cands else 1.0
            cand_q = share + (1 - share) * fill_q
            regimes.add(kept < len(cands))
            got = chosen.active[b, : chosen.count[b]]
            assert chosen.count[b] == shard.budget
            expected = [0.0 if i in mine else np.log(cand_q if i in cands else fill_q) for i in got]
            np.testing.assert_allclose(chosen.log_q[b, : chosen.count[b]], expected, rtol=1e-12)
    assert regimes == expected_regimes


def _reference(params, X, labels, active_global, log_q_global):
    """Corrected sampled-softmax loss and gradients, dense float64 numpy."""
    z1 = X @ params["hidden_weights"] + params["hidden_bias"]
    h = np.maximum(z1, 0)
    grads = {name: np.zeros_like(value) for name, value in params.items()}
    dh = np.zeros_like(h)
    loss = 0.0
    B = X.shape[0]
    for b, (ids, log_q) in enumerate(zip(active_global, log_q_global, strict=True)):
        ids = np.asarray(ids)
        z = h[b] @ params["output_weights"][ids].T + params["output_bias"][ids] - log_q
        lse = z.max() + np.log(np.exp(z - z.max()).sum())
        y = np.isin(ids, labels[b]) / len(labels[b])
        loss += float(np.sum(y * (lse - z)))
        delta = (np.exp(z - lse) - y) / B
        np.add.at(grads["output_weights"], ids, np.outer(delta, h[b]))
        np.add.at(grads["output_bias"], ids, delta)
        dh[b] = delta @ params["output_weights"][ids]
    dz1 = dh * (z1 > 0)
    grads["hidden_weights"] = X.T @ dz1
    grads["hidden_bias"] = dz1.sum(0)
    return loss / B, grads


def test_corrected_gradients_equal_the_numpy_reference():
    X, labels = _problem(2)
    model = _model(uniform_fraction=0.4, bucket_size=3).fit(X, labels, batch_size=8)
    hidden = model.hidden_layer_.forward(X)
    split = model.shard_map_.split_labels(_ptr(labels), np.concatenate(labels))
    active = [s.select(hidden, *split[p], step=model.n_steps_) for p, s in enumerate(model.shards_)]
    assert any((a.log_q[:, : a.count.min()] < 0).any() for a in active)
    pairs = list(zip(model.shards_, active, strict=True))
    active_global = [
        np.concatenate([s.ids[a.active[b, : a.count[b]]] for s, a in pairs]) for b in range(ROWS)
    ]
    log_q_global = [np.concatenate([a.log_q[b, : a.count[b]] for a in active]) for b in range(ROWS)]
    params = model.parameters()
    loss, grads = model.sampled_gradients(X, labels, active)
    ref_loss, ref_grads = _reference(params, X.toarray(), labels, active_global, log_q_global)
    assert loss == pytest.approx(ref_loss, rel=1e-12)
    for name, grad in grads.items():
        np.testing.assert_allclose(grad, ref_grads[name], rtol=1e-10, atol=1e-13, err_msg=name)
    # the reference itself: central differences of its loss
    eps = 1e-6
    rng = np.random.default_rng(0)
    for name in ("output_bias", "hidden_weights"):
        flat = params[name].reshape(-1)
        for i in rng.choice(flat.size, 4, replace=False):
            old = flat[i]
            flat[i] = old + eps
            up = _reference(params, X.toarray(), labels, active_global, log_q_global)[0]
            flat[i] = old - eps
            down = _reference(params, X.toarray(), labels, active_global, log_q_global)[0]
            flat[i] = old
            numeric = (up - down) / (2 * eps)
            assert ref_grads[name].reshape(-1)[i] == pytest.approx(numeric, abs=1e-8)
    # an active set from outside, without log_q, is refused by the correction
    bare = [ActiveSet(a.active, a.count, a.forced) for a in active]
    with pytest.raises(ValueError, match="needs the active set's log_q"):
        model.sampled_gradients(X, labels, bare)


@pytest.mark.parametrize(("uniform_fraction", "k"), [(0.0, 6), (0.5, 1)])
def test_corrected_normaliser_is_unbiased(uniform_fraction, k):
    """sum over the active set of exp(z - log q) estimates sum over all neurons of exp(z)."""
    X, labels = _problem(3)
    model = _model(
        shards=1, uniform_fraction=uniform_fraction, bucket_size=1000, k=k, n_tables=2
    ).fit(X, labels, batch_size=8)
    shard = model.shards_[0]
    trials = 4000
    hidden = np.repeat(model.hidden_layer_.forward(X[:1]), trials, axis=0)
    none = np.zeros(trials + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    chosen = shard.select(hidden, *none, step=0)  # one random stream a row
    candidates = shard.tables.query(shard.family.codes(hidden[:1])[0])
    room = shard.budget - int(uniform_fraction * shard.budget)
    # every neuron can be chosen only if the candidates fit, or a share of the budget is kept
    assert (len(candidates) < room) == (uniform_fraction == 0.0)
    _, stats = shard.logits(hidden, chosen)
    estimates = stats[:, 1] * np.exp(stats[:, 0])
    params = model.parameters()
    exact = np.exp(hidden[0] @ params["output_weights"].T + params["output_bias"]).sum()
    error = estimates.mean() - exact
    assert abs(error) < 4 * estimates.std() / np.sqrt(trials)
    assert estimates.std() > 0


def test_mips_transform_orders_items_by_logit():
    rng = np.random.default_rng(4)
    weights = rng.standard_normal((50, 7)) * rng.uniform(0.1, 3, (50, 1)) + 2.0
    bias = rng.standard_normal(50)
    hidden = np.maximum(rng.standard_normal((5, 7)), 0)
    items, queries = mips_items(weights, bias), mips_queries(hidden)
    np.testing.assert_allclose(np.linalg.norm(items, axis=1), 1.0, rtol=1e-12)
    centred = np.concatenate([weights - weights.mean(0), (bias - bias.mean())[:, None]], axis=1)
    largest = np.linalg.norm(centred, axis=1).max()
    logits = hidden @ weights.T + bias
    offset = hidden @ weights.mean(0) + bias.mean()
    np.testing.assert_allclose(queries @ items.T, (logits - offset[:, None]) / largest, atol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"correction": "bengio"}, "unknown sampled-softmax correction"),
        ({"hashing": "l2"}, "unknown hashing"),
        ({"uniform_fraction": 1.0}, "uniform_fraction must lie in"),
        ({"uniform_fraction": -0.1}, "uniform_fraction must lie in"),
        ({"uniform_fraction": float("nan")}, "uniform_fraction must lie in"),
        ({"uniform_fraction": 0.2, "underflow": "stop"}, "needs underflow='fill'"),
        ({"hidden_update": "dense"}, "unknown hidden_update"),
    ],
)
def test_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SampledMLP(**kwargs)


@pytest.mark.parametrize("hidden_update", ["rows", "all"])
def test_hidden_update_of_absent_features_against_numpy_adam(hidden_update):
    """Features 0-3 appear in the first batch only: with ``"all"`` their rows keep moving on
    their moments, as dense Adam; with ``"rows"`` they stay where the first step left them."""
    rng = np.random.default_rng(5)
    dense = rng.uniform(0.1, 1.0, (40, N_FEATURES)) / 3
    dense[20:, :4] = 0
    X = sp.csr_matrix(dense)
    labels = [list(rng.choice(10, rng.integers(1, 3), replace=False)) for _ in range(40)]
    model = SampledMLP(
        hidden=HIDDEN,
        active_fraction=1.0,
        k=2,
        n_tables=2,
        hogwild=False,
        dtype="float64",
        optimizer=Adam(lr=0.01),
        hidden_update=hidden_update,
        seed=8,
    ).initialize(N_FEATURES, 10)
    params = {k: v.copy() for k, v in model.parameters().items()}
    adam = AdamReference(0.01)
    y = targets(labels, 10)
    for step in range(6):
        rows = slice(0, 20) if step == 0 else slice(20, 40)
        model.train_step(X[rows], labels[rows])
        adam.step(params, reference_step(params, dense[rows], y[rows])[1])
        if step == 0:
            after_first = model.parameters()["hidden_weights"][:4].copy()
    got = model.parameters()
    for name in ("hidden_bias", "output_weights", "output_bias"):
        np.testing.assert_allclose(got[name], params[name], rtol=1e-9, atol=1e-9, err_msg=name)
    present, absent = got["hidden_weights"][4:], got["hidden_weights"][:4]
    np.testing.assert_allclose(present, params["hidden_weights"][4:], rtol=1e-9)
    if hidden_update == "all":
        np.testing.assert_allclose(absent, params["hidden_weights"][:4], rtol=1e-9)
    else:
        np.testing.assert_array_equal(absent, after_first)
        assert np.abs(params["hidden_weights"][:4] - after_first).min() > 1e-4
