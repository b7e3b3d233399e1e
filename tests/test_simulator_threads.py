"""The simulator harness of the GPU test modules (``tests/simulator_threads.py``): within
``simulator_switch_interval``, which puts ``atomic_shared_arrays`` in place, every simulated
thread of a block shares one ``cuda.shared.array``, even with a thread switch at nearly every
step.

Without it one launch in 20 to 40 (measured) gives a thread an array of its own at a 1 us switch
interval (the others then read a slot it never wrote); 400 launches miss that with a chance near
1e-4.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import config, cuda
from simulator_threads import simulator_switch_interval

pytestmark = pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="numba's CUDA simulator is off")

THREADS = 64
LAUNCHES = 400
SWITCH_INTERVAL = 1e-6  # seconds: a switch at nearly every bytecode


@cuda.jit
def _count_writes(out):
    """Each thread sets its slot of a shared array, waits at a barrier and counts the set slots."""
    seen = cuda.shared.array(THREADS, dtype=np.int32)
    t = cuda.threadIdx.x
    seen[t] = 1
    cuda.syncthreads()
    count = 0
    for i in range(THREADS):
        count += seen[i]
    out[t] = count


@pytest.mark.slow  # about 15 s of simulated launches
def test_every_thread_of_a_block_sees_every_write_to_a_shared_array():
    counts = []
    with simulator_switch_interval(SWITCH_INTERVAL):  # with atomic_shared_arrays in place
        for _ in range(LAUNCHES):
            out = np.zeros(THREADS, dtype=np.int32)
            _count_writes[1, THREADS](out)
            counts.append(out)
    assert (np.array(counts) == THREADS).all()
