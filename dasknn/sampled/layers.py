"""The two layers of the sampled network, each state that one process owns: the dense hidden
layer (or a block of its neurons) and one shard of the sampled output layer with its hash tables.
The one-process model holds all of them; a distributed worker holds one hidden block and one shard.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numba
import numpy as np
import scipy.sparse as sp

from dasknn.kernels.sampled import (
    hidden_backward,
    hidden_forward,
    output_backward,
    output_logits,
    select_active,
    zero_rows,
)
from dasknn.lsh import HashFamily, HashTables, make_family, mips_items, mips_queries
from dasknn.optim import Optimizer, OptimizerSlots, ParamState
from dasknn.sampled.schedule import scaled_lr

__all__ = [
    "ActiveSet",
    "HiddenLayer",
    "OutputShard",
    "SamplingConfig",
    "combine_statistics",
    "merge_top_k",
    "shard_bucket_cap",
    "shard_budget",
]


#: ``take(shape, dtype)``: an uninitialized C-contiguous array for a step (``numpy.empty``, or
#: one of a worker's reused buffers).
Take = Callable[..., np.ndarray]


def n_chunks(batch: int, hogwild: bool) -> int:
    """Chunks of a batch processed in parallel: one (in order) unless ``hogwild``."""
    return max(1, min(batch, numba.get_num_threads())) if hogwild else 1


def shard_budget(active_fraction: float, n_items: int) -> int:
    """Active neurons a shard of ``n_items`` neurons selects per sample:
    ``ceil(active_fraction * n_items)``."""
    return min(n_items, max(1, math.ceil(active_fraction * n_items - 1e-9)))


def shard_bucket_cap(bucket_size: int, shards: int) -> int:
    """The bucket cap of each shard's tables: ``ceil(bucket_size / shards)``, so the shards
    together keep as many candidates as one whole-layer table (docs/benchmarks.md)."""
    return max(1, -(-bucket_size // shards))


def combine_statistics(stats: list[np.ndarray]) -> np.ndarray:
    """Each sample's log-sum-exp over all shards from their ``(max, sum exp(z - max))``
    statistics, combined in shard order."""
    top = stats[0][:, 0].copy()
    for s in stats[1:]:
        np.maximum(top, s[:, 0], out=top)
    total = np.zeros_like(top)
    for s in stats:
        total += s[:, 1] * np.exp(s[:, 0] - top)
    return top + np.log(total)


@dataclass(frozen=True)
class SamplingConfig:
    """How a shard samples its neurons (hyperparameters of :class:`~dasknn.sampled.SampledMLP`)."""

    hash_family: str
    k: int
    n_tables: int
    bin_size: int
    bucket_size: int
    active_fraction: float
    underflow: str
    rehash_every: int
    rebuild_every: int
    seed: int
    correction: str
    hashing: str
    uniform_fraction: float
    shards: int


class ActiveSet(NamedTuple):
    """One shard's active neurons of a batch (:func:`dasknn.kernels.sampled.select_active`):
    ``active[b, :count[b]]``, the first ``forced[b]`` labels; ``log_q``: log inclusion
    probabilities (``None``: unknown, refused by ``"logq"``)."""

    active: np.ndarray
    count: np.ndarray
    forced: np.ndarray
    log_q: np.ndarray | None = None


class HiddenLayer:
    """The dense hidden layer ``relu(X @ weights + bias)`` on sparse inputs, or a block of its
    neurons, trained by Adam.

    Parameters
    ----------
    weights : (n_features, H) array
    bias : (H,) array
    hogwild : bool
        Accumulate the gradients of the batch's samples in parallel without locks.
    update_all_rows : bool, default False
        Update every row each step (as ``torch.optim.Adam`` on a dense gradient), not only the
        rows of the batch's features.
    """

    def __init__(
        self, weights: np.ndarray, bias: np.ndarray, hogwild: bool, update_all_rows: bool = False
    ) -> None:
        self.weights = np.ascontiguousarray(weights)
        self.bias = np.ascontiguousarray(bias)
        self.hogwild = hogwild
        self.update_all_rows = update_all_rows
        self.grad_w = np.zeros_like(self.weights)
        self.grad_b = np.zeros_like(self.bias)
        self.touched = np.zeros(self.weights.shape[0], dtype=np.bool_)
        self.slots = OptimizerSlots()

    def forward(self, X: sp.csr_matrix) -> np.ndarray:
        return hidden_forward(
            X.indptr, X.indices, X.data, self.weights, self.bias, n_chunks(X.shape[0], self.hogwild)
        )

    def backward(self, X: sp.csr_matrix, hidden: np.ndarray, grad_hidden: np.ndarray) -> None:
        """Accumulate the gradients from ``grad_hidden = dJ/dhidden`` (``(B, H)``)."""
        hidden_backward(
            X.indptr,
            X.indices,
            X.data,
            hidden,
            np.ascontiguousarray(grad_hidden),
            self.grad_w,
            self.grad_b,
            self.touched,
            n_chunks(X.shape[0], self.hogwild),
        )
        if self.update_all_rows:
            self.touched[:] = True

    def apply(self, optimizer: Optimizer, lr_scale: float = 1.0) -> None:
        """One optimizer step, its learning rate times ``lr_scale``, on the touched rows and
        the bias; the gradients are zeroed."""
        rows = np.flatnonzero(self.touched)
        step = scaled_lr(optimizer, lr_scale)
        weight_state = self.slots.state(optimizer, "weights", self.weights)
        step.update_rows(self.weights, self.grad_w, weight_state, rows)
        step.update(self.bias, self.grad_b, self.slots.state(optimizer, "bias", self.bias))
        zero_rows(self.grad_w, rows)
        self.grad_b[:] = 0
        self.touched[rows] = False


class OutputShard:
    """One shard of the sampled output layer: weights, bias, optimizer state, hash tables and
    gradient buffers.

    Parameters
    ----------
    index : int
        The shard's number (part of every random stream it draws from).
    ids : (n,) int array
        The global ids of its neurons; local id ``i`` is global ``ids[i]``.
    weights : (n, H) array
        Neuron-major weights.
    bias : (n,) array
    config : SamplingConfig
    hogwild : bool
    rebuilds : int
        Hash-function draws after the first (the family is that of :meth:`make_family`).
    tables : HashTables, optional
        The tables to query (default: built from ``weights`` under the family).
    """

    def __init__(
        self,
        index: int,
        ids: np.ndarray,
        weights: np.ndarray,
        bias: np.ndarray,
        config: SamplingConfig,
        hogwild: bool,
        rebuilds: int = 0,
        tables: HashTables | None = None,
    ) -> None:
        self.index = int(index)
        self.ids = np.asarray(ids, dtype=np.int64)
        self.weights = np.ascontiguousarray(weights)
        self.bias = np.ascontiguousarray(bias)
        self.config = config
        self.hogwild = hogwild
        self.budget = shard_budget(config.active_fraction, len(self.ids))
        self.reserve = math.floor(config.uniform_fraction * self.budget)
        self.bucket_cap = shard_bucket_cap(config.bucket_size, config.shards)
        self.grad_w = np.zeros_like(self.weights)
        self.grad_b = np.zeros_like(self.bias)
        self.touched = np.zeros(len(self.ids), dtype=np.bool_)
        self.slots = OptimizerSlots()
        self.rebuilds = int(rebuilds)
        self.family = self.make_family(self.rebuilds)
        self.tables = self.build_tables() if tables is None else tables

    def family_seed(self, rebuilds: int) -> int:
        """Seed of the hash family (and bucket reservoirs) after ``rebuilds`` rebuilds."""
        seq = np.random.SeedSequence([self.config.seed, self.index, rebuilds])
        return int(seq.generate_state(1)[0])

    def make_family(self, rebuilds: int) -> HashFamily:
        c = self.config
        return make_family(
            c.hash_family,
            self.weights.shape[1] + (2 if c.hashing == "mips" else 0),
            c.k,
            c.n_tables,
            self.family_seed(rebuilds),
            bin_size=c.bin_size,
        )

    def hashed_items(self) -> np.ndarray:
        """What the tables hash: the weights, or :func:`dasknn.lsh.mips_items` (``"mips"``)."""
        if self.config.hashing == "mips":
            return mips_items(self.weights, self.bias)
        return self.weights

    def hashed_queries(self, hidden: np.ndarray) -> np.ndarray:
        """What a query hashes: the layer input, or ``(h, 1, 0)`` with ``"mips"``."""
        return mips_queries(hidden) if self.config.hashing == "mips" else hidden

    def build_tables(self, take: Take = np.empty) -> HashTables:
        """Tables of the current weights under the current family (the hashing's temporaries
        in arrays of ``take``, free again once this returns)."""
        return HashTables.build(
            self.family,
            self.hashed_items(),
            self.bucket_cap,
            self.family_seed(self.rebuilds),
            take,
        )

    def end_step(self, steps: int, take: Take = np.empty) -> None:
        """After ``steps`` steps: new hash functions every ``rebuild_every`` steps, else new
        tables every ``rehash_every`` steps (temporaries of ``take``, as :meth:`build_tables`)."""
        if steps % self.config.rebuild_every == 0:
            self.rebuilds += 1
            self.family = self.make_family(self.rebuilds)
            self.tables = self.build_tables(take)
        elif steps % self.config.rehash_every == 0:
            self.tables = self.build_tables(take)

    def select(
        self,
        hidden: np.ndarray,
        label_ptr: np.ndarray,
        label_ids: np.ndarray,
        step: int,
        take: Take = np.empty,
    ) -> ActiveSet:
        """The batch's active neurons (labels given as local ids: forced; none: inference), in
        arrays of ``take(shape, dtype)`` (default: new)."""
        codes = self.family.codes(self.hashed_queries(hidden), take)
        n, chunks = hidden.shape[0], n_chunks(hidden.shape[0], self.hogwild)
        active = take((n, self.budget), np.int32)
        count, forced = take((n,), np.int32), take((n,), np.int32)
        log_q = take((n, self.budget), np.float64)
        select_active(
            codes,
            *self.tables.arrays(),
            len(self.ids),
            self.budget,
            self.reserve,
            label_ptr,
            label_ids,
            self.config.underflow == "fill",
            self.config.seed,
            step,
            0,
            self.index,
            chunks,
            active,
            count,
            forced,
            log_q,
            take((chunks, len(self.ids)), np.int64),
        )
        return ActiveSet(active, count, forced, log_q)

    def logits(
        self, hidden: np.ndarray, active: ActiveSet, take: Take = np.empty
    ) -> tuple[np.ndarray, np.ndarray]:
        """Active logits ``(B, budget)``, an array of ``take(shape, dtype)`` (default: new), and
        softmax statistics ``(B, 2)`` (new).

        With ``"logq"`` each logit is ``z_j - log q_j`` (labels keep theirs), so the active set's
        ``exp`` sum estimates the full normaliser (docs/sampled.md).
        """
        if self.config.correction == "logq":
            if active.log_q is None:
                raise ValueError(
                    "the correction 'logq' needs the active set's log_q (the log of each "
                    "neuron's probability of being chosen)"
                )
            shift = active.log_q
            if shift.dtype != self.weights.dtype:
                shift = take(shift.shape, self.weights.dtype)
                np.copyto(shift, active.log_q, casting="same_kind")
        else:
            shift = np.zeros((0, 0), dtype=self.weights.dtype)
        n = hidden.shape[0]
        z = take((n, self.budget), hidden.dtype)
        stats = np.empty((n, 2), dtype=hidden.dtype)
        output_logits(
            hidden,
            self.weights,
            self.bias,
            active.active,
            active.count,
            shift,
            n_chunks(n, self.hogwild),
            z,
            stats,
        )
        return z, stats

    def backward(
        self,
        hidden: np.ndarray,
        active: ActiveSet,
        z: np.ndarray,
        lse: np.ndarray,
        target: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Accumulate the shard's gradients; return its part of ``dJ/dhidden`` and of the
        per-sample losses (see :func:`dasknn.kernels.sampled.output_backward`)."""
        t = self.weights.dtype.type
        return output_backward(
            hidden,
            self.weights,
            active.active,
            active.count,
            active.forced,
            z,
            lse.astype(self.weights.dtype, copy=False),
            target.astype(self.weights.dtype, copy=False),
            t(1.0 / hidden.shape[0]),
            self.grad_w,
            self.grad_b,
            self.touched,
            n_chunks(hidden.shape[0], self.hogwild),
        )

    def apply(self, optimizer: Optimizer, lr_scale: float = 1.0) -> None:
        """One optimizer step, its learning rate times ``lr_scale``, on the touched neurons
        (weights and bias); gradients zeroed."""
        rows = np.flatnonzero(self.touched)
        step = scaled_lr(optimizer, lr_scale)
        weight_state = self.slots.state(optimizer, "weights", self.weights)
        step.update_rows(self.weights, self.grad_w, weight_state, rows)
        bias_state = self.slots.state(optimizer, "bias", self.bias)
        column = ParamState(
            bias_state.step,
            {name: array.reshape(-1, 1) for name, array in bias_state.arrays.items()},
        )
        step.update_rows(self.bias.reshape(-1, 1), self.grad_b.reshape(-1, 1), column, rows)
        bias_state.step = column.step
        zero_rows(self.grad_w, rows)
        self.grad_b[rows] = 0
        self.touched[rows] = False

    def top_k(self, hidden: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact top ``k`` (or all, if fewer) neurons by logit: ``(scores, global ids)``, each
        ``(B, min(k, n))`` sorted by decreasing score (ties: smaller global id first)."""
        scores = hidden @ self.weights.T + self.bias
        k = min(k, scores.shape[1])
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k] if k < scores.shape[1] else None
        if part is None:
            part = np.broadcast_to(np.arange(scores.shape[1]), scores.shape)
        top = np.take_along_axis(scores, part, axis=1)
        gids = self.ids[part]
        order = np.lexsort((gids, -top), axis=1)
        return np.take_along_axis(top, order, 1), np.take_along_axis(gids, order, 1)


def merge_top_k(tops: list[tuple[np.ndarray, np.ndarray]], k: int) -> np.ndarray:
    """The global ids of the ``k`` best of the shards' top lists (``(scores, ids)`` each), by
    decreasing score, ties by increasing id."""
    scores = np.concatenate([t[0] for t in tops], axis=1)
    ids = np.concatenate([t[1] for t in tops], axis=1)
    order = np.lexsort((ids, -scores), axis=1)[:, :k]
    return np.take_along_axis(ids, order, 1)
