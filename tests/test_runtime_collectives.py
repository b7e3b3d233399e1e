"""Collectives as task graphs: results equal numpy on random uneven inputs for N = 1..5 workers
(empty contributions included), and the bytes the transfer monitor measures per phase, sender and
receiver equal each collective's formula exactly; bad input is rejected before scheduling."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from distributed import Client, LocalCluster

from dasknn.runtime import collectives
from dasknn.runtime.cluster import scheduler_workers
from dasknn.runtime.collectives import chunk_bounds
from dasknn.runtime.measure import install_comm_monitor, read_transfers

pytestmark = pytest.mark.minversions  # also run at the minimum versions (.ci/run)


@pytest.fixture(scope="module")
def five_workers():
    """Five single-threaded in-process workers; a collective over N of them uses the first N."""
    with (
        LocalCluster(
            n_workers=5, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        install_comm_monitor(client)
        yield client, sorted(scheduler_workers(client))


def _place(client, arrays, workers):
    """One future per worker, holding its array there."""
    return [
        client.scatter(array, workers=[worker], hash=False)
        for array, worker in zip(arrays, workers, strict=True)
    ]


def _measured(client, coll) -> Counter:
    """``{(phase, sender position, receiver position): bytes}`` and the message count."""
    position = {w: i for i, w in enumerate(coll.workers)}
    measured: Counter = Counter()
    messages = 0
    for layer, phase, sender, receiver, nbytes, count in read_transfers(client, coll.token):
        assert layer is None
        measured[(phase, position[sender], position[receiver])] += nbytes
        messages += count
    return measured, messages


def _check_bytes(client, coll, expected: Counter, messages: int) -> None:
    measured, measured_messages = _measured(client, coll)
    assert +measured == +expected
    assert sum(measured.values()) == sum(expected.values())
    assert measured_messages == messages


def _run_allreduce(client, workers, rng, shape, dtype):
    n = len(workers)
    if np.dtype(dtype).kind == "f":
        arrays = [rng.standard_normal(shape).astype(dtype) for _ in range(n)]
    else:
        arrays = [rng.integers(-100, 100, size=shape).astype(dtype) for _ in range(n)]
    coll = collectives.allreduce(client, _place(client, arrays, workers), workers)
    expected = arrays[0].copy()
    for array in arrays[1:]:
        expected += array  # the order the workers add in
    for result in client.gather(coll.outputs):
        np.testing.assert_array_equal(result, expected)
        assert result.shape == expected.shape and result.dtype == expected.dtype
    size, itemsize = int(np.prod(shape)), np.dtype(dtype).itemsize
    bounds = chunk_bounds(size, n)
    chunk = [bounds[j + 1] - bounds[j] for j in range(n)]
    formula: Counter = Counter()
    for i in range(n):
        for j in range(n):
            if i != j:
                formula[("reduce-scatter", i, j)] = chunk[j] * itemsize
                formula[("allgather", i, j)] = chunk[i] * itemsize
    _check_bytes(client, coll, formula, 2 * n * (n - 1))
    # The closed forms: 2 (N - 1) n s in all; worker i receives s ((N - 1) c_i + n - c_i).
    assert sum(formula.values()) == 2 * (n - 1) * size * itemsize
    for i in range(n):
        received = sum(v for (_, _, r), v in formula.items() if r == i)
        assert received == itemsize * ((n - 1) * chunk[i] + size - chunk[i])


@pytest.mark.parametrize("nworkers", [1, 2, 3, 4, 5])
def test_allreduce(five_workers, nworkers):
    client, all_workers = five_workers
    workers = all_workers[:nworkers]
    rng = np.random.default_rng(nworkers)
    for shape, dtype in [
        ((1000 + nworkers,), "float64"),
        ((3,), "int32"),
        ((0,), "float32"),
        ((7, 3), "float32"),
        ((), "int64"),
    ]:
        _run_allreduce(client, workers, rng, shape, dtype)


def _run_allgather(client, workers, rng, lengths, stack):
    n = len(workers)
    if stack:
        arrays = [rng.standard_normal((lengths[0], 2)) for _ in range(n)]
        coll = collectives.allgather(client, _place(client, arrays, workers), workers)
        expected = np.stack(arrays)
    else:
        arrays = [rng.standard_normal((length, 2)).astype("float32") for length in lengths]
        coll = collectives.allgatherv(client, _place(client, arrays, workers), workers)
        expected = np.concatenate(arrays)
    for result in client.gather(coll.outputs):
        np.testing.assert_array_equal(result, expected)
    formula: Counter = Counter()
    for i in range(n):
        for j in range(n):
            if i != j:
                formula[("allgather", i, j)] = arrays[i].nbytes
    _check_bytes(client, coll, formula, n * (n - 1))
    assert sum(formula.values()) == (n - 1) * sum(a.nbytes for a in arrays)


@pytest.mark.parametrize("nworkers", [1, 2, 3, 4, 5])
def test_allgather_and_allgatherv(five_workers, nworkers):
    client, all_workers = five_workers
    workers = all_workers[:nworkers]
    rng = np.random.default_rng(10 + nworkers)
    _run_allgather(client, workers, rng, [4], stack=True)
    lengths = list(rng.integers(0, 6, size=nworkers))
    lengths[nworkers // 2] = 0  # an empty contribution
    _run_allgather(client, workers, rng, lengths, stack=False)
    _run_allgather(client, workers, rng, [0] * nworkers, stack=False)


def test_every_collective_across_worker_processes(dask_client):
    """The same on two worker processes: values and bytes really cross process boundaries."""
    install_comm_monitor(dask_client)
    workers = sorted(scheduler_workers(dask_client))
    rng = np.random.default_rng(50)
    _run_allreduce(dask_client, workers, rng, (1001,), "float64")
    _run_allgather(dask_client, workers, rng, [3, 0], stack=False)


def _task_count(client) -> int:
    return client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))


def test_bad_input_is_rejected_before_scheduling(five_workers):
    client, all_workers = five_workers
    workers = all_workers[:2]
    a = _place(client, [np.zeros(4), np.zeros(4, dtype="float32")], workers)
    b = _place(client, [np.zeros(4), np.zeros(5)], workers)
    good = _place(client, [np.zeros((2, 3)), np.zeros((1, 3))], workers)
    before = _task_count(client)
    cases = [
        (lambda: collectives.allreduce(client, [], []), "at least one worker"),
        (lambda: collectives.allreduce(client, a, workers), "dtype"),
        (lambda: collectives.allreduce(client, b, workers), "shape"),
        (lambda: collectives.allreduce(client, a[:1], workers), "one input per worker"),
        (lambda: collectives.allreduce(client, b, [workers[0]] * 2), "distinct"),
        (lambda: collectives.allreduce(client, b, ["tcp://nowhere:1", workers[1]]), "not workers"),
        (lambda: collectives.allreduce(client, b[::-1], workers), "not a numpy array in memory"),
        (lambda: collectives.allgather(client, good, workers), "shape"),
        (lambda: collectives.allgatherv(client, a, workers), "dtype"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    assert _task_count(client) == before
