"""The errors dasknn raises beside Python's own (``ValueError`` for bad input, ``OSError`` for
files), in one module; the package root re-exports them.

This module imports nothing of dasknn, so every layer of dasknn (the kernels' callers, the
one-process models, the runtime, the distributed models) raises the same classes.
"""

from __future__ import annotations

import math

__all__ = [
    "ModelClosedError",
    "ModelFailedError",
    "NonFiniteLossError",
    "StepTimeoutError",
    "WorkerLostError",
]


class WorkerLostError(RuntimeError):
    """A worker a computation depends on left the cluster (or is leaving it); the message names
    the worker and what it held for the model (its role)."""


class StepTimeoutError(RuntimeError):
    """A step made no progress within the model's ``step_timeout``; the message names the
    workers it waits for, their role and their state (silent, paused at the memory limit,
    running)."""


class ModelClosedError(RuntimeError):
    """A distributed model was used after :meth:`close` (or after its ``with`` block)."""


class ModelFailedError(RuntimeError):
    """A distributed model was used after a step failed part-way (a timeout, a lost worker, an
    interruption), when its workers' values may mix two steps; the message says why and how to
    go on (a checkpoint to resume from, or a saved copy)."""


class NonFiniteLossError(FloatingPointError):
    """A step's loss is not finite: names the step and, where the model locates it, the first
    layer (1-based, in the whole network) whose outputs are not finite.

    Attributes
    ----------
    step : int
    value : float
        The loss.
    layer : int or None
    """

    def __init__(self, step: int, value: float, layer: int | None = None) -> None:
        where = ""
        if layer is not None:
            where = f"; layer {layer} is the first whose outputs are not finite"
        super().__init__(
            f"step {step}: the loss is {value}{where} (lower the learning rate or check the inputs)"
        )
        self.step, self.value, self.layer = step, value, layer

    def __reduce__(self):
        return (type(self), (self.step, self.value, self.layer))

    @classmethod
    def check(cls, losses, first_step: int) -> None:
        """Raise the error for the first of ``losses`` (the losses of consecutive steps, the
        first numbered ``first_step``) that is not finite; nothing if all are."""
        for i, loss in enumerate(losses):
            if not math.isfinite(loss):
                raise cls(first_step + i, loss)
