"""Held-out data of ``dasknn train``: a fraction of the samples set aside, or a file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["read_validation_file", "split_validation"]


def split_validation(
    x: np.ndarray, y: np.ndarray, fraction: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_held, y_held)``: the last ``round(fraction * n)`` samples held out.

    Raises
    ------
    ValueError
        If ``fraction`` is not in (0, 1) or leaves no sample on either side.
    """
    if not 0 < fraction < 1:
        raise ValueError(f"--validation-fraction must be between 0 and 1, got {fraction}")
    held = round(fraction * x.shape[0])
    if not 0 < held < x.shape[0]:
        raise ValueError(
            f"--validation-fraction {fraction} of {x.shape[0]} samples leaves "
            f"{x.shape[0] - held} to train on and {held} held out; both need at least one"
        )
    cut = x.shape[0] - held
    return x[:cut], y[:cut], x[cut:], y[cut:]


def read_validation_file(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``X`` and ``y`` of an ``.npz`` file (read without pickle): inputs ``(n, n_0)`` and labels
    ``(n,)`` or targets ``(n, n_L)``; the model checks the shapes.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If it is not an ``.npz`` file with arrays ``X`` and ``y`` of the same length.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--validation-data {str(path)!r} does not exist")
    try:
        with np.load(path, allow_pickle=False) as data:
            x, y = data["X"], data["y"]
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(
            f"--validation-data {str(path)!r} must be an .npz file with arrays X and y ({exc})"
        ) from None
    if x.ndim != 2 or y.ndim not in (1, 2) or x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(
            f"--validation-data {str(path)!r}: X must be (n, inputs) and y (n,) or (n, outputs) "
            f"with n >= 1, got {x.shape} and {y.shape}"
        )
    return x, y
