"""Losses of the sparse MLP: their value and their gradient with respect to ``z_L``.

Both losses are means over the batch of ``B`` samples (rows), so :meth:`Loss.output_delta` returns
``dJ/dz_L`` already divided by ``B``: the exact gradient of the mean loss.

- ``"mse"``: ``J = 1/(2B) sum_b ||a_L,b - y_b||^2`` with ``a_L = f_out(z_L)``, hence
  ``dJ/dz_L = (a_L - y) * f_out'(z_L) / B``.
- ``"softmax_cross_entropy"``: the output layer is linear (``f_out`` must be the identity) and the
  softmax is part of the loss: ``J = -1/B sum_b sum_j y_bj log softmax(z_L,b)_j``, evaluated with
  the log-sum-exp shift, hence ``dJ/dz_L = (softmax(z_L) * sum_j y_bj - y) / B`` (``softmax - y``
  for one-hot or probability rows).
"""

from __future__ import annotations

import numpy as np

from dasknn.model.activations import Activation, get_activation

__all__ = [
    "Loss",
    "LOSSES",
    "MeanSquaredError",
    "SoftmaxCrossEntropy",
    "get_loss",
    "network_functions",
    "softmax",
]


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax of ``z`` (B, n), shifted by the row maximum so nothing overflows."""
    e = np.exp(z - z.max(axis=1, keepdims=True))
    e /= e.sum(axis=1, keepdims=True)
    return e


class Loss:
    """A batch-mean loss on the output layer.

    Attributes
    ----------
    name : str
        Registered name (see :func:`get_loss`).
    default_output_activation : str or None
        Output activation the model uses when none is given (``None``: the hidden activation).
    classification : bool
        Whether the outputs are class scores: the model's ``predict`` then returns labels,
        ``predict_proba`` the class probabilities and ``score`` the accuracy.
    """

    name: str = ""
    default_output_activation: str | None = None
    classification: bool = False

    def value(self, z_last: np.ndarray, a_last: np.ndarray, y: np.ndarray) -> float:
        """Loss of the batch, from the output pre-activations, activations and targets."""
        raise NotImplementedError

    def output_delta(
        self, z_last: np.ndarray, a_last: np.ndarray, y: np.ndarray, out_activation: Activation
    ) -> np.ndarray:
        """``dJ/dz_L`` of shape (B, n_L), divided by ``B``, as a new C-contiguous array."""
        raise NotImplementedError

    def value_t(self, zt: np.ndarray, at: np.ndarray, yt: np.ndarray) -> float:
        """:meth:`value` from feature-major ``(n_L, B)`` pre-activations, activations and
        targets."""
        return self.value(zt.T, at.T, yt.T)

    def output_delta_t(
        self, zt: np.ndarray, at: np.ndarray, yt: np.ndarray, out_activation: Activation
    ) -> np.ndarray:
        """:meth:`output_delta` from and in the feature-major layout: ``(dJ/dz_L).T``, shape
        ``(n_L, B)``, divided by ``B``, as a new C-contiguous array."""
        delta = self.output_delta(zt.T, at.T, yt.T, out_activation)
        return np.ascontiguousarray(delta.T)

    def prediction(self, z_last: np.ndarray, a_last: np.ndarray) -> np.ndarray:
        """The output layer as a new array: ``a_L`` for ``"mse"``, the class probabilities for
        softmax cross-entropy."""
        raise NotImplementedError

    def check_output_activation(self, out_activation: Activation) -> None:
        """Raise ``ValueError`` if the loss cannot be used with this output activation."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class MeanSquaredError(Loss):
    """``J = 1/(2B) sum_b ||a_L,b - y_b||^2``; predictions are the output activations ``a_L``."""

    name = "mse"

    def value(self, z_last: np.ndarray, a_last: np.ndarray, y: np.ndarray) -> float:
        diff = a_last - y
        return float(np.vdot(diff, diff)) / (2 * a_last.shape[0])

    def output_delta(
        self, z_last: np.ndarray, a_last: np.ndarray, y: np.ndarray, out_activation: Activation
    ) -> np.ndarray:
        delta = (a_last - y) * out_activation.derivative(z_last, a_last)
        delta /= a_last.shape[0]
        return np.ascontiguousarray(delta, dtype=a_last.dtype)

    def value_t(self, zt: np.ndarray, at: np.ndarray, yt: np.ndarray) -> float:
        diff = at - yt  # elementwise in the activations' layout: no transposing copy
        return float(np.vdot(diff, diff)) / (2 * at.shape[1])

    def output_delta_t(
        self, zt: np.ndarray, at: np.ndarray, yt: np.ndarray, out_activation: Activation
    ) -> np.ndarray:
        delta = at - yt
        delta *= out_activation.derivative(zt, at)
        delta /= at.shape[1]
        return np.ascontiguousarray(delta, dtype=at.dtype)

    def prediction(self, z_last: np.ndarray, a_last: np.ndarray) -> np.ndarray:
        return np.array(a_last, copy=True)


class SoftmaxCrossEntropy(Loss):
    """Mean softmax cross-entropy on a linear output layer; predictions are class probabilities."""

    name = "softmax_cross_entropy"
    default_output_activation = "identity"
    classification = True

    def value(self, z_last: np.ndarray, a_last: np.ndarray, y: np.ndarray) -> float:
        shifted = z_last - z_last.max(axis=1, keepdims=True)
        log_prob = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        return -float(np.vdot(y, log_prob)) / z_last.shape[0]

    def output_delta(
        self, z_last: np.ndarray, a_last: np.ndarray, y: np.ndarray, out_activation: Activation
    ) -> np.ndarray:
        self.check_output_activation(out_activation)
        delta = softmax(z_last) * y.sum(axis=1, keepdims=True) - y
        delta /= z_last.shape[0]
        return np.ascontiguousarray(delta, dtype=z_last.dtype)

    def prediction(self, z_last: np.ndarray, a_last: np.ndarray) -> np.ndarray:
        return softmax(z_last)

    def check_output_activation(self, out_activation: Activation) -> None:
        if out_activation.name != "identity":
            raise ValueError(
                "softmax_cross_entropy applies the softmax itself and needs a linear output layer "
                f"(output_activation='identity'), got {out_activation.name!r}"
            )


LOSSES: dict[str, type[Loss]] = {cls.name: cls for cls in (MeanSquaredError, SoftmaxCrossEntropy)}


def get_loss(name: str | Loss) -> Loss:
    """Return the loss registered under ``name`` (a :class:`Loss` passes through).

    Raises
    ------
    ValueError
        If ``name`` is not ``"mse"`` or ``"softmax_cross_entropy"``.
    """
    if isinstance(name, Loss):
        return name
    try:
        return LOSSES[name]()
    except (KeyError, TypeError):
        raise ValueError(f"unknown loss {name!r}; choose one of {sorted(LOSSES)}") from None


def network_functions(
    activation: str | Activation,
    output_activation: str | Activation | None,
    loss: str | Loss,
) -> tuple[Activation, Activation, Loss]:
    """The hidden activation, output activation and loss a model is built with.

    ``output_activation=None`` takes the loss's default (the identity for softmax cross-entropy)
    or else the hidden activation.

    Raises
    ------
    ValueError
        For an unknown activation or loss, or an output activation the loss cannot use.
    """
    hidden = get_activation(activation)
    loss = get_loss(loss)
    if output_activation is None:
        output_activation = loss.default_output_activation or hidden
    output = get_activation(output_activation)
    loss.check_output_activation(output)
    return hidden, output, loss
