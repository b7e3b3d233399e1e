"""EmbeddingMLP against an independent float64 reference, finite differences, the corpus loader
and bad input."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest
from embedding_reference import EmbeddingReference

from dasknn.datasets.stdlib_corpus import load_stdlib_corpus, stdlib_files, tokenize_source
from dasknn.exceptions import NonFiniteLossError
from dasknn.model.embedding_mlp import EmbeddingMLP
from dasknn.model.embedding_network import Workspace, batch_gradients, unique_rows
from dasknn.optim import SGD, Adam

V, C, D = 40, 3, 5


def _model(combine, dtype=np.float64, hidden=(7,)):
    return EmbeddingMLP(V, C, D, hidden=hidden, combine=combine, dtype=dtype, seed=3)


def _reference(model):
    return EmbeddingReference(model.embedding, model.weights, model.biases, model.spec.combine)


def _batches(steps, size, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        X = rng.integers(0, V // 2, (size, C))  # repeats within windows and across the batch
        yield X, rng.integers(0, V, size)


@pytest.mark.parametrize("combine", ["concat", "sum", "mean"])
@pytest.mark.parametrize(
    "optimizer,ref",
    [
        (SGD(lr=0.3), ("sgd", 0.0)),
        (SGD(lr=0.2, momentum=0.9), ("sgd", 0.9)),
        (Adam(lr=0.01), ("adam", 0.0)),
    ],
)
def test_steps_match_reference(combine, optimizer, ref):
    model = _model(combine, hidden=(7, 6))
    reference = _reference(model)
    for X, y in _batches(5, 9):
        loss = model.train_step(X, y, optimizer=optimizer)
        assert loss == pytest.approx(reference.loss(X, y), rel=1e-12)
        reference.step(X, y, optimizer.lr, optimizer=ref[0], momentum=ref[1])
    np.testing.assert_allclose(model.embedding, reference.E, rtol=0, atol=1e-12)
    for k in range(3):
        np.testing.assert_allclose(model.weights[k], reference.W[k], rtol=0, atol=1e-12)
        np.testing.assert_allclose(model.biases[k], reference.b[k], rtol=0, atol=1e-12)
    X, y = next(_batches(1, 11, seed=9))
    np.testing.assert_allclose(model.decision_function(X), reference.logits(X), atol=1e-12)


def test_float32_matches_reference():
    model = _model("concat", dtype=np.float32)
    reference = _reference(model)
    for X, y in _batches(5, 9):
        model.train_step(X, y, lr=0.3)
        reference.step(X, y, 0.3)
    np.testing.assert_allclose(model.embedding, reference.E, atol=1e-5)
    np.testing.assert_allclose(model.weights[-1], reference.W[-1], atol=1e-5)


def test_gradients_into_given_arrays_and_a_reused_workspace_are_the_new_arrays_gradients():
    """The workspace (reused by a second batch), the flat ``out`` and ``rows_out`` give the
    gradients of fresh arrays bit for bit; a ``rows_out`` or ``out`` of the wrong shape or dtype
    is a ValueError."""
    model = _model("mean", hidden=(5, 4))
    workspace = Workspace()
    for X, y in _batches(2, 7, seed=4):
        unique, inverse = unique_rows(X)
        rows = model.embedding[unique]
        args = (model.spec, rows, inverse, y, model.weights, model.biases, len(y))
        loss, grads, grad_rows = batch_gradients(*args)
        flat = np.full(sum(g.size for g in grads), np.nan)
        rows_out = np.full_like(rows, np.nan)
        got = batch_gradients(*args, workspace, flat, rows_out)
        assert got[0] == loss and got[2] is rows_out
        np.testing.assert_array_equal(rows_out, grad_rows)
        np.testing.assert_array_equal(flat, np.concatenate([g.reshape(-1) for g in grads]))
    with pytest.raises(ValueError, match="rows_out must be a float64 array of shape"):
        batch_gradients(*args, workspace, None, rows_out[1:])
    with pytest.raises(ValueError, match="out must be a flat float64 array"):
        batch_gradients(*args, workspace, flat[1:])


@pytest.mark.parametrize("combine", ["concat", "mean"])
def test_gradients_match_finite_differences(combine):
    model = _model(combine)
    X, y = next(_batches(1, 6))
    unique, inverse = unique_rows(X)
    _, grads, grad_rows = batch_gradients(
        model.spec, model.embedding[unique], inverse, y, model.weights, model.biases, len(y)
    )
    eps = 1e-6
    rng = np.random.default_rng(1)
    for _ in range(6):
        r, k = int(rng.integers(len(unique))), int(rng.integers(D))
        saved = model.embedding[unique[r], k]
        model.embedding[unique[r], k] = saved + eps
        up = model.evaluate(X, y)
        model.embedding[unique[r], k] = saved - eps
        down = model.evaluate(X, y)
        model.embedding[unique[r], k] = saved
        assert grad_rows[r, k] == pytest.approx((up - down) / (2 * eps), abs=1e-8)
    for layer, variable in enumerate(model.dense_variables()):
        flat = variable.reshape(-1)
        i = int(rng.integers(flat.size))
        saved = flat[i]
        flat[i] = saved + eps
        up = model.evaluate(X, y)
        flat[i] = saved - eps
        down = model.evaluate(X, y)
        flat[i] = saved
        assert grads[layer].reshape(-1)[i] == pytest.approx((up - down) / (2 * eps), abs=1e-8)


def test_fit_returns_self_and_learns():
    X, y = next(_batches(1, 64))
    model = _model("concat")
    before = model.evaluate(X, y)
    assert model.fit(X, y, batch_size=16, epochs=30, lr=0.5) is model
    assert len(model.loss_curve_) == 30
    assert model.evaluate(X, y) < before / 2
    assert model.perplexity(X, y) == pytest.approx(np.exp(model.evaluate(X, y)))
    assert model.predict_proba(X).sum(axis=1) == pytest.approx(np.ones(64))
    assert 0 <= model.score(X, y) <= 1


@pytest.mark.parametrize(
    "X,y,match",
    [
        (np.zeros((4, C + 1), dtype=int), np.zeros(4, dtype=int), "shape"),
        (np.zeros((0, C), dtype=int), np.zeros(0, dtype=int), "no windows"),
        (np.full((4, C), 0.5), np.zeros(4, dtype=int), "integers"),
        (np.full((4, C), V), np.zeros(4, dtype=int), "outside the vocabulary"),
        (np.full((4, C), -1), np.zeros(4, dtype=int), "outside the vocabulary"),
        (np.full((4, C), 2**63, dtype=np.uint64), np.zeros(4, dtype=int), "9223372036854775808"),
        (np.zeros((4, C), dtype=int), np.full(4, 2**64 - 1, dtype=np.uint64), "1844674407370955"),
        (np.zeros((4, C), dtype=int), np.zeros(3, dtype=int), "one label per window"),
        (np.zeros((4, C), dtype=int), np.full(4, V), "outside the classes"),
        (np.zeros((4, C), dtype=int), np.array(["a"] * 4), "integers"),
    ],
)
def test_bad_input_changes_nothing(X, y, match):
    model = _model("sum")
    before = model.embedding.copy()
    with pytest.raises(ValueError, match=match):
        model.fit(X, y, lr=0.1)
    np.testing.assert_array_equal(model.embedding, before)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"combine": "max"}, "combine"),
        ({"dtype": np.int32}, "dtype"),
        ({"embed_dim": 0}, "embed_dim"),
    ],
)
def test_bad_hyperparameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EmbeddingMLP(V, C, **kwargs)


def test_corpus_windows_follow_the_token_streams():
    packages = ("json", "tomllib")
    corpus = load_stdlib_corpus("prose", context=2, packages=packages)
    words = []
    for path in stdlib_files(packages):
        text = path.read_text(encoding="utf-8")
        assert tokenize_source(text, "prose") == re.findall(
            r"[a-z]+", " ".join(tokenize_source_texts(text)).lower()
        )
        words.append(tokenize_source(text, "prose"))
    counts = Counter(w for stream in words for w in stream)
    assert corpus.vocabulary[0] == "<unk>"
    assert set(corpus.vocabulary[1:]) == set(counts)
    assert [counts[w] for w in corpus.vocabulary[1:]] == sorted(counts.values(), reverse=True)
    assert corpus.n_tokens == sum(counts.values())
    assert len(corpus.y) == sum(max(len(s) - 2, 0) for s in words)
    first = np.array([corpus.vocabulary.index(w) for w in words[0][:5]])
    np.testing.assert_array_equal(corpus.X[0], first[:2])
    np.testing.assert_array_equal(corpus.y[:3], first[2:5])
    (X_train, _), (X_held, _) = corpus.split(every=2)
    assert len(X_train) + len(X_held) == len(corpus.X)
    small = load_stdlib_corpus("code", context=2, max_vocab=10, packages=packages)
    assert len(small.vocabulary) == 10 and small.X.max() < 10


def tokenize_source_texts(text):
    """Comments and docstrings of a file, found independently with ``ast`` and ``tokenize``."""
    import ast
    import io
    import tokenize

    toks = tokenize.generate_tokens(io.StringIO(text).readline)
    out = [t.string for t in toks if t.type == tokenize.COMMENT]
    tree = ast.parse(text)
    for node in ast.walk(tree):  # the module first, then every definition
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    out.append(body[0].value.value)
    return out


@pytest.mark.parametrize("kwargs", [{"kind": "words"}, {"context": 0}, {"max_vocab": 1}])
def test_corpus_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        load_stdlib_corpus(**kwargs)


@pytest.mark.filterwarnings("ignore:(overflow|invalid value) encountered:RuntimeWarning")
def test_a_non_finite_loss_is_an_error_naming_the_step():
    """numpy's own warnings of the overflowing products come first; the error is the model's."""
    X, y = next(_batches(1, 64))
    model = _model("sum")
    with pytest.raises(NonFiniteLossError, match=r"step \d+: the loss is (nan|inf)"):
        model.fit(X, y, batch_size=16, epochs=3, lr=1e300)
    assert model.n_steps_ >= 2  # the first step's loss is finite; its update is not
