"""The arithmetic of an embedding MLP on one batch, shared by every process that runs one.

A model maps windows of ``c`` integer token ids to a class (the next word):

    h_0 = combine(E[x_1], ..., E[x_c])      concat (B, c d), sum or mean (B, d)
    h_k = f(h_{k-1} @ W_k + b_k)            k = 1 .. H (dense hidden layers)
    z   = h_H @ W_out + b_out               (B, n_classes), softmax cross-entropy

or, with ``output="sampled"``, the sampled softmax of :mod:`dasknn.model.sampled_softmax`: the
output layer is then a second sparse variable, the table ``[W_out^T | b_out]`` (n_classes, H + 1)
of which a step reads and changes the rows of its labels and candidate classes only.

``E`` (V x d) is the *sparse* variable: a batch reads and changes only the rows its ids name. The
hidden and output layers are *dense* variables. The functions here take the batch's distinct
rows ``rows`` (u, d) and ``inverse`` (B, c), the position of every id in ``rows``, so the same code
runs on a one-process model (``rows = E[unique ids]``) and on a data-parallel worker (``rows``
pulled from the parameter servers). ``denominator`` is the number of windows of the *global*
batch: every worker's gradient is its share of the gradient of the global mean loss, and the sum
of the shares is the exact gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dasknn.kernels.embedding import gather_windows, scatter_add_windows
from dasknn.model.activations import get_activation
from dasknn.model.sampled_softmax import SampledOutput, sampled_softmax_gradients
from dasknn.optim import Optimizer, ParamState

__all__ = [
    "COMBINES",
    "EMBEDDING",
    "OUTPUTS",
    "SOFTMAX",
    "EmbeddingSpec",
    "apply_dense",
    "apply_rows",
    "batch_gradients",
    "batch_logits",
    "sampled_batch_gradients",
    "unique_rows",
]

COMBINES = ("concat", "sum", "mean")
OUTPUTS = ("softmax", "sampled")
EMBEDDING = "embedding"
#: The output table ``[W_out^T | b_out]`` of a sampled-softmax model (a sparse variable).
SOFTMAX = "softmax"


@dataclass(frozen=True)
class EmbeddingSpec:
    """Shapes and functions of an embedding MLP (everything but the values).

    Attributes
    ----------
    vocab_size, context, embed_dim, n_classes : int
    hidden : tuple of int
        Widths of the dense hidden layers (may be empty).
    combine : str
        ``"concat"``, ``"sum"`` or ``"mean"``.
    activation : str
        Hidden activation (see :func:`dasknn.model.get_activation`).
    dtype : str
        ``"float32"`` or ``"float64"``.
    output : str
        ``"softmax"`` (full) or ``"sampled"`` (sampled softmax in training).
    n_sampled : int
        Candidate classes per step (sampled softmax).
    sampler : str
        ``"log-uniform"`` or ``"uniform"`` (see :mod:`dasknn.model.sampled_softmax`).
    sampler_seed : int
        Seed of the candidate draws (step ``t`` draws from ``default_rng([sampler_seed, t])``).
    """

    vocab_size: int
    context: int
    embed_dim: int
    hidden: tuple[int, ...]
    n_classes: int
    combine: str
    activation: str
    dtype: str
    output: str = "softmax"
    n_sampled: int = 0
    sampler: str = "log-uniform"
    sampler_seed: int = 0

    @property
    def sampled(self) -> bool:
        """Whether training uses the sampled softmax (the output layer is then sparse)."""
        return self.output == "sampled"

    @property
    def input_width(self) -> int:
        """Width of ``h_0``."""
        return self.embed_dim * (self.context if self.combine == "concat" else 1)

    @property
    def layer_sizes(self) -> list[int]:
        """``[h_0 width, hidden..., n_classes]``."""
        return [self.input_width, *self.hidden, self.n_classes]

    def _dense_layers(self) -> int:
        return len(self.hidden) + (0 if self.sampled else 1)

    def dense_names(self) -> list[str]:
        """Names of the dense variables, in the order of :func:`batch_gradients`' list (the
        output layer is not one under the sampled softmax)."""
        names = []
        for k in range(self._dense_layers()):
            layer = "output" if k == len(self.hidden) else f"hidden{k + 1}"
            names += [f"{layer}.weight", f"{layer}.bias"]
        return names

    def dense_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the dense variables, in the order of :meth:`dense_names`."""
        sizes = self.layer_sizes
        shapes = []
        for k in range(self._dense_layers()):
            shapes += [(sizes[k], sizes[k + 1]), (sizes[k + 1],)]
        return shapes

    def sparse_shapes(self) -> dict[str, tuple[int, int]]:
        """The row-sparse variables and their shapes: the embedding, and the output table
        ``[W_out^T | b_out]`` under the sampled softmax."""
        shapes = {EMBEDDING: (self.vocab_size, self.embed_dim)}
        if self.sampled:
            shapes[SOFTMAX] = (self.n_classes, self.layer_sizes[-2] + 1)
        return shapes


