"""Dense fully connected networks in one process: the unpruned parent of SAMO's pruned models,
and the dense-with-mask baseline (pruned weights kept as zeros in dense arrays).

:class:`DenseMLP` follows the conventions of :class:`~dasknn.model.SparseMLP` (weights
``(n_in, n_out)``, row-block batches, ``Y_next = f(Y @ W + b)``, the same losses, activations,
optimizers and estimator API), multiplying with BLAS. With ``masks`` the gradient of a pruned
weight is zeroed before the optimizer step, so pruned weights stay 0: the way PyTorch's pruning
utilities train a pruned model. :meth:`DenseMLP.prune` gives the compressed model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dasknn.model.activations import Activation
from dasknn.model.compressed_mlp import CompressedMLP
from dasknn.model.estimator import InProcessEstimator
from dasknn.model.layer_shapes import LayerShapes
from dasknn.model.losses import Loss, network_functions
from dasknn.model.validation import check_float_dtype
from dasknn.optim import Optimizer, OptimizerSlots

__all__ = ["DenseMLP", "LENET_300_100", "MLP_1024_3"]

#: LeNet-300-100 on 28 x 28 inputs (266,200 weights).
LENET_300_100 = (784, 300, 100, 10)
#: The 784-1024-1024-1024-10 network of the memory and speed benchmarks (2.9 M weights).
MLP_1024_3 = (784, 1024, 1024, 1024, 10)


class DenseMLP(LayerShapes, InProcessEstimator):
    """A dense multilayer perceptron, optionally with fixed pruning masks.

    Parameters
    ----------
    weights : sequence of 2-D arrays
        ``weights[k]`` of shape ``(n_k, n_{k+1})``, copied.
    biases : sequence of 1-D arrays, optional
    activation, output_activation, loss
        As in :class:`~dasknn.model.SparseMLP` (defaults: ReLU, softmax cross-entropy).
    dtype : float32 or float64
    masks : sequence of boolean arrays, optional
        ``True`` where a weight is kept; pruned weights are set to 0 and their gradients zeroed.
    """

    def __init__(
        self,
        weights: Sequence,
        biases: Sequence | None = None,
        activation: str | Activation = "relu",
        output_activation: str | Activation | None = None,
        loss: str | Loss = "softmax_cross_entropy",
        dtype=np.float32,
        masks: Sequence | None = None,
    ) -> None:
        self.dtype = check_float_dtype(dtype)
        self.activation, self.output_activation, self.loss = network_functions(
            activation, output_activation, loss
        )
        self.weights = [np.array(w, dtype=self.dtype, copy=True, order="C") for w in weights]
        if not self.weights:
            raise ValueError("a network needs at least one weight matrix")
        for k, w in enumerate(self.weights):
            if w.ndim != 2 or not np.isfinite(w).all():
                raise ValueError(f"weights[{k}] must be a finite 2-D array, got {w.shape}")
            if k and w.shape[0] != self.weights[k - 1].shape[1]:
                raise ValueError(f"weights[{k}] does not chain with weights[{k - 1}]")
        if biases is None:
            biases = [np.zeros(w.shape[1]) for w in self.weights]
        self.biases = [np.array(b, dtype=self.dtype, copy=True) for b in biases]
        if len(self.biases) != len(self.weights) or any(
            b.shape != (w.shape[1],) for b, w in zip(self.biases, self.weights, strict=False)
        ):
            raise ValueError("biases must be one vector of n_out values per layer")
        self.masks = None
        if masks is not None:
            if len(masks) != len(self.weights):
                raise ValueError(f"got {len(masks)} masks for {len(self.weights)} layers")
            self.masks = []
            for k, (m, w) in enumerate(zip(masks, self.weights, strict=True)):
                m = np.asarray(m)
                if m.shape != w.shape or m.dtype != np.bool_:
                    raise ValueError(f"masks[{k}] must be boolean of shape {w.shape}")
                w[~m] = 0
                self.masks.append(m.astype(self.dtype))
        self._slots = OptimizerSlots()
        self.loss_curve_: list[float] = []
        self.batch_loss_curve_: list[float] = []

    @classmethod
    def init(
        cls, layer_sizes: Sequence[int], seed: int = 0, dtype=np.float32, **kwargs
    ) -> DenseMLP:
        """A network of ``layer_sizes`` with He-uniform weights (``sqrt(6 / n_in)``) and zero
        biases drawn from ``numpy.random.default_rng(seed)``."""
        sizes = [int(s) for s in layer_sizes]
        if len(sizes) < 2 or min(sizes) < 1:
            raise ValueError(f"layer_sizes must be >= 2 positive sizes, got {layer_sizes}")
        rng = np.random.default_rng(seed)
        weights = [
            rng.uniform(-1, 1, size=(n_in, n_out)) * np.sqrt(6.0 / n_in)
            for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True)
        ]
        return cls(weights, dtype=dtype, **kwargs)

    @property
    def layer_shapes(self) -> list[tuple[int, int]]:
        """``(n_in, n_out)`` of every layer."""
        return [w.shape for w in self.weights]

    def _forward(self, xt: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        layers, at = [], xt
        for k, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            zt = w.T @ at
            zt += b[:, None]
            activation = self.output_activation if k == self.n_layers - 1 else self.activation
            at = activation.forward(zt)
            layers.append((zt, at))
        return layers

    @property
    def optimizer(self) -> Optimizer | None:
        """The optimizer of the last training step (``None`` before the first)."""
        return self._slots.optimizer

    def _train_batch(self, x: np.ndarray, y: np.ndarray, optimizer: Optimizer) -> float:
        xt = np.ascontiguousarray(x.T)
        layers = self._forward(xt)
        z_last, a_last = layers[-1][0].T, layers[-1][1].T
        value = self.loss.value(z_last, a_last, y)
        deltat = np.ascontiguousarray(
            self.loss.output_delta(z_last, a_last, y, self.output_activation).T
        )
        for k in range(self.n_layers - 1, -1, -1):
            w = self.weights[k]
            a_prev = xt if k == 0 else layers[k - 1][1]
            grad_w = a_prev @ deltat.T
            if self.masks is not None:
                grad_w *= self.masks[k]
            grad_b = deltat.sum(axis=1)
            if k > 0:
                deltat = (w @ deltat) * self.activation.derivative(*layers[k - 1])
            self._slots.update(optimizer, ("weights", k), w.reshape(-1), grad_w.reshape(-1))
            self._slots.update(optimizer, ("bias", k), self.biases[k], grad_b)
        return value

    def prune(
        self, masks: Sequence, precision: str = "fp32", compute: str = "sparse", **kwargs
    ) -> CompressedMLP:
        """The pruned model on compressed states: the weights the ``masks`` keep, the biases,
        activations and loss of this model (no optimizer state)."""
        return CompressedMLP(
            self.weights,
            masks,
            self.biases,
            activation=self.activation,
            output_activation=self.output_activation,
            loss=self.loss,
            precision=precision,
            compute=compute,
            **kwargs,
        )
