"""The estimator API of the embedding models, one-process and data-parallel.

Inputs are windows of integer token ids ``X`` (B, c) and integer labels ``y`` (B,) (the next
word). ``fit`` / ``partial_fit`` return the model and append to ``loss_curve_`` (per epoch) and,
on request, ``batch_loss_curve_``; ``predict`` gives labels, ``predict_proba`` the softmax,
``score`` the accuracy, ``evaluate`` the mean cross-entropy and ``perplexity`` its exponential.
Subclasses implement :meth:`_train_batch` (one step on a checked batch), :meth:`_logits` and
:meth:`_interrupted` (what an interrupted ``fit`` leaves to do);
one that runs several steps at once also ``_steps_per_call`` and ``_train_batches`` of the
shared loop, :class:`~dasknn.model.step_loop.StepLoop`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from numbers import Integral
from typing import Self

import numpy as np

from dasknn.model.losses import softmax
from dasknn.model.step_loop import StepLoop
from dasknn.model.validation import (
    check_batch_size,
    check_epochs,
)
from dasknn.optim import Optimizer, resolve_optimizer

__all__ = ["WindowEstimator", "check_labels", "check_windows"]


def _integers(values, what: str) -> np.ndarray:
    array = np.asarray(values)
    if array.dtype.kind == "f":
        if not np.isfinite(array).all() or (array != np.round(array)).any():
            raise ValueError(f"{what} must be integers, got non-integral values")
    elif array.dtype.kind not in "iub":
        raise ValueError(f"{what} must be integers, got dtype {array.dtype}")
    if array.size and array.dtype.kind in "uf":  # beyond int64, the cast would wrap around
        bounds = np.iinfo(np.int64)
        for value in (array.min(), array.max()):
            if not bounds.min <= value <= bounds.max:
                raise ValueError(f"{what} must fit in int64, got {int(value)}")
    return array.astype(np.int64)


def check_windows(X, vocab_size: int, context: int) -> np.ndarray:
    """``X`` as a C-contiguous int64 array (B, context) of ids in ``[0, vocab_size)``.

    Raises
    ------
    ValueError
        If ``X`` is not 2-D with ``context`` columns, is empty, holds non-integers or ids out of
        range.
    """
    array = np.asarray(X)
    if array.ndim != 2 or array.shape[1] != context:
        raise ValueError(f"X must have shape (windows, {context}), got {array.shape}")
    if array.shape[0] == 0:
        raise ValueError("X has no windows (0 rows)")
    ids = np.ascontiguousarray(_integers(array, "token ids in X"))
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"token id {bad} in X is outside the vocabulary 0..{vocab_size - 1}")
    return ids


def check_labels(y, n_windows: int, n_classes: int) -> np.ndarray:
    """``y`` as an int64 array (n_windows,) of classes in ``[0, n_classes)``.

    Raises
    ------
    ValueError
        If ``y`` is not 1-D of ``n_windows`` entries, holds non-integers or classes out of range.
    """
    array = np.asarray(y)
    if array.ndim != 1 or array.shape[0] != n_windows:
        raise ValueError(
            f"y must have shape ({n_windows},) (one label per window), got {array.shape}"
        )
    labels = _integers(array, "labels y")
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        bad = int(labels.min()) if labels.min() < 0 else int(labels.max())
        raise ValueError(f"label {bad} in y is outside the classes 0..{n_classes - 1}")
    return labels


class WindowEstimator(StepLoop):
    """Training loop, loss curves and predictions of a model of token windows.

    A subclass sets ``spec`` (:class:`~dasknn.model.embedding_network.EmbeddingSpec`), starts
    ``loss_curve_`` and ``batch_loss_curve_`` as empty lists and implements :meth:`_train_batch`
    and :meth:`_logits`; for ``fit``'s checkpoints, the hooks of
    :class:`~dasknn.model.checkpoint.Checkpointed`.
    """

    loss_curve_: list[float]
    batch_loss_curve_: list[float]

    # ------------------------------------------------------------------ hooks
    def _train_batch(self, ids: np.ndarray, labels: np.ndarray, optimizer: Optimizer) -> float:
        """One step on checked windows and labels; the mean loss before the update."""
        raise NotImplementedError

    def _logits(self, ids: np.ndarray) -> np.ndarray:
        """The output ``z`` (B, n_classes) of checked windows."""
        raise NotImplementedError

    # ------------------------------------------------------------------ checks
    def _check_xy(self, X, y) -> tuple[np.ndarray, np.ndarray]:
        ids = check_windows(X, self.spec.vocab_size, self.spec.context)
        return ids, check_labels(y, ids.shape[0], self.spec.n_classes)

    # ------------------------------------------------------------------ training
    def train_step(self, X, y, *, lr: float | None = None, optimizer: Optimizer | None = None):
        """One step on the batch ``(X, y)`` (plain SGD with ``lr``, default 0.01, or
        ``optimizer``); returns the batch's mean loss before the update.

        Raises
        ------
        ValueError
            Before any update, on malformed windows, labels, ``lr`` or ``optimizer``.
        """
        ids, labels = self._check_xy(X, y)
        return self._train_batch(ids, labels, resolve_optimizer(lr, optimizer))

    def fit(
        self,
        X,
        y,
        *,
        batch_size: int = 64,
        epochs: int = 1,
        lr: float | None = None,
        optimizer: Optimizer | None = None,
        shuffle: bool = True,
        seed: int = 0,
        progress: bool = False,
        record_batches: bool = False,
        checkpoint: str | os.PathLike | None = None,
        checkpoint_every: int | None = None,
        resume: str | os.PathLike | None = None,
        on_epoch: Callable[[int, float], None] | None = None,
    ) -> Self:
        """Train on minibatches for ``epochs`` passes over ``(X, y)``, from the current values.

        Each epoch visits the windows in an order drawn from ``numpy.random.default_rng(seed)``
        (row order when ``shuffle`` is false), ``batch_size`` at a time (the last batch may be
        smaller), and appends the mean over windows of each batch's loss to ``loss_curve_``;
        ``progress`` shows a bar of each epoch's batches; ``on_epoch(epoch, loss)`` is called
        after each epoch with its index in the call and its mean loss.

        ``checkpoint`` (a directory, created if missing), ``checkpoint_every`` (batches, default
        one epoch) and ``resume`` (a checkpoint directory or file of a call with the same data
        and arguments; ``epochs`` may be larger) are those of
        :meth:`dasknn.model.SparseMLP.fit` (:mod:`dasknn.model.checkpoint`): a resumed call ends
        with the values of an uninterrupted one. The steps a model runs at once end where a
        checkpoint is due.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Before any update, on malformed data or arguments.
        NonFiniteLossError
            After the steps run in the same call as the first step whose loss is not finite
            (one step for the one-process model), naming that step.
        """
        ids, labels = self._check_xy(X, y)
        optimizer = resolve_optimizer(lr, optimizer)
        batch_size, epochs = check_batch_size(batch_size), check_epochs(epochs)
        if isinstance(seed, bool) or not isinstance(seed, Integral) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self._fit_loop(
            ids, labels, batch_size=batch_size, epochs=epochs, optimizer=optimizer,
            shuffle=shuffle, seed=seed, progress=progress, record_batches=record_batches,
            checkpoint=checkpoint, checkpoint_every=checkpoint_every, resume=resume,
            on_epoch=on_epoch,
        )  # fmt: skip
        return self

    def partial_fit(self, X, y, **kwargs) -> Self:
        """One epoch over ``(X, y)`` (the arguments of :meth:`fit` but ``epochs``)."""
        return self.fit(X, y, epochs=1, **kwargs)

    # ------------------------------------------------------------------ outputs
    def _blocks(self, X, batch_size: int):
        ids = check_windows(X, self.spec.vocab_size, self.spec.context)
        batch_size = check_batch_size(batch_size)
        for start in range(0, ids.shape[0], batch_size):
            yield self._logits(ids[start : start + batch_size])

    def decision_function(self, X, batch_size: int = 1024) -> np.ndarray:
        """The output logits ``z`` (B, n_classes)."""
        return np.concatenate(list(self._blocks(X, batch_size)), axis=0)

    def predict(self, X, batch_size: int = 1024) -> np.ndarray:
        """The most probable class of each window, int64 (B,)."""
        return np.concatenate([np.argmax(z, axis=1) for z in self._blocks(X, batch_size)])

    def predict_proba(self, X, batch_size: int = 1024) -> np.ndarray:
        """``softmax(z)`` (B, n_classes)."""
        return np.concatenate([softmax(z) for z in self._blocks(X, batch_size)], axis=0)

    def evaluate(self, X, y, batch_size: int = 1024) -> float:
        """Mean cross-entropy (nats) of the windows ``X`` with labels ``y``; no update."""
        ids, labels = self._check_xy(X, y)
        total, start = 0.0, 0
        for z in self._blocks(ids, batch_size):
            rows = labels[start : start + z.shape[0]]
            shifted = z - z.max(axis=1, keepdims=True)
            log_norm = np.log(np.exp(shifted).sum(axis=1))
            total += float(np.sum(log_norm - shifted[np.arange(len(rows)), rows]))
            start += z.shape[0]
        return total / ids.shape[0]

    def perplexity(self, X, y, batch_size: int = 1024) -> float:
        """``exp(evaluate(X, y))``."""
        return float(np.exp(self.evaluate(X, y, batch_size)))

    def score(self, X, y, batch_size: int = 1024) -> float:
        """Accuracy of :meth:`predict` against ``y``."""
        ids, labels = self._check_xy(X, y)
        return float(np.mean(self.predict(ids, batch_size) == labels))
