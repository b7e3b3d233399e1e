"""``EmbeddingMLP``: a one-process next-word model with a sparse embedding and dense layers.

The arithmetic is in :mod:`dasknn.model.embedding_network`; this class owns the values and the
optimizer state and follows the estimator conventions of :mod:`dasknn.model.window_estimator`.
``dasknn.data_parallel.data_parallel(model, client, ...)`` trains a copy of it on a cluster.
"""

from __future__ import annotations

from numbers import Integral

import numpy as np

from dasknn.model.activations import get_activation
from dasknn.model.embedding_network import (
    COMBINES,
    EmbeddingSpec,
    apply_dense,
    apply_rows,
    batch_gradients,
    batch_logits,
    unique_rows,
)
from dasknn.model.validation import check_float_dtype
from dasknn.model.window_estimator import WindowEstimator
from dasknn.optim import Optimizer, OptimizerSlots

__all__ = ["EmbeddingMLP"]


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


class EmbeddingMLP(WindowEstimator):
    """Embedding (V x d, the sparse variable) -> dense hidden layers -> softmax over classes.

    Parameters
    ----------
    vocab_size : int
        Rows ``V`` of the embedding.
    context : int
        Token ids per window ``c``.
    embed_dim : int
        Width ``d`` of an embedding row.
    hidden : sequence of int
        Widths of the dense hidden layers (may be empty).
    n_classes : int, optional
        Output classes (default ``vocab_size``: next-word prediction).
    combine : {"concat", "sum", "mean"}
        How the ``c`` rows of a window form the first layer's input.
    activation : str
        Hidden activation (``"relu"``, ``"sigmoid"``, ...).
    dtype : numpy dtype
        ``float32`` or ``float64``.
    seed : int
        Seed of the initial values: embedding ``N(0, 0.1^2)``, layers uniform in
        ``+-sqrt(6 / (fan_in + fan_out))`` (Glorot), biases 0.

    Attributes
    ----------
    embedding : numpy.ndarray (V, d)
    weights, biases : lists of numpy.ndarray
        The dense layers, hidden ones first, shapes ``(n_in, n_out)`` and ``(n_out,)``.
    optimizer : Optimizer or None
        The optimizer of the last step; its state is kept while later steps use an equal one.
    """

    def __init__(
        self,
        vocab_size: int,
        context: int,
        embed_dim: int = 32,
        hidden=(64,),
        n_classes: int | None = None,
        combine: str = "concat",
        activation: str = "relu",
        dtype=np.float32,
        seed: int = 0,
    ) -> None:
        if combine not in COMBINES:
            raise ValueError(f"combine must be one of {COMBINES}, got {combine!r}")
        get_activation(activation)
        dtype = check_float_dtype(dtype)
        self.spec = EmbeddingSpec(
            vocab_size=_positive("vocab_size", vocab_size),
            context=_positive("context", context),
            embed_dim=_positive("embed_dim", embed_dim),
            hidden=tuple(_positive("hidden width", h) for h in hidden),
            n_classes=_positive("n_classes", vocab_size if n_classes is None else n_classes),
            combine=combine,
            activation=activation,
            dtype=dtype.name,
        )
        rng = np.random.default_rng(seed)
        self.embedding = (0.1 * rng.standard_normal((vocab_size, embed_dim))).astype(dtype)
        self.weights: list[np.ndarray] = []
        self.biases: list[np.ndarray] = []
        sizes = self.spec.layer_sizes
        for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True):
            bound = np.sqrt(6.0 / (n_in + n_out))
            self.weights.append(rng.uniform(-bound, bound, (n_in, n_out)).astype(dtype))
            self.biases.append(np.zeros(n_out, dtype=dtype))
        self._slots = OptimizerSlots()
        self.loss_curve_: list[float] = []
        self.batch_loss_curve_: list[float] = []

    @property
    def optimizer(self) -> Optimizer | None:
        """The optimizer of the last step (``None`` before the first)."""
        return self._slots.optimizer

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.spec.dtype)

    def dense_variables(self) -> list[np.ndarray]:
        """The dense variables in the order of ``spec.dense_names()`` (views, not copies)."""
        out = []
        for w, b in zip(self.weights, self.biases, strict=True):
            out += [w, b]
        return out

    def variables(self) -> dict[str, np.ndarray]:
        """Every variable by name: ``"embedding"`` and the dense ones (views)."""
        return {
            "embedding": self.embedding,
            **dict(zip(self.spec.dense_names(), self.dense_variables(), strict=True)),
        }

    @classmethod
    def _from_values(
        cls,
        spec: EmbeddingSpec,
        embedding: np.ndarray,
        weights: list[np.ndarray],
        biases: list[np.ndarray],
    ) -> EmbeddingMLP:
        """A model of ``spec`` holding these arrays (not copied; shapes and dtype those of
        ``spec``), with no optimizer state and empty curves."""
        model = object.__new__(cls)
        model.spec = spec
        model.embedding, model.weights, model.biases = embedding, weights, biases
        model._slots = OptimizerSlots()
        model.loss_curve_, model.batch_loss_curve_ = [], []
        return model

    def copy(self) -> EmbeddingMLP:
        """A copy with the same values (no optimizer state, empty curves)."""
        return self._from_values(
            self.spec,
            self.embedding.copy(),
            [w.copy() for w in self.weights],
            [b.copy() for b in self.biases],
        )

    def __repr__(self) -> str:
        s = self.spec
        return (
            f"EmbeddingMLP(vocab_size={s.vocab_size}, context={s.context}, "
            f"embed_dim={s.embed_dim}, hidden={s.hidden}, n_classes={s.n_classes}, "
            f"combine={s.combine!r}, dtype={s.dtype})"
        )

    # ------------------------------------------------------------------ hooks
    def _train_batch(self, ids: np.ndarray, labels: np.ndarray, optimizer: Optimizer) -> float:
        unique, inverse = unique_rows(ids)
        loss_sum, grads, grad_rows = batch_gradients(
            self.spec,
            self.embedding[unique],
            inverse,
            labels,
            self.weights,
            self.biases,
            ids.shape[0],
        )
        state = self._slots.state(optimizer, "embedding", self.embedding)
        apply_rows(optimizer, self.embedding, state, unique, grad_rows)
        for name, param, grad in zip(
            self.spec.dense_names(), self.dense_variables(), grads, strict=True
        ):
            state = self._slots.state(optimizer, name, param.reshape(-1))
            apply_dense(optimizer, param, grad, state)
        return loss_sum / ids.shape[0]

    def _logits(self, ids: np.ndarray) -> np.ndarray:
        unique, inverse = unique_rows(ids)
        return batch_logits(self.spec, self.embedding[unique], inverse, self.weights, self.biases)
