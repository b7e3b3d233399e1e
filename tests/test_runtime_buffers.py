"""The arrays a worker reuses between steps (dasknn.runtime.buffers)."""

from __future__ import annotations

import threading

import numpy as np

from dasknn.runtime.buffers import BufferPool


def test_a_given_array_is_taken_again_for_its_shape_and_dtype_only():
    pool = BufferPool()
    a = pool.take((3, 4), np.float32)
    assert a.shape == (3, 4) and a.dtype == np.float32 and a.flags.c_contiguous
    pool.give([a])
    assert pool.take((4, 3), np.float32) is not a
    assert pool.take((3, 4), np.float64) is not a
    assert pool.take((3, 4), "float32") is a
    assert pool.take((3, 4), np.float32) is not a  # taken: not handed out twice


def test_threads_never_hold_the_same_array():
    pool = BufferPool()
    pool.give([np.empty(8) for _ in range(4)])
    held: list[list[int]] = [[] for _ in range(4)]

    def work(mine: list[int]) -> None:
        for _ in range(500):
            array = pool.take((8,), np.float64)
            mine.append(id(array))
            array[:] = len(mine)
            assert (array == len(mine)).all()
            pool.give([array])

    threads = [threading.Thread(target=work, args=(h,)) for h in held]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(map(len, held)) == 2000
