"""A short thread switch interval for the length of a ``with`` block where numba's CUDA simulator
runs the kernels in this process: shared by the GPU test modules.

The simulator runs each CUDA thread of a block as a Python thread, and the thread that launched
the block polls them in a loop without blocking until all of them wait at a barrier
(``syncthreads``). With CPython's default switch interval (5 ms) the polling thread keeps the GIL
for up to 5 ms before a simulated thread may run its next step, so a barrier of 64 threads takes
tens of milliseconds; at 0.2 ms the same kernels run about four times faster (the tiled kernel,
which has no barrier, gains nothing). On a GPU nothing changes. Only the test process: in a
cluster's workers the same setting twice left a worker without a heartbeat for minutes.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from numba import config

SIMULATOR_SWITCH_INTERVAL = 2e-4  # seconds; CPython's default is 5e-3


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
