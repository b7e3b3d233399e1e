"""Sampled softmax: the candidate sampler and the loss over a batch's labels and the candidates.

A full softmax over ``C`` classes gives every class's output weights a gradient each step. A
sampled softmax (Jean et al. 2015; TensorFlow's ``tf.nn.sampled_softmax_loss``) computes the
logits of each window's label and of ``S`` candidate classes drawn once per step from a fixed
distribution ``q``, each corrected by the log of its expected count ``log(S q(k))`` (the logQ
correction), and drops a candidate that equals the window's label (an accidental hit). Only the
labels' and the candidates' output weights get a gradient, so the output layer is a row-sparse
variable: the table ``[W_out^T | b_out]`` of shape ``(C, H + 1)``, one row per class.

Samplers (candidates drawn with replacement, as ``unique=False`` in TensorFlow):

- ``"log-uniform"``: ``q(k) = log((k + 2) / (k + 1)) / log(C + 1)`` (Zipfian; classes ordered
  by falling frequency), drawn by the inverse CDF ``floor(exp(u log(C + 1))) - 1``;
- ``"uniform"``: ``q(k) = 1 / C``.

The draw of step ``t`` comes from ``numpy.random.default_rng([seed, t])``, so any process can
draw it again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dasknn.kernels.embedding import scatter_add_windows

__all__ = [
    "SAMPLERS",
    "SampledOutput",
    "candidate_log_expected",
    "sample_candidates",
    "sampled_output",
    "sampled_softmax_gradients",
]

SAMPLERS = ("log-uniform", "uniform")


def sample_candidates(
    n_classes: int, n_sampled: int, sampler: str, seed: int, step: int
) -> np.ndarray:
    """The ``n_sampled`` candidate classes (int64, with replacement) of step ``step``."""
    rng = np.random.default_rng([seed, step])
    if sampler == "uniform":
        return rng.integers(0, n_classes, n_sampled, dtype=np.int64)
    u = rng.random(n_sampled)
    drawn = np.floor(np.exp(u * np.log(n_classes + 1.0))).astype(np.int64) - 1
    return np.clip(drawn, 0, n_classes - 1)


def candidate_log_expected(
    classes: np.ndarray, n_classes: int, n_sampled: int, sampler: str
) -> np.ndarray:
    """``log(S q(k))`` of every class ``k`` in ``classes`` (float64)."""
    k = np.asarray(classes, dtype=np.float64)
    if sampler == "uniform":
        q = np.full(k.shape, 1.0 / n_classes)
    else:
        q = np.log((k + 2.0) / (k + 1.0)) / np.log(n_classes + 1.0)
    return np.log(n_sampled * q)


@dataclass(frozen=True)
class SampledOutput:
    """Where a batch's labels and candidates are among the classes whose rows it uses.

    Attributes
    ----------
    classes : int64 array (u,)
        The sorted distinct classes of the labels and candidates (the rows of the output table
        the batch reads and changes).
    label_pos : int64 array (B,)
        Position in ``classes`` of every window's label.
    sampled_pos : int64 array (S,)
        Position in ``classes`` of every candidate (in draw order, repeats kept).
    log_expected : float64 array (u,)
        ``log(S q(k))`` of every class in ``classes``.
    """

    classes: np.ndarray
    label_pos: np.ndarray
    sampled_pos: np.ndarray
    log_expected: np.ndarray


def sampled_output(
    labels: np.ndarray, candidates: np.ndarray, n_classes: int, sampler: str
) -> SampledOutput:
    """The :class:`SampledOutput` of a batch's ``labels`` and a step's ``candidates``."""
    classes, inverse = np.unique(np.concatenate([labels, candidates]), return_inverse=True)
    inverse = inverse.astype(np.int64)
    return SampledOutput(
        classes=classes.astype(np.int64),
        label_pos=inverse[: len(labels)],
        sampled_pos=inverse[len(labels) :],
        log_expected=candidate_log_expected(classes, n_classes, len(candidates), sampler),
    )


def sampled_softmax_gradients(
    h: np.ndarray, rows: np.ndarray, output: SampledOutput, denominator: int
) -> tuple[float, np.ndarray, np.ndarray]:
    """Loss and gradients of the sampled softmax of the last hidden activations ``h``.

    Parameters
    ----------
    h : array (B, H)
        The input of the output layer.
    rows : array (u, H + 1)
        The rows ``[W_out^T | b_out]`` of ``output.classes``.
    output : SampledOutput
    denominator : int
        Windows of the global batch (the loss is a share of the global mean).

    Returns
    -------
    loss_sum : float
        Sum over the windows of ``-log`` of the label's probability among the label and the
        candidates (corrected logits, accidental hits dropped).
    grad_h : array (B, H)
        Gradient of ``loss_sum / denominator`` with respect to ``h``.
    grad_rows : array (u, H + 1)
        Its gradient with respect to ``rows``.
    """
    n_batch, width = h.shape
    ones = np.ones((n_batch, 1), dtype=h.dtype)
    h1 = np.hstack([h, ones])
    log_q = output.log_expected.astype(h.dtype)
    label_rows = rows[output.label_pos]
    sampled_rows = rows[output.sampled_pos]
    z_label = np.einsum("bk,bk->b", h1, label_rows) - log_q[output.label_pos]
    z_sampled = h1 @ sampled_rows.T - log_q[output.sampled_pos]
    z_sampled[output.sampled_pos[None, :] == output.label_pos[:, None]] = -np.inf
    top = np.maximum(z_label, z_sampled.max(axis=1, initial=-np.inf))
    p_label = np.exp(z_label - top)
    p_sampled = np.exp(z_sampled - top[:, None])
    norm = p_label + p_sampled.sum(axis=1)
    loss_sum = float(np.sum(np.log(norm) + top - z_label))
    d_label = (p_label / norm - 1.0) / denominator
    d_sampled = p_sampled / norm[:, None] / denominator
    grad_h = (d_label[:, None] * label_rows + d_sampled @ sampled_rows)[:, :width]
    grad_rows = np.zeros_like(rows)
    positions = np.concatenate([output.label_pos, output.sampled_pos])[:, None]
    contributions = np.vstack([d_label[:, None] * h1, d_sampled.T @ h1])
    scatter_add_windows(grad_rows, positions, False, rows.dtype.type(1.0), contributions)
    return loss_sum, grad_h, grad_rows
