"""What the test clusters hold of a distributed model's plugins (read by public client calls)."""

from __future__ import annotations

from dasknn.runtime.key_cache import key_cache_plugin_name


def key_cache_bound_count(client, token: str) -> int:
    """How many processes (the scheduler and the workers) hold the model's key-cache bound."""
    name = key_cache_plugin_name(token)
    on_scheduler = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))
    on_workers = client.run(lambda dask_worker: list(dask_worker.plugins))
    return [*on_scheduler, *(n for ns in on_workers.values() for n in ns)].count(name)
