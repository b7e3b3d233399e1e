"""Optimizers (dasknn.optim) in one process: an independent float64 reference and torch.optim.

The reference below is dense numpy with an explicit 0/1 mask for the sparsity pattern: gradients
from the maths of ``docs/training.md`` and the update formulas written out from the
``torch.optim`` documentation. It shares no code with dasknn.
"""

from __future__ import annotations

import numpy as np
import pytest
from model_reference import act, act_derivative, stored_mask
from random_layers import random_layers

from dasknn import SparseMLP
from dasknn.optim import SGD, Adam, AdamW, OptimizerSlots, ParamState

OPTIMIZERS = {
    "sgd": SGD(lr=0.3),
    "sgd-momentum": SGD(lr=0.1, momentum=0.9, dampening=0.2, weight_decay=0.05),
    "sgd-nesterov": SGD(lr=0.1, momentum=0.8, nesterov=True, weight_decay=0.01),
    "adam": Adam(lr=0.01),
    "adam-decay": Adam(lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    "adamw": AdamW(lr=0.01, betas=(0.85, 0.995), weight_decay=0.3),
}


def irregular_model(dtype=np.float64, seed=0, activation="sigmoid", loss="mse") -> SparseMLP:
    """Four sparse layers of different widths with random values, one explicit zero."""
    weights, biases = random_layers([24, 40, 32, 36, 20], 0.15, seed)
    weights[1].data[0] = 0.0  # an explicit zero is part of the pattern and is trained
    return SparseMLP(weights, biases, activation=activation, loss=loss, dtype=dtype)


def batches(model: SparseMLP, steps: int, batch: int = 6, seed: int = 1):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        x = rng.uniform(0, 1, size=(batch, model.n_inputs))
        y = rng.uniform(0, 1, size=(batch, model.n_outputs))
        yield x, y


class ReferenceOptimizer:
    """Dense float64 masked MLP (sigmoid, MSE) with the torch.optim update rules."""

    def __init__(self, model: SparseMLP, optimizer) -> None:
        self.W = [w.toarray().astype(np.float64) for w in model.weights]
        self.mask = [stored_mask(w).astype(np.float64) for w in model.weights]
        self.b = [np.array(b, dtype=np.float64) for b in model.biases]
        self.opt = optimizer
        self.t = 0
        self.state = {}

    def gradients(self, x, y):
        zs, acts = [], [x]
        for W, b in zip(self.W, self.b, strict=True):
            zs.append(acts[-1] @ W + b)
            acts.append(act("sigmoid", zs[-1]))
        delta = (acts[-1] - y) * act_derivative("sigmoid", zs[-1]) / x.shape[0]
        grads = [None] * len(self.W)
        for k in range(len(self.W) - 1, -1, -1):
            grads[k] = ((acts[k].T @ delta) * self.mask[k], delta.sum(0))
            if k > 0:
                delta = (delta @ self.W[k].T) * act_derivative("sigmoid", zs[k - 1])
        return grads

    def step(self, x, y) -> None:
        self.t += 1
        for k, (gw, gb) in enumerate(self.gradients(x, y)):
            self.W[k] = self._update(("w", k), self.W[k], gw, self.mask[k])
            self.b[k] = self._update(("b", k), self.b[k], gb, 1.0)

    def _update(self, name, p, g, mask):
        o, t = self.opt, self.t
        if isinstance(o, SGD):
            g = g + o.weight_decay * p * mask
            if o.momentum:
                buf = g if t == 1 else o.momentum * self.state[name] + (1 - o.dampening) * g
                self.state[name] = buf
                g = g + o.momentum * buf if o.nesterov else buf
            return p - o.lr * g
        beta1, beta2 = o.betas
        if isinstance(o, AdamW):
            p = p * (1 - o.lr * o.weight_decay * mask)
        else:
            g = g + o.weight_decay * p * mask
        m, v = self.state.get(name, (0.0, 0.0))
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g**2
        self.state[name] = (m, v)
        m_hat = m / (1 - beta1**t)
        v_hat = v / (1 - beta2**t)
        return p - o.lr * m_hat / (np.sqrt(v_hat) + o.eps) * mask


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_twenty_steps_equal_float64_reference(name):
    optimizer = OPTIMIZERS[name]
    model = irregular_model()
    reference = ReferenceOptimizer(model, optimizer)
    patterns = [stored_mask(w) for w in model.weights]
    for x, y in batches(model, 20):
        model.train_step(x, y, optimizer=optimizer)
        reference.step(x, y)
    for k in range(model.n_layers):
        np.testing.assert_array_equal(stored_mask(model.weights[k]), patterns[k])
        np.testing.assert_allclose(model.weights[k].toarray(), reference.W[k], rtol=0, atol=1e-12)
        np.testing.assert_allclose(model.biases[k], reference.b[k], rtol=0, atol=1e-12)
    # the weights moved: the comparison is not between two untouched models
    assert not np.allclose(model.weights[0].toarray(), irregular_model().weights[0].toarray())


def test_fit_carries_the_state_across_batches_and_calls():
    optimizer = Adam(lr=0.01)
    stepped, fitted = irregular_model(), irregular_model()
    data = list(batches(stepped, 4))
    x = np.concatenate([b[0] for b in data])
    y = np.concatenate([b[1] for b in data])
    for xb, yb in data:
        stepped.train_step(xb, yb, optimizer=optimizer)
    fitted.fit(x[:12], y[:12], batch_size=6, shuffle=False, optimizer=optimizer, progress=False)
    fitted.fit(x[12:], y[12:], batch_size=6, shuffle=False, optimizer=optimizer, progress=False)
    for a, b in zip(stepped.weights, fitted.weights, strict=True):
        np.testing.assert_array_equal(a.data, b.data)
    # a different optimizer starts from fresh state
    fitted.train_step(x[:6], y[:6], optimizer=Adam(lr=0.02))
    assert fitted.optimizer == Adam(lr=0.02)
    assert all(s.step == 1 for pair in fitted._optimizer_state for s in pair)


def test_lr_alone_is_plain_sgd():
    plain, explicit = irregular_model(seed=2), irregular_model(seed=2)
    for x, y in batches(plain, 3):
        plain.train_step(x, y, lr=0.25)
        explicit.train_step(x, y, optimizer=SGD(lr=0.25))
    for a, b in zip(plain.weights, explicit.weights, strict=True):
        np.testing.assert_array_equal(a.data, b.data)
    assert plain.optimizer == SGD(lr=0.25)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: SGD(lr=-0.1), "learning rate"),
        (lambda: SGD(lr=float("nan")), "learning rate"),
        (lambda: SGD(lr=0.1, momentum=-1), "momentum"),
        (lambda: SGD(lr=0.1, momentum=float("inf")), "momentum"),
        (lambda: SGD(lr=0.1, dampening=1.5), "dampening"),
        (lambda: SGD(lr=0.1, weight_decay=-0.1), "weight_decay"),
        (lambda: SGD(lr=0.1, nesterov=True), "Nesterov"),
        (lambda: SGD(lr=0.1, momentum=0.9, dampening=0.1, nesterov=True), "Nesterov"),
        (lambda: SGD(lr=0.1, nesterov="yes"), "nesterov"),
        (lambda: SGD(lr="0.1"), "real number"),
        (lambda: Adam(lr=float("inf")), "learning rate"),
        (lambda: Adam(betas=(1.0, 0.999)), r"betas\[0\]"),
        (lambda: Adam(betas=(0.9, -0.1)), r"betas\[1\]"),
        (lambda: Adam(betas=(0.9, float("nan"))), r"betas\[1\]"),
        (lambda: Adam(betas=(0.9,)), "pair"),
        (lambda: Adam(eps=-1e-8), "eps"),
        (lambda: AdamW(weight_decay=float("nan")), "weight_decay"),
    ],
)
def test_bad_hyperparameters_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_optimizer_arguments_raise_before_any_update():
    model = irregular_model()
    before = [w.data.copy() for w in model.weights]
    x, y = next(batches(model, 1))
    with pytest.raises(ValueError, match="not both"):
        model.train_step(x, y, lr=0.1, optimizer=Adam())
    with pytest.raises(ValueError, match="optimizer must be"):
        model.fit(x, y, optimizer="adam", progress=False)
    for a, w in zip(before, model.weights, strict=True):
        np.testing.assert_array_equal(a, w.data)


