"""Splitting a training step's batch into microbatches (see docs/training.md, Microbatches)."""

from __future__ import annotations

from numbers import Integral

import numpy as np

__all__ = ["AUTO_MIN_ROWS", "AUTO_MAX", "auto_microbatches", "check_microbatches", "split_rows"]

#: The automatic choice keeps at least this many rows in a microbatch ...
AUTO_MIN_ROWS = 256
#: ... and uses at most this many microbatches.
AUTO_MAX = 4


def check_microbatches(microbatches: int | None) -> int | None:
    """``microbatches`` as an int, or ``None`` (chosen per step); ``ValueError`` unless >= 1."""
    if microbatches is None:
        return None
    if isinstance(microbatches, bool) or not isinstance(microbatches, Integral) or microbatches < 1:
        raise ValueError(f"microbatches must be an integer >= 1 or None, got {microbatches!r}")
    return int(microbatches)


def auto_microbatches(batch: int, workers: int) -> int:
    """The microbatches of a ``batch``-row step on ``workers`` workers: 1 on one worker, otherwise
    ``batch // AUTO_MIN_ROWS`` clipped to ``[1, AUTO_MAX]``."""
    if workers <= 1:
        return 1
    return int(min(AUTO_MAX, max(1, batch // AUTO_MIN_ROWS)))


def split_rows(rows: np.ndarray | None, batch: int, microbatches: int) -> list:
    """The batch columns of each microbatch: ``min(microbatches, batch)`` consecutive blocks of
    ``rows``, or slices of ``0..batch-1`` when ``rows`` is ``None``; one block is ``rows`` itself.
    """
    count = min(microbatches, batch)
    if count == 1:
        return [rows]
    bounds = [(batch // count) * i + min(i, batch % count) for i in range(count + 1)]
    pairs = zip(bounds[:-1], bounds[1:], strict=True)
    return [slice(lo, hi) if rows is None else rows[lo:hi] for lo, hi in pairs]
