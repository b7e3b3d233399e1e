"""One Dask span for the tasks a distributed model submits, so a graph adds one span record:
tasks are submitted under :func:`new_span`, scattered values read through :func:`held_in_span`.
See docs/reliability.md, "Long runs: memory (soak)"."""

from __future__ import annotations

from collections.abc import Mapping

import dask
import distributed
from dask.task_spec import Task, TaskRef

from dasknn.runtime.keys import held_key
from dasknn.runtime.placement import KeyPlacement, same

__all__ = ["held_in_span", "new_span"]


def new_span(name: str) -> dict:
    """The ``span`` annotation of a new Dask span named ``name`` (nested in the caller's), for
    ``dask.annotate(span=...)``; schedules nothing."""
    with distributed.span(name):
        return dict(dask.get_annotations()["span"])


def _same(value):
    """The value itself (a task that gives a scattered value a key of its own)."""
    return value


def held_in_span(client, futures: Mapping, workers: Mapping, span: dict) -> dict:
    """Tasks of ``span``, one graph, returning the scattered ``futures`` (``{name: Future}``)
    on their workers ``workers[name]`` without a copy; ``{name: Future}`` of the tasks (keys
    :func:`~dasknn.runtime.keys.held_key`). The scattered futures may be dropped afterwards."""
    graph, placement = {}, {}
    for name, future in futures.items():
        key = held_key(future.key)
        graph[key] = Task(key, _same, TaskRef(future.key))
        placement[key] = workers[name]
    if not graph:
        return {}
    options = {"span": span, "workers": KeyPlacement(placement, same), "allow_other_workers": False}
    with dask.annotate(**options):
        held = client.get(graph, list(graph), sync=False)
    return dict(zip(futures, held, strict=True))
