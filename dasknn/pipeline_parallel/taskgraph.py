"""The task graph of one pipeline (and data-parallel) training step.

For every replica ``d`` and stage ``s`` the passes of the step are tasks pinned to the stage
replica's worker, chained in the order of the schedule (:func:`stage_order`). A forward task of
stage ``s > 0`` reads the ``fwd-msg`` key of stage ``s - 1`` (one message), a backward task of
stage ``s < S - 1`` the ``bwd-msg`` key of stage ``s + 1`` (one message). A message key is a task
of its own on the sender that passes the pass's value on, so the receiver is its only consumer:
the pass key itself, which the sender's next pass depends on, never leaves its worker (Dask's
active memory manager may drop either copy of a key held twice, and the sender would fetch a
message back). With ``D > 1`` replicas, each
stage's accumulated compressed gradients (one flat buffer in the storage dtype) are summed across
its replicas by the runtime's allreduce (:func:`dasknn.runtime.collectives.build_allreduce`,
summed in float32 for 16-bit storage), and every replica applies the same update. With fp16's
dynamic loss scaling, every stage replica checks its (summed) gradient for inf / NaN, stage 0 of
replica 0 combines the flags, and every update task reads the verdict: a step is applied on every
stage replica or skipped on all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from dask.task_spec import Task, TaskRef

from dasknn.pipeline_parallel import worker_state as ws
from dasknn.pipeline_parallel.schedule import stage_order
from dasknn.runtime.collectives import build_allreduce
from dasknn.runtime.keys import parse_collective_key, parse_pipeline_key, pipeline_key

__all__ = ["SchedulePriority", "StepGraph", "build_step", "collective_token"]


def collective_token(token: str, stage: int, step: int) -> str:
    """Token of the allreduce of ``stage``'s gradients in ``step``."""
    return f"{token}s{stage}n{step}"


class Placement:
    """``workers=`` annotation of a step's keys: the worker of the key's stage replica."""

    def __init__(self, workers: dict[tuple[int, int], str], collectives: dict[str, int]) -> None:
        self.workers = dict(workers)
        self.collectives = dict(collectives)

    def __call__(self, key) -> list[str]:
        pipeline = parse_pipeline_key(key)
        if pipeline is not None:
            return [self.workers[(pipeline.stage, pipeline.replica)]]
        collective = parse_collective_key(key)
        stage = self.collectives[collective.token]
        return [self.workers[(stage, collective.sender)]]


class SchedulePriority:
    """``priority=`` annotation of a step's keys (evaluated per key): a stage's passes in the
    order of its schedule (:func:`stage_order`), the earlier pass the higher priority, and the
    per-step work (gradients, allreduce, fp16 flags, update) after all of them. The chains already
    fix that order on a stage's worker; the priorities state it to the scheduler as well."""

    def __init__(self, schedule: str, stages: int, microbatches: int) -> None:
        self.last = 2 * microbatches
        self.position = {
            (s, "fwd" if kind == "F" else "bwd", u): n
            for s in range(stages)
            for n, (kind, u) in enumerate(stage_order(schedule, stages, s, microbatches))
        }

    def __call__(self, key) -> int:
        pipeline = parse_pipeline_key(key)
        if pipeline is None:
            return -self.last
        kind = pipeline.kind.removesuffix("-msg")  # a message right after its pass
        return -self.position.get((pipeline.stage, kind, pipeline.microbatch), self.last)


def _pass_on(value):
    """The value of a pass, as the message to another stage."""
    return value


def _send(tasks: dict, message_key: tuple, pass_key: tuple) -> None:
    tasks[message_key] = Task(message_key, _pass_on, TaskRef(pass_key))


@dataclass
class StepGraph:
    """A step's tasks, the keys to read back, and the placement and priority of every key."""

    tasks: dict
    loss_keys: list
    update_keys: list
    placement: Placement
    priority: SchedulePriority
    collective_tokens: list
    verdict_key: tuple | None = None


