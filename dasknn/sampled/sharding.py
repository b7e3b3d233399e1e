"""How the output layer's neurons are dealt to shards: a seeded random permutation cut into
consecutive blocks, and the translation of labels to each shard's local ids."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dasknn.sampled.layers import shard_budget

__all__ = ["ShardMap"]


@dataclass(frozen=True)
class ShardMap:
    """The neurons of each shard.

    Attributes
    ----------
    order : (N,) int64
        A seeded random permutation of the neurons; shard ``p`` owns
        ``order[bounds[p]:bounds[p + 1]]``, its local id ``i`` being global
        ``order[bounds[p] + i]``.
    bounds : (P + 1,) int64
        The first ``N % P`` shards hold one neuron more than the others.
    shard_of, local_of : (N,) int64
        The shard and local id of every global id.
    """

    order: np.ndarray
    bounds: np.ndarray
    shard_of: np.ndarray
    local_of: np.ndarray

    @classmethod
    def make(cls, n_items: int, shards: int, seed: int) -> ShardMap:
        if shards > n_items:
            raise ValueError(f"more shards ({shards}) than output neurons ({n_items})")
        seq = np.random.SeedSequence([seed, 0x5A4D])
        order = np.random.default_rng(seq).permutation(n_items).astype(np.int64)
        base, extra = divmod(n_items, shards)
        sizes = np.full(shards, base, dtype=np.int64)
        sizes[:extra] += 1
        bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        position = np.empty(n_items, dtype=np.int64)
        position[order] = np.arange(n_items)
        shard_of = np.searchsorted(bounds, position, side="right") - 1
        return cls(order, bounds, shard_of, position - bounds[shard_of])

    @property
    def shards(self) -> int:
        return len(self.bounds) - 1

    def ids(self, p: int) -> np.ndarray:
        """The global ids of shard ``p``'s neurons, by local id."""
        return self.order[self.bounds[p] : self.bounds[p + 1]]

    def split_labels(self, ptr: np.ndarray, ids: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per shard, the CSR ``(ptr, local ids)`` of a batch's global labels ``(ptr, ids)``."""
        rows = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))
        owner = self.shard_of[ids]
        out = []
        for p in range(self.shards):
            mask = owner == p
            counts = np.bincount(rows[mask], minlength=len(ptr) - 1)
            shard_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
            out.append((shard_ptr, self.local_of[ids[mask]]))
        return out

    def check_budgets(self, ptr: np.ndarray, ids: np.ndarray, active_fraction: float) -> None:
        """``ValueError`` if some sample has more labels on a shard than its budget."""
        for p, (shard_ptr, _) in enumerate(self.split_labels(ptr, ids)):
            budget = shard_budget(active_fraction, int(self.bounds[p + 1] - self.bounds[p]))
            per_row = np.diff(shard_ptr)
            if per_row.size and per_row.max() > budget:
                row = int(np.argmax(per_row))
                raise ValueError(
                    f"row {row} has {int(per_row[row])} labels on shard {p}, more than its "
                    f"budget of {budget} active neurons (raise active_fraction)"
                )
