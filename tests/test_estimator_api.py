"""The scikit-learn / dask-ml conventions of SparseMLP and DistributedSparseMLP: fit returns the
model, loss curves, partial_fit, predict / predict_proba / score, the same names and defaults on
both paths, and the distributed results equal to the single-process ones in float64."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from random_layers import random_layers

from dasknn import DistributedSparseMLP, SparseMLP
from dasknn.exceptions import ModelClosedError
from dasknn.optim import Adam


def tiny_model(loss="softmax_cross_entropy", seed=0):
    """24 -> 16 -> 12 -> 5, random patterns, float64."""
    weights, biases = random_layers([24, 16, 12, 5], 0.3, seed)
    return SparseMLP(weights, biases, activation="relu" if loss != "mse" else "sigmoid", loss=loss)


def tiny_data(model, n, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, size=(n, model.n_inputs))
    if model.loss.name == "mse":
        return x, rng.uniform(0, 1, size=(n, model.n_outputs))
    return x, rng.integers(0, model.n_outputs, size=n)


def block_partition(model, nparts=2):
    return [np.arange(n) * nparts // n for n in model.layer_sizes]


# ----------------------------------------------------------------- one process
def test_fit_returns_the_model_and_appends_per_epoch_and_per_batch_losses():
    model = tiny_model()
    x, y = tiny_data(model, 10)
    assert model.loss_curve_ == [] and model.batch_loss_curve_ == []
    assert model.fit(x, y, batch_size=4, epochs=2, lr=0.1, progress=False) is model
    assert len(model.loss_curve_) == 2 and model.batch_loss_curve_ == []
    model.fit(x, y, batch_size=4, epochs=1, lr=0.1, seed=5, progress=False, record_batches=True)
    assert len(model.loss_curve_) == 3 and len(model.batch_loss_curve_) == 3
    # the epoch's entry is the sample-weighted mean of its batches' losses (sizes 4, 4, 2)
    expected = np.dot(model.batch_loss_curve_, [4, 4, 2]) / 10
    assert model.loss_curve_[-1] == pytest.approx(expected, rel=1e-14)
    model.fit(x, y, epochs=0, progress=False)
    assert len(model.loss_curve_) == 3
    # train_step does not record; copies start with empty curves
    model.train_step(x, y, lr=0.1)
    assert len(model.loss_curve_) == 3 and model.copy().loss_curve_ == []


def test_batch_losses_are_the_losses_of_train_steps_on_the_same_batches():
    model = tiny_model(loss="mse")
    stepped = model.copy()
    x, y = tiny_data(model, 9)
    model.fit(x, y, batch_size=4, lr=0.2, shuffle=False, progress=False, record_batches=True)
    want = [stepped.train_step(x[s : s + 4], y[s : s + 4], lr=0.2) for s in range(0, 9, 4)]
    np.testing.assert_allclose(model.batch_loss_curve_, want, rtol=1e-14)


def test_partial_fit_is_one_epoch_of_fit_and_keeps_the_optimizer_state():
    model = tiny_model()
    fitted, stepped, restarted = model.copy(), model.copy(), model.copy()
    x, y = tiny_data(model, 14)
    adam = Adam(lr=0.01)
    for piece in (slice(0, 7), slice(7, 14)):
        assert model.partial_fit(x[piece], y[piece], batch_size=3, seed=2, optimizer=adam) is model
        fitted.fit(x[piece], y[piece], batch_size=3, seed=2, optimizer=adam, progress=False)
    assert model.loss_curve_ == fitted.loss_curve_ and len(model.loss_curve_) == 2
    for a, b in zip(model.weights, fitted.weights, strict=True):
        np.testing.assert_array_equal(a.data, b.data)
    # the same Adam state runs through both calls: it equals train steps on the same batches
    for piece in (slice(0, 7), slice(7, 14)):
        order = np.random.default_rng(2).permutation(7) + piece.start
        for s in range(0, 7, 3):
            stepped.train_step(x[order[s : s + 3]], y[order[s : s + 3]], optimizer=adam)
    for a, b in zip(model.weights, stepped.weights, strict=True):
        np.testing.assert_allclose(a.data, b.data, rtol=0, atol=1e-14)
    # ... and differs from restarting the state between the calls
    restarted.partial_fit(x[:7], y[:7], batch_size=3, seed=2, optimizer=adam)
    restarted = restarted.copy()
    restarted.partial_fit(x[7:], y[7:], batch_size=3, seed=2, optimizer=adam)
    assert not np.allclose(restarted.weights[0].data, model.weights[0].data, rtol=0, atol=1e-12)


def test_predict_predict_proba_and_score_of_a_softmax_model():
    model = tiny_model()
    x, labels = tiny_data(model, 11)
    proba = model.predict_proba(x, batch_size=4)
    assert proba.shape == (11, 5)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    predicted = model.predict(x, batch_size=4)
    assert predicted.shape == (11,) and predicted.dtype == np.int64
    np.testing.assert_array_equal(predicted, proba.argmax(axis=1))
    np.testing.assert_array_equal(model.classes_, np.arange(5))
    accuracy = model.score(x, labels)
    assert accuracy == np.mean(predicted == labels)
    assert model.score(x, np.eye(5)[labels], batch_size=3) == accuracy
    assert model.score(x, predicted) == 1.0
    z_last = model.forward(x)[-1][0]
    np.testing.assert_array_equal(predicted, z_last.argmax(axis=1))


def test_predict_and_score_of_a_regression_model():
    model = tiny_model(loss="mse")
    x, y = tiny_data(model, 7)
    output = model.predict(x)
    np.testing.assert_array_equal(output, model.forward(x)[-1][1])
    assert model.score(x, y, batch_size=2) == pytest.approx(-model.evaluate(x, y), rel=1e-14)
    assert model.score(x, y) < 0 and model.score(x, output) == 0.0
    assert not hasattr(model, "predict_proba")
    with pytest.raises(AttributeError, match="only defined for softmax models.*'mse'"):
        model.predict_proba(x)
    with pytest.raises(AttributeError, match="classes_"):
        _ = model.classes_


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m, x, y: m.score(x[:, :-1], y), "features"),
        (lambda m, x, y: m.score(x, y[:-1]), "labels for"),
        (lambda m, x, y: m.evaluate(x, y + 5), "labels must lie"),
        (lambda m, x, y: m.partial_fit(np.where(x > 0.5, np.nan, x), y), "NaN"),
        (lambda m, x, y: m.partial_fit(x, y.astype(float)), "must be integers"),
        (lambda m, x, y: m.predict_proba(x[0]), "2-D"),
        (lambda m, x, y: m.fit(x, y, batch_size=2.5), "batch_size must be an integer"),
        (lambda m, x, y: m.fit(x, y, batch_size=True), "batch_size must be an integer"),
        (lambda m, x, y: m.fit(x, y, epochs=1.5), "epochs must be an integer"),
        (lambda m, x, y: m.fit(x, y, seed=-1), "negative"),
        (lambda m, x, y: m.score(x, y, batch_size=0), "batch_size"),
    ],
)
def test_bad_input_raises_before_any_update(call, message):
    model = tiny_model()
    x, y = tiny_data(model, 6)
    before = [w.data.copy() for w in model.weights]
    with pytest.raises(ValueError, match=message):
        call(model, x, y)
    for w, b in zip(model.weights, before, strict=True):
        np.testing.assert_array_equal(w.data, b)
    assert model.loss_curve_ == []


def test_one_name_and_the_same_defaults_on_both_paths():
    for name in ("fit", "partial_fit", "train_step", "predict", "_predict_proba", "evaluate",
                 "score"):
        local = inspect.signature(getattr(SparseMLP, name)).parameters
        dist = dict(inspect.signature(getattr(DistributedSparseMLP, name)).parameters)
        if name in ("predict", "_predict_proba", "evaluate", "score"):
            assert dist.pop("in_flight").default == 2
        assert list(local) == list(dist), name
        for key, parameter in local.items():
            assert parameter.default == dist[key].default, (name, key)


# ----------------------------------------------------------------- distributed
@pytest.mark.parametrize("loss", ["softmax_cross_entropy", "mse"])
def test_distributed_estimator_api_equals_single_process(dask_client, loss):
    model = tiny_model(loss=loss, seed=3)
    local = model.copy()
    x, y = tiny_data(model, 13, seed=3)
    adam = Adam(lr=0.02)
    with DistributedSparseMLP(model, dask_client, partition=block_partition(model)) as dist:
        for name in ("n_layers", "n_inputs", "n_outputs", "layer_sizes", "dtype", "loss"):
            assert getattr(dist, name) == getattr(local, name), name
        fit = {"batch_size": 4, "epochs": 2, "lr": 0.2, "seed": 1, "progress": False,
               "record_batches": True}
        assert dist.fit(x, y, **fit) is dist
        local.fit(x, y, **fit)
        for piece in (slice(0, 6), slice(6, 13)):
            assert dist.partial_fit(x[piece], y[piece], batch_size=3, optimizer=adam) is dist
            local.partial_fit(x[piece], y[piece], batch_size=3, optimizer=adam)
        assert dist.optimizer_ == local.optimizer == adam
        assert dist.n_steps_ == 2 * 4 + 2 + 3
        assert len(dist.loss_curve_) == 4 and len(dist.batch_loss_curve_) == 8
        np.testing.assert_allclose(dist.loss_curve_, local.loss_curve_, rtol=1e-10)
        np.testing.assert_allclose(dist.batch_loss_curve_, local.batch_loss_curve_, rtol=1e-10)
        x_test, y_test = tiny_data(model, 9, seed=4)
        for in_flight in (1, 3):
            options = {"batch_size": 2, "in_flight": in_flight}
            assert dist.evaluate(x_test, y_test, **options) == pytest.approx(
                local.evaluate(x_test, y_test), rel=1e-10
            )
            assert dist.score(x_test, y_test, **options) == pytest.approx(
                local.score(x_test, y_test), rel=1e-10
            )
            if loss == "mse":
                np.testing.assert_allclose(
                    dist.predict(x_test, **options), local.predict(x_test), rtol=1e-10, atol=1e-10
                )
                assert not hasattr(dist, "predict_proba")
            else:
                labels = dist.predict(x_test, **options)
                np.testing.assert_array_equal(labels, local.predict(x_test))
                np.testing.assert_allclose(
                    dist.predict_proba(x_test, **options), local.predict_proba(x_test),
                    rtol=1e-10, atol=1e-10,
                )
        assert dist.comm_report().exact
        assert dist.gather().loss_curve_ == []
    with pytest.raises(ModelClosedError, match="closed"):
        dist.score(x_test, y_test)


def test_distributed_bad_input_is_rejected_before_scheduling(dask_client):
    model = tiny_model(seed=4)
    x, y = tiny_data(model, 6)
    with DistributedSparseMLP(model, dask_client, partition=block_partition(model)) as dist:
        step = dist._step
        before = dask_client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
        cases = [
            (lambda: dist.score(x, y[:-1]), "labels for"),
            (lambda: dist.score(x, y, in_flight=0), "in_flight"),
            (lambda: dist.evaluate(x[:, :-1], y), "features"),
            (lambda: dist.partial_fit(x, y + 5), "labels must lie"),
            (lambda: dist.partial_fit(np.where(x > 0.5, np.inf, x), y), "NaN"),
            (lambda: dist.predict_proba(x, batch_size=0), "batch_size"),
            (lambda: dist.fit(x, y, epochs=1.5), "epochs"),
        ]
        for call, message in cases:
            with pytest.raises(ValueError, match=message):
                call()
        after = dask_client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
        assert dist._step == step and after == before and dist.loss_curve_ == []