def unique_rows(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct ids of a batch ``(B, c)`` and the position of each id among them."""
    unique, inverse = np.unique(ids, return_inverse=True)
    return unique.astype(np.int64), inverse.reshape(ids.shape).astype(np.int64)


def _combined(spec: EmbeddingSpec, rows: np.ndarray, inverse: np.ndarray) -> np.ndarray:
    out = np.empty((inverse.shape[0], spec.input_width), dtype=rows.dtype)
    scale = rows.dtype.type(1.0 / spec.context if spec.combine == "mean" else 1.0)
    gather_windows(rows, inverse, spec.combine == "concat", scale, out)
    return out


def _forward(spec, rows, inverse, weights, biases, linear_last: bool) -> list:
    """``[(z_k, h_k)]`` of every layer, ``h_0`` first as ``(h_0, h_0)``; with ``linear_last``
    the last layer is the (linear) output ``(z, z)``."""
    activation = get_activation(spec.activation)
    h = _combined(spec, rows, inverse)
    layers = [(h, h)]
    for k, (w, b) in enumerate(zip(weights, biases, strict=True)):
        z = h @ w + b
        h = z if linear_last and k == len(weights) - 1 else activation.forward(z)
        layers.append((z, h))
    return layers


def _backward(spec, rows, inverse, layers, weights, delta) -> tuple[list, np.ndarray]:
    """The layers' gradients ``[grad W_1, grad b_1, ...]`` and the rows' gradient from ``delta``,
    the gradient of the last layer's pre-activation ``z``."""
    activation = get_activation(spec.activation)
    grads: list[np.ndarray] = []
    for k in range(len(weights) - 1, -1, -1):
        h_prev = layers[k][1]
        grads[:0] = [h_prev.T @ delta, delta.sum(axis=0)]
        delta = delta @ weights[k].T
        if k > 0:
            delta *= activation.derivative(layers[k][0], layers[k][1])
    grad_rows = np.zeros_like(rows)
    scale = rows.dtype.type(1.0 / spec.context if spec.combine == "mean" else 1.0)
    scatter_add_windows(grad_rows, inverse, spec.combine == "concat", scale, delta)
    return grads, grad_rows


def batch_logits(spec, rows, inverse, weights, biases) -> np.ndarray:
    """The output ``z`` (B, n_classes) of the windows ``inverse`` over ``rows`` (full softmax;
    ``weights`` and ``biases`` include the output layer)."""
    return _forward(spec, rows, inverse, weights, biases, linear_last=True)[-1][0]


def batch_gradients(
    spec: EmbeddingSpec,
    rows: np.ndarray,
    inverse: np.ndarray,
    labels: np.ndarray,
    weights: list[np.ndarray],
    biases: list[np.ndarray],
    denominator: int,
) -> tuple[float, list[np.ndarray], np.ndarray]:
    """Loss and gradients of a batch's share of the global mean cross-entropy.

    Parameters
    ----------
    spec : EmbeddingSpec
    rows : array (u, d)
        The batch's distinct embedding rows.
    inverse : int64 array (B, c)
        Position in ``rows`` of every id.
    labels : int64 array (B,)
    weights, biases : lists of arrays
        The dense layers (hidden ones, then the output layer).
    denominator : int
        Windows in the global batch (``>= B``).

    Returns
    -------
    loss_sum : float
        Sum over the ``B`` windows of ``-log softmax(z)[label]`` (divide by ``denominator``).
    dense_grads : list of arrays
        ``[grad W_1, grad b_1, ..., grad W_out, grad b_out]`` of ``sum / denominator``.
    grad_rows : array (u, d)
        Gradient of the embedding rows ``rows``.
    """
    layers = _forward(spec, rows, inverse, weights, biases, linear_last=True)
    z = layers[-1][0]
    shifted = z - z.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(shifted).sum(axis=1))
    picked = shifted[np.arange(len(labels)), labels]
    loss_sum = float(np.sum(log_norm - picked))
    delta = np.exp(shifted - log_norm[:, None])
    delta[np.arange(len(labels)), labels] -= 1
    delta /= denominator
    grads, grad_rows = _backward(spec, rows, inverse, layers, weights, delta)
    return loss_sum, grads, grad_rows


