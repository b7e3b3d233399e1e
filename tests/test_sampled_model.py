"""The one-process sampled network against independent float64 references (numpy Adam with every
neuron active, torch.optim.Adam, finite differences of the sampled-softmax loss) and the rules of
its active-set selection."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sampled_reference import AdamReference, reference_step, targets
from scipy import stats

from dasknn.lsh import HashTables
from dasknn.optim import Adam
from dasknn.sampled import ActiveSet, SampledMLP

N_FEATURES, HIDDEN, N_LABELS, ROWS, BATCH = 12, 6, 10, 40, 20


def _problem(seed: int = 0):
    """Dense-valued CSR features (every feature in every batch) and 1-3 labels a row."""
    rng = np.random.default_rng(seed)
    X = sp.csr_matrix(rng.uniform(0.1, 1.0, (ROWS, N_FEATURES)) / 3)
    labels = [list(rng.choice(N_LABELS, rng.integers(1, 4), replace=False)) for _ in range(ROWS)]
    return X, labels


@pytest.mark.minversions  # also at the minimum versions (.ci/run)
@pytest.mark.parametrize("shards", [1, 3])
def test_every_neuron_active_equals_numpy_adam(shards):
    X, labels = _problem()
    model = SampledMLP(
        hidden=HIDDEN,
        active_fraction=1.0,
        k=3,
        n_tables=4,
        bucket_size=4,
        shards=shards,
        hogwild=False,
        dtype="float64",
        optimizer=Adam(lr=0.01),
        seed=3,
    )
    model.initialize(N_FEATURES, N_LABELS)
    params = {k: v.astype(np.float64) for k, v in model.parameters().items()}
    adam = AdamReference(0.01)
    dense, y = X.toarray(), targets(labels, N_LABELS)
    for step in range(20):
        rows = slice((step % 2) * BATCH, (step % 2 + 1) * BATCH)
        loss = model.train_step(X[rows], labels[rows])
        ref_loss, grads = reference_step(params, dense[rows], y[rows])
        adam.step(params, grads)
        assert loss == pytest.approx(ref_loss, rel=1e-10)
    for name, value in model.parameters().items():
        np.testing.assert_allclose(value, params[name], rtol=1e-9, atol=1e-9, err_msg=name)


def test_every_neuron_active_equals_torch_adam():
    torch = pytest.importorskip("torch")
    X, labels = _problem(1)
    model = SampledMLP(
        hidden=HIDDEN,
        active_fraction=1.0,
        k=3,
        n_tables=4,
        shards=2,
        hogwild=False,
        optimizer=Adam(lr=0.01),
        seed=4,
    )
    model.initialize(N_FEATURES, N_LABELS)
    start = model.parameters()
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in start.items()}
    opt = torch.optim.Adam(tp.values(), lr=0.01)
    dense = torch.tensor(X.toarray(), dtype=torch.float32)
    y = torch.tensor(targets(labels, N_LABELS), dtype=torch.float32)
    for step in range(20):
        rows = slice((step % 2) * BATCH, (step % 2 + 1) * BATCH)
        model.train_step(X[rows], labels[rows])
        h = torch.relu(dense[rows] @ tp["hidden_weights"] + tp["hidden_bias"])
        z = h @ tp["output_weights"].T + tp["output_bias"]
        loss = -(y[rows] * torch.log_softmax(z, 1)).sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    for name, value in model.parameters().items():
        np.testing.assert_allclose(value, tp[name].detach().numpy(), rtol=1e-5, atol=1e-5)


def _sampled_loss(params: dict, X: np.ndarray, labels, active_global) -> float:
    """The sampled-softmax loss: softmax over each row's active ids, target 1/|labels|."""
    h = np.maximum(X @ params["hidden_weights"] + params["hidden_bias"], 0)
    total = 0.0
    for b, ids in enumerate(active_global):
        z = h[b] @ params["output_weights"][ids].T + params["output_bias"][ids]
        lse = z.max() + np.log(np.exp(z - z.max()).sum())
        zl = h[b] @ params["output_weights"][labels[b]].T + params["output_bias"][labels[b]]
        total += np.mean(lse - zl)
    return total / X.shape[0]


