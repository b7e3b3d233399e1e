"""A bound on ``dask.utils.key_split``'s cache, which keeps alive every key a process has seen.

Dask names the prefix of every task with ``dask.utils.key_split``, a ``functools.lru_cache`` of
100,000 entries: the scheduler calls it for every task it creates, every worker for every task it
learns of. The cache keeps each key it was called with alive, about 330 bytes for a step key of the
model-parallel trainer (the key tuple, its name string, its step number and the cache's entry). A
run whose keys never repeat (every step key carries the step number, so no key of an earlier step is
used again) adds one entry per key: a 256-neuron, 4-layer network at P = 2 makes about 16 keys a
step, and without a bound the scheduler and every worker grow by about 5 MiB per 1,000 steps until,
after some 6,000 steps, the cache is full at about 31 MiB a process (``docs/reliability.md``, ``##
Long runs: memory (soak)``).

:class:`SchedulerKeyCacheBound` (a scheduler plugin, checked at every graph the scheduler receives)
and :class:`WorkerKeyCacheBound` (a worker plugin, checked whenever a worker forgets a task) empty
the cache once it holds more than ``max_entries`` keys. Clearing a cache changes no result; the
keys of a run that never repeats its keys never hit it anyway, a prefix a later task needs is
computed again in about 0.1-0.4 microseconds more than a hit, and emptying 1,000 entries takes
about 16 microseconds (``docs/benchmarks.md``, Soak). The bound of :data:`MAX_ENTRIES` keys is
reached early in a run (about 60 steps at 16 keys a step; 500 on the soak's scheduler and 1,000
on its workers with posted messages, 2 and 1 keys a step), after which the cache adds no memory.
:func:`install_key_cache_bound` registers both under names of a model's own,
:func:`remove_key_cache_bound` removes them.

Both plugins also hold Dask's serialization header keys interned in their process when they start
(:func:`~dasknn.runtime.header_keys.hold_header_keys`, another bound on what Dask's messages
leave behind), so every scheduler and worker a distributed model runs on holds them.
"""

from __future__ import annotations

from dask.utils import key_split
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from dasknn.runtime.header_keys import hold_header_keys
from dasknn.runtime.waiting import call_at_most

__all__ = [
    "MAX_ENTRIES",
    "SchedulerKeyCacheBound",
    "WorkerKeyCacheBound",
    "bound_key_cache",
    "install_key_cache_bound",
    "key_cache_plugin_name",
    "remove_key_cache_bound",
]

#: Keys the cache may hold before it is emptied (about 0.3 MiB of step keys; the soak's scheduler
#: reaches it within its 500-batch warm-up, at about 2 new keys a batch).
MAX_ENTRIES = 1_000


def bound_key_cache(max_entries: int) -> bool:
    """Empty this process's ``key_split`` cache if it holds more than ``max_entries`` keys;
    ``True`` if it was emptied."""
    if key_split.cache_info().currsize <= max_entries:
        return False
    key_split.cache_clear()
    return True


def _check_max_entries(max_entries: int) -> int:
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 0:
        raise ValueError(f"max_entries must be an integer >= 0, got {max_entries!r}")
    return max_entries


class SchedulerKeyCacheBound(SchedulerPlugin):
    """Scheduler plugin: after every graph the scheduler receives (it has just called
    ``key_split`` on the graph's new keys), empty the cache if it holds more than
    ``max_entries`` keys."""

    def __init__(self, max_entries: int = MAX_ENTRIES):
        self.max_entries = _check_max_entries(max_entries)

    async def start(self, scheduler) -> None:
        hold_header_keys()

    def update_graph(self, scheduler, **kwargs) -> None:
        bound_key_cache(self.max_entries)


class WorkerKeyCacheBound(WorkerPlugin):
    """Worker plugin, on every worker present and future: whenever the worker forgets a task,
    empty the cache if it holds more than ``max_entries`` keys."""

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
    """Unregister both plugins of ``token`` (registered by :func:`install_key_cache_bound`),
    waiting for the workers at most ``seconds`` (``None``: until all answered; see
    :func:`~dasknn.runtime.waiting.call_at_most`)."""
    name = key_cache_plugin_name(token)
    call_at_most(lambda: client.unregister_worker_plugin(name), seconds)
    client.unregister_scheduler_plugin(name)
