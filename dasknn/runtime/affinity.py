"""Pin worker processes, all their threads, to cores of their own.

Worker processes on one machine share its cores with each other, with the scheduler and the
client, and the kernel places their threads where a core is free. :class:`PinCores` is a worker
plugin that gives each named worker one core of those its process may run on (the ``slot``-th,
so the workers of one host get different cores while there are enough): every thread of the
process is bound to it with ``os.sched_setaffinity``, and threads started later inherit the
binding. Removing the plugin restores every thread to the process's cores as they were. Workers
the plugin does not name, and systems without ``os.sched_setaffinity`` (not Linux), are left as
they are.

:class:`~dasknn.pipeline_parallel.DistributedCompressedMLP` installs it for its stage workers
with ``pin_cores=True``, and by default on a local cluster of its own where the machine has more
cores than stage workers (``docs/benchmarks.md`` gives the measured effect on the pipeline's idle
fractions).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from distributed.comm import get_address_host
from distributed.diagnostics.plugin import WorkerPlugin

__all__ = [
    "PLUGIN_NAME",
    "PinCores",
    "host_slots",
    "migrations",
    "pin_by_default",
    "pinned_core",
    "usable_cores",
]

PLUGIN_NAME = "dasknn-pin-cores"


def usable_cores() -> set[int]:
    """The cores this process may run on (every core where the system cannot tell)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def pin_by_default(own_cluster: bool, workers: int) -> bool:
    """Whether ``workers`` workers are pinned when no one said: on a local cluster dasknn started
    itself (``own_cluster``) whose machine has more cores than ``workers``."""
    return own_cluster and len(usable_cores()) > workers


def host_slots(addresses: Iterable[str]) -> dict[str, int]:
    """Each address's position among the given addresses of its host (in the given order)."""
    taken: dict[str, int] = {}
    slots = {}
    for address in addresses:
        host = get_address_host(address)
        slots[address] = taken.get(host, 0)
        taken[host] = slots[address] + 1
    return slots


def _threads() -> list[int]:
    """The ids of this process's threads."""
    return [int(name) for name in os.listdir("/proc/self/task")]


def _bind_threads(cores: set[int]) -> None:
    """Bind every thread of this process to ``cores`` (threads that ended meanwhile skipped)."""
    for thread in _threads():
        try:
            os.sched_setaffinity(thread, cores)
        except ProcessLookupError:
            pass


class PinCores(WorkerPlugin):
    """Worker plugin binding each worker of ``slots`` to one core, kept as the worker attribute
    ``dasknn_pinned_core`` (``None`` if left as it was).

    Parameters
    ----------
    slots : dict of str to int
        Worker address to its slot: the ``slot``-th (modulo) of the cores its process may use.
    """

    name = PLUGIN_NAME

    def __init__(self, slots: dict[str, int]) -> None:
        self.slots = dict(slots)
        self.original: set[int] | None = None

    def setup(self, worker) -> None:
        worker.dasknn_pinned_core = None
        slot = self.slots.get(worker.address)
        if slot is None or not hasattr(os, "sched_setaffinity"):
            return
        self.original = os.sched_getaffinity(0)
        allowed = sorted(self.original)
        core = allowed[slot % len(allowed)]
        _bind_threads({core})
        worker.dasknn_pinned_core = core

    def teardown(self, worker) -> None:
        if self.original is not None:
            _bind_threads(self.original)
            self.original = None
        worker.dasknn_pinned_core = None


def pinned_core(dask_worker) -> tuple[int | None, list[list[int]]]:
    """For ``Client.run``: the worker's pinned core (``None`` if not pinned) and the cores each
    of its threads may run on."""
    cores = []
    for thread in _threads():
        try:
            cores.append(sorted(os.sched_getaffinity(thread)))
        except ProcessLookupError:
            pass
    return getattr(dask_worker, "dasknn_pinned_core", None), cores


def migrations(thread: int | None = None) -> int:
    """``se.nr_migrations`` of a thread of this process (default the caller's); 0 if not
    reported."""
    path = "/proc/thread-self/sched" if thread is None else f"/proc/self/task/{thread}/sched"
    try:
        with open(path) as sched:
            for line in sched:
                if line.startswith("se.nr_migrations"):
                    return int(line.split(":")[1])
    except OSError:
        pass
    return 0