def test_sampled_gradients_equal_finite_differences():
    X, labels = _problem(2)
    X, labels = X[:8], labels[:8]
    model = SampledMLP(
        hidden=HIDDEN,
        active_fraction=0.5,
        k=2,
        n_tables=3,
        shards=2,
        hogwild=False,
        dtype="float64",
        correction="none",  # SLIDE's sampled softmax: the sets come from outside, without log q
        seed=5,
    )
    model.initialize(N_FEATURES, N_LABELS)
    rng = np.random.default_rng(7)
    smap = model.shard_map_
    active, active_global = [], [[] for _ in range(8)]
    for p, shard in enumerate(model.shards_):
        budget = shard.budget
        table = np.full((8, budget), -1, dtype=np.int32)
        count = np.zeros(8, dtype=np.int32)
        forced = np.zeros(8, dtype=np.int32)
        for b in range(8):
            mine = [smap.local_of[g] for g in labels[b] if smap.shard_of[g] == p]
            others = [i for i in rng.permutation(len(shard.ids)) if i not in mine]
            chosen = mine + others[: int(rng.integers(0, budget - len(mine) + 1))]
            table[b, : len(chosen)] = chosen
            count[b], forced[b] = len(chosen), len(mine)
            active_global[b] += [int(shard.ids[i]) for i in chosen]
        active.append(ActiveSet(table, count, forced))
    loss, grads = model.sampled_gradients(X, labels, active)
    params = model.parameters()
    dense = X.toarray()
    assert loss == pytest.approx(_sampled_loss(params, dense, labels, active_global), rel=1e-12)
    eps = 1e-6
    for name, grad in grads.items():
        flat = params[name].reshape(-1)
        for i in rng.choice(flat.size, min(12, flat.size), replace=False):
            old = flat[i]
            flat[i] = old + eps
            up = _sampled_loss(params, dense, labels, active_global)
            flat[i] = old - eps
            down = _sampled_loss(params, dense, labels, active_global)
            flat[i] = old
            assert grad.reshape(-1)[i] == pytest.approx((up - down) / (2 * eps), abs=1e-8)


def _trained_model(underflow="fill", fraction=0.2, **kw):
    """A model of 60 labels in two shards trained one epoch (1-2 labels a row), hashing its
    weight vectors as they are, without a uniform share of the budget."""
    rng = np.random.default_rng(3)
    X = sp.csr_matrix(rng.uniform(0.1, 1.0, (ROWS, N_FEATURES)) / 3)
    labels = [list(rng.choice(60, rng.integers(1, 3), replace=False)) for _ in range(ROWS)]
    model = SampledMLP(
        hidden=HIDDEN,
        active_fraction=fraction,
        k=2,
        n_tables=3,
        shards=2,
        underflow=underflow,
        hashing="plain",
        uniform_fraction=0.0,
        seed=6,
        **{"bucket_size": 3, **kw},
    )
    return model.fit(X, labels, epochs=1, batch_size=BATCH), X, labels


@pytest.mark.parametrize("underflow", ["fill", "stop"])
def test_selection_budgets_labels_and_candidates(underflow):
    model, X, labels = _trained_model(underflow)
    hidden = model.hidden_layer_.forward(X)
    smap = model.shard_map_
    empty = np.zeros(ROWS + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    for p, shard in enumerate(model.shards_):
        codes = shard.family.codes(hidden)
        for with_labels in (True, False):
            ptr = np.concatenate([[0], np.cumsum([len(r) for r in labels])])
            chosen = shard.select(
                hidden,
                *(smap.split_labels(ptr, np.concatenate(labels)))[p] if with_labels else empty,
                step=5,
            )
            for b in range(ROWS):
                got = list(chosen.active[b, : chosen.count[b]])
                mine = [smap.local_of[g] for g in labels[b] if smap.shard_of[g] == p]
                mine = mine if with_labels else []
                assert len(set(got)) == len(got)
                assert got[: len(mine)] == mine and chosen.forced[b] == len(mine)
                cands = set()
                for t in range(shard.tables.n_tables):
                    cands |= set(shard.tables.bucket(t, codes[b, t]).tolist())
                cands -= set(mine)
                rest = set(got[len(mine) :])
                room = shard.budget - len(mine)
                if len(cands) >= room:
                    assert rest <= cands and len(rest) == room
                else:
                    assert cands <= rest
                    expected = room if underflow == "fill" else len(cands)
                    assert len(rest) == expected


def test_reservoir_of_candidates_is_uniform():
    model, X, labels = _trained_model(fraction=0.1, bucket_size=64)
    trials = 3000
    hidden = np.repeat(model.hidden_layer_.forward(X[:1]), trials, axis=0)
    shard = model.shards_[0]
    cands = shard.tables.query(shard.family.codes(hidden[:1])[0])
    assert len(cands) > shard.budget
    # every row has its own random stream: 3000 independent draws from the same candidates
    chosen = shard.select(hidden, np.zeros(trials + 1, dtype=np.int64), np.zeros(0, int), 0)
    assert (chosen.count == shard.budget).all()
    assert set(np.unique(chosen.active)) <= set(cands.tolist())
    counts = np.bincount(chosen.active.ravel(), minlength=len(shard.ids))[cands]
    assert counts.sum() == trials * shard.budget
    assert stats.chisquare(counts).pvalue > 1e-3


@pytest.mark.parametrize("shards", [2, 3])
def test_shards_keep_as_many_bucket_items_as_one_table(shards):
    # 3-bit codes of 3,000 neurons: every bucket overflows the cap in the one table and in
    # every shard, so the buckets a query meets hold the cap of the layer, split over the shards
    kw = {"hidden": HIDDEN, "k": 3, "n_tables": 5, "bucket_size": 60, "hashing": "plain", "seed": 2}
    one = SampledMLP(shards=1, **kw).initialize(N_FEATURES, 3000)
    many = SampledMLP(shards=shards, **kw).set_parameters(one.parameters())
    probe = np.random.default_rng(1).standard_normal((8, HIDDEN)).astype(np.float32)

    def met(shard):  # per row and table, the items of the query's bucket
        codes = shard.family.codes(probe)
        return np.array([[len(shard.tables.bucket(t, c)) for t, c in enumerate(r)] for r in codes])

    assert (met(one.shards_[0]) == 60).all()
    np.testing.assert_array_equal(sum(met(shard) for shard in many.shards_), met(one.shards_[0]))


def test_rehash_and_rebuild_equal_a_fresh_build():
    model, X, labels = _trained_model(rehash_every=3, rebuild_every=7)
    model.fit(X, labels, epochs=3, batch_size=BATCH)
    assert model.n_steps_ == 8
    for shard in model.shards_:
        assert shard.rebuilds == 1
        fresh_family = shard.make_family(1)
        probe = np.random.default_rng(0).standard_normal((5, HIDDEN)).astype(np.float32)
        np.testing.assert_array_equal(shard.family.codes(probe), fresh_family.codes(probe))
        # the tables were rebuilt at step 7 and not rehashed at step 8: rehash now and compare
        shard.end_step(9)
        fresh = HashTables.build(
            fresh_family, shard.weights, shard.bucket_cap, shard.family_seed(1)
        )
        for mine, theirs in zip(shard.tables.arrays(), fresh.arrays(), strict=True):
            np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"k": 0}, "k must be"),
        ({"n_tables": 0}, "n_tables must be"),
        ({"k": 31}, "31 bits"),
        ({"hash_family": "dwta", "bin_size": 6}, "power of two"),
        ({"hash_family": "dwta", "bin_size": 1}, "power of two"),
        ({"bucket_size": 0}, "bucket_size"),
        ({"hash_family": "minhash"}, "unknown hash family"),
        ({"underflow": "wait"}, "unknown underflow mode"),
        ({"active_fraction": 0.0}, "active_fraction"),
        ({"active_fraction": 1.5}, "active_fraction"),
        ({"active_fraction": float("nan")}, "active_fraction"),
        ({"optimizer": "sgd"}, "optimizer must be"),
        ({"dtype": "int32"}, "dtype must be"),
    ],
)
def test_bad_hyperparameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SampledMLP(**kwargs)


