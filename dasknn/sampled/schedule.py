"""The learning-rate schedule of the sampled models: constant, then a linear fall to zero over
the last share of a horizon of steps; the scale multiplies ``lr`` only, so one optimizer state
serves every step (docs/sampled.md)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from dasknn.optim import Optimizer

__all__ = ["DecaySchedule", "lr_scale", "scaled_lr", "training_schedule"]


def lr_scale(step: int, horizon: int, decay: float) -> float:
    """The learning-rate factor of step ``step`` (0-based) of a schedule of ``horizon`` steps.

    Parameters
    ----------
    step : int
        Steps taken since the schedule began (>= 0).
    horizon : int
        Steps the schedule spans (>= 1).
    decay : float in [0, 1]
        Share of the horizon, at its end, over which the factor falls linearly towards 0.

    Returns
    -------
    float
        1 before the fall (always when ``decay`` is 0); ``(horizon - step) / (decay * horizon)``
        during it; 0 after the horizon.
    """
    if decay == 0:
        return 1.0
    span = decay * horizon
    left = horizon - step
    if left >= span:
        return 1.0
    return max(left, 0) / span


@dataclass(frozen=True)
class DecaySchedule:
    """A schedule of ``horizon`` steps that began at the model's step ``start``.

    Attributes
    ----------
    start : int
        The model's step count when the schedule began.
    horizon : int
        Steps the schedule spans.
    decay : float
        Share of the horizon over which the learning rate falls to zero (0: constant).
    """

    start: int
    horizon: int
    decay: float

    def scale(self, step: int) -> float:
        """The learning-rate factor of the model's step ``step``."""
        return lr_scale(step - self.start, self.horizon, self.decay)


def scaled_lr(optimizer: Optimizer, scale: float) -> Optimizer:
    """``optimizer`` with its learning rate times ``scale`` (itself at 1); its state belongs to
    the unscaled optimizer."""
    return optimizer if scale == 1.0 else replace(optimizer, lr=optimizer.lr * scale)


def training_schedule(
    decay: float, horizon: int | None, step: int, fit_steps: int | None
) -> DecaySchedule | None:
    """The schedule of a training call that begins at the model's step ``step``.

    Parameters
    ----------
    decay : float in [0, 1]
        The model's ``lr_decay`` (0: constant learning rate, no schedule).
    horizon : int or None
        The model's ``decay_horizon`` (its steps ``0 .. horizon - 1``); ``None``: the call's own.
    step : int
        The model's step count at the start of the call.
    fit_steps : int or None
        A ``fit``'s steps (epochs times batches); ``None`` for ``partial_fit`` and
        ``train_step`` (constant unless ``horizon`` is given).

    Returns
    -------
    DecaySchedule or None
        ``None`` when the learning rate stays constant.
    """
    if decay == 0:
        return None
    if horizon is not None:
        return DecaySchedule(0, horizon, decay)
    if fit_steps is None:
        return None
    return DecaySchedule(step, fit_steps, decay)
