"""One Dask span for the tasks a distributed model submits, so a graph adds one span record.

Dask's scheduler files every task under a span (``distributed.spans``), and for every graph it
receives it appends the graph's metadata (``{"type": "low-level-graph"}`` for ``Client.get``,
``{"type": "Future"}`` for ``Client.submit``) to the metadata of **every span the graph's tasks
and dependencies belong to**, and keeps it for the cluster's lifetime: no configuration bounds
it and no public call drops it. A task belongs to the span of its task group, fixed when the
group is first seen: the span of the task's ``span`` annotation, else the cluster's current
default span, which Dask replaces by a new one whenever its tasks are done (so at almost every
call of a model). Scattered data never has an annotation, so its group always lands in a default
span. A model-parallel training step refers to its postboxes (default span of the placement),
its plans (scattered at the placement) and the data of the ``fit`` call (scattered per call); in
default spans each step would add three entries in three spans: 0.6-0.9 KB a step, about
0.6-0.9 MiB per 1,000 steps on the scheduler, never freed (``docs/reliability.md``, ``## Long
runs: memory (soak)``).

:func:`new_span` makes a model's own span once (``distributed.span``, read back with
``dask.get_annotations()`` as its docstring documents); the model submits its tasks under it
(``dask.annotate(span=...)``). :func:`held_in_span` gives scattered values a home in that span: a
task per value, on the value's worker, that returns it (the same object: no copy), so the graphs
that read the values depend on tasks of the model's span only. A step graph then touches one span
and adds one entry, a third of the three. The entries themselves stay (one a graph).
"""

from __future__ import annotations

from collections.abc import Mapping

import dask
import distributed
from dask.task_spec import Task, TaskRef

from dasknn.runtime.keys import held_key
from dasknn.runtime.placement import KeyPlacement, same

__all__ = ["held_in_span", "new_span"]


def new_span(name: str) -> dict:
    """The ``span`` annotation of a new Dask span named ``name`` (nested in the span the caller
    is in, if any): pass it as ``dask.annotate(span=...)`` to every submission that belongs to
    it. Entering and leaving ``distributed.span`` schedules nothing; the scheduler makes the span
    when the first task annotated with it arrives."""
    with distributed.span(name):
        return dict(dask.get_annotations()["span"])


def _same(value):
    """The value itself (a task that gives a scattered value a key of its own)."""
    return value


def held_in_span(client, futures: Mapping, workers: Mapping, span: dict) -> dict:
    """Tasks of ``span`` that return the scattered values ``futures`` (``{name: Future}``), each on
    its value's worker ``workers[name]``, submitted in one graph; returns ``{name: Future}`` of
    the tasks (keys :func:`~dasknn.runtime.keys.held_key` of the scattered futures' keys).

    The scattered futures may be dropped once this returns: Dask keeps a value its waiting task
    needs, and frees it when the task has run (the task's result is the same object)."""
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