def test_bad_training_data_leaves_the_model_untouched():
    X, labels = _problem()
    model = SampledMLP(hidden=4, active_fraction=0.6, k=2, n_tables=2, shards=2, seed=1)
    with pytest.raises(ValueError, match="more shards"):
        SampledMLP(hidden=4, shards=11).fit(X, labels)
    model.fit(X, labels, batch_size=BATCH)
    before = model.parameters()
    steps = model.n_steps_
    nan = X.copy()
    nan.data[0] = np.inf
    for bad_x, bad_y, message in [
        (X[:, :5], labels, "5 features, the model expects 12"),
        (nan, labels, "NaN or infinite"),
        (X, labels[:-1], "Y has 39 rows, X has 40"),
        (X, [[0]] * 39 + [[]], "training row 39 has no label"),
        (X, [[0]] * 39 + [[10]], "labels out of range"),
        (X, [[0]] * 39 + [[-1]], "labels must be >= 0"),
        (X, [list(range(10))] * 40, "more than its budget"),
    ]:
        with pytest.raises(ValueError, match=message):
            model.fit(bad_x, bad_y)
    assert model.n_steps_ == steps
    for name, value in model.parameters().items():
        np.testing.assert_array_equal(value, before[name])
    with pytest.raises(ValueError, match="k must be"):
        model.predict(X, k=0)


def test_sparse_inputs_stay_sparse():
    from dasknn.sampled.checks import check_features

    wide = sp.csr_matrix(([1.0, 2.0], ([0, 1], [3, 10**11])), shape=(2, 10**11 + 1))
    checked = check_features(wide, None, np.float32)
    assert sp.issparse(checked) and checked.nnz == 2 and checked.dtype == np.float32


def test_active_sets_do_not_depend_on_hogwild_threads():
    X, labels = _problem(4)
    sets = []
    for hogwild in (False, True):
        model = SampledMLP(
            hidden=HIDDEN, active_fraction=0.6, k=2, n_tables=3, shards=2, hogwild=hogwild, seed=2
        ).initialize(N_FEATURES, N_LABELS)
        sets.append((model.active_sets(X, labels), model.active_sets(X)))
    for which in (0, 1):  # with labels (training), without (inference)
        for first, second in zip(sets[0][which], sets[1][which], strict=True):
            np.testing.assert_array_equal(first, second)
