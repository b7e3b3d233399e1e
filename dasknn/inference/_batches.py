"""Input rows cut into batches, and what one batch of inference sends back."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["BatchResult", "batch_starts", "default_batch_size"]


def default_batch_size(n_rows: int, workers: int) -> int:
    """Rows per batch: about 4 batches per worker, between 256 and 2048 rows."""
    return int(min(2048, max(256, math.ceil(n_rows / (4 * max(1, workers))))))


def batch_starts(n_rows: int, batch_size: int) -> list[int]:
    """First row of every batch of ``batch_size`` rows (the last batch may be shorter)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return list(range(0, n_rows, batch_size))


@dataclass
class BatchResult:
    """What a batch sends back: its live rows (batch-local ids) and what it cost.

    Attributes
    ----------
    rows : int array
        Batch-local ids of the rows that are not all zero after the last layer.
    macs_done, macs_needed : int
        Multiply-adds the kernel executed, and those a sparse product skipping every zero
        activation would need (0 where the kernel does not count them).
    kernel_seconds : float
        Time spent loading the batch and inside the kernel.
    peak_memory : dict of str to int
        Peak resident memory (bytes) of each worker process the batch ran on.
    """

    rows: np.ndarray
    macs_done: int
    macs_needed: int
    kernel_seconds: float
    peak_memory: dict[str, int] = field(default_factory=dict)

    def __sizeof__(self) -> int:
        """Bytes of this object and its arrays (what Dask's ``sizeof`` counts)."""
        return object.__sizeof__(self) + self.rows.nbytes
