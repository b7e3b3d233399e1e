"""Storage precisions of compressed training and fp16's dynamic loss scaling.

``precision`` names the dtype the 16-bit states are stored in and the dtype of the arithmetic:

=========  ==================  ===========  ==================================================
name       storage (16-bit     arithmetic   notes
           weights, gradients)
=========  ==================  ===========  ==================================================
``fp64``   float64             float64      one precision, for checks against float64 references
``fp32``   float32             float32      one precision: no second copy of weights or gradients
``bf16``   bfloat16            float32      needs ``ml_dtypes``
``fp16``   float16             float32      dynamic loss scaling, steps with inf/NaN skipped
=========  ==================  ===========  ==================================================

With a 16-bit storage the master weights, optimizer states and the gradients' copy the optimizer
reads are float32 (mixed precision); activations stay in the arithmetic dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["PRECISIONS", "LossScaler", "Precision", "get_precision"]

PRECISIONS = ("fp64", "fp32", "bf16", "fp16")


@dataclass(frozen=True)
class Precision:
    """A training precision.

    Attributes
    ----------
    name : str
        One of :data:`PRECISIONS`.
    storage : numpy.dtype
        Dtype of the compute weights and of the stored gradients.
    arithmetic : numpy.dtype
        Dtype of the master weights, optimizer states, activations and every product.
    """

    name: str
    storage: np.dtype
    arithmetic: np.dtype

    @property
    def mixed(self) -> bool:
        """Whether storage and arithmetic differ (a second, 16-bit copy of some states)."""
        return self.storage != self.arithmetic

    @property
    def loss_scaling(self) -> bool:
        """Whether gradients are computed from a scaled loss (fp16 only)."""
        return self.name == "fp16"


def _bfloat16() -> np.dtype:
    try:
        import ml_dtypes
    except ImportError:
        raise ImportError(
            'precision="bf16" needs the ml_dtypes package: python3 -m pip install ml_dtypes'
        ) from None
    return np.dtype(ml_dtypes.bfloat16)


def get_precision(name: str | Precision) -> Precision:
    """The :class:`Precision` called ``name``.

    Raises
    ------
    ValueError
        For a name outside :data:`PRECISIONS`.
    ImportError
        For ``"bf16"`` without ``ml_dtypes`` (with the install command).
    """
    if isinstance(name, Precision):
        return name
    if name == "fp64":
        return Precision("fp64", np.dtype(np.float64), np.dtype(np.float64))
    if name == "fp32":
        return Precision("fp32", np.dtype(np.float32), np.dtype(np.float32))
    if name == "bf16":
        return Precision("bf16", _bfloat16(), np.dtype(np.float32))
    if name == "fp16":
        return Precision("fp16", np.dtype(np.float16), np.dtype(np.float32))
    raise ValueError(f"unknown precision {name!r}; expected one of {PRECISIONS}")


class LossScaler:
    """Dynamic loss scaling for float16 gradients, as AxoNN (and apex / ``torch.amp``) do.

    The output delta is multiplied by ``scale``; a step whose gradients hold inf or NaN is
    skipped and the scale halved; ``growth_interval`` clean steps in a row double it.

    Parameters
    ----------
    scale : float
        Initial scale (``2**16``).
    growth_interval : int
        Overflow-free steps before the scale doubles.
    """

    def __init__(self, scale: float = 2.0**16, growth_interval: int = 1000) -> None:
        if not (np.isfinite(scale) and scale > 0):
            raise ValueError(f"the loss scale must be finite and > 0, got {scale}")
        if int(growth_interval) < 1:
            raise ValueError(f"growth_interval must be >= 1, got {growth_interval}")
        self.scale = float(scale)
        self.growth_interval = int(growth_interval)
        self.good_steps = 0
        self.skipped_steps = 0

    def update(self, finite: bool) -> bool:
        """Record one step's outcome; returns whether the step may be applied."""
        if not finite:
            self.scale /= 2.0
            self.good_steps = 0
            self.skipped_steps += 1
            return False
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.scale *= 2.0
            self.good_steps = 0
        return True
