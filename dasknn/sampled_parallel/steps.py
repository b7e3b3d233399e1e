"""The tasks of a distributed sampled step, run on the worker of their position.

A training step on ``P`` workers (position ``p`` owns hidden block ``p`` and output shard ``p``):

1. :func:`hidden_block`: ``relu(X @ W1[:, block p] + b1[block p])``, sent to every other worker
   (phase ``hidden``).
2. :func:`select_and_score`: the full hidden activation (blocks in worker order) is the query of
   shard ``p``'s tables; the shard selects its active neurons (labels forced) and computes their
   logits; its softmax statistics go to every other worker (phase ``stats``).
3. :func:`output_step`: the log-sum-exp over all shards, the shard's gradients, its partial
   gradient of the hidden activation (columns of block ``q`` sent to worker ``q``, phase
   ``grad``), then the shard's Adam step and its rehash / rebuild.
4. :func:`hidden_step`: the sum of the partial gradients of block ``p`` (in worker order), the
   block's gradients and Adam step; returns the worker's part of the batch loss.

Weights, optimizer state and tables never leave the worker.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from dasknn.optim import Optimizer
from dasknn.sampled.layers import ActiveSet, combine_statistics
from dasknn.sampled_parallel.worker_state import shard_state

__all__ = [
    "Forward",
    "columns_of",
    "hidden_block",
    "hidden_step",
    "output_step",
    "select_and_score",
    "shard_top_k",
    "statistics_of",
]


class Forward(NamedTuple):
    """A shard's forward values of one step (held on its worker only)."""

    hidden: np.ndarray
    active: ActiveSet
    logits: np.ndarray
    stats: np.ndarray


def _with_own(position: int, own, received: tuple) -> list:
    items = list(received)
    items.insert(position, own)
    return items


def hidden_block(token: str, x) -> np.ndarray:
    """The worker's block of the hidden activation of the batch ``x`` (CSR)."""
    return shard_state(token).hidden.forward(x)


def _assemble(state, own: np.ndarray, received: tuple) -> np.ndarray:
    return np.ascontiguousarray(np.concatenate(_with_own(state.position, own, received), axis=1))


def select_and_score(
    token: str, call_step: int, labels: tuple, own: np.ndarray, *received: np.ndarray
) -> Forward:
    """Select the shard's active neurons for the batch and compute their logits."""
    state = shard_state(token)
    hidden = _assemble(state, own, received)
    active = state.shard.select(hidden, labels[0], labels[1], call_step)
    z, stats = state.shard.logits(hidden, active)
    return Forward(hidden, active, z, stats)


def statistics_of(forward: Forward) -> np.ndarray:
    """The message of phase ``stats``: the shard's ``(max, sum exp)`` per sample."""
    return forward.stats


def output_step(
    token: str,
    optimizer: Optimizer,
    steps_after: int,
    target: np.ndarray,
    forward: Forward,
    *received_stats: np.ndarray,
) -> tuple[np.ndarray, float]:
    """The shard's backward pass and update; returns (partial ``dJ/dhidden``, loss part)."""
    state = shard_state(token)
    shard = state.shard
    lse = combine_statistics(_with_own(state.position, forward.stats, received_stats))
    grad_hidden, loss = shard.backward(forward.hidden, forward.active, forward.logits, lse, target)
    shard.apply(optimizer)
    shard.end_step(steps_after)
    return grad_hidden, float(np.sum(loss, dtype=np.float64))


def columns_of(token: str, result: tuple, receiver: int) -> np.ndarray:
    """The message of phase ``grad``: the columns of ``receiver``'s hidden block."""
    columns = shard_state(token).columns
    return np.ascontiguousarray(result[0][:, columns[receiver] : columns[receiver + 1]])


def hidden_step(
    token: str,
    optimizer: Optimizer,
    x,
    own_hidden: np.ndarray,
    own_result: tuple,
    *received: np.ndarray,
) -> float:
    """Sum the partial gradients of the worker's hidden block, apply its update; returns the
    worker's part of the batch's summed loss."""
    state = shard_state(token)
    own = columns_of(token, own_result, state.position)
    parts = _with_own(state.position, own, received)
    grad = parts[0]
    for part in parts[1:]:
        grad = grad + part
    state.hidden.backward(x, own_hidden, grad)
    state.hidden.apply(optimizer)
    return own_result[1]


def shard_top_k(
    token: str, k: int, own: np.ndarray, *received: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top ``k`` of the shard for every row of a prediction batch."""
    state = shard_state(token)
    return state.shard.top_k(_assemble(state, own, received), k)
