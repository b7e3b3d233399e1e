"""Task graphs of a distributed sampled step and of a prediction batch.

Keys are :func:`dasknn.runtime.keys.sampled_key` tuples ``(name, call, phase, sender, receiver)``;
each task runs on its ``sender``'s worker, and a key with ``receiver == EVERY_WORKER`` is one
message to every other worker that reads it. Per training step (``B`` rows, ``H`` hidden, item
size ``s``): ``hidden`` moves ``(P - 1) B H s`` bytes, ``stats`` ``P (P - 1) 2 B s`` and ``grad``
``(P - 1) B H s``, each in ``P (P - 1)`` messages (:func:`step_bytes`). See docs/sampled.md.
"""

from __future__ import annotations

from functools import partial

from dask.task_spec import DataNode, Task, TaskRef

from dasknn.runtime.keys import parse_sampled_key, sampled_key
from dasknn.sampled_parallel import _steps as steps

__all__ = [
    "EVERY_WORKER",
    "PHASES",
    "message_priority",
    "predict_graph",
    "step_bytes",
    "train_graph",
]

#: Phases of the messages of a training step.
PHASES = ("hidden", "stats", "grad")

#: The receiver field of a value that every worker reads.
EVERY_WORKER = -1


def message_priority(key) -> int:
    """``priority=`` annotation: a worker's ``grad`` messages before its other work."""
    return 1 if parse_sampled_key(key).phase == "grad" else 0


def step_bytes(batch: int, hidden: int, workers: int, itemsize: int) -> dict[str, int]:
    """Bytes each phase of one training step moves between workers, in all."""
    return {
        "hidden": (workers - 1) * batch * hidden * itemsize,
        "stats": workers * (workers - 1) * 2 * batch * itemsize,
        "grad": (workers - 1) * batch * hidden * itemsize,
    }


def _graph(token: str, call: int, rows: list):
    """A new graph of submission ``call`` with worker ``p``'s batch rows ``rows[p]`` as data nodes
    ``("rows", p, p)``; returns ``(tasks, key, add, shared)``: ``add(phase, p, receiver, func,
    *args)`` adds a task ``func(token, *args)``, ``shared(phase)`` references every worker's
    ``(phase, p, EVERY_WORKER)`` value, in worker order."""
    key = partial(sampled_key, token, call)
    tasks: dict = {}

    def add(phase: str, p: int, receiver: int, func, *args) -> tuple:
        k = key(phase, p, receiver)
        tasks[k] = Task(k, func, token, *args)
        return k

    def shared(phase: str) -> list[TaskRef]:
        return [TaskRef(key(phase, p, EVERY_WORKER)) for p in range(len(rows))]

    for p, block in enumerate(rows):
        tasks[key("rows", p, p)] = DataNode(key("rows", p, p), block)
    return tasks, key, add, shared


def train_graph(
    token: str,
    call: int,
    step: int,
    rows: list,
    labels: list,
    optimizer,
    lr_scale: float = 1.0,
    after: list | None = None,
) -> tuple[dict, list]:
    """The tasks of training step ``step`` (submission ``call``) and its output keys (loss shares).

    ``rows[p]``: worker ``p``'s batch rows (CSR); ``labels[p]``: its
    :class:`~dasknn.sampled_parallel._steps.ShardLabels`; ``after[p]``: the previous step's output
    key on ``p`` when queued; the updates use ``optimizer``'s learning rate times ``lr_scale``.
    """
    tasks, key, add, shared = _graph(token, call, rows)
    workers = len(rows)
    for p in range(workers):
        previous = [TaskRef(after[p])] if after else []
        x = TaskRef(key("rows", p, p))
        add("hidden", p, EVERY_WORKER, steps.hidden_block, x, call, *previous)
    for p in range(workers):
        tasks[key("labels", p, p)] = DataNode(key("labels", p, p), labels[p])
        data = TaskRef(key("labels", p, p))
        add("stats", p, EVERY_WORKER, steps.select_and_score, call, step, data, *shared("hidden"))
    for p in range(workers):
        data = TaskRef(key("labels", p, p))
        out = TaskRef(add("output", p, p, steps.output_backward, call, data, *shared("stats")))
        for q in range(workers):
            if q != p:
                add("grad", p, q, steps.columns_of, out, q)
        add("output-update", p, p, steps.output_update, optimizer, lr_scale, step + 1, out)
    return tasks, [
        add(
            "update", p, p, steps.hidden_step, call, optimizer, lr_scale,
            TaskRef(key("rows", p, p)), TaskRef(key("output", p, p)),
            TaskRef(key("output-update", p, p)),
            *(TaskRef(key("grad", q, p)) for q in range(workers) if q != p),
        )  # fmt: skip
        for p in range(workers)
    ]


def predict_graph(token: str, call: int, rows: list, k: int) -> tuple[dict, list]:
    """The tasks of one prediction batch (``rows[p]`` for worker ``p``): each worker's top ``k``."""
    tasks, key, add, shared = _graph(token, call, rows)
    for p in range(len(rows)):
        add("predict-hidden", p, EVERY_WORKER, steps.hidden_block, TaskRef(key("rows", p, p)))
    hidden = shared("predict-hidden")
    return tasks, [add("top", p, p, steps.shard_top_k, k, *hidden) for p in range(len(rows))]
