"""Row shards of a sparse variable: ``"mod"`` puts row ``r`` in shard ``r mod P`` (offset
``r // P``), ``"div"`` cuts consecutive blocks as :func:`numpy.array_split`; shard ``p`` lives on
worker ``p mod N``."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

import numpy as np

from dasknn.runtime.collectives import chunk_bounds

__all__ = ["STRATEGIES", "ShardMap"]

STRATEGIES = ("mod", "div")


@dataclass(frozen=True)
class ShardMap:
    """``P`` shards of ``V`` rows over ``N`` workers.

    Parameters
    ----------
    n_rows, n_shards, n_workers : int
    strategy : {"mod", "div"}, default "mod"

    Raises
    ------
    ValueError
        For an unknown strategy, or a shard count that is not an integer in ``[1, V]``.
    """

    n_rows: int
    n_shards: int
    n_workers: int
    strategy: str = "mod"

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"unknown partition strategy {self.strategy!r}; expected one of {STRATEGIES}"
            )
        p = self.n_shards
        if isinstance(p, bool) or not isinstance(p, Integral) or not 1 <= p <= self.n_rows:
            raise ValueError(
                f"the number of shards must be an integer in 1..{self.n_rows} (the rows of the "
                f"embedding), got {p!r}"
            )

    @property
    def bounds(self) -> np.ndarray:
        """``P + 1`` row bounds of the ``"div"`` blocks."""
        return np.asarray(chunk_bounds(self.n_rows, self.n_shards), dtype=np.int64)

    def owner(self, shard: int) -> int:
        """The worker of ``shard``."""
        return shard % self.n_workers

    def shards_of(self, worker: int) -> list[int]:
        """The shards worker ``worker`` serves."""
        return list(range(worker, self.n_shards, self.n_workers))

    def rows(self, shard: int) -> np.ndarray:
        """The global rows of ``shard``, in the order it stores them (ascending)."""
        if self.strategy == "mod":
            return np.arange(shard, self.n_rows, self.n_shards, dtype=np.int64)
        bounds = self.bounds
        return np.arange(bounds[shard], bounds[shard + 1], dtype=np.int64)

    def split(self, ids: np.ndarray) -> list[np.ndarray]:
        """Per shard, the positions in the sorted distinct ``ids`` of its rows (ascending)."""
        shard = self.shard_of(ids)
        order = np.argsort(shard, kind="stable")
        cuts = np.searchsorted(shard[order], np.arange(self.n_shards + 1))
        return [order[cuts[p] : cuts[p + 1]] for p in range(self.n_shards)]

    def shard_of(self, ids: np.ndarray) -> np.ndarray:
        """The shard of every row id."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.strategy == "mod":
            return ids % self.n_shards
        return np.searchsorted(self.bounds, ids, side="right") - 1

    def offset_of(self, ids: np.ndarray) -> np.ndarray:
        """The position of every row id inside its shard."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.strategy == "mod":
            return ids // self.n_shards
        return ids - self.bounds[self.shard_of(ids)]
