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

A :class:`Workspace` passed to :func:`batch_gradients` (or :func:`sampled_batch_gradients`)
holds the pass's temporaries (the layers' values, the softmax and the backward deltas) from one
batch to the next: the same operations write into arrays kept from the last batch instead of
new ones. Where the allocator hands large freed blocks back to the system at once (Dask's
workers set ``MALLOC_TRIM_THRESHOLD_``), every new array of a step costs page faults again.
"""

from __future__ import annotations

from collections.abc import Callable
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
    "Workspace",
    "apply_dense",
    "apply_rows",
    "batch_gradients",
    "batch_logits",
    "gradients",
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


class Workspace:
    """Named arrays reused from one batch to the next (the temporaries of a pass).

    :meth:`array` gives an array of the asked shape and dtype, a view of a buffer kept under
    its name that grows when a larger one is asked for; its values are those left by the last
    use. A workspace serves one thread at a time.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def array(self, name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
        """An uninitialized C-contiguous array ``shape`` of ``dtype``, kept under ``name``."""
        dtype = np.dtype(dtype)
        size = int(np.prod(shape))
        buffer = self._buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.size < size:
            buffer = self._buffers[name] = np.empty(size, dtype=dtype)
        return buffer[:size].reshape(shape)


def _temporary(workspace: Workspace | None, name: str, shape: tuple, dtype) -> np.ndarray:
    """A new array, or the workspace's array ``name`` (uninitialized either way)."""
    if workspace is None:
        return np.empty(shape, dtype=dtype)
    return workspace.array(name, shape, dtype)


def unique_rows(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct ids of a batch ``(B, c)`` and the position of each id among them."""
    unique, inverse = np.unique(ids, return_inverse=True)
    return unique.astype(np.int64), inverse.reshape(ids.shape).astype(np.int64)


def _combined(spec: EmbeddingSpec, rows: np.ndarray, inverse: np.ndarray, workspace=None):
    out = _temporary(workspace, "h0", (inverse.shape[0], spec.input_width), rows.dtype)
    scale = rows.dtype.type(1.0 / spec.context if spec.combine == "mean" else 1.0)
    gather_windows(rows, inverse, spec.combine == "concat", scale, out)
    return out


def _forward(spec, rows, inverse, weights, biases, linear_last: bool, workspace=None) -> list:
    """``[(z_k, h_k)]`` of every layer, ``h_0`` first as ``(h_0, h_0)``; with ``linear_last``
    the last layer is the (linear) output ``(z, z)``. Every array is one of ``workspace`` when
    one is given."""
    activation = get_activation(spec.activation)
    h = _combined(spec, rows, inverse, workspace)
    layers = [(h, h)]
    for k, (w, b) in enumerate(zip(weights, biases, strict=True)):
        z = np.matmul(h, w, out=_temporary(workspace, f"z{k}", (h.shape[0], w.shape[1]), h.dtype))
        z += b
        if linear_last and k == len(weights) - 1:
            h = z
        else:
            h = activation.forward(z, out=_temporary(workspace, f"a{k}", z.shape, z.dtype))
        layers.append((z, h))
    return layers


def _gradient_views(weights, out: np.ndarray | None, dtype) -> list[np.ndarray]:
    """``[grad W_1, grad b_1, ...]`` as consecutive views of the flat ``out`` (a new one by
    default), uninitialized."""
    shapes = [shape for w in weights for shape in (w.shape, w.shape[1:])]
    sizes = [int(np.prod(shape)) for shape in shapes]
    if out is None:
        out = np.empty(sum(sizes), dtype=dtype)
    elif out.shape != (sum(sizes),) or out.dtype != dtype:
        raise ValueError(f"out must be a flat {np.dtype(dtype)} array of {sum(sizes)} items")
    bounds = np.cumsum([0, *sizes])
    return [
        out[lo:hi].reshape(shape)
        for lo, hi, shape in zip(bounds[:-1], bounds[1:], shapes, strict=True)
    ]


def _backward(
    spec, rows, inverse, layers, weights, delta, workspace=None, out=None, rows_out=None
) -> tuple[list, np.ndarray]:
    """The layers' gradients ``[grad W_1, grad b_1, ...]`` (views of the flat ``out``, or of a
    new array) and the rows' gradient (``rows_out``, or a new array) from ``delta``, the gradient
    of the last layer's pre-activation ``z``; the deltas of the layers below and the activations'
    derivatives are arrays of ``workspace`` when one is given."""
    activation = get_activation(spec.activation)
    grads = _gradient_views(weights, out, rows.dtype)
    for k in range(len(weights) - 1, -1, -1):
        h_prev = layers[k][1]
        np.matmul(h_prev.T, delta, out=grads[2 * k])
        np.sum(delta, axis=0, out=grads[2 * k + 1])
        below = _temporary(workspace, f"delta{k}", (delta.shape[0], h_prev.shape[1]), delta.dtype)
        delta = np.matmul(delta, weights[k].T, out=below)
        if k > 0:
            z, h = layers[k]
            delta *= activation.derivative(
                z, h, out=_temporary(workspace, f"slope{k}", z.shape, z.dtype)
            )
    if rows_out is None:
        grad_rows = np.zeros_like(rows)
    elif rows_out.shape != rows.shape or rows_out.dtype != rows.dtype:
        raise ValueError(f"rows_out must be a {rows.dtype} array of shape {rows.shape}")
    else:
        grad_rows = rows_out
        grad_rows.fill(0)
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
    workspace: Workspace | None = None,
    out: np.ndarray | None = None,
    rows_out: np.ndarray | None = None,
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
    workspace : Workspace, optional
        Where the pass's temporaries are kept from one batch to the next (default: new arrays).
    out : array, optional
        A flat array of the dense variables' total size (their order) to write the gradients
        into (default: a new one).
    rows_out : array (u, d), optional
        Where to write the rows' gradient (default: a new array); ``ValueError`` if its shape or
        dtype is not that of ``rows``.

    Returns
    -------
    loss_sum : float
        Sum over the ``B`` windows of ``-log softmax(z)[label]`` (divide by ``denominator``).
    dense_grads : list of arrays
        ``[grad W_1, grad b_1, ..., grad W_out, grad b_out]`` of ``sum / denominator``,
        consecutive views of one flat array (``out`` when given).
    grad_rows : array (u, d)
        Gradient of the embedding rows ``rows``.
    """
    layers = _forward(spec, rows, inverse, weights, biases, True, workspace)
    z = layers[-1][0]
    loss_sum = _softmax_cross_entropy(z, labels, denominator)
    grads, grad_rows = _backward(spec, rows, inverse, layers, weights, z, workspace, out, rows_out)
    return loss_sum, grads, grad_rows


def _softmax_cross_entropy(z: np.ndarray, labels: np.ndarray, denominator: int) -> float:
    """The sum over the rows of ``-log softmax(z)[label]``; ``z`` is overwritten, in place, with
    its gradient of the sum divided by ``denominator``: ``(softmax(z) - onehot(label)) /
    denominator``."""
    rows = np.arange(len(labels))
    z -= z.max(axis=1, keepdims=True)
    picked = z[rows, labels]
    np.exp(z, out=z)
    sums = z.sum(axis=1)
    loss_sum = float(np.sum(np.log(sums) - picked))
    z *= (1.0 / (sums * denominator))[:, None]
    z[rows, labels] -= z.dtype.type(1.0 / denominator)
    return loss_sum


def sampled_batch_gradients(
    spec: EmbeddingSpec,
    rows: np.ndarray,
    inverse: np.ndarray,
    weights: list[np.ndarray],
    biases: list[np.ndarray],
    output_rows: np.ndarray,
    output: SampledOutput,
    denominator: int,
    workspace: Workspace | None = None,
    out: np.ndarray | None = None,
    rows_out: np.ndarray | None = None,
) -> tuple[float, list[np.ndarray], np.ndarray, np.ndarray]:
    """:func:`batch_gradients` under the sampled softmax.

    ``weights`` and ``biases`` are the hidden layers only; ``output_rows`` (u, H + 1) are the
    rows of the output table ``[W_out^T | b_out]`` of ``output.classes``. Returns the loss sum,
    the hidden layers' gradients (views of ``out``, or of a new flat array), the embedding rows'
    gradient and the output rows' gradient.
    """
    activation = get_activation(spec.activation)
    layers = _forward(spec, rows, inverse, weights, biases, False, workspace)
    loss_sum, delta, grad_output = sampled_softmax_gradients(
        layers[-1][1], output_rows, output, denominator
    )
    if weights:  # from the gradient of h_H to that of its pre-activation
        delta = delta * activation.derivative(layers[-1][0], layers[-1][1])
    grads, grad_rows = _backward(
        spec, rows, inverse, layers, weights, delta, workspace, out, rows_out
    )
    return loss_sum, grads, grad_rows, grad_output


def gradients(
    spec: EmbeddingSpec,
    rows: dict[str, np.ndarray],
    inverse: np.ndarray,
    labels: np.ndarray,
    output: SampledOutput | None,
    dense: list[np.ndarray],
    denominator: int,
    workspace: Workspace | None = None,
    out: np.ndarray | None = None,
    rows_out: np.ndarray | None = None,
) -> tuple[float, list[np.ndarray], dict[str, np.ndarray]]:
    """:func:`batch_gradients`, or :func:`sampled_batch_gradients` under the sampled softmax, of
    the rows ``rows`` (``{sparse variable: the rows the batch reads}``) and the dense variables
    ``dense`` (in the order of ``spec.dense_names()``); ``output`` is the sampled softmax's
    (``None`` otherwise); ``rows_out`` is where the embedding rows' gradient goes (default: a
    new array). Returns the loss sum, the dense gradients and ``{sparse variable: the gradient of
    its rows}``."""
    weights, biases = dense[0::2], dense[1::2]
    if not spec.sampled:
        loss_sum, grads, grad_rows = batch_gradients(
            spec, rows[EMBEDDING], inverse, labels, weights, biases, denominator, workspace, out,
            rows_out,
        )  # fmt: skip
        return loss_sum, grads, {EMBEDDING: grad_rows}
    loss_sum, grads, grad_rows, grad_output = sampled_batch_gradients(
        spec, rows[EMBEDDING], inverse, weights, biases, rows[SOFTMAX], output, denominator,
        workspace, out, rows_out,
    )  # fmt: skip
    return loss_sum, grads, {EMBEDDING: grad_rows, SOFTMAX: grad_output}


def apply_dense(optimizer: Optimizer, param: np.ndarray, grad: np.ndarray, state) -> None:
    """One step of ``optimizer`` on a whole (C-contiguous) variable, in place."""
    optimizer.update(param.reshape(-1), np.ascontiguousarray(grad).reshape(-1), state)


def apply_rows(
    optimizer: Optimizer,
    table: np.ndarray,
    state: ParamState,
    rows: np.ndarray,
    grad: np.ndarray,
    take: Callable[..., np.ndarray] = np.empty,
) -> None:
    """One row-sparse step on ``table`` (n, d): only the rows ``rows`` (distinct) change.

    The rows' values and optimizer state are gathered (into arrays of ``take(shape, dtype)``,
    default new ones), stepped with ``grad`` (len(rows), d) and written back; the step count
    advances whether or not ``rows`` is empty. This is the update of the sparse variable
    everywhere (``torch.optim.SparseAdam``'s and TensorFlow's sparse apply for stateful
    optimizers; plain SGD gives the dense update's values).
    """
    shape = (len(rows), *table.shape[1:])

    def gathered(array: np.ndarray) -> np.ndarray:
        out = take(shape, array.dtype)
        return np.take(array, rows, axis=0, out=out, mode="clip").reshape(-1)  # rows valid

    picked = ParamState(
        step=state.step, arrays={name: gathered(values) for name, values in state.arrays.items()}
    )
    values = gathered(table)
    optimizer.update(values, np.ascontiguousarray(grad).reshape(-1), picked)
    table[rows] = values.reshape(shape)
    for name, array in picked.arrays.items():
        state.arrays[name][rows] = array.reshape(shape)
    state.step = picked.step
