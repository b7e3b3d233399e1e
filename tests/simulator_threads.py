"""A short thread switch interval for the length of a ``with`` block where numba's CUDA simulator
runs the kernels, in this process and in a cluster's workers: shared by the GPU test modules.

The simulator runs each CUDA thread of a block as a Python thread, and the thread that launched
the block polls them in a loop without blocking until all of them wait at a barrier
(``syncthreads``). With CPython's default switch interval (5 ms) the polling thread keeps the GIL
for up to 5 ms before a simulated thread may run its next step, so a barrier of 64 threads takes
tens of milliseconds; at 0.2 ms the same kernels run about four times faster (the tiled kernel,
which has no barrier, gains nothing). On a GPU nothing changes.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from numba import config

SIMULATOR_SWITCH_INTERVAL = 2e-4  # seconds; CPython's default is 5e-3


def _set_switch_interval(seconds: float) -> float:
    """Set this process's thread switch interval; return the one it replaces."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    return previous


@contextmanager
def simulator_switch_interval(client=None) -> Iterator[None]:
    """Under the CUDA simulator, switch threads every ``SIMULATOR_SWITCH_INTERVAL`` seconds in
    this process and in the workers of ``client`` (when given) for the block; the intervals in
    place before are set back when it ends. Elsewhere the block runs unchanged."""
    if not config.ENABLE_CUDASIM:
        yield
        return
    previous = _set_switch_interval(SIMULATOR_SWITCH_INTERVAL)
    workers = {} if client is None else client.run(_set_switch_interval, SIMULATOR_SWITCH_INTERVAL)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)
        for address, seconds in workers.items():
            client.run(_set_switch_interval, seconds, workers=[address])
