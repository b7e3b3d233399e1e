"""A bound on ``dask.utils.key_split``'s cache, which keeps alive every key a process has seen
(about 330 bytes a step key; step keys never repeat). Emptying it changes no result (a miss costs
about 0.1-0.4 us). The plugins also hold Dask's header keys (:mod:`dasknn.runtime.header_keys`).
See docs/reliability.md, "Long runs: memory (soak)"."""

from __future__ import annotations

from dask.utils import key_split
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from dasknn.runtime.header_keys import hold_header_keys
from dasknn.runtime.plugin_removal import remove_worker_plugin

__all__ = [
    "MAX_ENTRIES",
    "SchedulerKeyCacheBound",
    "WorkerKeyCacheBound",
    "bound_key_cache",
    "install_key_cache_bound",
    "key_cache_plugin_name",
    "remove_key_cache_bound",
]

#: Keys the cache may hold before it is emptied (about 0.3 MiB of step keys).
MAX_ENTRIES = 1_000


def bound_key_cache(max_entries: int) -> bool:
    """Empty ``key_split``'s cache here if above ``max_entries`` keys; ``True`` if emptied."""
    if key_split.cache_info().currsize <= max_entries:
        return False
    key_split.cache_clear()
    return True


def _check_max_entries(max_entries: int) -> int:
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 0:
        raise ValueError(f"max_entries must be an integer >= 0, got {max_entries!r}")
    return max_entries


class SchedulerKeyCacheBound(SchedulerPlugin):
    """Scheduler plugin: after every graph, empty the cache if above ``max_entries`` keys."""

    def __init__(self, max_entries: int = MAX_ENTRIES):
        self.max_entries = _check_max_entries(max_entries)

    async def start(self, scheduler) -> None:
        hold_header_keys()

    def update_graph(self, scheduler, **kwargs) -> None:
        bound_key_cache(self.max_entries)


class WorkerKeyCacheBound(WorkerPlugin):
    """Worker plugin: when a task is forgotten, empty the cache if above ``max_entries`` keys."""

    def __init__(self, max_entries: int = MAX_ENTRIES):
        self.max_entries = _check_max_entries(max_entries)

    def setup(self, worker) -> None:
        hold_header_keys()

    def transition(self, key, start: str, finish: str, **kwargs) -> None:
        if finish == "forgotten":
            bound_key_cache(self.max_entries)


def key_cache_plugin_name(token: str) -> str:
    """The name both plugins of the owner ``token`` are registered under."""
    return f"dasknn-key-cache-bound-{token}"


def install_key_cache_bound(client, token: str, max_entries: int = MAX_ENTRIES) -> str:
    """Register both plugins under :func:`key_cache_plugin_name` of ``token``; returns the name."""
    name = key_cache_plugin_name(token)
    client.register_plugin(SchedulerKeyCacheBound(max_entries), name=name)
    client.register_plugin(WorkerKeyCacheBound(max_entries), name=name)
    return name


def remove_key_cache_bound(client, token: str, seconds: float | None = None) -> None:
    """Unregister both plugins of ``token``, waiting for the workers at most ``seconds``
    (``None``: until all answered)."""
    name = key_cache_plugin_name(token)
    remove_worker_plugin(client, name, seconds)
    client.unregister_scheduler_plugin(name)
