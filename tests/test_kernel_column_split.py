"""The CPU challenge kernel's column split: the same results bit for bit on 1 and 2 threads.

When a layer has fewer live tiles than numba threads, ``advance`` splits each tile's output columns
among the threads and sums the chunks' lane hits and counts per tile. A column's sum keeps its
order, so rows, activations and multiply-add counts must not depend on the thread count or on the
split; categories are checked against the float64 scipy reference of
``tests/test_challenge_correctness.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numba
import numpy as np
import pytest
import scipy.sparse as sp
from test_challenge_correctness import reference_challenge

from dasknn.datasets import load_mnist_test, mnist_to_challenge_inputs, read_challenge_network
from dasknn.kernels.inference import (
    LANES,
    MIN_CHUNK_COLUMNS,
    _column_chunks,
    advance,
    live_activations,
    live_rows,
    pack_layers,
    start_batch,
)

BATCH_ROWS = (1, 2, 17, 63, 64, 65, 100, 128, 129, 200)


@contextmanager
def numba_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` numba threads, then restore the previous count."""
    if n > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"numba has {numba.config.NUMBA_NUM_THREADS} threads, the test needs {n}")
    before = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        yield
    finally:
        numba.set_num_threads(before)


def run_kernel(inputs, packed, bias: float, dtype, threads: int, split_columns: bool = True):
    """(rows, activations, macs_done, macs_needed) of one batch on ``threads`` numba threads."""
    with numba_threads(threads):
        state = advance(start_batch(inputs, dtype), packed, bias, split_columns=split_columns)
    return live_rows(state), live_activations(state), state.macs_done, state.macs_needed


def assert_same_run(got, expected) -> None:
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])
    assert got[1].dtype == expected[1].dtype
    assert got[2:] == expected[2:]


@pytest.mark.parametrize(
    ("n_tiles", "n", "threads", "chunks"),
    [
        (1, 1024, 1, 1),  # one thread never splits
        (2, 1024, 2, 1),  # as many tiles as threads
        (1, 1024, 2, 2),  # this machine: one tile, two threads
        (1, 300, 2, 1),  # too few columns for two chunks of MIN_CHUNK_COLUMNS
        (4, 1024, 16, 4),  # 16 items for 16 threads
        (3, 65536, 16, 16),  # 48 items, 3 a thread
        (6, 65536, 16, 8),  # 48 items, 3 a thread
        (3, 1024, 16, 4),  # at most 1024 // 256 chunks
        (1, 65536, 16, 16),
        (17, 65536, 16, 1),
    ],
)
def test_column_chunks(n_tiles, n, threads, chunks):
    assert MIN_CHUNK_COLUMNS == 256
    assert _column_chunks(n_tiles, n, threads) == chunks


def test_column_chunks_cover_the_threads_with_wide_chunks():
    for n in (64, 256, 511, 512, 1024, 4096, 65536):
        for threads in range(1, 33):
            for n_tiles in range(1, 40):
                chunks = _column_chunks(n_tiles, n, threads)
                most = max(1, n // MIN_CHUNK_COLUMNS)
                assert 1 <= chunks <= most
                assert n_tiles * chunks >= threads or chunks == most
                if n_tiles >= threads:
                    assert chunks == 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_kept_alive_by_one_chunk_only(dtype):
    """One tile on 2 threads: the two chunks are columns 0-511 and 512-1023.

    Row 0 lives only through columns of the first chunk, row 1 only through columns of the
    second, in both layers; row 2 dies in layer 1. A reduction that missed a chunk's lane hits
    would drop row 0 or row 1, one that missed its counts would change the multiply-adds.
    """
    n = 1024
    assert _column_chunks(1, n, 2) == 2
    first = sp.csr_matrix(([1.0, 2.0, -1.0], ([5, 7, 9], [3, 1000, 600])), shape=(n, n))
    second = sp.csr_matrix(([0.5, 1.5], ([3, 1000], [1020, 10])), shape=(n, n))
    inputs = sp.csr_matrix(([1.0, 1.0, 1.0], ([0, 1, 2], [5, 7, 9])), shape=(3, n))
    packed = pack_layers([first, second], dtype)
    split = run_kernel(inputs, packed, 0.0, dtype, threads=2)
    np.testing.assert_array_equal(split[0], [0, 1])
    expected = np.zeros((2, n), dtype=dtype)
    expected[0, 1020] = 0.5
    expected[1, 10] = 3.0
    np.testing.assert_array_equal(split[1], expected)
    # layer 1 accumulates the sections of inputs 5, 7 and 9, layer 2 those of 3 and 1000
    assert split[2] == LANES * (3 + 2)
    # nnz(y) * nnz(W[j, :]): 3 inputs of one weight each, then outputs 3 and 1000 of layer 1
    assert split[3] == 3 + 2
    assert_same_run(run_kernel(inputs, packed, 0.0, dtype, threads=1), split)
    assert_same_run(run_kernel(inputs, packed, 0.0, dtype, threads=2, split_columns=False), split)


def _random_network(n: int, depth: int, seed: int) -> list[sp.csr_matrix]:
    """Sparse layers of about 16 inputs a column (weights in [-0.9, 1)): with the bias -0.25, the
    200 rows of ``random_case`` go from 4 tiles down to 17 rows over the layers."""
    rng = np.random.default_rng(seed)
    return [
        sp.random(
            n,
            n,
            density=16 / n,
            random_state=rng,
            format="csr",
            data_rvs=lambda k: rng.uniform(-0.9, 1.0, k),
        )
        for _ in range(depth)
    ]


@pytest.fixture(scope="module")
def random_case():
    n = 1024
    layers = _random_network(n, 24, seed=11)
    inputs = sp.random(200, n, density=0.03, random_state=np.random.default_rng(12), format="csr")
    return layers, inputs, -0.25


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_threads_and_split_do_not_change_a_random_network(random_case, dtype):
    layers, inputs, bias = random_case
    packed = pack_layers(layers, dtype)
    for rows in BATCH_ROWS:
        batch = inputs[:rows]
        one = run_kernel(batch, packed, bias, dtype, threads=1)
        assert_same_run(run_kernel(batch, packed, bias, dtype, threads=2), one)
        assert_same_run(run_kernel(batch, packed, bias, dtype, threads=2, split_columns=False), one)
        if dtype == np.float64:
            expected, activations = reference_challenge(batch, layers, bias)
            np.testing.assert_array_equal(one[0] + 1, expected)
            np.testing.assert_allclose(one[1], activations, rtol=1e-12, atol=1e-12)
    assert 0 < one[0].size < LANES  # the last batch ends in one tile


@pytest.fixture(scope="module")
def official_case(official_1024_dir):
    layers = read_challenge_network(official_1024_dir)
    inputs = mnist_to_challenge_inputs(load_mnist_test()[0][:200], 32)
    return layers, inputs, -0.30


@pytest.mark.parametrize("dtype", [np.float32, pytest.param(np.float64, marks=pytest.mark.slow)])
def test_threads_and_split_do_not_change_the_official_network(official_case, dtype):
    layers, inputs, bias = official_case
    packed = pack_layers(layers, dtype)
    for rows in BATCH_ROWS:
        batch = inputs[:rows]
        one = run_kernel(batch, packed, bias, dtype, threads=1)
        assert_same_run(run_kernel(batch, packed, bias, dtype, threads=2), one)
        assert_same_run(run_kernel(batch, packed, bias, dtype, threads=2, split_columns=False), one)
        expected, _ = reference_challenge(batch, layers, bias)
        np.testing.assert_array_equal(one[0] + 1, expected)
    assert one[0].size > 0
