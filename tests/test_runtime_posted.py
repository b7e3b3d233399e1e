"""The posted-program engine (:mod:`dasknn.runtime.posted`): any keyed task graph cut into one
program per worker, by a key -> worker function."""

from __future__ import annotations

import operator

import pytest
from dask.task_spec import Task, TaskRef

from dasknn.runtime.posted import cut_programs


def _worker(key) -> int:
    return key[1]


def _graph() -> dict:
    """``a`` and ``b`` on worker 0, ``c`` on worker 1 reads both, ``d`` on worker 0 reads ``c``
    (keys ``(name, worker)``), listed out of order."""
    a, b, c, d = ("a", 0), ("b", 0), ("c", 1), ("d", 0)
    return {
        d: Task(d, operator.neg, TaskRef(c)),
        c: Task(c, operator.add, TaskRef(a), TaskRef(b)),
        a: Task(a, operator.pos, 2),
        b: Task(b, operator.pos, 3),
    }


def test_each_worker_runs_its_tasks_in_one_topological_order_and_posts_what_others_read():
    tasks = _graph()
    zero, one = cut_programs(tasks, [("d", 0), ("c", 1)], 2, _worker)
    assert [t.key for t in zero.tasks] == [("a", 0), ("b", 0), ("d", 0)]
    assert [t.key for t in one.tasks] == [("c", 1)]
    assert zero.sends == {("a", 0): (1,), ("b", 0): (1,)}
    assert one.sends == {("c", 1): (0,)}
    assert (zero.outputs, one.outputs) == ((("d", 0),), (("c", 1),))
    # run as the workers would, the posted values handed over: the graph's own results
    values: dict = {}
    for program in (zero, one, zero):
        for task in program.tasks:
            if task.key not in values and all(k in values for k in task.dependencies):
                values[task.key] = task({k: values[k] for k in task.dependencies})
    assert values[("d", 0)] == -5


def test_a_task_reading_a_key_the_graph_does_not_make_is_a_value_error():
    tasks = _graph()
    del tasks[("a", 0)]
    with pytest.raises(ValueError, match="reads \\('a', 0\\), which the step does not make"):
        cut_programs(tasks, [], 2, _worker)
