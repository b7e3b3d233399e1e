"""Waiting with a time limit leaves nothing on the cluster once the futures are dropped."""

from __future__ import annotations

import gc
import time

import pytest
from distributed import Event

from dasknn.runtime.waiting import wait_at_most

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
        deadline = time.monotonic() + 10
        while dask_client.run_on_scheduler(_held, key=key):
            assert time.monotonic() < deadline, "the key was still held 10 s after the drop"
            time.sleep(0.05)
    finally:
        if was_enabled:
            gc.enable()
