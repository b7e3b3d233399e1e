"""Task graphs of a distributed sampled step and of a prediction batch.

Keys are :func:`dasknn.runtime.keys.sampled_key` tuples ``(name, call, phase, sender,
receiver)``. A key with ``sender == receiver`` is the local work of that worker and never moves;
one with ``sender != receiver`` is made on ``sender`` and its value, a plain numpy array, is the
one message of that phase from ``sender`` to ``receiver``, so the transfer monitor counts it by
phase. Every task runs on the worker of its ``sender`` position (:class:`SenderPlacement`).

Per training step, with ``B`` rows, ``H`` hidden neurons in blocks of ``H_q`` and item size
``s``: phase ``hidden`` moves ``(P - 1) B H s`` bytes, ``stats`` ``P (P - 1) 2 B s`` and
``grad`` ``(P - 1) B H s``, each in ``P (P - 1)`` messages (see :func:`step_bytes`).
"""

from __future__ import annotations

from functools import partial

from dask.task_spec import Task, TaskRef

from dasknn.runtime.collectives import messages_to
from dasknn.runtime.keys import parse_sampled_key, sampled_key
from dasknn.sampled_parallel import steps

__all__ = [
    "PHASES",
    "SenderPlacement",
    "predict_graph",
    "step_bytes",
    "train_graph",
]

#: Phases of the messages of a training step.
PHASES = ("hidden", "stats", "grad")


class SenderPlacement:
    """``workers=`` annotation: the worker at the key's sender position."""

    def __init__(self, workers: list[str]) -> None:
        self.workers = list(workers)

    def __call__(self, key) -> list[str]:
        return [self.workers[parse_sampled_key(key).sender]]


def step_bytes(batch: int, hidden: int, workers: int, itemsize: int) -> dict[str, int]:
    """Bytes each phase of one training step moves between workers, in all."""
    return {
        "hidden": (workers - 1) * batch * hidden * itemsize,
        "stats": workers * (workers - 1) * 2 * batch * itemsize,
        "grad": (workers - 1) * batch * hidden * itemsize,
    }


def _broadcast(tasks: dict, key_of, source, count: int, func) -> None:
    """Messages ``key_of(p, q)`` for every ``q != p``: ``func`` of the value ``source(p)``."""
    for p in range(count):
        for q in range(count):
            if p != q:
                k = key_of(p, q)
                tasks[k] = Task(k, func, TaskRef(source(p)))


def _hidden_exchange(tasks: dict, key, phase: str, token: str, inputs: list, count: int) -> None:
    """Worker ``p``'s hidden block ``key(phase, p, p)`` of its rows ``inputs[p]``, and the
    messages ``key(phase, p, q)`` that carry it to every other worker ``q``."""
    for p in range(count):
        k = key(phase, p, p)
        tasks[k] = Task(k, steps.hidden_block, token, TaskRef(inputs[p]))
    _broadcast(
        tasks,
        lambda p, q: key(phase, p, q),
        lambda p: key(phase, p, p),
        count,
        _identity,
    )


def train_graph(
    token: str,
    call: int,
    step: int,
    workers: int,
    inputs: list,
    labels: list,
    target: list,
    optimizer,
) -> tuple[dict, list]:
    """The tasks of training step ``step`` (submission ``call``) and its output keys.

    ``inputs[p]``, ``labels[p]``, ``target[p]``: keys of the batch rows (CSR), the shard's
    labels ``(ptr, local ids)`` and the per-row target ``1 / n_labels`` on worker ``p``.
    """
    key = partial(sampled_key, token, call)
    tasks: dict = {}
    _hidden_exchange(tasks, key, "hidden", token, inputs, workers)
    for p in range(workers):
        k = key("select", p, p)
        tasks[k] = Task(
            k,
            steps.select_and_score,
            token,
            step,
            TaskRef(labels[p]),
            TaskRef(key("hidden", p, p)),
            *messages_to(key, "hidden", p, workers),
        )
    _broadcast(
        tasks,
        lambda p, q: key("stats", p, q),
        lambda p: key("select", p, p),
        workers,
        steps.statistics_of,
    )
    for p in range(workers):
        k = key("output", p, p)
        tasks[k] = Task(
            k,
            steps.output_step,
            token,
            optimizer,
            step + 1,
            TaskRef(target[p]),
            TaskRef(key("select", p, p)),
            *messages_to(key, "stats", p, workers),
        )
    for p in range(workers):
        for q in range(workers):
            if p != q:
                k = key("grad", p, q)
                tasks[k] = Task(k, steps.columns_of, token, TaskRef(key("output", p, p)), q)
    outputs = []
    for p in range(workers):
        k = key("update", p, p)
        tasks[k] = Task(
            k,
            steps.hidden_step,
            token,
            optimizer,
            TaskRef(inputs[p]),
            TaskRef(key("hidden", p, p)),
            TaskRef(key("output", p, p)),
            *messages_to(key, "grad", p, workers),
        )
        outputs.append(k)
    return tasks, outputs


def predict_graph(token: str, call: int, workers: int, inputs: list, k: int) -> tuple[dict, list]:
    """The tasks of one prediction batch: each worker's exact top ``k`` (phase
    ``predict-hidden`` carries the hidden blocks)."""
    key = partial(sampled_key, token, call)
    tasks: dict = {}
    _hidden_exchange(tasks, key, "predict-hidden", token, inputs, workers)
    outputs = []
    for p in range(workers):
        kk = key("top", p, p)
        tasks[kk] = Task(
            kk,
            steps.shard_top_k,
            token,
            k,
            TaskRef(key("predict-hidden", p, p)),
            *messages_to(key, "predict-hidden", p, workers),
        )
        outputs.append(kk)
    return tasks, outputs


def _identity(x):
    return x
