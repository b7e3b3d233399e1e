"""Dask's size of the values dasknn keeps on workers and moves between them counts their arrays.

``dask.sizeof`` falls back on ``sys.getsizeof`` for a type it does not know, which for a
dataclass of arrays is the instance alone (56 bytes for a window of packed layers of 33 MB):
a worker's memory accounting (its spilling and pausing) and the scheduler's transfer costs
then do not see them. Each such type gives its arrays' bytes in ``__sizeof__``.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from dask.sizeof import sizeof

from dasknn.datasets import radixnet
from dasknn.inference._batches import BatchResult
from dasknn.inference._broadcast import broadcast
from dasknn.inference._cpu_inference import StreamedBatch
from dasknn.kernels.inference import pack_layers, start_batch
from dasknn.model_parallel._plan import build_comm_plan

pytestmark = pytest.mark.minversions  # also run at the minimum versions (.ci/run)

#: What a value's size may exceed its arrays' bytes by (the objects holding them).
OVERHEAD = 1024


def _inputs(rows: int, neurons: int) -> sp.csr_matrix:
    return sp.random(rows, neurons, density=0.2, format="csr", random_state=0, dtype=np.float64)


def _within(value, arrays_bytes: int) -> None:
    assert arrays_bytes <= sizeof(value) <= arrays_bytes + OVERHEAD, (sizeof(value), arrays_bytes)


def test_packed_layers_count_their_arrays():
    packed = pack_layers(radixnet(64, 6), np.float32)
    _within(packed, packed.nbytes)


def test_a_batch_between_windows_counts_its_state():
    state = start_batch(_inputs(40, 64), np.float64)
    arrays = state.rows.nbytes + state.block.nbytes
    _within(state, arrays)
    _within(StreamedBatch(state=state), arrays)


def test_a_batch_result_counts_its_rows():
    result = BatchResult(rows=np.arange(5000), macs_done=1, macs_needed=1, kernel_seconds=0.0)
    _within(result, result.rows.nbytes)


def test_a_layer_plan_counts_its_arrays():
    layers = radixnet(64, 2)
    parts = [np.arange(64) % 3 for _ in range(3)]
    plan, _ = build_comm_plan(layers, parts, 3)
    for part_plan in plan.layers[1]:
        arrays = [part_plan.indptr, part_plan.groups, part_plan.own, *part_plan.send.values()]
        _within(part_plan, sum(a.nbytes for a in arrays))


def _scheduler_nbytes(key: str, dask_scheduler=None) -> int:
    return dask_scheduler.tasks[key].nbytes


def test_the_scheduler_counts_a_broadcast_window(dask_client):
    """A window broadcast to two workers: the scheduler's size of its key is the window's."""
    packed = pack_layers(radixnet(256, 12), np.float32)
    placed = broadcast(dask_client, packed, 30)
    nbytes = dask_client.run_on_scheduler(_scheduler_nbytes, placed.key)
    assert packed.nbytes <= nbytes <= packed.nbytes + OVERHEAD, (nbytes, packed.nbytes)
    placed.release()
