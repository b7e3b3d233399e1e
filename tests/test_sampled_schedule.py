"""The sampled model's learning-rate schedule (``lr_decay``, ``decay_horizon``) against numpy Adam
with the learning rate of each step written out here."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sampled_reference import AdamReference, reference_step, targets

from dasknn.optim import Adam
from dasknn.sampled import SampledMLP

N_FEATURES, HIDDEN, N_LABELS, ROWS, BATCH, LR = 12, 6, 10, 40, 10, 0.01


def _problem():
    rng = np.random.default_rng(5)
    X = sp.csr_matrix(rng.uniform(0.1, 1.0, (ROWS, N_FEATURES)) / 3)
    labels = [list(rng.choice(N_LABELS, rng.integers(1, 4), replace=False)) for _ in range(ROWS)]
    return X, labels


def _dense_model(**options) -> SampledMLP:
    """Every neuron active: exactly full-softmax training with Adam."""
    model = SampledMLP(
        hidden=HIDDEN,
        active_fraction=1.0,
        k=3,
        n_tables=4,
        hogwild=False,
        dtype="float64",
        optimizer=Adam(lr=LR),
        seed=3,
        **options,
    )
    return model.initialize(N_FEATURES, N_LABELS)


@pytest.mark.parametrize("decay", [0.0, 0.5, 1.0])
def test_fit_decays_the_learning_rate_over_its_steps_as_numpy_adam(decay):
    X, labels = _problem()
    model = _dense_model(lr_decay=decay)
    params = {k: v.astype(np.float64) for k, v in model.parameters().items()}
    model.fit(X, labels, epochs=2, batch_size=BATCH, shuffle=False)
    adam = AdamReference(LR)
    dense, y = X.toarray(), targets(labels, N_LABELS)
    total = 2 * ROWS // BATCH
    for step in range(total):
        # constant, then linear to 0 over the last decay * total steps
        adam.lr = LR if decay == 0 else LR * min(1.0, (total - step) / (decay * total))
        rows = slice((step % 4) * BATCH, (step % 4 + 1) * BATCH)
        adam.step(params, reference_step(params, dense[rows], y[rows])[1])
    assert adam.lr == pytest.approx(LR * (1 if decay == 0 else 1 / (decay * total)))
    for name, value in model.parameters().items():
        np.testing.assert_allclose(value, params[name], rtol=1e-9, atol=1e-9, err_msg=name)


def test_decay_horizon_spans_calls_and_partial_fit_keeps_the_rate():
    X, labels = _problem()
    whole = _dense_model().fit(X, labels, batch_size=BATCH, shuffle=False)
    parts = _dense_model(decay_horizon=ROWS // BATCH)
    half = ROWS // 2
    parts.fit(X[:half], labels[:half], batch_size=BATCH, shuffle=False)
    parts.fit(X[half:], labels[half:], batch_size=BATCH, shuffle=False)
    for name, value in whole.parameters().items():
        np.testing.assert_allclose(parts.parameters()[name], value, rtol=1e-12, err_msg=name)
    # past the horizon the learning rate is 0
    before = parts.parameters()
    parts.train_step(X[:BATCH], labels[:BATCH])
    for name, value in parts.parameters().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    # partial_fit without a horizon: constant, as lr_decay=0
    streamed = _dense_model().partial_fit(X, labels, batch_size=BATCH, shuffle=False)
    constant = _dense_model(lr_decay=0.0).fit(X, labels, batch_size=BATCH, shuffle=False)
    for name, value in constant.parameters().items():
        np.testing.assert_allclose(streamed.parameters()[name], value, rtol=1e-12, err_msg=name)
    # the decay of ``whole`` made a difference
    decayed, kept = whole.parameters()["output_weights"], constant.parameters()["output_weights"]
    assert not np.allclose(decayed, kept, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lr_decay": -0.1}, "lr_decay must lie"),
        ({"lr_decay": 1.5}, "lr_decay must lie"),
        ({"lr_decay": float("nan")}, "lr_decay must lie"),
        ({"lr_decay": True}, "lr_decay must lie"),
        ({"decay_horizon": 0}, "decay_horizon must be"),
        ({"decay_horizon": 2.5}, "decay_horizon must be"),
    ],
)
def test_bad_schedule_hyperparameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SampledMLP(**kwargs)