def sampled_batch_gradients(
    spec: EmbeddingSpec,
    rows: np.ndarray,
    inverse: np.ndarray,
    weights: list[np.ndarray],
    biases: list[np.ndarray],
    output_rows: np.ndarray,
    output: SampledOutput,
    denominator: int,
) -> tuple[float, list[np.ndarray], np.ndarray, np.ndarray]:
    """:func:`batch_gradients` under the sampled softmax.

    ``weights`` and ``biases`` are the hidden layers only; ``output_rows`` (u, H + 1) are the
    rows of the output table ``[W_out^T | b_out]`` of ``output.classes``. Returns the loss sum,
    the hidden layers' gradients, the embedding rows' gradient and the output rows' gradient.
    """
    activation = get_activation(spec.activation)
    layers = _forward(spec, rows, inverse, weights, biases, linear_last=False)
    loss_sum, delta, grad_output = sampled_softmax_gradients(
        layers[-1][1], output_rows, output, denominator
    )
    if weights:  # from the gradient of h_H to that of its pre-activation
        delta = delta * activation.derivative(layers[-1][0], layers[-1][1])
    grads, grad_rows = _backward(spec, rows, inverse, layers, weights, delta)
    return loss_sum, grads, grad_rows, grad_output


def apply_dense(optimizer: Optimizer, param: np.ndarray, grad: np.ndarray, state) -> None:
    """One step of ``optimizer`` on a whole (C-contiguous) variable, in place."""
    optimizer.update(param.reshape(-1), np.ascontiguousarray(grad).reshape(-1), state)


def apply_rows(
    optimizer: Optimizer,
    table: np.ndarray,
    state: ParamState,
    rows: np.ndarray,
    grad: np.ndarray,
) -> None:
    """One row-sparse step on ``table`` (n, d): only the rows ``rows`` (distinct) change.

    The rows' values and optimizer state are gathered, stepped with ``grad`` (len(rows), d) and
    written back; the step count advances whether or not ``rows`` is empty. This is the update of
    the sparse variable everywhere (``torch.optim.SparseAdam``'s and TensorFlow's sparse apply for
    stateful optimizers; plain SGD gives the dense update's values).
    """
    picked = ParamState(
        step=state.step,
        arrays={name: values[rows].reshape(-1) for name, values in state.arrays.items()},
    )
    values = table[rows].reshape(-1)
    optimizer.update(values, np.ascontiguousarray(grad).reshape(-1), picked)
    shape = (len(rows), *table.shape[1:])
    table[rows] = values.reshape(shape)
    for name, array in picked.arrays.items():
        state.arrays[name][rows] = array.reshape(shape)
    state.step = picked.step
