"""OneAtATime: calls in a background thread, in order, at most one on its way; the last one's
error raised when the block ends, a running call's outcome dropped when the block ends on an
error."""

from __future__ import annotations

import threading

import pytest

from dasknn.runtime.background import OneAtATime


def test_calls_run_in_order_in_the_named_thread_and_the_block_waits_for_the_last():
    done: list[tuple[int, str]] = []
    with OneAtATime("test-background") as calls:
        for k in range(5):
            calls.submit(lambda k: done.append((k, threading.current_thread().name)), k)
    assert [k for k, _ in done] == list(range(5))
    assert all(name.startswith("test-background") for _, name in done)
    assert threading.current_thread().name not in {name for _, name in done}


def test_submit_waits_for_the_call_before_it():
    release = threading.Event()
    first_done = []

    def first() -> None:
        release.wait(30)  # set by a timer: the main thread is then waiting in submit
        first_done.append(True)

    with OneAtATime("test-background") as calls:
        calls.submit(first)
        threading.Timer(0.1, release.set).start()
        calls.submit(lambda: None)
        assert first_done == [True]  # submit returned once the call before it had ended


def test_an_error_is_raised_by_the_next_submit_or_the_end_of_the_block():
    def fail(what: str) -> None:
        raise ValueError(what)

    ran = []
    with pytest.raises(ValueError, match="first"):
        with OneAtATime("test-background") as calls:
            calls.submit(fail, "first")
            calls.submit(ran.append, 1)
    assert ran == []  # the call after the failed one never started
    with pytest.raises(ValueError, match="last"):
        with OneAtATime("test-background") as calls:
            calls.submit(fail, "last")


def test_a_block_ending_in_an_error_waits_for_the_running_call_and_drops_its_error():
    release = threading.Event()
    finished = []

    def slow_failure() -> None:
        release.wait(30)
        finished.append(True)
        raise ValueError("dropped")

    with pytest.raises(KeyError, match="the caller's"):
        with OneAtATime("test-background") as calls:
            calls.submit(slow_failure)
            release.set()
            raise KeyError("the caller's")
    assert finished == [True]  # waited for, its ValueError not raised
