"""The shard count from step times fitted to ``t(P) = t0 + t1 / P + t2 * P`` (Parallax, 3.2; see
docs/data_parallel.md, The number of shards)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["SearchReport", "balanced", "brute_force", "search_partitions"]


@dataclass(frozen=True)
class SearchReport:
    """What a search did.

    Attributes
    ----------
    mode : str
        ``"model"`` or ``"brute-force"``.
    samples : list of (int, float)
        ``(P, seconds per step)`` in the order timed.
    theta : tuple of float or None
        ``(t0, t1, t2)`` of the fit (``None`` with fewer than three samples or brute force).
    choice : int
        The chosen count.
    """

    mode: str
    samples: list[tuple[int, float]]
    theta: tuple[float, float, float] | None
    choice: int

    def __str__(self) -> str:
        lines = [f"shard-count search ({self.mode}): {len(self.samples)} samples"]
        for p, seconds in self.samples:
            fitted = "" if self.theta is None else f"  fit {1e3 * _cost(self.theta, p):.2f} ms"
            lines.append(f"  P = {p:5d}: {1e3 * seconds:.2f} ms/step{fitted}")
        if self.theta is not None:
            t0, t1, t2 = self.theta
            lines.append(f"  t(P) = {t0:.4g} + {t1:.4g} / P + {t2:.4g} P")
        lines.append(f"  chosen P = {self.choice}")
        return "\n".join(lines)


def _cost(theta, p):
    return theta[0] + theta[1] / p + theta[2] * p


def _fit(samples: Sequence[tuple[int, float]]) -> tuple[float, float, float]:
    """Least-squares ``(t0, t1, t2)`` of ``t = t0 + t1 / P + t2 P`` (needs 3 distinct P)."""
    p = np.array([s[0] for s in samples], dtype=float)
    t = np.array([s[1] for s in samples], dtype=float)
    design = np.stack([np.ones_like(p), 1.0 / p, p], axis=1)
    theta, *_ = np.linalg.lstsq(design, t, rcond=None)
    return float(theta[0]), float(theta[1]), float(theta[2])


def balanced(p: int, servers: int) -> bool:
    """Whether ``p`` shards put the same number on every server that holds one."""
    return p <= servers or p % servers == 0


def _choose(theta: tuple, low: int, high: int, servers: int | None) -> int:
    """The integer ``P`` in ``[low, high]`` minimising the fitted cost (the smallest on ties); with
    ``servers``, only :func:`balanced` counts (``low`` at most ``servers``)."""
    candidates = [p for p in range(low, high + 1) if servers is None or balanced(p, servers)]
    return candidates[int(np.argmin(_cost(theta, np.array(candidates, dtype=float))))]


def search_partitions(
    measure: Callable[[int], float],
    start: int,
    max_partitions: int,
    max_samples: int = 5,
    servers: int | None = None,
) -> SearchReport:
    """Time steps at a few shard counts, fit the cost model and :func:`choose`
    (docs/data_parallel.md).

    Parameters
    ----------
    measure : callable
        ``measure(P)``: seconds per step with ``P`` shards.
    start : int
        First count (the number of machines), at most ``max_partitions``.
    max_partitions : int
        Largest count allowed (the rows of the sparse variable).
    max_samples : int, default 5
        Counts timed at most (>= 1).
    servers : int, optional
        Workers the shards are spread over (``p mod servers``), at least ``start``: the choice is
        then a :func:`balanced` count.
    """
    samples = {start: measure(start)}
    p = start * 2
    while p <= max_partitions and len(samples) < max_samples:  # doubling while it gets faster
        samples[p] = measure(p)
        if samples[p] >= samples[p // 2]:
            break
        p *= 2
    p = start // 2
    while p >= 1 and len(samples) < max_samples:  # halving while faster than every other
        samples[p] = measure(p)
        if samples[p] >= min(v for q, v in samples.items() if q != p):
            break
        p //= 2
    ordered = list(samples.items())
    if len(samples) < 3:
        eligible = [p for p in samples if servers is None or balanced(p, servers)]
        return SearchReport("model", ordered, None, min(eligible, key=samples.get))
    theta = _fit(ordered)
    return SearchReport(
        "model", ordered, theta, _choose(theta, min(samples), max(samples), servers)
    )


def brute_force(measure: Callable[[int], float], candidates: Sequence[int]) -> SearchReport:
    """Time every count in ``candidates``; choose the fastest."""
    samples = [(int(p), measure(int(p))) for p in candidates]
    return SearchReport("brute-force", samples, None, min(samples, key=lambda s: s[1])[0])
