"""Activation functions of the sparse MLP, with their derivatives from the pre-activation.

Every activation maps a pre-activation ``z`` to ``a = f(z)`` elementwise and gives ``f'(z)``; both
return arrays of the dtype of ``z``, new ones or the ``out`` given (a C-contiguous array of the
shape and dtype of ``z``, which the training steps reuse from step to step). Where ``f`` has a
kink (ReLU at 0, the clipped ReLU at 0 and at its cap) the derivative taken is 0, the usual
subgradient convention. The training paths pass the activations they already hold to
:meth:`Activation.derivative`, so the sigmoid's derivative costs a multiplication instead of a
second exponential.
"""

from __future__ import annotations

import numpy as np

from dasknn.kernels.activations import sigmoid

__all__ = [
    "Activation",
    "ACTIVATIONS",
    "ClippedReLU",
    "Identity",
    "ReLU",
    "Sigmoid",
    "get_activation",
]


class Activation:
    """An elementwise activation ``a = f(z)`` with its derivative ``f'(z)``.

    Attributes
    ----------
    name : str
        Registered name (see :func:`get_activation`).
    """

    name: str = ""

    def forward(self, z: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Return ``f(z)``: written into ``out`` when given, else a new array of the dtype of
        ``z``."""
        raise NotImplementedError

    def derivative(
        self, z: np.ndarray, a: np.ndarray | None = None, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Return ``f'(z)``: written into ``out`` when given, else a new array of the dtype of
        ``z``.

        ``a``, when given, must be ``f(z)``; activations whose derivative is cheaper from it use it.
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Sigmoid(Activation):
    """Logistic function ``1 / (1 + exp(-z))``; derivative ``a (1 - a)``."""

    name = "sigmoid"

    def forward(self, z: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            out = np.empty(z.shape, dtype=z.dtype)
        sigmoid(np.ravel(z), out.reshape(-1))
        return out

    def derivative(
        self, z: np.ndarray, a: np.ndarray | None = None, out: np.ndarray | None = None
    ) -> np.ndarray:
        s = self.forward(z) if a is None else a
        if out is None:
            return s * (1 - s)
        np.subtract(1, s, out=out)
        out *= s
        return out


class ReLU(Activation):
    """``max(z, 0)``; derivative 1 where ``z > 0``, else 0."""

    name = "relu"

    def forward(self, z: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        return np.maximum(z, 0, out=out)

    def derivative(
        self, z: np.ndarray, a: np.ndarray | None = None, out: np.ndarray | None = None
    ) -> np.ndarray:
        if out is None:
            return (z > 0).astype(z.dtype)
        return np.greater(z, 0, out=out)


class ClippedReLU(Activation):
    """The Graph Challenge activation ``min(max(z, 0), 32)``; derivative 1 on ``0 < z < 32``."""

    name = "clipped_relu"
    cap = 32.0

    def forward(self, z: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        return np.clip(z, 0, self.cap, out=out)

    def derivative(
        self, z: np.ndarray, a: np.ndarray | None = None, out: np.ndarray | None = None
    ) -> np.ndarray:
        inside = (z > 0) & (z < self.cap)
        if out is None:
            return inside.astype(z.dtype)
        np.copyto(out, inside)
        return out


class Identity(Activation):
    """``f(z) = z``; derivative 1."""

    name = "identity"

    def forward(self, z: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            return np.array(z, copy=True)
        np.copyto(out, z)
        return out

    def derivative(
        self, z: np.ndarray, a: np.ndarray | None = None, out: np.ndarray | None = None
    ) -> np.ndarray:
        if out is None:
            return np.ones_like(z)
        out.fill(1)
        return out


ACTIVATIONS: dict[str, type[Activation]] = {
    cls.name: cls for cls in (Sigmoid, ReLU, ClippedReLU, Identity)
}


def get_activation(name: str | Activation) -> Activation:
    """Return the activation registered under ``name`` (an :class:`Activation` passes through).

    Raises
    ------
    ValueError
        If ``name`` is not one of ``"sigmoid"``, ``"relu"``, ``"clipped_relu"``, ``"identity"``.
    """
    if isinstance(name, Activation):
        return name
    try:
        return ACTIVATIONS[name]()
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}"
        ) from None
