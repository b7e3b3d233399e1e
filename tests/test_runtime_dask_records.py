"""Dask's debugging records on the clusters and clients dasknn opens are kept short, and their
workers run no profiler, unless the user's configuration sets these
(``dasknn.runtime.cluster.short_dask_records``)."""

from __future__ import annotations

import os
import time
from contextlib import ExitStack

import dask
import pytest

from dasknn.runtime.cluster import (
    LOW_LEVEL_LOG_LENGTH,
    open_client,
    short_dask_records,
)

KEY = "distributed.admin.low-level-log-length"
PROFILE = "distributed.worker.profile.enabled"


def _scheduler_lengths(dask_scheduler) -> list:
    """The bounds of the scheduler's records of its streams to workers and clients, and of its
    transitions."""
    streams = [*dask_scheduler.stream_comms.values(), *dask_scheduler.client_comms.values()]
    bounds = {stream.recent_message_log.maxlen for stream in streams}
    return sorted(bounds | {dask_scheduler.transition_log.maxlen})


def _worker_lengths(dask_worker) -> list:
    """The bound of the worker's record of its stream to the scheduler."""
    return [dask_worker.batched_stream.recent_message_log.maxlen]


def _profiles(dask_worker) -> int:
    """The one-second profiles the worker's profiler kept."""
    return len(dask_worker.profile_history)


def test_the_length_is_shortened_only_where_the_user_did_not_set_it(monkeypatch):
    monkeypatch.delenv("DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH", raising=False)
    monkeypatch.delenv("DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED", raising=False)
    assert short_dask_records() == {KEY: LOW_LEVEL_LOG_LENGTH, PROFILE: False}
    with dask.config.set({KEY: 5000}):
        assert short_dask_records() == {PROFILE: False}
    # Dask's own value, given in the environment, is the user's choice too
    monkeypatch.setenv("DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH", "1000")
    assert short_dask_records() == {PROFILE: False}
    monkeypatch.setenv("DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED", "True")
    assert short_dask_records() == {}


@pytest.mark.parametrize("user", [None, pytest.param(300, marks=pytest.mark.slow)])
def test_a_local_cluster_keeps_short_records_in_every_process(user, monkeypatch):
    before = dask.config.get(KEY), dask.config.get(PROFILE)
    monkeypatch.delenv("DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED", raising=False)
    with ExitStack() as stack:
        if user is not None:
            stack.enter_context(dask.config.set({KEY: user}))
            # Dask's own value: the user's choice where it is given outside the program
            monkeypatch.setenv("DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED", "True")
        client = open_client(stack, workers=1)
        expected = LOW_LEVEL_LOG_LENGTH if user is None else user
        assert client.scheduler_comm.recent_message_log.maxlen == expected
        assert client.run_on_scheduler(_scheduler_lengths) == [expected]
        assert list(client.run(_worker_lengths).values()) == [[expected]]
        # the profiler keeps a profile a second (distributed.worker.profile.cycle), task or not
        client.submit(time.sleep, 1.2, pure=False).result()
        (profiles,) = client.run(_profiles).values()
        assert profiles == 0 if user is None else profiles >= 1
    assert (dask.config.get(KEY), dask.config.get(PROFILE)) == before  # left as it was



def _tuned(dask_worker) -> bool:
    return dask_worker.dasknn_malloc_tuned


def test_the_workers_of_a_local_cluster_keep_freed_buffers_for_reuse():
    environ = dict(os.environ)
    with ExitStack() as stack:
        client = open_client(stack, workers=1)
        assert list(client.run(_tuned).values()) == [True]
        client.cluster.scale(2)  # a worker that joins is tuned too
        client.wait_for_workers(2, timeout=60)
        assert list(client.run(_tuned).values()) == [True, True]
    # nothing of it in this process's environment, which later processes would inherit (Dask's
    # nanny leaves its own MALLOC_TRIM_THRESHOLD_ there)
    added = {k for k in os.environ if k.startswith("MALLOC_")} - set(environ)
    assert added <= {"MALLOC_TRIM_THRESHOLD_"}, added
