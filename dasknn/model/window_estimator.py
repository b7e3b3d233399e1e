"""The estimator API of the embedding models, one-process and data-parallel.

Inputs are windows of integer token ids ``X`` (B, c) and integer labels ``y`` (B,) (the next
word). ``fit`` / ``partial_fit`` return the model and append to ``loss_curve_`` (per epoch) and,
on request, ``batch_loss_curve_``; ``predict`` gives labels, ``predict_proba`` the softmax,
``score`` the accuracy, ``evaluate`` the mean cross-entropy and ``perplexity`` its exponential.
Subclasses implement :meth:`_train_batch` (one step on a checked batch), :meth:`_logits` and
:meth:`_interrupted` (what an interrupted ``fit`` leaves to do);
one that runs several steps at once also :meth:`_steps_per_call` and :meth:`_train_batches`.
"""

from __future__ import annotations

import os
from numbers import Integral
from pathlib import Path
from typing import Self

import numpy as np
from tqdm import tqdm

from dasknn.exceptions import NonFiniteLossError
from dasknn.model.checkpoint import Checkpointed, Progress
from dasknn.model.losses import softmax
from dasknn.model.validation import (
    check_batch_size,
    check_epochs,
    epoch_batches,
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


class WindowEstimator(Checkpointed):
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

    def _steps_per_call(self) -> int:
        """How many consecutive steps :meth:`fit` hands :meth:`_train_batches` at once."""
        return 1

    def _train_batches(
        self,
        batches: list[tuple[np.ndarray, np.ndarray]],
        after: tuple[np.ndarray, np.ndarray] | None,
        optimizer: Optimizer,
    ) -> list[float]:
        """Consecutive steps on checked batches ``[(ids, labels), ...]``; ``after`` is the batch
        of the step after the last one (``None`` if there is none; a model that fetches a step's
        values ahead uses it). Returns each step's mean loss before its update."""
        return [self._train_batch(ids, labels, optimizer) for ids, labels in batches]

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
    ) -> Self:
        """Train on minibatches for ``epochs`` passes over ``(X, y)``, from the current values.

        Each epoch visits the windows in an order drawn from ``numpy.random.default_rng(seed)``
        (row order when ``shuffle`` is false), ``batch_size`` at a time (the last batch may be
        smaller), and appends the mean over windows of each batch's loss to ``loss_curve_``;
        ``progress`` shows a bar of each epoch's batches.

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
        state, directory, every = self._open_checkpoints(
            ids, labels, batch_size=batch_size, epochs=epochs, shuffle=shuffle, seed=seed,
            optimizer=optimizer, checkpoint=checkpoint, checkpoint_every=checkpoint_every,
            resume=resume,
        )  # fmt: skip
        saved: list[Path] = []
        if directory is not None and epochs:
            saved.append(self._save_checkpoint(directory, state))

        def run(at: Progress) -> None:
            rng = np.random.default_rng(seed)
            # each epoch's order is drawn one epoch ahead (the same draws, in the same order),
            # so the batch after every step is known before the step
            orders = (epoch_batches(ids.shape[0], batch_size, rng, shuffle) for _ in range(epochs))
            self._run_windows(
                ids, labels, orders, epochs, optimizer, progress, record_batches,
                at, directory, every, saved,
            )  # fmt: skip

        self._recovering(run, state, lambda: saved[-1] if saved else None)
        return self

    def _run_windows(
        self, ids, labels, orders, epochs, optimizer, progress: bool, record_batches: bool,
        state: Progress, directory: Path | None, every: int, saved: list[Path],
    ) -> None:  # fmt: skip
        """The epochs of a :meth:`fit` call, whose batch orders ``orders`` yields, from the
        position ``state``; a checkpoint goes to ``directory`` every ``every`` batches (its file
        appended to ``saved``)."""
        current = next(orders, None)
        per_call = self._steps_per_call()
        for epoch in range(epochs):
            following = next(orders, None)
            if epoch < state.epoch:
                current = following
                continue
            bar = tqdm(
                total=len(current),
                initial=state.batch,
                desc=f"epoch {epoch + 1}/{epochs}",
                disable=not progress,
            )
            while state.epoch == epoch:
                start = state.batch
                stop = min(start + per_call, len(current))
                if directory is not None:
                    stop = min(stop, start + every - state.batches_done % every)
                group = current[start:stop]
                if stop < len(current):
                    after = current[stop]
                else:
                    after = following[0] if following else None
                if directory is not None and (state.batches_done + len(group)) % every == 0:
                    after = None  # a checkpoint comes between: nothing is fetched ahead
                losses = self._train_batches(
                    [(ids[rows], labels[rows]) for rows in group],
                    None if after is None else (ids[after], labels[after]),
                    optimizer,
                )
                for rows, loss in zip(group, losses, strict=True):
                    state.epoch_loss += loss * len(rows)
                    if record_batches:
                        self.batch_loss_curve_.append(loss)
                NonFiniteLossError.check(losses, self.n_steps_ - len(losses) + 1)
                bar.update(len(group))
                state.batch, state.batches_done = stop, state.batches_done + len(group)
                if stop == len(current):
                    self.loss_curve_.append(state.epoch_loss / ids.shape[0])
                    state.epoch, state.batch, state.epoch_loss = epoch + 1, 0, 0.0
                due = state.batches_done % every == 0 or state.epoch == epochs
                if directory is not None and due:
                    saved.append(self._save_checkpoint(directory, state))
            bar.close()
            current = following

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
