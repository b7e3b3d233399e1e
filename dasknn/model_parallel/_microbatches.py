"""Splitting a training step's batch into microbatches, and how many to use.

A step's batch of ``B`` rows is cut into ``m`` consecutive row blocks (the first ``B mod m`` one
row longer) that run through the layer chain as separate tasks, so a worker computes one
microbatch's layer while the messages of another travel; their gradients are summed before the
update, so the step is the same step (see ``docs/training.md``, "Microbatches").
"""

from __future__ import annotations

from numbers import Integral

import numpy as np

__all__ = ["AUTO_MIN_ROWS", "AUTO_MAX", "auto_microbatches", "check_microbatches", "split_rows"]

#: The automatic choice keeps at least this many rows in a microbatch ...
AUTO_MIN_ROWS = 256
#: ... and uses at most this many microbatches.
AUTO_MAX = 4


def check_microbatches(microbatches: int | None) -> int | None:
    """Return ``microbatches`` (``None``: chosen per step by :func:`auto_microbatches`) as an int;
    ``ValueError`` unless it is ``None`` or an integer >= 1."""
    if microbatches is None:
        return None
    integer = isinstance(microbatches, Integral) and not isinstance(microbatches, bool)
    if not integer or microbatches < 1:
        raise ValueError(f"microbatches must be an integer >= 1 or None, got {microbatches!r}")
    return int(microbatches)


def auto_microbatches(batch: int, workers: int) -> int:
    """The number of microbatches of a ``batch``-row step on ``workers`` workers when none is given.

    One when every part is on one worker (no message crosses a worker, there is no latency to
    hide); otherwise as many as give microbatches of at least :data:`AUTO_MIN_ROWS` rows, at most
    :data:`AUTO_MAX`.
    """
    if workers <= 1:
        return 1
    return int(min(AUTO_MAX, max(1, batch // AUTO_MIN_ROWS)))


def split_rows(rows: np.ndarray | None, batch: int, microbatches: int) -> list:
    """The batch columns of each microbatch: ``min(microbatches, batch)`` consecutive blocks of
    ``rows`` (index arrays), or of ``0..batch-1`` (slices) when ``rows`` is ``None``; a single
    block is ``rows`` itself."""
    count = min(microbatches, batch)
    if count == 1:
        return [rows]
    bounds = [(batch // count) * i + min(i, batch % count) for i in range(count + 1)]
    if rows is None:
        return [slice(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
    return [rows[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
