"""Waiting and gathering with a time limit leave nothing on the cluster once the futures are
dropped."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import threading
import time

import pytest
from distributed import Event
from polling import HANG_GUARD, wait_until

from dasknn.runtime.cluster import scheduler_workers
from dasknn.runtime.waiting import (
    call_at_most,
    finished,
    gather_at_most,
    run_watching,
    wait_at_most,
)

pytestmark = pytest.mark.minversions


def _held(dask_scheduler, key) -> bool:
    return key in dask_scheduler.tasks


def _wait_for_event(name: str) -> int:
    Event(name).wait()
    return 1


def test_wait_at_most_times_out_then_finishes_and_keeps_no_reference(dask_client):
    """A timed-out wait returns False, a later one True; after the caller drops the future its
    key leaves the scheduler with the garbage collector off (a timed-out ``distributed.wait``
    leaves a reference cycle that would hold it)."""
    name = f"dasknn-test-wait-{time.monotonic_ns()}"
    event = Event(name, client=dask_client)
    future = dask_client.submit(_wait_for_event, name, pure=False)
    key = future.key
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        assert wait_at_most([future], 0.05) is False
        assert not future.done()
        event.set()
        assert wait_at_most([future], 30) is True
        assert future.result() == 1
        del future
        wait_until(
            lambda: not dask_client.run_on_scheduler(_held, key=key),
            30,
            "the key was still held after the drop",
        )
    finally:
        if was_enabled:
            gc.enable()


def _identity(value):
    return value


def _fail_after_event(name: str) -> int:
    Event(name).wait()
    raise ValueError("a failed task")


def test_finished_waits_for_every_future_whatever_its_end(dask_client):
    """``finished`` ends once every future has finished, failed ones included, and not before:
    under :func:`run_watching` it times out while one still waits."""
    name = f"dasknn-test-finished-{time.monotonic_ns()}"
    event = Event(name, client=dask_client)
    done = dask_client.submit(_identity, 1, pure=False)
    done.result()
    futures = [
        done,
        dask_client.submit(_wait_for_event, name, pure=False),
        dask_client.submit(_fail_after_event, name, pure=False),
    ]

    def quiet() -> None:
        pass

    with pytest.raises(TimeoutError):
        run_watching(dask_client, finished(futures), 0.3, quiet, 0.1)
    assert [f.status for f in futures] == ["finished", "pending", "pending"]
    event.set()
    assert run_watching(dask_client, finished(futures), 30, quiet, 0.1) is None
    assert [f.status for f in futures] == ["finished", "finished", "error"]


@pytest.mark.slow
def test_gather_at_most_gives_up_on_a_stopped_worker_and_keeps_no_reference(dask_client):
    """A result on a worker stopped (SIGSTOP) after its task finished: ``Client.gather`` would
    wait for ever; the gather gives up after the time limit, another gather once the worker goes
    on returns the results, and after the caller drops the futures their keys leave the scheduler
    with the garbage collector off."""
    workers = sorted(scheduler_workers(dask_client))
    pid = dask_client.run(os.getpid, workers=[workers[-1]])[workers[-1]]
    futures = [
        dask_client.submit(_identity, i, workers=[w], pure=False) for i, w in enumerate(workers)
    ]
    keys = [future.key for future in futures]
    assert wait_at_most(futures, 30)
    was_enabled = gc.isenabled()
    gc.disable()
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="did not arrive within 0.5 s"):
            gather_at_most(dask_client, futures, 0.5)
        assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing
        os.kill(pid, signal.SIGCONT)
        assert gather_at_most(dask_client, futures, 30) == [0, 1]
        del futures
        wait_until(
            lambda: not any(dask_client.run_on_scheduler(_held, key=key) for key in keys),
            30,
            "a key was still held after the drop",
        )
    finally:
        os.kill(pid, signal.SIGCONT)
        if was_enabled:
            gc.enable()


def test_a_gather_given_up_leaves_no_report_of_its_waits(dask_client, caplog):
    """A gather given up before its futures finished leaves distributed's waits on each of them
    behind; once the futures are cancelled each wait ends in ``AllExit``, which asyncio would
    report if none read it ("Task exception was never retrieved", a traceback on a command's
    stderr)."""
    name = f"dasknn-test-gather-{time.monotonic_ns()}"
    event = Event(name, client=dask_client)
    futures = [dask_client.submit(_wait_for_event, name, pure=False) for _ in range(2)]
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            with pytest.raises(TimeoutError, match="did not arrive within 0.2 s"):
                gather_at_most(dask_client, futures, 0.2)
            assert dask_client.sync(_futures_waiting)  # the waits left behind
            dask_client.cancel(futures)
            del futures
            wait_until(  # the waits end on the client's loop, then are collected
                lambda: not dask_client.sync(_futures_waiting), HANG_GUARD,
                "the gather's waits did not end", 0.05,
            )  # fmt: skip
            gc.collect()
        reports = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
        assert not reports, reports
    finally:
        event.set()  # the tasks on the workers end


async def _futures_waiting() -> list:
    """The tasks of the running event loop that wait for a future of a gather (distributed's
    ``Client._gather``)."""
    return [
        t for t in asyncio.all_tasks()
        if getattr(t.get_coro(), "__qualname__", "").startswith("Client._gather.")
    ]  # fmt: skip


async def _sleep_then_answer(seconds: float) -> str:
    await asyncio.sleep(seconds)  # a slow call on purpose, not a wait
    return "done"


def _sleeping(client, seconds: float):
    """``Client.run`` of a coroutine sleeping ``seconds`` on every worker, as a coroutine."""
    return client.run(_sleep_then_answer, seconds, asynchronous=True)


def test_run_watching_returns_gives_up_when_the_check_raises_and_times_out(dask_client):
    """A call run while a check watches: its result when it finishes; the check's error as soon
    as the check raises (long before the call would finish); ``TimeoutError`` after the limit."""
    calls = []

    def quiet() -> None:
        calls.append(time.monotonic())

    answer = run_watching(dask_client, _sleeping(dask_client, 0.6), 30, quiet, 0.1)
    assert set(answer.values()) == {"done"} and len(answer) == 2
    assert len(calls) >= 3  # checked while it ran

    def alarmed() -> None:
        raise ValueError("the cluster changed")

    # calls far longer than the hang guard: an error after the call finished would fail it
    start = time.monotonic()
    with pytest.raises(ValueError, match="the cluster changed"):
        run_watching(dask_client, _sleeping(dask_client, 4 * HANG_GUARD), 30, alarmed, 0.1)
    with pytest.raises(TimeoutError, match="did not finish within 0.3 s"):
        run_watching(dask_client, _sleeping(dask_client, 4 * HANG_GUARD), 0.3, quiet, 0.1)
    assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing


def test_call_at_most_leaves_a_slow_call_to_finish_and_raises_a_quick_calls_error():
    release, finished = threading.Event(), threading.Event()

    def slow() -> None:
        release.wait(HANG_GUARD)
        finished.set()

    assert call_at_most(slow, 0.2) is False
    assert not finished.is_set()  # it gave up, not waited for the call
    release.set()
    assert finished.wait(HANG_GUARD)  # not cancelled: it went on after the wait
    assert call_at_most(lambda: None, 5) is True and call_at_most(lambda: None, None) is True
    for seconds in (5, None):
        with pytest.raises(ZeroDivisionError):
            call_at_most(lambda: 1 / 0, seconds)
