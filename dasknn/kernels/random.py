"""A counter-seeded random stream for numba code: splitmix64.

Every random choice of the sampled layers draws from a stream seeded by the integers that name it
(seed, table, step, sample, shard), so results do not depend on threads, order or process.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["rand_below", "seed_stream", "splitmix64"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@njit(cache=True, inline="always")
def splitmix64(state):  # pragma: no cover - compiled
    """``(next_state, output)`` of the splitmix64 generator at ``state`` (uint64)."""
    state = state + _GOLDEN
    z = state
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return state, z ^ (z >> np.uint64(31))


@njit(cache=True)
def seed_stream(a, b, c, d):  # pragma: no cover - compiled
    """A uint64 stream state determined by four non-negative integers."""
    _, state = splitmix64(np.uint64(a))
    _, state = splitmix64(state ^ np.uint64(b))
    _, state = splitmix64(state ^ np.uint64(c))
    _, state = splitmix64(state ^ np.uint64(d))
    return state


@njit(cache=True, inline="always")
def rand_below(state, n):  # pragma: no cover - compiled
    """``(next_state, r)`` with ``r`` uniform in ``[0, n)`` (``n >= 1``; bias below 2**-40)."""
    state, out = splitmix64(state)
    return state, np.int64(out % np.uint64(n))
