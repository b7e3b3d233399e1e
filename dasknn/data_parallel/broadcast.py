"""Weights placed on the workers once: the same data on every worker, or a copy loaded on each
named worker by a task pinned there (for example into its GPU's memory)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from distributed import Client, Future

__all__ = ["broadcast", "load_on_each"]


def broadcast(client: Client, value: Any) -> Future:
    """Send ``value`` to every worker once; tasks that take the returned future read it there."""
    return client.scatter(value, broadcast=True, hash=False)


def load_on_each(
    client: Client, value: Any, addresses: Sequence[str], load: Callable, *args: Any
) -> dict[str, Future]:
    """Send ``value`` to each worker of ``addresses`` and run ``load(value, *args)`` there.

    Returns the future of each worker's loaded copy, by address; its task is pinned to the worker
    (``allow_other_workers=False``), so the copy never moves.
    """
    loaded = {}
    for address in addresses:
        host = client.scatter(value, workers=[address], hash=False)
        loaded[address] = client.submit(
            load, host, *args, workers=[address], allow_other_workers=False, pure=False
        )
    return loaded
