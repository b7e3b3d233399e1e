"""The estimator API shared by :class:`~dasknn.model.SparseMLP` and
:class:`~dasknn.model_parallel.DistributedSparseMLP`, after the scikit-learn / dask-ml conventions.

``fit`` and ``partial_fit`` return the model and append to ``loss_curve_`` (per epoch) and, on
request, to ``batch_loss_curve_`` (per batch); ``predict`` returns class labels for softmax models
and the output activations otherwise; ``predict_proba`` exists on softmax models only; ``score``
is higher-is-better (accuracy, or the negative mean loss). Both models run the same code here and
differ only in three hooks: where the training data lives, how a batch is trained, and how the
output layer of a row block is computed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import numpy as np
from tqdm.auto import tqdm

from dasknn.exceptions import NonFiniteLossError
from dasknn.model.checkpoint import Checkpointed, Progress
from dasknn.model.losses import Loss
from dasknn.model.validation import (
    check_batch_size,
    check_epochs,
    check_inputs,
    check_targets,
    epoch_batches,
)
from dasknn.optim import Optimizer, resolve_optimizer

__all__ = ["SparseEstimator"]

OutputBlocks = Iterable[tuple[np.ndarray, np.ndarray]]


@dataclass
class _Run:
    """The fixed arguments of one ``fit`` call, and its newest checkpoint."""

    x: np.ndarray
    y: np.ndarray
    epochs: int
    batch_size: int
    shuffle: bool
    seed: int
    progress: bool
    optimizer: Optimizer
    record_batches: bool
    on_epoch: Callable[[int, float], None] | None = None
    directory: Path | None = None
    every: int = 1
    saved: Path | None = None


class SparseEstimator(Checkpointed):
    """Training loop, loss curves, predictions and scores of a sparse MLP.

    A subclass sets ``loss`` and ``dtype``, provides ``n_inputs`` and ``n_outputs``, starts
    ``loss_curve_`` and ``batch_loss_curve_`` as empty lists, and implements
    :meth:`_training_data`, :meth:`_train_batches`, :meth:`_output_blocks` and ``_interrupted()``
    (what a ``fit`` call interrupted by ``KeyboardInterrupt`` leaves to do).

    Attributes
    ----------
    loss_curve_ : list of float
        One entry per epoch trained by :meth:`fit` or :meth:`partial_fit` on this object (a
        :meth:`partial_fit` call is one epoch): the mean over the epoch's samples of the loss of
        each batch before its update. ``train_step`` does not add to it.
    batch_loss_curve_ : list of float
        The loss of every batch (before its update) of the calls made with
        ``record_batches=True``, in order; empty if there were none.
    """

    loss: Loss
    dtype: np.dtype
    loss_curve_: list[float]
    batch_loss_curve_: list[float]

    n_inputs: int
    n_outputs: int

    # ------------------------------------------------------------------ hooks
    def _training_data(self, x: np.ndarray, y: np.ndarray) -> AbstractContextManager[Any]:
        """The checked training data where :meth:`_train_batches` reads it, for one call."""
        raise NotImplementedError

    def _train_batches(
        self, data: Any, batches: list[np.ndarray], optimizer: Optimizer
    ) -> Iterator[float]:
        """Train on the rows ``batches[i]`` of ``data`` in order; yield each batch's loss. When
        the generator is exhausted no step is running."""
        raise NotImplementedError

    def _output_blocks(self, x: np.ndarray, batch_size: int, **options) -> OutputBlocks:
        """Row-block ``(z_L, a_L)`` of the checked rows ``x``, ``batch_size`` rows at a time, in
        order; the model's inference ``options`` are checked before anything runs."""
        raise NotImplementedError

    # ------------------------------------------------------------------ checks
    def _check_xy(self, X, Y) -> tuple[np.ndarray, np.ndarray]:
        x = check_inputs(X, self.n_inputs, self.dtype)
        y = check_targets(Y, x.shape[0], self.n_outputs, self.loss, self.dtype)
        return x, y

    # ------------------------------------------------------------------ training
    def fit(
        self,
        X,
        Y,
        *,
        batch_size: int = 64,
        epochs: int = 1,
        lr: float | None = None,
        shuffle: bool = True,
        seed: int = 0,
        progress: bool = True,
        optimizer: Optimizer | None = None,
        record_batches: bool = False,
        on_epoch: Callable[[int, float], None] | None = None,
        checkpoint: str | os.PathLike | None = None,
        checkpoint_every: int | None = None,
        resume: str | os.PathLike | None = None,
    ) -> Self:
        """Train on minibatches for ``epochs`` passes over ``(X, Y)``, from the current weights.

        Each epoch visits the samples in an order drawn from ``numpy.random.default_rng(seed)``
        (in row order when ``shuffle`` is false) in batches of ``batch_size`` rows; the last batch
        of an epoch may be smaller. Plain SGD with learning rate ``lr`` (default 0.01) unless
        ``optimizer`` is given; the optimizer state is kept while later calls use an equal
        optimizer. The single-process and the distributed model take the same steps.

        Parameters
        ----------
        X : array-like (B, n_0)
        Y : array-like (B, n_L), or integer labels (B,) for softmax cross-entropy
        batch_size, epochs : int
            Rows per batch (>= 1) and passes over the data (>= 0).
        lr : float, optional
            Learning rate of plain SGD; not together with ``optimizer``.
        shuffle : bool
            Draw a permutation per epoch (true) or keep the row order.
        seed : int
            Seed of the permutations.
        progress : bool
            Show a tqdm bar per epoch on stderr (it stays when the epoch ends).
        optimizer : dasknn.optim.Optimizer, optional
            ``SGD(...)``, ``Adam(...)`` or ``AdamW(...)``.
        record_batches : bool
            Also append every batch's loss to ``batch_loss_curve_``.
        on_epoch : callable, optional
            Called after every epoch with its index (from 0) and its mean loss, such as to
            print it or to score held-out data.
        checkpoint : path, optional
            Directory (created if missing) where a checkpoint is written atomically at the start,
            every ``checkpoint_every`` batches and at the end (the older ones are removed). A
            distributed model that loses a worker restores the last checkpoint on the workers
            left and trains on from there.
        checkpoint_every : int, optional
            Batches between checkpoints (default: one epoch).
        resume : path, optional
            A checkpoint directory (its newest checkpoint) or file written by a ``fit`` call with
            the same data and arguments (``epochs`` may be larger): its weights, optimizer state
            and loss curves replace the model's and training goes on from the batch it had
            reached, to the weights of an uninterrupted run.

        Returns
        -------
        self
            The trained model; each epoch's mean loss is appended to ``loss_curve_``.

        Raises
        ------
        ValueError
            Before any update (and, distributed, before anything is scheduled) if ``X``, ``Y``,
            ``lr``, ``optimizer``, ``batch_size``, ``epochs``, ``seed`` or ``checkpoint_every``
            are malformed, or ``resume`` names a checkpoint of another model, other data or
            other arguments.
        NonFiniteLossError
            At the end of the batches up to the next checkpoint (all of them without one) if
            one of them had a loss that is not finite, naming the first such step of the call.
        """
        x, y = self._check_xy(X, Y)
        optimizer = resolve_optimizer(lr, optimizer)
        batch_size, epochs = check_batch_size(batch_size), check_epochs(epochs)
        np.random.default_rng(seed)  # a bad seed is an error before anything else
        state, directory, every = self._open_checkpoints(
            x, y, batch_size=batch_size, epochs=epochs, shuffle=shuffle, seed=seed,
            optimizer=optimizer, checkpoint=checkpoint, checkpoint_every=checkpoint_every,
            resume=resume,
        )  # fmt: skip
        if epochs == 0:
            return self
        run = _Run(x, y, epochs, batch_size, shuffle, seed, progress, optimizer, record_batches,
                   on_epoch)
        run.directory, run.every = directory, every
        if directory is not None:
            self._write_checkpoint(run, state)
        self._recovering(lambda at: self._run_epochs(run, at), state, lambda: run.saved)
        return self

    def _run_epochs(self, run: _Run, state: Progress) -> None:
        """Train from ``state`` to the end of the call, writing the checkpoints on the way."""
        rng = np.random.default_rng(run.seed)
        with self._training_data(run.x, run.y) as data:
            for epoch in range(run.epochs):
                batches = epoch_batches(run.x.shape[0], run.batch_size, rng, run.shuffle)
                if epoch >= state.epoch:
                    self._run_epoch(run, state, data, batches)

    def _run_epoch(self, run: _Run, state: Progress, data, batches: list[np.ndarray]) -> None:
        """The rest of the epoch ``state.epoch``: segments of batches that end where a checkpoint
        is due (the distributed model has no step in flight between two segments)."""
        with tqdm(
            total=len(batches),
            initial=state.batch,
            desc=f"epoch {state.epoch + 1}/{run.epochs}",
            disable=not run.progress,
            leave=True,
        ) as bar:
            epoch = state.epoch
            while state.epoch == epoch:
                stop = len(batches)
                if run.directory is not None:
                    due = run.every - state.batches_done % run.every
                    stop = min(stop, state.batch + due)
                segment = batches[state.batch : stop]
                losses = []
                for idx, loss in zip(
                    segment, self._train_batches(data, segment, run.optimizer), strict=True
                ):
                    losses.append(loss)
                    state.epoch_loss += loss * len(idx)
                    if run.record_batches:
                        self.batch_loss_curve_.append(loss)
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss:.4g}", refresh=False)
                NonFiniteLossError.check(losses, state.batches_done + 1)
                state.batch, state.batches_done = stop, state.batches_done + len(segment)
                if stop == len(batches):
                    self.loss_curve_.append(state.epoch_loss / run.x.shape[0])
                    if run.on_epoch is not None:
                        run.on_epoch(state.epoch, self.loss_curve_[-1])
                    state.epoch, state.batch, state.epoch_loss = state.epoch + 1, 0, 0.0
                due = state.batches_done % run.every == 0 or state.epoch == run.epochs
                if run.directory is not None and due:
                    self._write_checkpoint(run, state)

    def _write_checkpoint(self, run: _Run, state: Progress) -> None:
        run.saved = self._save_checkpoint(run.directory, state)

    def partial_fit(
        self,
        X,
        Y,
        *,
        batch_size: int = 64,
        lr: float | None = None,
        shuffle: bool = True,
        seed: int = 0,
        progress: bool = False,
        optimizer: Optimizer | None = None,
        record_batches: bool = False,
    ) -> Self:
        """One epoch over the rows ``(X, Y)``, for data that arrives in pieces.

        The same steps as ``fit(X, Y, epochs=1, ...)`` with the same arguments (only the
        progress bar is off by default): batches of ``batch_size`` rows in an order drawn from
        ``seed`` (row order if ``shuffle`` is false). The optimizer state is kept from one call
        to the next while the calls use an equal optimizer (``lr`` alone always gives an equal
        plain SGD). One entry, the epoch's mean batch loss, is appended to ``loss_curve_``.

        Returns
        -------
        self
        """
        return self.fit(
            X,
            Y,
            batch_size=batch_size,
            epochs=1,
            lr=lr,
            shuffle=shuffle,
            seed=seed,
            progress=progress,
            optimizer=optimizer,
            record_batches=record_batches,
        )

    # ------------------------------------------------------------------ outputs
    @property
    def classes_(self) -> np.ndarray:
        """The class labels ``0 .. n_L - 1`` of a softmax model (``AttributeError`` otherwise)."""
        self._require_classifier("classes_")
        return np.arange(self.n_outputs)

    @property
    def predict_proba(self):
        """Class probabilities ``softmax(z_L)``, shape (B, n_L): softmax models only.

        ``model.predict_proba(X, batch_size=1024)`` (the distributed model also takes
        ``in_flight``, as its ``predict``). On a model whose loss is not
        ``"softmax_cross_entropy"`` the attribute does not exist: reading it raises
        ``AttributeError``, so ``hasattr(model, "predict_proba")`` tells whether it has one.
        """
        self._require_classifier("predict_proba")
        return self._predict_proba

    def _require_classifier(self, name: str) -> None:
        if not self.loss.classification:
            raise AttributeError(
                f"{name} is only defined for softmax models (loss='softmax_cross_entropy'); "
                f"this model's loss is {self.loss.name!r}: use predict for its outputs"
            )

    def predict(self, X, batch_size: int = 1024) -> np.ndarray:
        """Predictions for ``X`` (B, n_0).

        Parameters
        ----------
        X : array-like (B, n_0)
        batch_size : int
            Rows run through the network at a time (bounds the memory).

        Returns
        -------
        numpy.ndarray
            For softmax cross-entropy, the class labels (B,) (int64): the class of the largest
            output ``z_L`` of each row, the most probable one (probabilities:
            :attr:`predict_proba`). Otherwise the output activations ``a_L`` (B, n_L).
        """
        return self._predictions(self._input_blocks(X, batch_size))

    def _predict_proba(self, X, batch_size: int = 1024) -> np.ndarray:
        return self._probabilities(self._input_blocks(X, batch_size))

    def evaluate(self, X, Y, batch_size: int = 1024) -> float:
        """Mean loss over ``(X, Y)`` (``Y`` as in :meth:`fit`), without training."""
        return self._mean_loss(*self._labelled_blocks(X, Y, batch_size))

    def score(self, X, Y, batch_size: int = 1024) -> float:
        """How well the model does on ``(X, Y)``; higher is better, as scikit-learn expects.

        Parameters
        ----------
        X : array-like (B, n_0)
        Y : array-like (B, n_L), or integer labels (B,) for softmax cross-entropy
            As in :meth:`fit`; for a softmax model the label of a target row is its largest
            entry.
        batch_size : int
            Rows run through the network at a time.

        Returns
        -------
        float
            For softmax cross-entropy, the accuracy: the fraction of samples whose
            :meth:`predict` label is the target label. Otherwise the **negative** mean loss,
            ``-evaluate(X, Y)`` (for ``"mse"``, ``-1/(2B) sum_b ||a_L,b - y_b||^2``), so 0 is a
            perfect fit.
        """
        return self._score(*self._labelled_blocks(X, Y, batch_size))

    def _input_blocks(self, X, batch_size: int, **options) -> OutputBlocks:
        """The output blocks of the rows ``X`` (``X``, ``batch_size`` and the inference
        ``options`` checked before anything runs)."""
        x = check_inputs(X, self.n_inputs, self.dtype)
        return self._output_blocks(x, check_batch_size(batch_size), **options)

    def _labelled_blocks(self, X, Y, batch_size: int, **options) -> tuple[OutputBlocks, np.ndarray]:
        """The output blocks of the rows ``X`` and the checked targets ``Y`` (as in :meth:`fit`),
        everything checked before anything runs."""
        x, y = self._check_xy(X, Y)
        return self._output_blocks(x, check_batch_size(batch_size), **options), y

    def _predictions(self, blocks: OutputBlocks) -> np.ndarray:
        """Class labels (the largest logit of each row) for a softmax model, else ``a_L``."""
        if self.loss.classification:
            return np.concatenate([np.argmax(z, axis=1) for z, _ in blocks])
        return np.concatenate([self.loss.prediction(z, a) for z, a in blocks], axis=0)

    def _probabilities(self, blocks: OutputBlocks) -> np.ndarray:
        return np.concatenate([self.loss.prediction(z, a) for z, a in blocks], axis=0)

    def _mean_loss(self, blocks: OutputBlocks, y: np.ndarray) -> float:
        """Mean loss over the samples; the blocks cover the rows of ``y`` in order."""
        total, start = 0.0, 0
        for z, a in blocks:
            stop = start + z.shape[0]
            total += self.loss.value(z, a, y[start:stop]) * z.shape[0]
            start = stop
        return total / y.shape[0]

    def _score(self, blocks: OutputBlocks, y: np.ndarray) -> float:
        """Accuracy for a softmax model (the label of a target row is its largest entry), else
        the negative mean loss."""
        if self.loss.classification:
            return float(np.mean(self._predictions(blocks) == np.argmax(y, axis=1)))
        return -self._mean_loss(blocks, y)


