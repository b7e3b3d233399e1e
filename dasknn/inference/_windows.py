"""Windows of layers for streamed weights: how many layers a worker holds at once."""

from __future__ import annotations

from collections.abc import Sequence

import psutil
from distributed import Client

from dasknn.runtime.cluster import scheduler_workers

__all__ = ["layer_windows", "window_layers", "worker_memory_limit"]


def worker_memory_limit(client: Client) -> int:
    """The smallest memory limit of the cluster's workers (this machine's memory if none has
    a limit)."""
    workers = scheduler_workers(client).values()
    limits = [w.get("memory_limit") or 0 for w in workers]
    limits = [x for x in limits if x > 0]
    return min(limits) if limits else int(psutil.virtual_memory().total)


def window_layers(
    layer_bytes: Sequence[int], budget: int, buffers: int, resident_layers: int | None = None
) -> int | None:
    """Layers per window when the weights are streamed, ``None`` when they are held whole.

    Windows of ``resident_layers`` when given (whole when it covers every layer); else whole
    when the bytes fit ``budget``, or windows such that ``buffers`` of them fit it (>= 1 layer).
    """
    if resident_layers is None and sum(layer_bytes) > budget:
        resident_layers = max(1, int(budget // (buffers * max(layer_bytes))))
    if resident_layers is None or resident_layers >= len(layer_bytes):
        return None
    return resident_layers


def layer_windows(n_layers: int, per_window: int) -> list[slice]:
    """Consecutive slices of ``per_window`` layers covering ``n_layers`` layers."""
    return [slice(first, first + per_window) for first in range(0, n_layers, per_window)]
