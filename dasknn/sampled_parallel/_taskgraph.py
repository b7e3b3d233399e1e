"""Task graphs of a distributed sampled step and of a prediction batch.

Keys are :func:`dasknn.runtime.keys.sampled_key` tuples ``(name, call, phase, sender, receiver)``,
and every task runs on the worker of its ``sender`` position
(:class:`~dasknn.runtime.placement.KeyPlacement`). A key with ``sender == receiver`` is local to
that worker and never moves. A key with ``receiver == EVERY_WORKER`` is a value its sender uses and
every other worker reads: each read is one message of that phase from the sender to the reader. A
key with another ``receiver`` is made on ``sender`` for that one worker: one message. The batch
itself is part of the graph (data nodes on their workers), so nothing is scattered before a step.

Per training step, with ``B`` rows, ``H`` hidden neurons in blocks of ``H_q`` and item size
``s``: phase ``hidden`` moves ``(P - 1) B H s`` bytes, ``stats`` ``P (P - 1) 2 B s`` and
``grad`` ``(P - 1) B H s``, each in ``P (P - 1)`` messages (see :func:`step_bytes`).

Steps can be queued: the first task of a step on a worker may take that worker's last task
of the previous step (``after``), so the next step's batch is placed and its tasks are known
to the scheduler while the current one runs, and each worker goes on as soon as it is done.
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
    """``priority=`` annotation: the ``grad`` messages before the other work of their worker
    (the shard's update), so that they leave as soon as they exist."""
    return 1 if parse_sampled_key(key).phase == "grad" else 0


def step_bytes(batch: int, hidden: int, workers: int, itemsize: int) -> dict[str, int]:
    """Bytes each phase of one training step moves between workers, in all."""
    return {
        "hidden": (workers - 1) * batch * hidden * itemsize,
        "stats": workers * (workers - 1) * 2 * batch * itemsize,
        "grad": (workers - 1) * batch * hidden * itemsize,
    }


def _shared(key, phase: str, workers: int) -> list[TaskRef]:
    """References to every worker's value ``key(phase, p, EVERY_WORKER)``, in worker order."""
    return [TaskRef(key(phase, p, EVERY_WORKER)) for p in range(workers)]


def _rows(tasks: dict, key, rows: list) -> None:
    """Worker ``p``'s batch rows ``rows[p]``: a data node ``key("rows", p, p)``."""
    for p, block in enumerate(rows):
        data = key("rows", p, p)
        tasks[data] = DataNode(data, block)


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
    """The tasks of training step ``step`` (submission ``call``) and its output keys, one per
    worker (its loss share); the updates take ``optimizer`` with its learning rate times
    ``lr_scale``.

    ``rows[p]``: the batch rows (CSR) for worker ``p``; ``labels[p]``: its
    :class:`~dasknn.sampled_parallel._steps.ShardLabels`; ``after[p]``: a key of the previous
    step on worker ``p`` (its output key) when this step is queued behind it.
    """
    key = partial(sampled_key, token, call)
    workers = len(rows)
    tasks: dict = {}
    _rows(tasks, key, rows)
    for p in range(workers):
        k = key("hidden", p, EVERY_WORKER)
        previous = [TaskRef(after[p])] if after else []
        tasks[k] = Task(
            k, steps.train_hidden_block, token, call, TaskRef(key("rows", p, p)), *previous
        )
    for p in range(workers):
        data = key("labels", p, p)
        tasks[data] = DataNode(data, labels[p])
        k = key("stats", p, EVERY_WORKER)
        tasks[k] = Task(
            k,
            steps.select_and_score,
            token,
            call,
            step,
            TaskRef(data),
            *_shared(key, "hidden", workers),
        )
    for p in range(workers):
        k = key("output", p, p)
        tasks[k] = Task(
            k,
            steps.output_backward,
            token,
            call,
            TaskRef(key("labels", p, p)),
            *_shared(key, "stats", workers),
        )
        for q in range(workers):
            if q != p:
                kq = key("grad", p, q)
                tasks[kq] = Task(kq, steps.columns_of, token, TaskRef(k), q)
        ku = key("output-update", p, p)
        tasks[ku] = Task(
            ku, steps.output_update, token, optimizer, lr_scale, step + 1, TaskRef(k)
        )
    outputs = []
    for p in range(workers):
        k = key("update", p, p)
        tasks[k] = Task(
            k,
            steps.hidden_step,
            token,
            call,
            optimizer,
            lr_scale,
            TaskRef(key("rows", p, p)),
            TaskRef(key("output", p, p)),
            TaskRef(key("output-update", p, p)),
            *(TaskRef(key("grad", q, p)) for q in range(workers) if q != p),
        )
        outputs.append(k)
    return tasks, outputs


def predict_graph(token: str, call: int, rows: list, k: int) -> tuple[dict, list]:
    """The tasks of one prediction batch (``rows[p]``: the rows for worker ``p``): each
    worker's exact top ``k`` (phase ``predict-hidden`` carries the hidden blocks)."""
    key = partial(sampled_key, token, call)
    tasks: dict = {}
    _rows(tasks, key, rows)
    for p in range(len(rows)):
        kh = key("predict-hidden", p, EVERY_WORKER)
        tasks[kh] = Task(kh, steps.hidden_block, token, TaskRef(key("rows", p, p)))
    outputs = []
    for p in range(len(rows)):
        kk = key("top", p, p)
        tasks[kk] = Task(
            kk, steps.shard_top_k, token, k, *_shared(key, "predict-hidden", len(rows))
        )
        outputs.append(kk)
    return tasks, outputs
