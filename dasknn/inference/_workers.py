"""What a task learns about the Dask worker it runs on: its address, threads and peak memory."""

from __future__ import annotations

import resource

import numba

__all__ = ["peak_rss", "worker_name", "worker_threads"]


def worker_threads() -> tuple[str, int]:
    """The address and thread count of the Dask worker running the caller; outside a worker,
    ``"local"`` and numba's thread count."""
    from distributed import get_worker

    try:
        worker = get_worker()
    except ValueError:
        return "local", numba.get_num_threads()
    return worker.address, max(1, int(worker.state.nthreads))


def worker_name() -> str:
    """The address of the Dask worker running the caller, ``"local"`` outside a worker."""
    return worker_threads()[0]


def peak_rss() -> int:
    """Peak resident memory of this process in bytes.

    Linux: ``VmHWM`` of ``/proc/self/status`` (``ru_maxrss`` keeps the parent's across
    ``execve``). Elsewhere: ``ru_maxrss``.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
