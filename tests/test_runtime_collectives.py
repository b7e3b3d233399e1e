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

INDEX_BYTES = 8


@pytest.fixture(scope="module")
def five_workers():
    """Five single-threaded in-process workers; a collective over N of them uses the first N."""
    with LocalCluster(
        n_workers=5, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:
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
    for shape, dtype in [((1000 + nworkers,), "float64"), ((3,), "int32"), ((0,), "float32"),
                         ((7, 3), "float32"), ((), "int64")]:
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


def _run_alltoallv(client, workers, rng):
    n = len(workers)
    counts = rng.integers(0, 4, size=(n, n))
    counts[0, :] = 0  # the first worker sends nothing, not even to itself
    arrays = [rng.integers(0, 1000, size=(int(counts[i].sum()), 3)) for i in range(n)]
    coll = collectives.alltoallv(client, _place(client, arrays, workers), workers, counts)
    offsets = np.concatenate([np.zeros((n, 1), int), np.cumsum(counts, axis=1)], axis=1)
    results = client.gather(coll.outputs)
    row = 3 * arrays[0].itemsize
    formula: Counter = Counter()
    for j in range(n):
        blocks = [arrays[i][offsets[i, j] : offsets[i, j + 1]] for i in range(n)]
        np.testing.assert_array_equal(results[j], np.concatenate(blocks))
        for i in range(n):
            if i != j:
                formula[("alltoallv", i, j)] = int(counts[i, j]) * row
    _check_bytes(client, coll, formula, n * (n - 1))
    assert sum(formula.values()) == row * int(counts.sum() - np.trace(counts))


@pytest.mark.parametrize("nworkers", [1, 2, 3, 4, 5])
def test_alltoallv(five_workers, nworkers):
    client, all_workers = five_workers
    _run_alltoallv(client, all_workers[:nworkers], np.random.default_rng(20 + nworkers))


def _sharding(rng, n, rows):
    """Random uneven row blocks (some empty) of a table of ``rows`` rows over ``n`` owners."""
    cuts = np.sort(rng.integers(0, rows + 1, size=n - 1))
    bounds = np.concatenate([[0], cuts, [rows]]).astype(int)
    return bounds


def _distinct_per_owner(indices, bounds):
    """``u[j]``: the distinct entries of ``indices`` in owner ``j``'s rows."""
    unique = np.unique(indices)
    owners = np.searchsorted(bounds, unique, side="right") - 1
    return np.bincount(owners, minlength=len(bounds) - 1)


def _run_pull(client, workers, rng):
    n = len(workers)
    table = rng.standard_normal((23, 4))
    bounds = _sharding(rng, n, len(table))
    shards = [table[bounds[j] : bounds[j + 1]] for j in range(n)]
    wanted = [rng.integers(0, len(table), size=int(rng.integers(0, 15))) for _ in range(n)]
    wanted[-1] = np.array([], dtype=np.int64)  # a worker that asks for nothing
    coll = collectives.pull(
        client, _place(client, shards, workers), _place(client, wanted, workers), workers
    )
    results = client.gather(coll.outputs)
    row = table.shape[1] * table.itemsize
    formula: Counter = Counter()
    for i in range(n):
        np.testing.assert_array_equal(results[i], table[wanted[i]])
        assert results[i].shape == (len(wanted[i]), 4)
        distinct = _distinct_per_owner(wanted[i], bounds)
        for j in range(n):
            if i != j:
                formula[("pull-indices", i, j)] = INDEX_BYTES * int(distinct[j])
                formula[("pull-rows", j, i)] = row * int(distinct[j])
    _check_bytes(client, coll, formula, 2 * n * (n - 1))


@pytest.mark.parametrize("nworkers", [1, 2, 3, 4, 5])
def test_row_sparse_pull(five_workers, nworkers):
    client, all_workers = five_workers
    rng = np.random.default_rng(30 + nworkers)
    for _ in range(2):
        _run_pull(client, all_workers[:nworkers], rng)


def _run_push(client, workers, rng):
    n = len(workers)
    rows_total = 19
    bounds = _sharding(rng, n, rows_total)
    sizes = list(np.diff(bounds))
    indices = [rng.integers(0, rows_total, size=int(rng.integers(0, 12))) for _ in range(n)]
    indices[0] = np.array([], dtype=np.int32)  # a worker that pushes nothing
    # Integer-valued rows: the sums are exact in any order of addition.
    rows = [rng.integers(-9, 10, size=(len(idx), 2, 3)).astype("float64") for idx in indices]
    coll = collectives.push(
        client, _place(client, indices, workers), _place(client, rows, workers), workers, sizes
    )
    results = client.gather(coll.outputs)
    total = np.zeros((rows_total, 2, 3))
    for idx, values in zip(indices, rows, strict=True):
        np.add.at(total, idx, values)
    np.testing.assert_array_equal(np.concatenate(results), total)
    row = 2 * 3 * 8
    formula: Counter = Counter()
    for i in range(n):
        distinct = _distinct_per_owner(indices[i], bounds)
        for j in range(n):
            if i != j:
                formula[("push-indices", i, j)] = INDEX_BYTES * int(distinct[j])
                formula[("push-rows", i, j)] = row * int(distinct[j])
    _check_bytes(client, coll, formula, 2 * n * (n - 1))


@pytest.mark.parametrize("nworkers", [1, 2, 3, 4, 5])
def test_row_sparse_push(five_workers, nworkers):
    client, all_workers = five_workers
    rng = np.random.default_rng(40 + nworkers)
    for _ in range(2):
        _run_push(client, all_workers[:nworkers], rng)


def test_every_collective_across_worker_processes(dask_client):
    """The same on two worker processes: values and bytes really cross process boundaries."""
    install_comm_monitor(dask_client)
    workers = sorted(scheduler_workers(dask_client))
    rng = np.random.default_rng(50)
    _run_allreduce(dask_client, workers, rng, (1001,), "float64")
    _run_allgather(dask_client, workers, rng, [3, 0], stack=False)
    _run_alltoallv(dask_client, workers, rng)
    _run_pull(dask_client, workers, rng)
    _run_push(dask_client, workers, rng)


def _task_count(client) -> int:
    return client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))


def test_bad_input_is_rejected_before_scheduling(five_workers):
    client, all_workers = five_workers
    workers = all_workers[:2]
    a = _place(client, [np.zeros(4), np.zeros(4, dtype="float32")], workers)
    b = _place(client, [np.zeros(4), np.zeros(5)], workers)
    good = _place(client, [np.zeros((2, 3)), np.zeros((1, 3))], workers)
    index = _place(client, [np.array([0, 2]), np.array([7])], workers)
    floats = _place(client, [np.zeros(2), np.zeros(1)], workers)
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
        (lambda: collectives.alltoallv(client, good, workers, [[2, 1], [0, 1]]), "sums to"),
        (lambda: collectives.alltoallv(client, good, workers, [[2, 0]]), "2 x 2"),
        (lambda: collectives.pull(client, good, index, workers), "outside"),
        (lambda: collectives.pull(client, good, floats, workers), "integer"),
        (lambda: collectives.push(client, index, b, workers, [4, 4]), "pushes 4 rows"),
        (lambda: collectives.push(client, index, good, workers, [4, -1]), "non-negative"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    assert _task_count(client) == before