class InProcessEstimator(SparseEstimator):
    """A :class:`SparseEstimator` that runs in this process.

    A subclass provides ``_forward(xt) -> [(z_k, a_k)]`` (the feature-major pre-activations and
    activations of the layers ``k = 1..L`` for the feature-major batch ``xt``, ``(n_0, B)``) and
    ``_train_batch(x, y, optimizer) -> float`` (one step on checked rows, returning the loss).
    """

    def _interrupted(self) -> None:
        """A ``fit`` call was interrupted (``KeyboardInterrupt``): a step runs whole in the
        process, so nothing is to be done."""


    def _training_data(self, x: np.ndarray, y: np.ndarray) -> nullcontext:
        return nullcontext((x, y))

    def _train_batches(
        self, data: tuple[np.ndarray, np.ndarray], batches: list[np.ndarray], optimizer: Optimizer
    ) -> Iterator[float]:
        x, y = data
        for idx in batches:
            yield self._train_batch(x[idx], y[idx], optimizer)

    def _output(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Row-block ``(z_L, a_L)`` (transposed views) of the row-block batch ``x``."""
        z_last, a_last = self._forward(np.ascontiguousarray(x.T))[-1]
        return z_last.T, a_last.T

    def _output_blocks(
        self, x: np.ndarray, batch_size: int
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Row-block ``(z_L, a_L)`` of ``x``, ``batch_size`` rows at a time."""
        for start in range(0, x.shape[0], batch_size):
            yield self._output(x[start : start + batch_size])

    def forward(self, X) -> list[tuple[np.ndarray, np.ndarray]]:
        """Run the batch ``X`` (B, n_0) through the network.

        Returns
        -------
        list of (z, a)
            Pre-activations ``z_k`` and activations ``a_k`` (both (B, n_k)) for ``k = 1..L``:
            transposed views of the feature-major arrays the computation works on.
        """
        xt = np.ascontiguousarray(check_inputs(X, self.n_inputs, self.dtype).T)
        return [(z.T, a.T) for z, a in self._forward(xt)]

    def train_step(
        self, X, Y, *, lr: float | None = None, optimizer: Optimizer | None = None
    ) -> float:
        """One training step on the batch ``(X, Y)``, updating weights and biases in place.

        Parameters
        ----------
        X : array-like (B, n_0)
        Y : array-like (B, n_L), or integer labels (B,) for softmax cross-entropy
        lr : float, optional
            Learning rate of plain SGD (default 0.01); not together with ``optimizer``.
        optimizer : dasknn.optim.Optimizer, optional
            ``SGD(...)``, ``Adam(...)`` or ``AdamW(...)``; its state is kept by the model.

        Returns
        -------
        float
            The loss of the batch before the update.

        Raises
        ------
        ValueError
            For malformed ``X``, ``Y``, ``lr`` or ``optimizer`` (before any update).
        FloatingPointError
            From a :class:`~dasknn.model.CompressedMLP` whose loss is not finite, naming the step
            and the first layer whose outputs are not.
        """
        x, y = self._check_xy(X, Y)
        return self._train_batch(x, y, resolve_optimizer(lr, optimizer))
