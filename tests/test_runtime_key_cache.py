"""The bound on ``dask.utils.key_split``'s cache: without it the scheduler and every worker keep
every distinct key they saw (up to 100,000); with it no process keeps more than the bound.

The tests run on a cluster of their own: a LocalCluster's scheduler lives in the pytest process,
whose cache every scheduler there shares, and a Bokeh session of the shared ``dask_client``
cluster's dashboard (one fetch of its status page keeps one alive, rendering the task stream, for
about 15 s) calls ``key_split`` on every task that cluster runs, after the bound emptied the cache.
"""

from __future__ import annotations

import uuid

import pytest
from polling import wait_until

from dasknn.runtime.cluster import local_cluster, scheduler_workers
from dasknn.runtime.key_cache import (
    MAX_ENTRIES,
    SchedulerKeyCacheBound,
    WorkerKeyCacheBound,
    install_key_cache_bound,
    key_cache_plugin_name,
    remove_key_cache_bound,
)

pytestmark = pytest.mark.minversions

TASKS = 400
BOUND = 50


@pytest.fixture(scope="module")
def own_client():
    """A client of a 2-worker LocalCluster whose dashboard no test has opened."""
    from distributed import Client

    with local_cluster(2) as cluster, Client(cluster) as client:
        yield client


def _cached_keys(dask_worker=None, dask_scheduler=None) -> int:
    from dask.utils import key_split

    return key_split.cache_info().currsize


def _cache_sizes(client) -> dict[str, int]:
    return {"scheduler": client.run_on_scheduler(_cached_keys), **client.run(_cached_keys)}


def _holds_prefix(dask_worker, prefix: str) -> bool:
    """Whether the scheduler or worker ``dask_worker`` holds a key starting with ``prefix``."""
    from distributed import Scheduler

    tasks = dask_worker.tasks if isinstance(dask_worker, Scheduler) else dask_worker.state.tasks
    return any(str(key).startswith(prefix) for key in tasks)


def _run_unique_tasks(client, tasks: int = TASKS) -> None:
    """Run ``tasks`` tasks of keys never used before; wait until every process forgot them."""
    prefix = f"dasknn-test-keycache-{uuid.uuid4().hex[:8]}"
    keys = [f"{prefix}-{i}" for i in range(tasks)]
    futures = client.map(abs, range(-tasks, 0), key=keys)
    assert client.gather(futures) == list(range(tasks, 0, -1))
    del futures
    wait_until(
        lambda: not client.run_on_scheduler(_holds_prefix, prefix=prefix)
        and not any(client.run(_holds_prefix, prefix=prefix).values()),
        30,
        "the tasks were not forgotten",
    )


def _plugin_names(client) -> tuple[list[str], list[str]]:
    on_scheduler = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))
    on_workers = client.run(lambda dask_worker: list(dask_worker.plugins))
    return on_scheduler, [name for names in on_workers.values() for name in names]


@pytest.mark.slow
def test_bound_keeps_the_cache_small_on_the_scheduler_and_every_worker(own_client):
    token = uuid.uuid4().hex[:16]
    name = key_cache_plugin_name(token)
    before = _cache_sizes(own_client)
    _run_unique_tasks(own_client)
    unbounded = _cache_sizes(own_client)
    # Without the bound each process keeps the keys it saw: every one on the scheduler, the
    # tasks it ran on each worker (at least one task each, as both workers are idle).
    assert unbounded["scheduler"] >= min(before["scheduler"] + TASKS, 100_000)
    for worker, size in unbounded.items():
        assert size > before[worker], (worker, before, unbounded)
    assert sum(unbounded.values()) - sum(before.values()) >= 2 * TASKS

    assert install_key_cache_bound(own_client, token, max_entries=BOUND) == name
    try:
        on_scheduler, on_workers = _plugin_names(own_client)
        assert name in on_scheduler
        assert on_workers.count(name) == len(scheduler_workers(own_client))
        _run_unique_tasks(own_client)
        bounded = _cache_sizes(own_client)
        assert max(bounded.values()) <= BOUND, bounded
    finally:
        remove_key_cache_bound(own_client, token)
    on_scheduler, on_workers = _plugin_names(own_client)
    assert name not in on_scheduler and name not in on_workers


def test_default_bound_holds_every_process_below_max_entries(own_client):
    # More new keys than the default bound in one graph: the scheduler empties its cache after
    # the graph, every worker when it forgets one of the tasks.
    token = uuid.uuid4().hex[:16]
    install_key_cache_bound(own_client, token)
    try:
        _run_unique_tasks(own_client, tasks=MAX_ENTRIES + 200)
        sizes = _cache_sizes(own_client)
        assert max(sizes.values()) <= MAX_ENTRIES, sizes
    finally:
        remove_key_cache_bound(own_client, token)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "10", None])
def test_bad_bound_is_a_value_error(bad):
    for plugin in (SchedulerKeyCacheBound, WorkerKeyCacheBound):
        with pytest.raises(ValueError, match="max_entries must be an integer >= 0"):
            plugin(bad)
