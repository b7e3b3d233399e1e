"""A short thread switch interval for the length of a ``with`` block where numba's CUDA simulator
runs the kernels in this process: shared by the GPU test modules.

The simulator runs each CUDA thread of a block as a Python thread, and the thread that launched
the block polls them in a loop without blocking until all of them wait at a barrier
(``syncthreads``). With CPython's default switch interval (5 ms) the polling thread keeps the GIL
for up to 5 ms before a simulated thread may run its next step, so a barrier of 64 threads takes
tens of milliseconds; at 0.2 ms the same kernels run about four times faster (the tiled kernel,
which has no barrier, gains nothing). On a GPU nothing changes.

A cluster's workers that simulate the kernels (the engine tests) take a longer interval,
``WORKER_SWITCH_INTERVAL``: 0.2 ms there twice left a worker without a heartbeat for minutes; 1 ms
halves a tiny engine call (5 s instead of 11 s for a 32 x 3 network and 30 inputs).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from distributed import Client
from numba import config

SIMULATOR_SWITCH_INTERVAL = 2e-4  # seconds; CPython's default is 5e-3
WORKER_SWITCH_INTERVAL = 1e-3  # seconds, in the workers of a cluster


@contextmanager
def simulator_switch_interval() -> Iterator[None]:
    """Under the CUDA simulator, switch threads every ``SIMULATOR_SWITCH_INTERVAL`` seconds in
    this process for the block; the interval in place before is set back when it ends. Elsewhere
    the block runs unchanged."""
    if not config.ENABLE_CUDASIM:
        yield
        return
    previous = sys.getswitchinterval()
    sys.setswitchinterval(SIMULATOR_SWITCH_INTERVAL)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


@contextmanager
def workers_switch_interval(client: Client) -> Iterator[None]:
    """Under the CUDA simulator, switch threads every ``WORKER_SWITCH_INTERVAL`` seconds in each
    worker of ``client``'s cluster for the block; each worker's interval in place before is set
    back when it ends. Elsewhere the block runs unchanged."""
    if not config.ENABLE_CUDASIM:
        yield
        return
    previous = client.run(sys.getswitchinterval)
    client.run(sys.setswitchinterval, WORKER_SWITCH_INTERVAL, workers=list(previous))
    try:
        yield
    finally:
        for address, seconds in previous.items():
            client.run(sys.setswitchinterval, seconds, workers=[address])
