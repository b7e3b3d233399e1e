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

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Self

import numpy as np
from tqdm.auto import tqdm

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


class SparseEstimator:
    """Training loop, loss curves, predictions and scores of a sparse MLP.

    A subclass sets ``loss`` and ``dtype``, provides ``n_inputs`` and ``n_outputs``, starts
    ``loss_curve_`` and ``batch_loss_curve_`` as empty lists, and implements
    :meth:`_training_data`, :meth:`_train_batches` and an ``_output_blocks`` generator.

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
        """Train on the rows ``batches[i]`` of ``data`` in order; yield each batch's loss."""
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
        batch_size: int = 64,
        epochs: int = 1,
        lr: float | None = None,
        shuffle: bool = True,
        seed: int = 0,
        progress: bool = True,
        optimizer: Optimizer | None = None,
        record_batches: bool = False,
        on_epoch: Callable[[int, float], None] | None = None,
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

        Returns
        -------
        self
            The trained model; each epoch's mean loss is appended to ``loss_curve_``.

        Raises
        ------
        ValueError
            Before any update (and, distributed, before anything is scheduled) if ``X``, ``Y``,
            ``lr``, ``optimizer``, ``batch_size``, ``epochs`` or ``seed`` are malformed.
        """
        x, y = self._check_xy(X, Y)
        optimizer = resolve_optimizer(lr, optimizer)
        batch_size, epochs = check_batch_size(batch_size), check_epochs(epochs)
        rng = np.random.default_rng(seed)
        if epochs == 0:
            return self
        n = x.shape[0]
        with self._training_data(x, y) as data:
            for epoch in range(epochs):
                batches = epoch_batches(n, batch_size, rng, shuffle)
                total = 0.0
                with tqdm(
                    total=len(batches),
                    desc=f"epoch {epoch + 1}/{epochs}",
                    disable=not progress,
                    leave=True,
                ) as bar:
                    losses = self._train_batches(data, batches, optimizer)
                    for idx, loss in zip(batches, losses, strict=True):
                        total += loss * len(idx)
                        if record_batches:
                            self.batch_loss_curve_.append(loss)
                        bar.update(1)
                        bar.set_postfix(loss=f"{loss:.4g}", refresh=False)
                self.loss_curve_.append(total / n)
                if on_epoch is not None:
                    on_epoch(epoch, self.loss_curve_[-1])
        return self

    def partial_fit(
        self,
        X,
        Y,
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
