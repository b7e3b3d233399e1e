"""Single-process training of a pruned network on compressed model states (SAMO).

:class:`CompressedMLP` holds each layer as its unpruned values at one sorted int32 flat index
(:mod:`dasknn.compressed`): master weights, gradients and optimizer moments cover the unpruned
entries only, so pruned weights are not stored and stay exactly 0. Batches are row blocks and the
conventions are those of :class:`~dasknn.model.SparseMLP` (``Y_next = f(Y @ W + b)``, weights of
shape ``(n_in, n_out)``); the estimator API (``fit``, ``partial_fit``, ``score``, ...) is the same.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from dasknn.compressed import (
    CompressedStack,
    LossScaler,
    MemoryReport,
    check_index,
    flat_index,
    formula_bytes,
    get_precision,
)
from dasknn.compressed.memory import CATEGORIES, FORMULAS
from dasknn.compressed.stack import check_compute
from dasknn.exceptions import NonFiniteLossError
from dasknn.model.activations import Activation
from dasknn.model.compressed_persistence import (
    COMPRESSED_FILE,
    CompressedRecord,
    compressed_identity,
    read_compressed,
    write_compressed,
)
from dasknn.model.estimator import InProcessEstimator
from dasknn.model.layer_shapes import LayerShapes
from dasknn.model.losses import Loss, network_functions
from dasknn.optim import Optimizer

__all__ = [
    "CompressedMLP",
    "LayerShapes",
    "first_nonfinite_layer",
    "nonfinite_loss_error",
]


def first_nonfinite_layer(outputs: Sequence[np.ndarray], first_layer: int) -> int | None:
    """Number (1-based, counted from ``first_layer``) of the first of ``outputs`` that holds a
    value that is not finite; ``None`` if all are finite."""
    for k, out in enumerate(outputs):
        if not np.isfinite(out).all():
            return first_layer + k
    return None


def nonfinite_loss_error(
    step: int, value: float, outputs: Sequence[np.ndarray], first_layer: int
) -> NonFiniteLossError:
    """The error of a step whose loss is not finite, naming the step and the first layer
    (1-based, counted from ``first_layer``) whose outputs are not finite (the last layer if all
    are)."""
    layer = first_nonfinite_layer(outputs, first_layer)
    if layer is None:
        layer = first_layer + len(outputs) - 1
    return NonFiniteLossError(step, value, layer)


def split_layers(
    weights: Sequence, masks: Sequence | None
) -> list[tuple[np.ndarray, np.ndarray, tuple[int, int]]]:
    """Per layer ``(values, index, shape)`` of dense ``weights`` under ``masks`` (default: the
    nonzero entries), checked."""
    weights = [np.asarray(w) for w in weights]
    if not weights:
        raise ValueError("a network needs at least one weight matrix")
    if masks is not None and len(masks) != len(weights):
        raise ValueError(f"got {len(masks)} masks for {len(weights)} layers")
    layers = []
    for k, w in enumerate(weights):
        if w.ndim != 2:
            raise ValueError(f"weights[{k}] must be a 2-D array, got shape {w.shape}")
        if w.dtype.kind not in "fiu" or not np.isfinite(w).all():
            raise ValueError(f"weights[{k}] must hold finite real numbers")
        if k and w.shape[0] != weights[k - 1].shape[1]:
            raise ValueError(
                f"weights[{k}] has {w.shape[0]} input neurons but weights[{k - 1}] has "
                f"{weights[k - 1].shape[1]} output neurons"
            )
        mask = w != 0 if masks is None else np.asarray(masks[k])
        if mask.shape != w.shape:
            raise ValueError(f"masks[{k}] has shape {mask.shape}, weights[{k}] {w.shape}")
        index = flat_index(mask, name=f"masks[{k}]")
        layers.append((np.ascontiguousarray(w).reshape(-1)[index], index, w.shape))
    return layers


class CompressedMLP(LayerShapes, InProcessEstimator):
    """A pruned fully connected network trained on compressed states, in one process.

    Parameters
    ----------
    weights : sequence of 2-D arrays
        Dense layer matrices ``(n_k, n_{k+1})``; only the entries the masks keep are stored.
    masks : sequence of boolean arrays, optional
        ``True`` where a weight is kept (default: the nonzero entries of ``weights``).
    biases : sequence of 1-D arrays, optional
        Zeros when omitted.
    activation, output_activation, loss
        As in :class:`~dasknn.model.SparseMLP`.
    precision : {"fp32", "bf16", "fp16", "fp64"}
        Storage of the 16-bit states and arithmetic (see :mod:`dasknn.compressed.precision`);
        ``"fp64"`` is for checks against float64 references.
    compute : {"sparse", "dense"}
        Multiply with the compressed weights (default, faster on CPUs at 80-90% sparsity) or with
        dense weights expanded from them every step (SAMO as published).
    loss_scale : float
        Initial dynamic loss scale of ``"fp16"``.

    Attributes
    ----------
    stack : CompressedStack
        The layers' compressed states.
    optimizer : Optimizer or None
        The optimizer of the last step (its state is kept while later steps use an equal one).
    scaler : LossScaler or None
        fp16's loss scaler.
    steps_ : int
        Training steps taken (skipped fp16 steps included).
    loss_curve_, batch_loss_curve_ : list of float
    """

    def __init__(
        self,
        weights: Sequence,
        masks: Sequence | None = None,
        biases: Sequence | None = None,
        activation: str | Activation = "relu",
        output_activation: str | Activation | None = None,
        loss: str | Loss = "softmax_cross_entropy",
        precision: str = "fp32",
        compute: str = "sparse",
        loss_scale: float = 2.0**16,
    ) -> None:
        self._setup(
            split_layers(weights, masks),
            biases,
            activation,
            output_activation,
            loss,
            precision,
            compute,
            loss_scale,
        )

    def _setup(
        self,
        layers: list[tuple],
        biases: Sequence | None,
        activation: str | Activation,
        output_activation: str | Activation | None,
        loss: str | Loss,
        precision: str,
        compute: str,
        loss_scale: float,
    ) -> None:
        """Build the model from checked per-layer ``(values, index, shape)``."""
        self.precision = get_precision(precision)
        self.compute = check_compute(compute)
        self.dtype = self.precision.arithmetic
        self.activation, self.output_activation, self.loss = network_functions(
            activation, output_activation, loss
        )
        self._init_stack(layers, biases)
        self.scaler = LossScaler(loss_scale) if self.precision.loss_scaling else None
        self.steps_ = 0
        self.loss_curve_: list[float] = []
        self.batch_loss_curve_: list[float] = []

    def _init_stack(self, layers: list[tuple], biases: Sequence | None) -> None:
        if biases is None:
            biases = [np.zeros(shape[1]) for _, _, shape in layers]
        biases = list(biases)
        if len(biases) != len(layers):
            raise ValueError(f"got {len(biases)} biases for {len(layers)} layers")
        for k, (b, (_, _, shape)) in enumerate(zip(biases, layers, strict=True)):
            b = np.asarray(b)
            if b.shape != (shape[1],) or not np.isfinite(b).all():
                raise ValueError(f"biases[{k}] must be {shape[1]} finite values, got {b.shape}")
        self.layer_shapes = [tuple(int(s) for s in shape) for _, _, shape in layers]
        activations = [self.activation] * (len(layers) - 1) + [self.output_activation]
        self.stack = CompressedStack(layers, biases, activations, self.precision, self.compute)

    @classmethod
    def from_compressed(
        cls,
        values: Sequence,
        indices: Sequence,
        shapes: Sequence,
        biases=None,
        activation: str | Activation = "relu",
        output_activation: str | Activation | None = None,
        loss: str | Loss = "softmax_cross_entropy",
        precision: str = "fp32",
        compute: str = "sparse",
        loss_scale: float = 2.0**16,
    ) -> CompressedMLP:
        """A model from per-layer compressed values, flat indices and shapes (checked; no dense
        matrix is built), the other parameters as :class:`CompressedMLP`'s."""
        if not (len(values) == len(indices) == len(shapes)) or not len(values):
            raise ValueError("values, indices and shapes must have one entry per layer (>= 1)")
        layers = []
        for k, (v, i, s) in enumerate(zip(values, indices, shapes, strict=True)):
            index = check_index(i, s, name=f"indices[{k}]")
            v = np.asarray(v)
            if v.shape != index.shape:
                raise ValueError(f"values[{k}] has {v.size} entries, its index {index.size}")
            if v.dtype.kind not in "fiu" or not np.isfinite(v).all():
                raise ValueError(f"values[{k}] must hold finite real numbers")
            shape = (int(s[0]), int(s[1]))
            if k and shape[0] != layers[-1][2][1]:
                raise ValueError(
                    f"shapes[{k}] has {shape[0]} input neurons but shapes[{k - 1}] has "
                    f"{layers[-1][2][1]} output neurons"
                )
            layers.append((v, index, shape))
        model = cls.__new__(cls)
        model._setup(
            layers, biases, activation, output_activation, loss, precision, compute, loss_scale
        )
        return model

    # ------------------------------------------------------------------ persistence
    _checkpoint_format = COMPRESSED_FILE

    def save(self, path: str | os.PathLike) -> None:
        """Write the model to the ``.npz`` file ``path`` atomically (all or nothing): every
        layer's flat index, master weights and bias, the precision, compute, activations and
        loss, fp16's loss scale, and the optimizer with its compressed state (format of
        :mod:`dasknn.model.compressed_persistence`)."""
        write_compressed(path, self._record())

    def _identity(self) -> dict:
        return compressed_identity(self._record())

    def _record(self) -> CompressedRecord:
        """The model's compressed states as a record (arrays shared, not copied)."""
        layers = self.stack.layers
        state = []
        held = [layer.optimizer_state for layer in layers]
        if self.optimizer is not None and all(pair is not None for pair in held):
            state = held
        scaler = None
        if self.scaler is not None:
            scaler = {
                "scale": self.scaler.scale,
                "growth_interval": self.scaler.growth_interval,
                "good_steps": self.scaler.good_steps,
                "skipped_steps": self.scaler.skipped_steps,
            }
        return CompressedRecord(
            values=[layer.master for layer in layers],
            indices=[layer.index for layer in layers],
            shapes=[layer.shape for layer in layers],
            biases=[layer.bias for layer in layers],
            precision=self.precision.name,
            compute=self.compute,
            activation=self.activation.name,
            output_activation=self.output_activation.name,
            loss=self.loss.name,
            steps=self.steps_,
            loss_scaler=scaler,
            optimizer=self.optimizer if state else None,
            optimizer_state=state,
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> CompressedMLP:
        """Read a model written by :meth:`save`, with its optimizer state and loss scale; every
        array is checked before the model is built (see
        :mod:`dasknn.model.compressed_persistence`). Nothing is unpickled.

        Raises
        ------
        FileNotFoundError
            If ``path`` does not exist.
        ValueError
            Naming ``path``, if the file is not a compressed model file (not a zip archive,
            truncated, corrupt), has a newer format version, or is incomplete or inconsistent
            (an unsorted, duplicate or out-of-range index, values that do not fit it or are not
            finite, layers that do not chain, an unknown precision, activation or loss,
            optimizer state that does not fit).
        ImportError
            For a bf16 model without ``ml_dtypes``.
        """
        return cls._from_record(read_compressed(path), path)

    def _restore(self, record: CompressedRecord) -> None:
        """Take the values, biases, optimizer state, step count and loss scale of ``record``
        (a record of the same network)."""
        model = type(self)._from_record(record, "checkpoint")
        self.stack, self.scaler, self.steps_ = model.stack, model.scaler, model.steps_

    @classmethod
    def _from_record(cls, record: CompressedRecord, path) -> CompressedMLP:
        """A model of the checked ``record`` (read from ``path``, named in the errors)."""
        scaler = record.loss_scaler
        try:
            model = cls.from_compressed(
                record.values,
                record.indices,
                record.shapes,
                record.biases,
                activation=record.activation,
                output_activation=record.output_activation,
                loss=record.loss,
                precision=record.precision,
                compute=record.compute,
                **({} if scaler is None else {"loss_scale": scaler["scale"]}),
            )
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: invalid compressed model file: {exc}") from None
        model.steps_ = record.steps
        if scaler is not None:
            model.scaler.growth_interval = scaler["growth_interval"]
            model.scaler.good_steps = scaler["good_steps"]
            model.scaler.skipped_steps = scaler["skipped_steps"]
        if record.optimizer is not None:
            for layer, pair in zip(model.stack.layers, record.optimizer_state, strict=True):
                layer.restore_optimizer_state(record.optimizer, pair)
        return model

    # ------------------------------------------------------------------ values
    @property
    def weights(self) -> list[np.ndarray]:
        """Dense copies of the layers (the master values, exact zeros where pruned)."""
        return [layer.dense_weights() for layer in self.stack.layers]

    @property
    def biases(self) -> list[np.ndarray]:
        """Copies of the layers' biases."""
        return [layer.bias.copy() for layer in self.stack.layers]

    @property
    def indices(self) -> list[np.ndarray]:
        """The layers' sorted int32 flat indices."""
        return [layer.index for layer in self.stack.layers]

    @property
    def optimizer(self) -> Optimizer | None:
        """The optimizer of the last training step (``None`` before the first)."""
        return self.stack.optimizer

    @property
    def nnz(self) -> int:
        """Weights kept (unpruned) in all layers."""
        return sum(layer.nnz for layer in self.stack.layers)

    @property
    def phi(self) -> int:
        """Weights before pruning."""
        return sum(n_in * n_out for n_in, n_out in self.layer_shapes)

    def __repr__(self) -> str:
        return (
            f"CompressedMLP(layer_sizes={self.layer_sizes}, nnz={self.nnz}, "
            f"precision={self.precision.name!r}, compute={self.compute!r})"
        )

    # ------------------------------------------------------------------ training
    def _forward(self, xt: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        return self.stack.forward(xt)

    def _train_batch(self, x: np.ndarray, y: np.ndarray, optimizer: Optimizer) -> float:
        self.steps_ += 1
        xt = np.ascontiguousarray(x.T)
        yt = np.ascontiguousarray(y.T)  # the targets in the activations' feature-major layout
        layers = self.stack.forward(xt)
        zt, at = layers[-1]
        value = self.loss.value_t(zt, at, yt)
        if not np.isfinite(value):
            raise nonfinite_loss_error(self.steps_, value, [a for _, a in layers], 1)
        deltat = self.loss.output_delta_t(zt, at, yt, self.output_activation)
        scale = 1.0 if self.scaler is None else self.scaler.scale
        if scale != 1.0:
            deltat *= scale
        self.stack.backward(xt, layers, deltat, first=True, input_delta=False)
        if self.scaler is not None and not self.scaler.update(self.stack.gradients_finite()):
            return value
        self.stack.apply(optimizer, 1.0 / scale)
        return value

    # ------------------------------------------------------------------ memory
    def memory_report(self, optimizer: Optimizer | None = None) -> MemoryReport:
        """Exact bytes of the model states by category, with the paper's formulas beside them.

        Parameters
        ----------
        optimizer : Optimizer, optional
            Counts the states this optimizer would hold when the model has none yet (before the
            first step); by default the states held.
        """
        categories = dict.fromkeys(CATEGORIES, 0)
        for key, value in self.stack.state_bytes().items():
            categories[key] += value
        if optimizer is not None and self.stack.optimizer is None:
            for layer in self.stack.layers:
                for param in (layer.master, layer.bias):
                    arrays = optimizer.init_state(param[:0]).arrays
                    categories["optimizer_states"] += len(arrays) * param.nbytes
        categories["temporaries"] = self._temporary_bytes()
        report = MemoryReport(categories, self.phi, self.nnz, self.precision.name, self.compute)
        sparsity = 1.0 - self.nnz / self.phi
        report.formulas = {name: formula_bytes(name, self.phi, sparsity) for name in FORMULAS}
        return report

    def _temporary_bytes(self) -> int:
        """The largest buffer one layer's step allocates and frees (upcast compute weights, a
        dense gradient, a fresh compressed gradient, the downcast copy of the update)."""
        arith = self.precision.arithmetic.itemsize
        storage = self.precision.storage.itemsize
        largest = 0
        for layer in self.stack.layers:
            n_dense = layer.shape[0] * layer.shape[1]
            buffers = [
                layer.nnz * storage if self.precision.mixed or self.compute == "dense" else 0
            ]
            if self.compute == "dense":
                buffers.append(n_dense * arith)  # the layer's dense gradient
                if self.precision.mixed:
                    buffers.append(n_dense * arith)  # upcast dense weights
            elif self.precision.mixed:
                buffers.append(layer.nnz * arith)  # upcast values / fresh gradient
            largest = max(largest, max(buffers))
        return largest