def test_slots_keep_the_state_while_the_optimizer_stays_equal():
    """OptimizerSlots: one state per key, made on first use, kept for an equal optimizer (also
    one made anew), all dropped for other hyperparameters or another type."""
    w, b = np.zeros(5), np.zeros(3)
    slots = OptimizerSlots()
    first = slots.state(Adam(lr=0.1), "w", w)
    assert set(first.arrays) == {"exp_avg", "exp_avg_sq"} and first.arrays["exp_avg"].shape == (5,)
    first.step = 4
    assert slots.state(Adam(lr=0.1), "w", w) is first
    slots.update(Adam(lr=0.1), "b", b, np.ones(3))
    # Adam's first step from g = 1: m = 0.1, v = 0.001, p -= 0.1 * (m / 0.1) / (1 + eps)
    np.testing.assert_allclose(b, -0.1 / (1 + 1e-8), rtol=1e-12)
    assert slots.states["b"].step == 1 and slots.states["w"] is first
    copied = slots.copy()
    copied.states["b"].arrays["exp_avg"] += 1
    np.testing.assert_allclose(slots.states["b"].arrays["exp_avg"], 0.1, rtol=1e-12)
    for other in (Adam(lr=0.2), AdamW(lr=0.1, weight_decay=0.0), SGD(lr=0.1)):
        fresh = slots.state(other, "w", w)
        assert fresh.step == 0 and list(slots.states) == ["w"] and slots.optimizer == other
    assert copied.optimizer == Adam(lr=0.1) and copied.states["w"].step == 4
    with pytest.raises(ValueError, match="need the optimizer"):
        OptimizerSlots(None, {"w": ParamState()})


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_twenty_steps_equal_torch_optim(name):
    """The same masked problem in torch (float32): dense weights whose gradients are masked to
    the pattern, ``torch.optim`` updating them; the values off the pattern stay zero."""
    torch = pytest.importorskip("torch")
    optimizer = OPTIMIZERS[name]
    model = irregular_model(dtype=np.float32, seed=3)
    masks = [torch.tensor(stored_mask(w), dtype=torch.float32) for w in model.weights]
    params = []
    for w, b in zip(model.weights, model.biases, strict=True):
        params.append(torch.tensor(w.toarray(), requires_grad=True))
        params.append(torch.tensor(b.copy(), requires_grad=True))
    hyper = {k: v for k, v in vars(optimizer).items()}
    kind = {SGD: torch.optim.SGD, Adam: torch.optim.Adam, AdamW: torch.optim.AdamW}
    torch_opt = kind[type(optimizer)](params, **hyper)
    for x, y in batches(model, 20, seed=4):
        x, y = x.astype(np.float32), y.astype(np.float32)
        model.train_step(x, y, optimizer=optimizer)
        torch_opt.zero_grad()
        a = torch.tensor(x)
        for k in range(model.n_layers):
            a = torch.sigmoid(a @ params[2 * k] + params[2 * k + 1])
        loss = 0.5 * ((a - torch.tensor(y)) ** 2).sum() / x.shape[0]
        loss.backward()
        for k, mask in enumerate(masks):
            params[2 * k].grad *= mask
        torch_opt.step()
        with torch.no_grad():  # decay (weight decay, AdamW) must not leave the pattern either
            for k, mask in enumerate(masks):
                params[2 * k] *= mask
    for k in range(model.n_layers):
        want = params[2 * k].detach().numpy()
        np.testing.assert_allclose(model.weights[k].toarray(), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(
            model.biases[k], params[2 * k + 1].detach().numpy(), rtol=1e-5, atol=1e-5
        )
