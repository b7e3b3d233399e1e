"""The tasks of a distributed sampled step, each on the worker of its position ``p`` (hidden block
and output shard ``p``); see docs/sampled.md."""

from __future__ import annotations

import functools
import operator
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
]


class ShardLabels(NamedTuple):
    """A worker's labels on its shard, ``(ptr, local ids)``, and row targets ``1 / n_labels``."""

    label_ptr: np.ndarray
    label_ids: np.ndarray
    target: np.ndarray


class Forward(NamedTuple):
    """A shard's forward values of one step (held in the worker's state only) and the arrays
    it took from the worker's buffers."""

    hidden: np.ndarray
    active: ActiveSet
    logits: np.ndarray
    stats: np.ndarray
    taken: list


def hidden_block(token: str, x: sp.csr_matrix, call: int | None = None, *after) -> np.ndarray:
    """The worker's block of the hidden activation of the batch rows ``x`` (CSR); in a training
    step (submission ``call``) also kept until :func:`hidden_step`. ``after`` (the previous
    step's result) only orders the steps."""
    state = ShardState.on_worker(token)
    block = state.hidden.forward(x)
    if call is not None:
        state.hidden_blocks[call] = block
    return block


def _concatenate(blocks: tuple, out: np.ndarray | None = None) -> np.ndarray:
    """The ``blocks`` side by side (C-contiguous), into ``out`` when given."""
    return np.concatenate(blocks, axis=1, out=out)


def select_and_score(
    token: str, call: int, step: int, labels: ShardLabels, *blocks: np.ndarray
) -> np.ndarray:
    """Select the shard's active neurons (hidden ``blocks`` in worker order), keep their logits as
    the :class:`Forward` of ``call`` (its arrays from the worker's buffers); returns the shard's
    ``(max, sum exp)`` per sample (new)."""
    state = ShardState.on_worker(token)
    taken: list = []
    take = state.buffers.taker(taken)
    width = sum(block.shape[1] for block in blocks)
    hidden = _concatenate(blocks, take((blocks[0].shape[0], width), blocks[0].dtype))
    active = state.shard.select(hidden, labels.label_ptr, labels.label_ids, step, take)
    z, stats = state.shard.logits(hidden, active, take)
    state.forwards[call] = Forward(hidden, active, z, stats, taken)
    return stats


def output_backward(
    token: str, call: int, labels: ShardLabels, *stats: np.ndarray
) -> tuple[np.ndarray, float]:
    """The shard's backward pass; returns (partial ``dJ/dhidden``, loss part)."""
    state = ShardState.on_worker(token)
    forward = state.forwards.pop(call)
    lse = combine_statistics(list(stats))
    grad_hidden, loss = state.shard.backward(
        forward.hidden, forward.active, forward.logits, lse, labels.target
    )
    state.buffers.give(forward.taken)  # read for the last time
    return grad_hidden, float(np.sum(loss, dtype=np.float64))


def output_update(
    token: str, optimizer: Optimizer, lr_scale: float, steps_after: int, result: tuple
) -> None:
    """The shard's optimizer step (learning rate times ``lr_scale``), then its rehash / rebuild
    after ``steps_after`` steps (``result`` only orders it)."""
    state = ShardState.on_worker(token)
    state.shard.apply(optimizer, lr_scale)
    taken: list = []
    state.shard.end_step(steps_after, state.buffers.taker(taken))
    state.buffers.give(taken)


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
    """Sum the partial gradients of the worker's hidden block (own first, then ``received``) and
    update it; returns the worker's part of the summed batch loss (``updated`` only orders it)."""
    state = ShardState.on_worker(token)
    parts = list(received)
    parts.insert(state.position, columns_of(token, own_result, state.position))
    grad = functools.reduce(operator.add, parts)
    state.hidden.backward(x, state.hidden_blocks.pop(call), grad)
    state.hidden.apply(optimizer, lr_scale)
    return own_result[1]


def shard_top_k(token: str, k: int, *blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact top ``k`` of the shard for every row of a prediction batch."""
    return ShardState.on_worker(token).shard.top_k(_concatenate(blocks), k)