def build_step(
    token: str,
    step: int,
    stages: int,
    replicas: int,
    microbatches: int,
    schedule: str,
    workers: dict[tuple[int, int], str],
    optimizer,
    scale: float,
    grad_sizes: list[int],
    accumulate,
    loss_scale: float | None = None,
) -> StepGraph:
    """Build the step: the inputs are the keys ``pipeline_key(token, "x", step, 0, d, u)`` on
    stage 0's workers and ``pipeline_key(token, "y", step, S - 1, d, u)`` on the last stage's.

    Parameters
    ----------
    workers : dict
        ``{(stage, replica): address}``.
    scale : float
        Each microbatch's share of the batch (its rows over the batch's rows).
    grad_sizes : list of int
        Length of each stage's gradient buffer.
    accumulate : numpy dtype
        The dtype the allreduce sums in.
    loss_scale : float, optional
        fp16's dynamic loss scale: the output deltas are multiplied by it, the updates divide
        it out, and a step whose gradients overflow anywhere is skipped everywhere (the verdict
        is the value of ``verdict_key``).
    """
    tasks: dict = {}
    loss_keys, update_keys, tokens, collectives = [], [], [], {}
    last_pass: dict[tuple[int, int], tuple] = {}
    for d in range(replicas):
        for s in range(stages):
            previous = None
            for kind, u in stage_order(schedule, stages, s, microbatches):
                after = TaskRef(previous) if previous is not None else None
                if kind == "F":
                    key = pipeline_key(token, "fwd", step, s, d, u)
                    source = "x" if s == 0 else "fwd-msg"
                    inputs = TaskRef(pipeline_key(token, source, step, max(s - 1, 0), d, u))
                    labels = None
                    if s == stages - 1:
                        labels = TaskRef(pipeline_key(token, "y", step, s, d, u))
                        loss_keys.append(key)
                    tasks[key] = Task(
                        key,
                        ws.forward_pass,
                        token,
                        step,
                        u,
                        scale,
                        1.0 if loss_scale is None else loss_scale,
                        inputs,
                        labels,
                        after,
                    )
                    if s < stages - 1:
                        _send(tasks, pipeline_key(token, "fwd-msg", step, s, d, u), key)
                else:
                    key = pipeline_key(token, "bwd", step, s, d, u)
                    incoming = None
                    if s < stages - 1:
                        incoming = TaskRef(pipeline_key(token, "bwd-msg", step, s + 1, d, u))
                    tasks[key] = Task(key, ws.backward_pass, token, step, u, incoming, after)
                    if s > 0:
                        _send(tasks, pipeline_key(token, "bwd-msg", step, s, d, u), key)
                previous = key
            last_pass[(s, d)] = previous
    summed_by_stage = []
    for s in range(stages):
        summed = [None] * replicas
        if replicas > 1:
            grads = []
            for d in range(replicas):
                key = pipeline_key(token, "grad", step, s, d)
                tasks[key] = Task(key, ws.gradient, token, step, TaskRef(last_pass[(s, d)]))
                grads.append(key)
            name = collective_token(token, s, step)
            graph = build_allreduce(name, grads, (grad_sizes[s],), accumulate)
            tasks.update(graph.tasks)
            summed = [TaskRef(k) for k in graph.outputs]
            tokens.append(name)
            collectives[name] = s
        summed_by_stage.append(summed)
    apply, verdict = True, None
    if loss_scale is not None:
        flags = []
        for s in range(stages):
            for d in range(replicas):
                key = pipeline_key(token, "finite", step, s, d)
                after = TaskRef(last_pass[(s, d)])
                tasks[key] = Task(
                    key, ws.gradients_finite, token, step, summed_by_stage[s][d], after
                )
                flags.append(TaskRef(key))
        verdict = pipeline_key(token, "verdict", step, 0, 0)
        tasks[verdict] = Task(verdict, ws.all_finite, *flags)
        apply = TaskRef(verdict)
    inv_scale = 1.0 if loss_scale is None else 1.0 / loss_scale
    for s in range(stages):
        for d in range(replicas):
            key = pipeline_key(token, "update", step, s, d)
            after = TaskRef(last_pass[(s, d)])
            summed = summed_by_stage[s][d]
            tasks[key] = Task(
                key, ws.update, token, step, optimizer, summed, inv_scale, apply, after
            )
            update_keys.append(key)
    return StepGraph(
        tasks,
        loss_keys,
        update_keys,
        Placement(workers, collectives),
        SchedulePriority(schedule, stages, microbatches),
        tokens,
        verdict,
    )


def accumulate_dtype(storage: np.dtype) -> np.dtype:
    """float32 for 16-bit storage, the storage dtype otherwise."""
    return np.dtype(np.float32) if storage.itemsize == 2 else np.dtype(storage)
