"""The tasks of a distributed sampled step, run on the worker of their position.

A training step on ``P`` workers (position ``p`` owns hidden block ``p`` and output shard ``p``;
every value a task receives from another worker is one message):

1. :func:`train_hidden_block`: ``relu(X @ W1[:, block p] + b1[block p])``, kept in the
   worker's state for the backward pass; every other worker reads it (phase ``hidden``).
2. :func:`select_and_score`: the full hidden activation (blocks in worker order) is the query of
   shard ``p``'s tables; the shard selects its active neurons (labels forced) and computes their
   logits, which stay in the worker's state; the task's value is the shard's softmax statistics,
   which every other worker reads (phase ``stats``).
3. :func:`output_backward`: the log-sum-exp over all shards, the shard's gradients and its
   partial gradient of the hidden activation (columns of block ``q`` sent to worker ``q``,
   phase ``grad``, by :func:`columns_of`).
4. :func:`output_update`: the shard's optimizer step and its rehash / rebuild (while the
   partial gradients travel).
5. :func:`hidden_step`: the sum of the partial gradients of block ``p`` (in worker order), the
   block's gradients and optimizer step; returns the worker's part of the batch loss.

Weights, optimizer state and tables never leave the worker.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from dasknn.optim import Optimizer
from dasknn.sampled.layers import ActiveSet, combine_statistics
from dasknn.sampled_parallel._worker_state import ShardState

__all__ = [
    "Forward",
    "ShardLabels",
    "columns_of",
    "hidden_block",
    "hidden_step",
    "output_backward",
    "output_update",
    "select_and_score",
    "shard_top_k",
    "train_hidden_block",
]


class ShardLabels(NamedTuple):
    """What one worker is given of a training batch's labels: those on its shard as
    ``(ptr, local ids)`` and the per-row target ``1 / n_labels``."""

    label_ptr: np.ndarray
    label_ids: np.ndarray
    target: np.ndarray


class Forward(NamedTuple):
    """A shard's forward values of one step (held in the worker's state only)."""

    hidden: np.ndarray
    active: ActiveSet
    logits: np.ndarray
    stats: np.ndarray


def hidden_block(token: str, x: sp.csr_matrix) -> np.ndarray:
    """The worker's block of the hidden activation of the batch rows ``x`` (CSR)."""
    return ShardState.on_worker(token).hidden.forward(x)


def train_hidden_block(token: str, call: int, x: sp.csr_matrix, *after) -> np.ndarray:
    """:func:`hidden_block` of a training step, also kept in the worker's state under the
    submission number ``call`` until :func:`hidden_step`.

    ``after``: the worker's result of the previous step when steps are queued, taken only so
    that this step starts after it."""
    state = ShardState.on_worker(token)
    block = state.hidden.forward(x)
    state.hidden_blocks[call] = block
    return block


def _concatenate(blocks: tuple) -> np.ndarray:
    return np.ascontiguousarray(np.concatenate(blocks, axis=1))


def select_and_score(
    token: str, call: int, step: int, labels: ShardLabels, *blocks: np.ndarray
) -> np.ndarray:
    """Select the shard's active neurons for the batch (hidden ``blocks`` in worker order) and
    compute their logits, kept as the worker's :class:`Forward` of submission ``call``; returns
    the shard's ``(max, sum exp)`` per sample."""
    state = ShardState.on_worker(token)
    hidden = _concatenate(blocks)
    active = state.shard.select(hidden, labels.label_ptr, labels.label_ids, step)
    z, stats = state.shard.logits(hidden, active)
    state.forwards[call] = Forward(hidden, active, z, stats)
    return stats


def output_backward(
    token: str, call: int, labels: ShardLabels, *stats: np.ndarray
) -> tuple[np.ndarray, float]:
    """The shard's backward pass from the statistics of every shard (in worker order); returns
    (partial ``dJ/dhidden``, loss part)."""
    state = ShardState.on_worker(token)
    forward = state.forwards.pop(call)
    lse = combine_statistics(list(stats))
    grad_hidden, loss = state.shard.backward(
        forward.hidden, forward.active, forward.logits, lse, labels.target
    )
    return grad_hidden, float(np.sum(loss, dtype=np.float64))


def output_update(
    token: str, optimizer: Optimizer, lr_scale: float, steps_after: int, result: tuple
) -> None:
    """The shard's optimizer step (learning rate times ``lr_scale``), then its rehash /
    rebuild after ``steps_after`` steps (``result``: the shard's :func:`output_backward`,
    taken for the order)."""
    shard = ShardState.on_worker(token).shard
    shard.apply(optimizer, lr_scale)
    shard.end_step(steps_after)


def columns_of(token: str, result: tuple, receiver: int) -> np.ndarray:
    """The message of phase ``grad``: the columns of ``receiver``'s hidden block."""
    columns = ShardState.on_worker(token).columns
    return np.ascontiguousarray(result[0][:, columns[receiver] : columns[receiver + 1]])


def hidden_step(
    token: str,
    call: int,
    optimizer: Optimizer,
    lr_scale: float,
    x: sp.csr_matrix,
    own_result: tuple,
    updated: None,
    *received: np.ndarray,
) -> float:
    """Sum the partial gradients of the worker's hidden block (its own from ``own_result``, the
    others ``received`` in worker order), apply its update (learning rate times ``lr_scale``);
    returns the worker's part of the batch's summed loss (``x``: the batch rows; ``updated``:
    the shard's :func:`output_update`, taken for the order)."""
    state = ShardState.on_worker(token)
    parts = list(received)
    parts.insert(state.position, columns_of(token, own_result, state.position))
    grad = parts[0]
    for part in parts[1:]:
        grad = grad + part
    state.hidden.backward(x, state.hidden_blocks.pop(call), grad)
    state.hidden.apply(optimizer, lr_scale)
    return own_result[1]


def shard_top_k(token: str, k: int, *blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact top ``k`` of the shard for every row of a prediction batch (hidden ``blocks`` in
    worker order)."""
    return ShardState.on_worker(token).shard.top_k(_concatenate(blocks), k)
