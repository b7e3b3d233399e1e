"""The synthetic extreme-classification generator (its Bayes-optimal ceiling against a brute-force
posterior) and the Extreme Classification Repository reader."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from dasknn.datasets import make_extreme_classification, oracle_top, read_xmc
from dasknn.optim import Adam
from dasknn.sampled import SampledMLP

XMC_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "xmc"


def _brute_force_top(data, nnz: int, allowed: np.ndarray | None = None) -> np.ndarray:
    """argmax_l P(l in labels | x) from the generative model, over every label (or the labels
    with ``allowed``), float64."""
    g = data.generator
    n_features = data.X.shape[1]
    prior, cluster_of = g["prior"], g["cluster_of"]
    n_labels = len(prior)
    bg = (1 - g["p_label"] - g["p_cluster"]) / n_features
    in_label = np.zeros((n_labels, n_features))
    for lab, sig in enumerate(g["label_signatures"]):
        in_label[lab, sig] = 1
    in_cluster = np.zeros((cluster_of.max() + 1, n_features))
    for cl, sig in enumerate(g["cluster_signatures"]):
        in_cluster[cl, sig] = 1
    s_l = g["label_signatures"].shape[1]
    s_c = g["cluster_signatures"].shape[1]
    density = bg + g["p_label"] * in_label / s_l + g["p_cluster"] * in_cluster[cluster_of] / s_c
    ratio = data.X.toarray().astype(np.float64) / g["idf"]
    counts = np.rint(ratio / ratio.sum(1, keepdims=True) * nnz)
    loglik = counts @ np.log(density).T + np.log(prior)
    post = np.exp(loglik - loglik.max(1, keepdims=True))
    post /= post.sum(1, keepdims=True)
    cluster_post = np.zeros((post.shape[0], cluster_of.max() + 1))
    np.add.at(cluster_post.T, cluster_of, post.T)
    pi = g["extra_share"]
    score = (1 - pi) * post + pi * cluster_post[:, cluster_of]
    if allowed is not None:
        score[:, ~allowed] = -np.inf
    return np.argmax(score, axis=1)


def _small_problem(n_features: int, p_label: float, p_cluster: float):
    return make_extreme_classification(
        n_samples=400,
        n_features=n_features,
        n_labels=60,
        nnz=12,
        cluster_size=4,
        label_features=4,
        cluster_features=6,
        p_label=p_label,
        p_cluster=p_cluster,
        extra_labels=0.8,
        seed=3,
    )


@pytest.mark.parametrize(
    ("n_features", "p_label", "p_cluster"),
    # signal-rich rows; mostly noise over many features, so some rows touch no signature and
    # the oracle falls back on the prior
    [(300, 0.15, 0.3), (3000, 0.02, 0.03)],
)
def test_oracle_equals_the_brute_force_posterior(n_features, p_label, p_cluster):
    data = _small_problem(n_features, p_label, p_cluster)
    top = _brute_force_top(data, 12)
    np.testing.assert_array_equal(data.oracle_top, top)
    hits = np.asarray(data.Y[np.arange(400), top]).ravel() > 0
    assert data.oracle_precision_at_1 == pytest.approx(hits.mean())
    assert 0.05 < data.oracle_precision_at_1 < 1.0


@pytest.mark.parametrize(
    ("n_features", "p_label", "p_cluster"), [(300, 0.15, 0.3), (3000, 0.02, 0.03)]
)
def test_oracle_among_seen_labels_equals_the_brute_force_posterior(n_features, p_label, p_cluster):
    data = _small_problem(n_features, p_label, p_cluster)
    np.testing.assert_array_equal(oracle_top(data), data.oracle_top)
    # the labels of the first 40 rows, as a learner trained on them could name
    seen = np.bincount(data.Y[:40].indices, minlength=60) > 0
    held = np.arange(40, 400)
    top = oracle_top(data, held, seen)
    np.testing.assert_array_equal(top, _brute_force_top(data, 12, seen)[held])
    assert seen[top].all() and (~seen).sum() > 20
    assert (top != data.oracle_top[held]).any()


def test_oracle_top_rejects_bad_rows_and_masks():
    data = _small_problem(300, 0.15, 0.3)
    with pytest.raises(ValueError, match="rows must lie in"):
        oracle_top(data, np.array([0, 400]))
    with pytest.raises(ValueError, match="rows must be a 1-d array"):
        oracle_top(data, np.array([0.5]))
    with pytest.raises(ValueError, match="boolean mask of shape"):
        oracle_top(data, labels=np.ones(59, dtype=bool))
    with pytest.raises(ValueError, match="at least one label"):
        oracle_top(data, labels=np.zeros(60, dtype=bool))


def test_generated_rows_and_labels_follow_the_model():
    kw = dict(n_samples=3000, n_features=2000, n_labels=400, cluster_size=5, seed=1)
    data = make_extreme_classification(**kw)
    again = make_extreme_classification(**kw)
    assert (data.X != again.X).nnz == 0 and (data.Y != again.Y).nnz == 0
    X, Y, g = data.X, data.Y, data.generator
    assert X.shape == (3000, 2000) and Y.shape == (3000, 400) and X.dtype == np.float32
    nnz = np.diff(X.indptr)
    assert nnz.max() <= 40 and 30 < nnz.mean() <= 40
    np.testing.assert_allclose(np.sqrt(X.multiply(X).sum(1)).A1, 1, rtol=1e-5)
    labels = np.diff(Y.indptr)
    assert labels.min() >= 1 and labels.max() <= 5
    assert labels.mean() - 1 == pytest.approx(g["extra_share"] * 4, abs=0.1)
    for row in range(200):  # the labels of a sample share one cluster
        assert len(set(g["cluster_of"][Y.indices[Y.indptr[row] : Y.indptr[row + 1]]])) == 1
    popular = (Y[:, 0].toarray().ravel() > 0).mean()  # label 0: primary with its prior
    low = g["prior"][0]
    assert popular >= low - 4 * math.sqrt(low * (1 - low) / 3000)
    assert sorted(data.generator["cluster_signatures"][0]) == sorted(
        set(data.generator["cluster_signatures"][0])
    )


@pytest.mark.slow
@pytest.mark.parametrize("hogwild", [False, True])
def test_sampled_model_learns_the_synthetic_problem(hogwild):
    data = make_extreme_classification(
        n_samples=4000, n_features=1000, n_labels=300, p_label=0.2, seed=2
    )
    train, test = slice(0, 3200), slice(3200, 4000)
    model = SampledMLP(
        hidden=32,
        active_fraction=0.1,
        k=5,
        n_tables=8,
        shards=2,
        hogwild=hogwild,
        seed=0,
        optimizer=Adam(lr=0.01),
    ).fit(data.X[train], data.Y[train], epochs=3, batch_size=64)
    assert model.loss_curve_[-1] < model.loss_curve_[0]
    ceiling = data.oracle_hits[test].mean()
    # always answering the most popular label scores about 0.16 here
    assert model.precision_at_k(data.X[test], data.Y[test], 1) > 0.4 * ceiling


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "data.txt"
    path.write_text(text)
    return path


def test_xmc_reader_reads_features_and_labels(tmp_path):
    path = _write(tmp_path, "3 5 4\n0,3 1:0.5 4:2\n 0:1.5\n2 3:-1 3:1e-1\n")
    X, Y = read_xmc(path)
    np.testing.assert_allclose(
        X.toarray(), [[0, 0.5, 0, 0, 2], [1.5, 0, 0, 0, 0], [0, 0, 0, -0.9, 0]], rtol=1e-6
    )
    np.testing.assert_array_equal(Y.toarray(), [[1, 0, 0, 1], [0, 0, 0, 0], [0, 0, 1, 0]])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("3 5\n0 1:1\n", "line 1: the header"),
        ("x 5 4\n", "line 1: the header"),
        ("1 5 4\n0 7:1\n", "line 2: feature index 7 out of range"),
        ("1 5 4\n9 1:1\n", "line 2: label index 9 out of range"),
        ("2 5 4\n0 1:1\n1 2-1\n", "line 3: malformed pair"),
        ("1 5 4\n0 a:1\n", "line 2: malformed feature index"),
        ("1 5 4\n0 1:x\n", "line 2: malformed value"),
        ("1 5 4\n0 1:nan\n", "line 2: value 'nan' is not finite"),
        ("2 5 4\n0 1:1\n", "announces 2 samples, the file has 1"),
    ],
)
def test_xmc_reader_rejects_bad_files(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        read_xmc(_write(tmp_path, text))


def test_xmc_files_in_shared_data_read():
    files = sorted(XMC_DIR.glob("*.txt")) if XMC_DIR.is_dir() else []
    if not files:
        pytest.skip("../shared/data/xmc holds no Extreme Classification Repository files")
    for path in files:
        X, Y = read_xmc(path)
        assert X.shape[0] == Y.shape[0] and np.isfinite(X.data).all()


@pytest.mark.slow
def test_stdlib_next_word_rows_encode_the_context():
    import re
    import sysconfig

    from dasknn.datasets import stdlib_next_word

    task = stdlib_next_word(context=2, max_train=50, max_test=5)
    assert task.X_train.shape == (50, 2 * len(task.vocabulary))
    assert task.Y_train.shape == (50, len(task.vocabulary)) and task.X_test.shape[0] == 5
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(f for f in root.rglob("*.py") if "site-packages" not in f.parts)
    words = [
        w
        for f in files[1:]
        for w in (re.findall(r"[A-Za-z]+", f.read_text("utf-8", "replace")),)
        if len(w) > 2
    ][0]
    vocab = len(task.vocabulary)
    for t in range(10):
        cols = sorted(task.X_train[t].indices)
        assert [task.vocabulary[cols[0]], task.vocabulary[cols[1] - vocab]] == words[t : t + 2]
        assert task.vocabulary[task.Y_train[t].indices[0]] == words[t + 2]
