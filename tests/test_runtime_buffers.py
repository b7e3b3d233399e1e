"""The arrays a worker reuses between steps (dasknn.runtime.buffers)."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import numpy as np

from dasknn.runtime.buffers import BufferPool, StepBuffers, size_class


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


def _posts(done: bool, n: int = 2) -> list[Future]:
    posts = [Future() for _ in range(n)]
    for post in posts if done else ():
        post.set_result(None)
    return posts


def test_size_classes_hold_their_items_with_at_most_a_quarter_more():
    for items in [*range(0, 300), 1000, 4097, 10**6, 3 * 2**20 + 1]:
        capacity = size_class(items)
        assert items <= capacity <= max(8, 1.25 * items)
    assert len({size_class(n) for n in range(1000, 2001)}) <= 5


def test_a_step_gives_its_arrays_back_once_over_and_its_posts_delivered():
    buffers = StepBuffers()
    a = buffers.take(1, (4, 2), np.float32)
    assert a.shape == (4, 2) and a.dtype == np.float32 and a.flags.c_contiguous
    pending = _posts(done=False)
    buffers.ended(1, pending)
    assert buffers.held() == 1  # a post may still be reading it
    b = buffers.take(2, (4, 2), np.float32)
    assert b.base is not a.base
    for post in pending:
        post.set_result(None)
    buffers.ended(2, [])
    assert buffers.held() == 0 and buffers.made == 2
    again = {id(buffers.take(3, (2, 3), np.float32).base) for _ in range(2)}  # same class
    assert again == {id(a.base), id(b.base)} and buffers.made == 2
    assert buffers.take(3, (4, 2), np.float64).base is not a.base  # other dtype: made


def test_arrays_taken_for_the_next_step_wait_for_its_end():
    buffers = StepBuffers()
    now = buffers.take(1, (8,), np.float64)
    prefetched = buffers.take(2, (8,), np.float64)  # made in step 1's program for step 2
    buffers.ended(1, _posts(done=True))
    assert buffers.held() == 1
    assert buffers.take(3, (8,), np.float64).base is now.base
    buffers.ended(2, _posts(done=True))
    assert buffers.take(4, (8,), np.float64).base is prefetched.base


def test_a_later_step_waits_for_the_posts_of_an_earlier_one():
    buffers = StepBuffers()
    first, second = buffers.take(1, (3,), np.int64), buffers.take(2, (3,), np.int64)
    slow = _posts(done=False, n=1)
    buffers.ended(1, slow)
    buffers.ended(2, _posts(done=True))
    assert buffers.held() == 2  # step 1's post may read what step 2's tasks were given
    slow[0].set_result(None)
    buffers.ended(3, [])
    assert buffers.held() == 0
    taken = {id(buffers.take(4, (3,), np.int64).base) for _ in range(2)}
    assert taken == {id(first.base), id(second.base)}


def test_forgotten_holds_never_come_back():
    buffers = StepBuffers()
    a = buffers.take(1, (5,), np.float32)
    buffers.forget()
    buffers.ended(1, [])
    assert buffers.held() == 0
    assert buffers.take(2, (5,), np.float32).base is not a.base and buffers.made == 2


def test_a_taker_records_what_it_hands_out_for_one_give():
    pool = BufferPool()
    taken: list[np.ndarray] = []
    take = pool.taker(taken)
    a, b = take((2, 3), np.float32), take((4,), np.int64)
    assert [id(x) for x in taken] == [id(a), id(b)] and pool.made == 2
    pool.give(taken)
    assert pool.take((4,), np.int64) is b and pool.take((2, 3), np.float32) is a
    assert pool.made == 2
