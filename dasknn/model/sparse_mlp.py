"""Single-process sparse multilayer perceptron: the reference path and the P = 1 case.

Conventions (those of the Graph Challenge): layer ``k`` (1-based in the maths, 0-based in code) has
a CSR weight matrix ``W_k`` of shape ``(n_{k-1}, n_k)`` whose entry ``(i, j)`` connects input neuron
``i`` to output neuron ``j``, and a bias ``b_k`` of length ``n_k``. Batches are row blocks::

    z_k = a_{k-1} @ W_k + b_k,   a_k = f(z_k)   (f_out on the last layer),   a_0 = X

Training minimises the mean loss of the batch, backpropagated through the fixed sparsity pattern,
with plain SGD or an optimizer of :mod:`dasknn.optim` (see ``docs/training.md``). All per-element
arithmetic on the sparse matrices runs in the numba kernels of :mod:`dasknn.kernels.training` and
:mod:`dasknn.kernels.optimizers`, on feature-major copies of the batch (``x.T``): the public methods
take and return row blocks, the private ones work on ``(n_k, B)`` arrays.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import numpy as np
import scipy.sparse as sp

from dasknn.datasets.radixnet import radixnet as radixnet_pattern
from dasknn.kernels.training import column_runs, masked_outer_grad, spmm_backward, spmm_forward
from dasknn.model.activations import Activation
from dasknn.model.estimator import InProcessEstimator
from dasknn.model.layer_shapes import LayerShapes
from dasknn.model.losses import Loss, network_functions
from dasknn.model.persistence import ModelRecord, pattern_digest, read_model, write_model
from dasknn.model.validation import check_bias, check_float_dtype, check_layer
from dasknn.optim import Optimizer, OptimizerSlots, ParamState

__all__ = ["SparseMLP"]



def _init_scale(scale: float | str, fan_in: float, fan_out: float) -> float:
    if scale == "he":
        return float(np.sqrt(6.0 / fan_in))
    if scale == "glorot":
        return float(np.sqrt(6.0 / (fan_in + fan_out)))
    if isinstance(scale, str):
        raise ValueError(f"scale must be a number, 'he' or 'glorot', got {scale!r}")
    scale = float(scale)
    if not np.isfinite(scale) or scale < 0:
        raise ValueError(f"scale must be finite and >= 0, got {scale}")
    return scale


class SparseMLP(LayerShapes, InProcessEstimator):
    """A feed-forward network of sparse layers trained in one process.

    It follows the scikit-learn conventions: :meth:`fit` and :meth:`partial_fit` return the
    model, ``loss_curve_`` records the training, :meth:`predict` gives class labels for softmax
    models (:attr:`predict_proba` their probabilities) and :meth:`score` is higher-is-better.

    Parameters
    ----------
    weights : sequence of sparse (or dense) matrices
        ``weights[k]`` has shape ``(n_k, n_{k+1})``; consecutive shapes must chain. The stored
        entries (explicit zeros included) are the sparsity pattern, which training never changes.
    biases : sequence of 1-D arrays, optional
        ``biases[k]`` has length ``n_{k+1}``; zeros when omitted.
    activation : str or Activation
        Hidden-layer activation: ``"sigmoid"``, ``"relu"``, ``"clipped_relu"`` or ``"identity"``.
    output_activation : str or Activation, optional
        Activation of the last layer; defaults to ``activation`` for ``"mse"`` and to
        ``"identity"`` for ``"softmax_cross_entropy"`` (which requires it).
    loss : str or Loss
        ``"mse"`` or ``"softmax_cross_entropy"``.
    dtype : float32 or float64
        Value type of weights, biases and activations.

    Attributes
    ----------
    weights : list of scipy.sparse.csr_matrix
        Layer matrices (own copies, sorted indices, ``dtype``); updated in place by training.
    biases : list of numpy.ndarray
    activation, output_activation : Activation
    loss : Loss
    dtype : numpy.dtype
    optimizer : Optimizer or None
        The optimizer of the last training step. Its state (one :class:`~dasknn.optim.ParamState`
        per layer's weight values and per bias) is kept while later steps use an equal optimizer
        and started afresh when they use a different one.
    loss_curve_ : list of float
        Per epoch of :meth:`fit` / :meth:`partial_fit` on this object, the mean batch loss.
    batch_loss_curve_ : list of float
        Per batch of the training calls made with ``record_batches=True``, its loss.
    """

    def __init__(
        self,
        weights: Sequence,
        biases: Sequence | None = None,
        activation: str | Activation = "sigmoid",
        output_activation: str | Activation | None = None,
        loss: str | Loss = "mse",
        dtype=np.float64,
    ) -> None:
        self.dtype = check_float_dtype(dtype)
        self.activation, self.output_activation, self.loss = network_functions(
            activation, output_activation, loss
        )

        weights = list(weights)
        if not weights:
            raise ValueError("a network needs at least one weight matrix")
        self.weights = [check_layer(w, k, self.dtype) for k, w in enumerate(weights)]
        for k in range(1, len(self.weights)):
            if self.weights[k].shape[0] != self.weights[k - 1].shape[1]:
                raise ValueError(
                    f"weights[{k}] has {self.weights[k].shape[0]} input neurons but "
                    f"weights[{k - 1}] has {self.weights[k - 1].shape[1]} output neurons"
                )
        if biases is None:
            self.biases = [np.zeros(w.shape[1], dtype=self.dtype) for w in self.weights]
        else:
            biases = list(biases)
            if len(biases) != len(self.weights):
                raise ValueError(f"got {len(biases)} biases for {len(self.weights)} layers")
            self.biases = [
                check_bias(b, k, w.shape[1], self.dtype)
                for k, (b, w) in enumerate(zip(biases, self.weights, strict=True))
            ]
        self._slots = OptimizerSlots()
        self.loss_curve_: list[float] = []
        self.batch_loss_curve_: list[float] = []

    def __getstate__(self) -> dict:
        """The attributes without the column views (rebuilt from the pattern when next used)."""
        state = dict(self.__dict__)
        state.pop("_column_views", None)
        return state

    def _column_view(self, k: int) -> tuple:
        """``(starts, ends, rows, order)`` of layer ``k``'s :func:`column_runs` (the forward
        kernel's view of the pattern), kept while the layer's index arrays are the same."""
        w = self.weights[k]
        views = self.__dict__.setdefault("_column_views", {})
        held = views.get(k)
        if held is None or held[0] is not w.indptr or held[1] is not w.indices:
            bounds, rows, order = column_runs(
                w.indptr, w.indices, w.shape[1], np.array([0, w.shape[0]], dtype=np.int64)
            )
            held = views[k] = (w.indptr, w.indices, (bounds[0], bounds[-1], rows, order))
        return held[2]

    # ------------------------------------------------------------------ shape
    @property
    def layer_shapes(self) -> list[tuple[int, int]]:
        """``(n_in, n_out)`` of every layer."""
        return [w.shape for w in self.weights]

    def iter_weights(self) -> Iterator[sp.csr_matrix]:
        """The layers' weight matrices in order (those of :attr:`weights`, not copies)."""
        return iter(self.weights)

    def layer_activation(self, k: int) -> Activation:
        """Activation of layer ``k`` (0-based): the output activation on the last layer."""
        return self.output_activation if k == self.n_layers - 1 else self.activation

    def __repr__(self) -> str:
        return (
            f"SparseMLP(layer_sizes={self.layer_sizes}, nnz={sum(w.nnz for w in self.weights)}, "
            f"activation={self.activation.name!r}, output_activation="
            f"{self.output_activation.name!r}, loss={self.loss.name!r}, dtype={self.dtype.name})"
        )

    # ------------------------------------------------------------ arithmetic
    # The private methods work on feature-major arrays (``x.T``, shape (n, B)), the layout of the
    # kernels; the public methods take and return row blocks.
    def _forward(self, xt: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Feature-major ``(z_k, a_k)`` for ``k = 1..L`` from the feature-major inputs ``xt``."""
        layers = []
        at = xt
        for k, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            zt = np.empty((w.shape[1], at.shape[1]), dtype=self.dtype)
            spmm_forward(at, *self._column_view(k), w.data, zt)
            zt += b[:, None]
            at = self.layer_activation(k).forward(zt)
            layers.append((zt, at))
        return layers

    @property
    def optimizer(self) -> Optimizer | None:
        """The optimizer of the last training step (``None`` before the first)."""
        return self._slots.optimizer

    @property
    def _optimizer_state(self) -> list[tuple[ParamState, ParamState]]:
        """Per layer, the optimizer state of the weight values and of the bias (empty before the
        first step)."""
        if self._slots.optimizer is None:
            return []
        states = self._slots.states
        return [(states["weights", k], states["bias", k]) for k in range(self.n_layers)]

    def _train_batch(self, x: np.ndarray, y: np.ndarray, optimizer: Optimizer) -> float:
        xt = np.ascontiguousarray(x.T)
        layers = self._forward(xt)
        z_last, a_last = layers[-1][0].T, layers[-1][1].T
        value = self.loss.value(z_last, a_last, y)
        deltat = np.ascontiguousarray(
            self.loss.output_delta(z_last, a_last, y, self.output_activation).T
        )
        one = self.dtype.type(1)
        for k in range(self.n_layers - 1, -1, -1):
            w = self.weights[k]
            a_prev = xt if k == 0 else layers[k - 1][1]
            grad_w = np.empty_like(w.data)
            masked_outer_grad(a_prev, deltat, w.indptr, w.indices, one, grad_w)
            grad_b = deltat.sum(axis=1)
            if k > 0:
                st = np.empty((w.shape[0], deltat.shape[1]), dtype=self.dtype)
                spmm_backward(deltat, w.indptr, w.indices, w.data, st)
                st *= self.activation.derivative(*layers[k - 1])
                deltat = st
            # W_k is not read again in this backward pass, so it can be updated now.
            self._slots.update(optimizer, ("weights", k), w.data, grad_w)
            self._slots.update(optimizer, ("bias", k), self.biases[k], grad_b)
        return value

    # ------------------------------------------------------------ public API
    def copy(self) -> SparseMLP:
        """An independent copy (weights and biases copied; no optimizer state, empty loss
        curves)."""
        return SparseMLP(
            self.weights,
            self.biases,
            activation=self.activation,
            output_activation=self.output_activation,
            loss=self.loss,
            dtype=self.dtype,
        )

    # ------------------------------------------------------------ construction
    @classmethod
    def radixnet(
        cls,
        neurons: int,
        layers: int,
        seed: int = 0,
        activation: str | Activation = "sigmoid",
        loss: str | Loss = "mse",
        dtype=np.float64,
        output_activation: str | Activation | None = None,
        n_inputs: int | None = None,
        n_outputs: int | None = None,
        scale: float | str = 1.0,
        bias: float = 0.0,
    ) -> SparseMLP:
        """A network on the RadiX-Net pattern with weights drawn uniformly in ``[-scale, scale]``.

        The hidden layers are the ``layers`` RadiX-Net layers of
        :func:`dasknn.datasets.radixnet` (``neurons`` x ``neurons``, 32 nonzeros per row and
        column). Two optional ends adapt it to a data set:

        - ``n_inputs`` (default ``neurons``): when different, the first layer has shape
          ``(n_inputs, neurons)`` and input ``i`` takes the RadiX-Net row ``i mod neurons`` (every
          input feeds 32 neurons; each neuron sees about ``32 * n_inputs / neurons`` inputs).
        - ``n_outputs``: when given, one more layer ``(neurons, n_outputs)`` is appended, fully
          connected (a classifier head: ``neurons * n_outputs`` stored entries), so the model
          has ``layers + 1`` layers.

        Parameters
        ----------
        neurons, layers : int
            Width ``16 * 2**m`` and number of RadiX-Net layers.
        seed : int
            Seeds both the RadiX-Net relabellings and the weight values.
        activation, loss, dtype, output_activation
            As in :class:`SparseMLP`.
        scale : float or {"he", "glorot"}
            Half-width of the uniform initial weights: a number (1.0 gives
            ``[-1, 1]``), or per layer ``sqrt(6 / fan_in)`` ("he", for ReLU) or
            ``sqrt(6 / (fan_in + fan_out))`` ("glorot"), with the layer's mean fan-in and fan-out.
        bias : float
            Initial value of every bias.
        """
        dtype = check_float_dtype(dtype)
        patterns = radixnet_pattern(neurons, layers, seed=seed, dtype=dtype)
        if n_inputs is not None and n_inputs != neurons:
            if n_inputs < 1:
                raise ValueError(f"n_inputs must be >= 1, got {n_inputs}")
            patterns[0] = patterns[0][np.arange(n_inputs) % neurons]
        if n_outputs is not None:
            if n_outputs < 1:
                raise ValueError(f"n_outputs must be >= 1, got {n_outputs}")
            patterns.append(sp.csr_matrix(np.ones((neurons, n_outputs), dtype=dtype)))
        rng = np.random.default_rng([seed, 0x5EED])
        weights = []
        for pattern in patterns:
            n_in, n_out = pattern.shape
            half = _init_scale(scale, pattern.nnz / n_out, pattern.nnz / n_in)
            pattern.data = rng.uniform(-half, half, size=pattern.nnz).astype(dtype)
            weights.append(pattern)
        biases = [np.full(w.shape[1], bias, dtype=dtype) for w in weights]
        return cls(
            weights,
            biases,
            activation=activation,
            output_activation=output_activation,
            loss=loss,
            dtype=dtype,
        )

    # ------------------------------------------------------------ persistence
    def _identity(self) -> dict:
        return {
            "layer_sizes": self.layer_sizes,
            "pattern": pattern_digest(self.weights),
            "activation": self.activation.name,
            "output_activation": self.output_activation.name,
            "loss": self.loss.name,
            "dtype": self.dtype.name,
        }

    def _record(self) -> ModelRecord:
        """The model as a :class:`~dasknn.model.persistence.ModelRecord` (arrays not copied)."""
        return ModelRecord(
            weights=list(self.weights),
            biases=list(self.biases),
            activation=self.activation.name,
            output_activation=self.output_activation.name,
            loss=self.loss.name,
            dtype=self.dtype.name,
            optimizer=self.optimizer,
            optimizer_state=self._optimizer_state,
        )

    def _restore(self, record: ModelRecord) -> None:
        for w, stored in zip(self.weights, record.weights, strict=True):
            w.data[:] = stored.data
        for b, stored in zip(self.biases, record.biases, strict=True):
            b[:] = stored
        states = {}
        for k, (w_state, b_state) in enumerate(record.optimizer_state):
            states["weights", k], states["bias", k] = w_state.copy(), b_state.copy()
        self._slots = OptimizerSlots(record.optimizer, states)

    def save(self, path: str | os.PathLike) -> None:
        """Write the model to the ``.npz`` file ``path`` atomically (all or nothing): weights,
        biases, activations, loss, dtype, and the optimizer with its state (format of
        :mod:`dasknn.model.persistence`)."""
        write_model(path, self._record())

    @classmethod
    def load(cls, path: str | os.PathLike) -> SparseMLP:
        """Read a model (or a checkpoint) written by :meth:`save` or ``fit(checkpoint=...)``,
        with its optimizer state.

        Every layer's arrays are checked (:func:`graph.checks.csr_from_arrays`) before any
        kernel or scipy routine reads them. Nothing is unpickled.

        Raises
        ------
        FileNotFoundError
            If ``path`` does not exist.
        ValueError
            Naming ``path``, if the file is not a model file (not a zip archive, truncated,
            corrupt), has a newer format version, or is incomplete or inconsistent (an index out
            of range, a decreasing ``indptr``, a value that is not finite, shapes that do not
            chain, optimizer state that does not fit).
        """
        record = read_model(path)
        try:
            model = cls(
                record.weights,
                record.biases,
                activation=record.activation,
                output_activation=record.output_activation,
                loss=record.loss,
                dtype=record.dtype,
            )
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: invalid model file: {exc}") from None
        model._restore(record)
        return model
