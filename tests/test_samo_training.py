"""Training on compressed states (SAMO) in one process, against a dense-with-mask float64
reference written here and against torch's pruning utilities; precisions, memory, bad input."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from model_reference import act, act_derivative

from dasknn.model import CompressedMLP, DenseMLP
from dasknn.optim import SGD, Adam, AdamW
from dasknn.pruning import magnitude_masks

OPTIMIZERS = {
    "adam": Adam(lr=0.01, weight_decay=0.05),
    "adamw": AdamW(lr=0.01, betas=(0.85, 0.99), weight_decay=0.2),
    "sgd-nesterov": SGD(lr=0.1, momentum=0.8, nesterov=True, weight_decay=0.01),
}
SIZES = (30, 24, 16, 5)


def pruned_problem(seed=0, p=0.7):
    rng = np.random.default_rng(seed)
    weights = [rng.uniform(-1, 1, (a, b)) for a, b in zip(SIZES[:-1], SIZES[1:], strict=True)]
    biases = [rng.uniform(-0.1, 0.1, b) for b in SIZES[1:]]
    masks = magnitude_masks(weights, p)
    return weights, biases, masks


def data(steps, batch=8, seed=1):
    rng = np.random.default_rng(seed)
    return [
        (rng.uniform(0, 1, (batch, SIZES[0])), rng.integers(0, SIZES[-1], batch))
        for _ in range(steps)
    ]


class MaskedReference:
    """Dense float64 ReLU / softmax cross-entropy network, gradients times the 0/1 mask, the
    torch.optim update formulas written out (no dasknn code)."""

    def __init__(self, weights, biases, masks, optimizer):
        self.W = [np.where(m, w, 0.0) for w, m in zip(weights, masks, strict=True)]
        self.M = [m.astype(np.float64) for m in masks]
        self.b = [np.array(b, dtype=np.float64) for b in biases]
        self.opt, self.t, self.state = optimizer, 0, {}

    def step(self, x, labels):
        y = np.eye(SIZES[-1])[labels]
        zs, acts = [], [x]
        for k, (w, b) in enumerate(zip(self.W, self.b, strict=True)):
            zs.append(acts[-1] @ w + b)
            acts.append(zs[-1] if k == len(self.W) - 1 else act("relu", zs[-1]))
        e = np.exp(zs[-1] - zs[-1].max(1, keepdims=True))
        delta = (e / e.sum(1, keepdims=True) - y) / x.shape[0]
        grads = [None] * len(self.W)
        for k in range(len(self.W) - 1, -1, -1):
            grads[k] = ((acts[k].T @ delta) * self.M[k], delta.sum(0))
            if k:
                delta = (delta @ self.W[k].T) * act_derivative("relu", zs[k - 1])
        self.t += 1
        for k, (gw, gb) in enumerate(grads):
            self.W[k] = self.update(("w", k), self.W[k], gw, self.M[k])
            self.b[k] = self.update(("b", k), self.b[k], gb, 1.0)

    def update(self, name, p, g, mask):
        o, t = self.opt, self.t
        if isinstance(o, SGD):
            g = g + o.weight_decay * p * mask
            buf = g if t == 1 else o.momentum * self.state[name] + (1 - o.dampening) * g
            self.state[name] = buf
            return p - o.lr * (g + o.momentum * buf if o.nesterov else buf)
        b1, b2 = o.betas
        if isinstance(o, AdamW):
            p = p * (1 - o.lr * o.weight_decay * mask)
        else:
            g = g + o.weight_decay * p * mask
        m, v = self.state.get(name, (0.0, 0.0))
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g**2
        self.state[name] = (m, v)
        return p - o.lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + o.eps) * mask


@pytest.mark.parametrize("compute", ["sparse", "dense"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_twenty_compressed_steps_equal_the_float64_reference(name, compute):
    weights, biases, masks = pruned_problem()
    model = CompressedMLP(weights, masks, biases, precision="fp64", compute=compute)
    reference = MaskedReference(weights, biases, masks, OPTIMIZERS[name])
    for x, labels in data(20):
        model.train_step(x, labels, optimizer=OPTIMIZERS[name])
        reference.step(x, labels)
    for k, (w, m) in enumerate(zip(model.weights, masks, strict=True)):
        np.testing.assert_allclose(w, reference.W[k], rtol=0, atol=1e-12)
        np.testing.assert_allclose(model.biases[k], reference.b[k], rtol=0, atol=1e-12)
        assert (w[~m] == 0).all()  # pruned entries stay exactly 0
        assert model.stack.layers[k].master.size == m.sum()  # and are not stored
    assert not np.allclose(model.weights[0], np.where(masks[0], weights[0], 0))


def test_twenty_steps_equal_torch_adam_with_custom_from_mask():
    torch = pytest.importorskip("torch")
    prune = pytest.importorskip("torch.nn.utils.prune")
    weights, biases, masks = pruned_problem(seed=2)
    model = CompressedMLP(weights, masks, biases, precision="fp32")
    layers = []
    for w, b, m in zip(weights, biases, masks, strict=True):
        lin = torch.nn.Linear(*w.shape)
        with torch.no_grad():
            lin.weight.copy_(torch.tensor(w.T, dtype=torch.float32))
            lin.bias.copy_(torch.tensor(b, dtype=torch.float32))
        prune.custom_from_mask(lin, "weight", torch.tensor(m.T))
        layers.append(lin)
    params = [p for lin in layers for p in lin.parameters()]
    opt = torch.optim.Adam(params, lr=0.01)
    for x, labels in data(20, seed=3):
        x = x.astype(np.float32)
        model.train_step(x, labels, optimizer=Adam(lr=0.01))
        opt.zero_grad()
        a = torch.tensor(x)
        for k, lin in enumerate(layers):
            a = lin(a) if k == len(layers) - 1 else torch.relu(lin(a))
        torch.nn.functional.cross_entropy(a, torch.tensor(labels)).backward()
        opt.step()
    for w, lin in zip(model.weights, layers, strict=True):
        want = (lin.weight_orig * lin.weight_mask).detach().numpy().T  # `weight` is stale
        np.testing.assert_allclose(w, want, rtol=1e-5, atol=1e-5)


def test_dense_and_sparse_compute_agree_and_match_the_dense_with_mask_model():
    weights, biases, masks = pruned_problem(seed=4)
    models = [
        CompressedMLP(weights, masks, biases, precision="fp32", compute=c)
        for c in ("sparse", "dense")
    ]
    masked = DenseMLP(weights, biases, masks=masks, dtype=np.float32)
    for x, labels in data(10, seed=5):
        for m in (*models, masked):
            m.train_step(x, labels, optimizer=Adam(lr=0.01))
    for a, b, c in zip(models[0].weights, models[1].weights, masked.weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
        np.testing.assert_allclose(a, c, rtol=0, atol=1e-5)


@pytest.mark.parametrize("compute", ["sparse", "dense"])
def test_sixteen_bit_storage_tracks_fp32(compute):
    pytest.importorskip("ml_dtypes")
    weights, biases, masks = pruned_problem(seed=6)
    models = {
        p: CompressedMLP(weights, masks, biases, precision=p, compute=compute, loss_scale=1024)
        for p in ("fp32", "bf16", "fp16")
    }
    for x, labels in data(10, seed=7):
        for m in models.values():
            m.train_step(x, labels, optimizer=Adam(lr=0.01))
    layer = models["bf16"].stack.layers[0]
    assert layer.grad_w.dtype.name == "bfloat16" and layer.master.dtype == np.float32
    for p in ("bf16", "fp16"):
        for a, b in zip(models[p].weights, models["fp32"].weights, strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=0.05)
    assert models["fp16"].scaler.skipped_steps == 0


def test_fp16_overflow_skips_the_step_and_halves_the_scale():
    weights, biases, masks = pruned_problem(seed=8)
    model = CompressedMLP(weights, masks, biases, precision="fp16", loss_scale=2.0**40)
    before = model.weights
    x, labels = data(1, seed=9)[0]
    model.train_step(x, labels, optimizer=Adam(lr=0.01))
    assert model.scaler.skipped_steps == 1 and model.scaler.scale == 2.0**39
    for a, b in zip(before, model.weights, strict=True):
        np.testing.assert_array_equal(a, b)
    while model.scaler.skipped_steps < 40 and model.scaler.good_steps == 0:
        model.train_step(x, labels, optimizer=Adam(lr=0.01))
    assert model.scaler.good_steps == 1
    assert not np.array_equal(before[0], model.weights[0])


@pytest.mark.parametrize(
    ("precision", "compute"),
    [("fp32", "sparse"), ("fp32", "dense"), ("bf16", "sparse"), ("bf16", "dense")],
)
def test_memory_report_counts_every_byte(precision, compute):
    pytest.importorskip("ml_dtypes")
    weights, biases, masks = pruned_problem(seed=10, p=0.9)
    model = CompressedMLP(weights, masks, biases, precision=precision, compute=compute)
    report = model.memory_report(optimizer=Adam())
    phi = sum(w.size for w in weights)
    nnz = sum(int(m.sum()) for m in masks)
    n_bias = sum(SIZES[1:])
    rows = sum(SIZES[:-1]) + len(weights)
    half = precision == "bf16"
    weights_bytes = 4 * (nnz + n_bias) + (2 * phi if compute == "dense" and half else 0)
    weights_bytes += 4 * phi if compute == "dense" and not half else 0
    weights_bytes += 2 * nnz if compute == "sparse" and half else 0
    grads = (2 + 4 if half else 4) * (nnz + n_bias)
    assert report.categories["weights"] == weights_bytes
    assert report.categories["gradients"] == grads
    assert report.categories["optimizer_states"] == 8 * (nnz + n_bias)
    assert report.categories["index"] == 4 * nnz + 8 * rows
    assert report.nnz == nnz and report.phi == phi
    assert report.formulas["samo"] == pytest.approx(2 * phi + 24 * nnz)
    assert report.formulas["mixed_precision"] == 20 * phi
    # after a step the states held are the ones predicted
    x, labels = data(1)[0]
    model.train_step(x, labels, optimizer=Adam())
    assert model.memory_report().categories == report.categories


def test_bad_input_raises_before_any_update(monkeypatch):
    weights, biases, masks = pruned_problem(seed=11)
    with pytest.raises(ValueError, match="unknown precision"):
        CompressedMLP(weights, masks, precision="fp8")
    with pytest.raises(ValueError, match="unknown compute"):
        CompressedMLP(weights, masks, compute="gpu")
    with pytest.raises(ValueError, match="masks\\[1\\] has shape"):
        CompressedMLP(weights, [masks[0], masks[1].T, masks[2]])
    with pytest.raises(ValueError, match="fully pruned"):
        CompressedMLP(weights, [masks[0], np.zeros_like(masks[1]), masks[2]])
    with pytest.raises(ValueError, match="indices\\[0\\] must be strictly increasing"):
        CompressedMLP.from_compressed([np.ones(2)], [np.array([4, 1])], [(3, 3)])
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    with pytest.raises(ImportError, match="pip install ml_dtypes"):
        CompressedMLP(weights, masks, precision="bf16")
    model = CompressedMLP(weights, masks, biases)
    before = model.weights
    x, labels = data(1)[0]
    with pytest.raises(ValueError, match="learning rate"):
        model.train_step(x, labels, optimizer=Adam(lr=-1))
    with pytest.raises(ValueError, match="not both"):
        model.train_step(x, labels, lr=0.1, optimizer=Adam())
    with pytest.raises(ValueError, match="features"):
        model.train_step(x[:, :3], labels)
    for a, b in zip(before, model.weights, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_non_finite_loss_names_the_step_and_the_layer():
    weights, biases, masks = pruned_problem(seed=12)
    weights[1] = weights[1] * 1e30
    model = CompressedMLP(weights, masks, biases, precision="fp32")
    x, labels = data(1)[0]
    with pytest.raises(FloatingPointError, match="step 1: .* layer 2 is the first"):
        model.train_step(x * 1e20, labels, lr=0.1)


@pytest.mark.parametrize("compute", ["sparse", "dense"])
def test_a_mean_squared_error_step_equals_the_float64_reference(compute):
    weights, biases, masks = pruned_problem(seed=12)
    rng = np.random.default_rng(13)
    x, y = rng.uniform(0, 1, (8, SIZES[0])), rng.uniform(0, 1, (8, SIZES[-1]))
    model = CompressedMLP(
        weights,
        masks,
        biases,
        loss="mse",
        output_activation="sigmoid",
        compute=compute,
        precision="fp64",
    )
    loss = model.train_step(x, y, optimizer=SGD(lr=0.5))
    # reference: masked float64 network, ReLU hidden layers, sigmoid output, J = |a - y|^2 / 2B
    ws = [w * m for w, m in zip(weights, masks, strict=True)]
    acts = [x]
    for k, (w, b) in enumerate(zip(ws, biases, strict=True)):
        z = acts[-1] @ w + b
        acts.append(1 / (1 + np.exp(-z)) if k == len(ws) - 1 else np.maximum(z, 0))
    assert loss == pytest.approx(((acts[-1] - y) ** 2).sum() / 16, rel=1e-12)
    delta = (acts[-1] - y) * acts[-1] * (1 - acts[-1]) / 8
    for k in range(len(ws) - 1, -1, -1):
        want_w = ws[k] - 0.5 * (acts[k].T @ delta) * masks[k]
        np.testing.assert_allclose(model.weights[k], want_w, rtol=0, atol=1e-12)
        np.testing.assert_allclose(model.biases[k], biases[k] - 0.5 * delta.sum(0), atol=1e-12)
        delta = (delta @ ws[k].T) * (acts[k] > 0)
