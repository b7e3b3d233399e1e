"""A short thread switch interval for the length of a ``with`` block where numba's CUDA simulator
runs the kernels in this process, and shared arrays the simulator's threads cannot split: shared by
the GPU test modules.

The simulator runs each CUDA thread of a block as a Python thread, and the thread that launched
the block polls them in a loop without blocking until all of them wait at a barrier
(``syncthreads``). With CPython's default switch interval (5 ms) the polling thread keeps the GIL
for up to 5 ms before a simulated thread may run its next step, so a barrier of 64 threads takes
tens of milliseconds; at 0.2 ms the same kernels run about four times faster (the tiled kernel,
which has no barrier, gains nothing). On a GPU nothing changes.

A cluster's workers that simulate the kernels (the engine tests) take a longer interval,
``WORKER_SWITCH_INTERVAL``: 0.2 ms there twice left a worker without a heartbeat for minutes; 1 ms
halves a tiny engine call (5 s instead of 11 s for a 32 x 3 network and 30 inputs).

The simulator makes a block's ``cuda.shared.array`` on the first call from each line, keyed by the
caller's file and line, with a look-up and an insert that are not atomic: a thread switch between
the two (more likely the shorter the interval) gives one simulated thread an array of its own, so
the others read slots it never wrote. :func:`atomic_shared_arrays` makes the look-up and the insert
one step under a lock, in this process and, by ``workers_switch_interval``, in the workers.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
from distributed import Client
from numba import config
from numba.core import types
from numba.np import numpy_support

SIMULATOR_SWITCH_INTERVAL = 2e-4  # seconds; CPython's default is 5e-3
WORKER_SWITCH_INTERVAL = 1e-3  # seconds, in the workers of a cluster

_SHARED_LOCK = threading.Lock()
_SIMULATOR_ARRAY: Callable[..., np.ndarray] | None = None  # the simulator's own, once replaced


def _shared_array(shared, shape, dtype) -> np.ndarray:
    """``FakeCUDAShared.array`` with the look-up and the insert of a new array under one lock;
    keyed, as the simulator keys it, by the caller's file and line (dynamic shared memory,
    ``shape == 0``, is one buffer and needs no key)."""
    if shape == 0:
        return _SIMULATOR_ARRAY(shared, shape, dtype)
    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    frame = sys._getframe(1)
    caller = (frame.f_code.co_filename, frame.f_lineno)
    with _SHARED_LOCK:
        array = shared._allocations.get(caller)
        if array is None:
            array = shared._allocations[caller] = np.empty(shape, dtype)
    return array


def atomic_shared_arrays() -> None:
    """Under the CUDA simulator, make each block's first ``cuda.shared.array`` call from a line
    atomic in this process (idempotent; nothing happens on a GPU)."""
    global _SIMULATOR_ARRAY
    if not config.ENABLE_CUDASIM:
        return
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    if FakeCUDAShared.array is not _shared_array:
        _SIMULATOR_ARRAY = FakeCUDAShared.array
        FakeCUDAShared.array = _shared_array


@contextmanager
def simulator_switch_interval(seconds: float = SIMULATOR_SWITCH_INTERVAL) -> Iterator[None]:
    """Under the CUDA simulator, switch threads every ``seconds`` in this process for the block,
    the interval in place before set back when it ends, and shared arrays made atomically
    (:func:`atomic_shared_arrays`, kept). Elsewhere the block runs unchanged."""
    if not config.ENABLE_CUDASIM:
        yield
        return
    atomic_shared_arrays()
    previous = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


@contextmanager
def workers_switch_interval(client: Client) -> Iterator[None]:
    """Under the CUDA simulator, switch threads every ``WORKER_SWITCH_INTERVAL`` seconds in each
    worker of ``client``'s cluster for the block, each worker's interval in place before set back
    when it ends, and shared arrays made atomically there (:func:`atomic_shared_arrays`, kept).
    Elsewhere the block runs unchanged."""
    if not config.ENABLE_CUDASIM:
        yield
        return
    client.run(atomic_shared_arrays)
    previous = client.run(sys.getswitchinterval)
    client.run(sys.setswitchinterval, WORKER_SWITCH_INTERVAL, workers=list(previous))
    try:
        yield
    finally:
        for address, seconds in previous.items():
            client.run(sys.setswitchinterval, seconds, workers=[address])
