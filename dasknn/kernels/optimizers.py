"""Numba kernels of the optimizers' updates on the values array of one chunk.

Parameters are 1-D (a weight chunk's nonzeros, or a bias) and every state array (momentum, moments)
has their length, updated in place. Formulas of ``torch.optim`` (``SGD``, ``Adam``, ``AdamW``); the
scalars come from :mod:`dasknn.optim` in the parameters' dtype. Single-threaded, ``nogil``.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["adam_update", "adam_update_rows", "sgd_update"]


@njit(cache=True, nogil=True)
def sgd_update(
    param, grad, buf, lr, momentum, one_minus_dampening, weight_decay, nesterov, first
):  # pragma: no cover - compiled
    """SGD with optional momentum, Nesterov momentum and (coupled) weight decay, in place.

    For every entry ``i``: ``g = grad + weight_decay * param``; with ``momentum != 0``,
    ``buf = g`` on the first step and ``buf = momentum * buf + (1 - dampening) * g`` after it, and
    ``g = g + momentum * buf`` (Nesterov) or ``g = buf``; finally ``param -= lr * g``.

    Parameters
    ----------
    param, grad : 1-D arrays of one length
        Parameters (updated in place) and their gradient.
    buf : 1-D array
        Momentum buffer (updated in place); unused (may be empty) when ``momentum == 0``.
    lr, momentum, one_minus_dampening, weight_decay : scalars of the parameters' dtype
    nesterov, first : bool
        Nesterov momentum; whether this is the buffer's first step.
    """
    for i in range(param.shape[0]):
        g = grad[i]
        if weight_decay != 0:
            g = g + weight_decay * param[i]
        if momentum != 0:
            if first:
                b = g
            else:
                b = momentum * buf[i] + one_minus_dampening * g
            buf[i] = b
            if nesterov:
                g = g + momentum * b
            else:
                g = b
        param[i] -= lr * g


@njit(cache=True, nogil=True)
def adam_update(
    param,
    grad,
    exp_avg,
    exp_avg_sq,
    beta1,
    beta2,
    one_minus_beta1,
    one_minus_beta2,
    eps,
    weight_decay,
    decay_factor,
    step_size,
    bias_correction2_sqrt,
):  # pragma: no cover - compiled
    """One Adam / AdamW step in place.

    For every entry ``i``: ``param *= decay_factor`` (AdamW's decoupled decay ``1 - lr * wd``;
    ``1`` for Adam), ``g = grad + weight_decay * param`` (Adam's coupled decay; ``0`` for AdamW),
    ``m = beta1 * m + (1 - beta1) * g``, ``v = beta2 * v + (1 - beta2) * g * g`` and
    ``param -= step_size * m / (sqrt(v) / bias_correction2_sqrt + eps)``, where
    ``step_size = lr / (1 - beta1**t)`` and ``bias_correction2_sqrt = sqrt(1 - beta2**t)``.

    Parameters
    ----------
    param, grad, exp_avg, exp_avg_sq : 1-D arrays of one length
        Parameters, gradient, first and second moments (all but ``grad`` updated in place).
    beta1, beta2, one_minus_beta1, one_minus_beta2, eps : scalars
    weight_decay, decay_factor, step_size, bias_correction2_sqrt : scalars
    """
    for i in range(param.shape[0]):
        p = param[i] * decay_factor
        g = grad[i]
        if weight_decay != 0:
            g = g + weight_decay * p
        m = beta1 * exp_avg[i] + one_minus_beta1 * g
        v = beta2 * exp_avg_sq[i] + one_minus_beta2 * g * g
        exp_avg[i] = m
        exp_avg_sq[i] = v
        param[i] = p - step_size * m / (np.sqrt(v) / bias_correction2_sqrt + eps)


@njit(cache=True, nogil=True, parallel=True)
def adam_update_rows(
    param,
    grad,
    exp_avg,
    exp_avg_sq,
    rows,
    beta1,
    beta2,
    one_minus_beta1,
    one_minus_beta2,
    eps,
    weight_decay,
    decay_factor,
    step_size,
    bias_correction2_sqrt,
):  # pragma: no cover - compiled
    """:func:`adam_update` on the listed rows of 2-D arrays only (a sparse row update).

    The rows ``rows`` (distinct) are updated in parallel; the others are left as they are.

    Parameters
    ----------
    param, grad, exp_avg, exp_avg_sq : 2-D arrays of one shape
    rows : 1-D integer array of distinct row numbers
    beta1, beta2, one_minus_beta1, one_minus_beta2, eps : scalars
    weight_decay, decay_factor, step_size, bias_correction2_sqrt : scalars
    """
    for r in prange(rows.shape[0]):
        i = rows[r]
        adam_update(
            param[i], grad[i], exp_avg[i], exp_avg_sq[i], beta1, beta2, one_minus_beta1,
            one_minus_beta2, eps, weight_decay, decay_factor, step_size, bias_correction2_sqrt,
        )  # fmt: skip
