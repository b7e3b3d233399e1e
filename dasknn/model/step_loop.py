"""The ``fit`` loop of the models that run one optimizer step a batch, several at a time where
they can: :class:`~dasknn.model.window_estimator.WindowEstimator` (the embedding models) and the
LSH-sampled models (:class:`~dasknn.sampled.SampledMLP`,
:class:`~dasknn.sampled_parallel.DistributedSampledMLP`).

One loop serves them all, with the checkpoints, the resume and the recovery of
:class:`~dasknn.model.checkpoint.Checkpointed`: a model checks its data and arguments, then calls
:meth:`StepLoop._fit_loop`; its hooks say how an epoch's batches are drawn, how a batch is cut
from the data and how consecutive steps are run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from dasknn.exceptions import NonFiniteLossError
from dasknn.model.checkpoint import Checkpointed, Progress
from dasknn.model.validation import epoch_batches
from dasknn.optim import Optimizer

__all__ = ["StepLoop"]


class StepLoop(Checkpointed):
    """Epochs of minibatches, checkpoints every so many batches, resume and recovery.

    A subclass holds ``loss_curve_``, ``batch_loss_curve_`` and ``n_steps_`` (steps taken),
    implements :meth:`_train_batches` (or ``_train_batch`` with the default one) and the hooks of
    :class:`~dasknn.model.checkpoint.Checkpointed`; it may override :meth:`_steps_per_call`,
    :meth:`_batch`, :meth:`_epoch_orders` and :meth:`_epoch_ended`.
    """

    loss_curve_: list[float]
    batch_loss_curve_: list[float]
    n_steps_: int

    # ------------------------------------------------------------------ hooks
    def _train_batch(self, *batch) -> float:
        """One step on a checked batch (what :meth:`_batch` returns); its mean loss before the
        update."""
        raise NotImplementedError

    def _steps_per_call(self) -> int:
        """How many consecutive steps :meth:`_fit_loop` hands :meth:`_train_batches` at once
        (asked before each call)."""
        return 1

    def _train_batches(self, batches: list, after, optimizer: Optimizer) -> list[float]:
        """Consecutive steps on checked batches (each what :meth:`_batch` returns); ``after`` is
        the batch of the step after the last one (``None`` if there is none, or a checkpoint
        comes between; a model that fetches a step's values ahead uses it). Returns each step's
        mean loss before its update."""
        return [self._train_batch(*batch, optimizer) for batch in batches]

    def _batch(self, x, y, rows: np.ndarray) -> Any:
        """The batch of the rows ``rows`` of the checked data ``x``, ``y``."""
        return x[rows], y[rows]

    def _epoch_orders(
        self, n: int, batch_size: int, shuffle: bool, seed: int, epochs: int, state: Progress
    ) -> Iterator[list[np.ndarray]]:
        """The row numbers of every batch of each of the call's ``epochs`` epochs, in order,
        for a call that stands at ``state`` (its checkpoint restored): by default permutations
        drawn one after the other from ``numpy.random.default_rng(seed)``
        (:func:`~dasknn.model.validation.epoch_batches`)."""
        rng = np.random.default_rng(seed)
        return (epoch_batches(n, batch_size, rng, shuffle) for _ in range(epochs))

    def _epoch_ended(self) -> None:
        """An epoch of a ``fit`` call has ended (its mean loss is on ``loss_curve_``)."""

    # ------------------------------------------------------------------ the loop
    def _fit_loop(
        self, x, y, *, batch_size: int, epochs: int, optimizer: Optimizer, shuffle: bool,
        seed: int, progress: bool, record_batches: bool,
        checkpoint: str | os.PathLike | None, checkpoint_every: int | None,
        resume: str | os.PathLike | None,
        start: Callable[[Progress], None] | None = None,
        on_epoch: Callable[[int, float], None] | None = None,
        extra_call: dict | None = None,
    ) -> None:  # fmt: skip
        """Train ``epochs`` epochs of the checked data ``x``, ``y`` (``x.shape[0]`` rows) from
        the current values, or from the ``resume`` checkpoint, writing a checkpoint to the
        directory ``checkpoint`` at the start, every ``checkpoint_every`` batches and at the end
        (:meth:`~dasknn.model.checkpoint.Checkpointed._open_checkpoints`); after an error that
        :meth:`_recoverable` accepts, the last checkpoint is restored and training goes on.

        ``start(progress)``, if given, is called each time training starts or starts again
        from a position (after the checkpoint is restored); ``on_epoch(epoch, loss)`` after
        each epoch with its index in the call and its mean loss. ``extra_call``: more of the
        call that a resume must repeat (JSON values, in the checkpoints' progress).

        Raises
        ------
        ValueError
            As :meth:`~dasknn.model.checkpoint.Checkpointed._open_checkpoints`, before any step.
        NonFiniteLossError
            After the steps run in the same call of :meth:`_train_batches` as the first step
            whose loss is not finite, naming that step.
        """
        state, directory, every = self._open_checkpoints(
            x, y, batch_size=batch_size, epochs=epochs, shuffle=shuffle, seed=seed,
            optimizer=optimizer, checkpoint=checkpoint, checkpoint_every=checkpoint_every,
            resume=resume, extra_call=extra_call,
        )  # fmt: skip
        saved: list[Path] = []
        if directory is not None and epochs:
            saved.append(self._save_checkpoint(directory, state))

        def run(at: Progress) -> None:
            if start is not None:
                start(at)
            # each epoch's order is drawn one epoch ahead (the same draws, in the same order),
            # so the batch after every step is known before the step
            orders = self._epoch_orders(x.shape[0], batch_size, shuffle, seed, epochs, at)
            self._loop_epochs(
                x, y, orders, epochs, optimizer, progress, record_batches,
                at, directory, every, saved, on_epoch,
            )  # fmt: skip

        self._recovering(run, state, lambda: saved[-1] if saved else None)

    def _loop_epochs(
        self, x, y, orders, epochs, optimizer, progress: bool, record_batches: bool,
        state: Progress, directory: Path | None, every: int, saved: list[Path], on_epoch,
    ) -> None:  # fmt: skip
        """The epochs of a :meth:`_fit_loop` call, whose batch orders ``orders`` yields, from the
        position ``state``; a checkpoint goes to ``directory`` every ``every`` batches (its file
        appended to ``saved``)."""
        current = next(orders, None)
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
                begin = state.batch
                stop = min(begin + self._steps_per_call(), len(current))
                if directory is not None:
                    stop = min(stop, begin + every - state.batches_done % every)
                group = current[begin:stop]
                if stop < len(current):
                    after = current[stop]
                else:
                    after = following[0] if following else None
                if directory is not None and (state.batches_done + len(group)) % every == 0:
                    after = None  # a checkpoint comes between: nothing is fetched ahead
                losses = self._train_batches(
                    [self._batch(x, y, rows) for rows in group],
                    None if after is None else self._batch(x, y, after),
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
                    self.loss_curve_.append(state.epoch_loss / x.shape[0])
                    self._epoch_ended()
                    if on_epoch is not None:
                        on_epoch(epoch, self.loss_curve_[-1])
                    state.epoch, state.batch, state.epoch_loss = epoch + 1, 0, 0.0
                due = state.batches_done % every == 0 or state.epoch == epochs
                if directory is not None and due:
                    saved.append(self._save_checkpoint(directory, state))
            bar.close()
            current = following
