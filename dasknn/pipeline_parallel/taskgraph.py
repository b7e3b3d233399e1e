"""The task graph of one pipeline (and data-parallel) training step.

For every replica ``d`` and stage ``s`` the passes of the step are tasks pinned to the stage
replica's worker, each running after its predecessor in the order of the schedule
(:func:`stage_order`, :func:`chain_links`), except the first stage's opening forward passes, which
read only the microbatches and are handed to the worker at once (their priorities order them). A
forward task of stage ``s > 0`` reads a message of stage ``s - 1``, a backward task of stage
``s < S - 1`` a message of stage ``s + 1``: one key each, whose only other readers are passes of
the sender that read nothing from another stage, and so run as soon as the message is made
(:func:`message_keys`: the pass key itself, or else a ``fwd-msg`` / ``bwd-msg`` task that passes
the value on). Dask's active memory manager keeps a replica that a task processing on its worker
still needs, so it cannot drop the sender's copy while a pass of the sender waits for it, and the
sender never fetches a message back. With ``D > 1`` replicas, each
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

__all__ = [
    "SchedulePriority",
    "StepGraph",
    "build_step",
    "chain_links",
    "collective_token",
    "message_keys",
]


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


def _local_inputs(kind: str, stage: int, stages: int) -> bool:
    """Whether a pass reads nothing from another stage: a forward pass of the first stage (the
    microbatch, in memory before the step), a backward pass of the last (its output delta)."""
    return (kind == "F" and stage == 0) or (kind == "B" and stage == stages - 1)


def chain_links(order: list[tuple[str, int]], stage: int, stages: int) -> list[int | None]:
    """Per pass of a stage's ``order``, the position of the pass it runs after (``None``: the
    first pass, or one of the first stage's forward passes that open the order).

    Every pass runs after its predecessor in the order, except, with ``stages > 1``, the first
    stage's forward passes before its first backward pass: they read only the microbatches, so
    they are handed to the worker at once and run in the order of their priorities without a
    scheduler round trip between them. Its first backward pass runs after the last of them, and
    their activations reach it only through the later stages, so every pass still precedes the
    stage's last one.
    """
    links: list[int | None] = []
    for n, (kind, _) in enumerate(order):
        opening = stages > 1 and stage == 0 and kind == "F" and all(k == "F" for k, _ in order[:n])
        links.append(None if n == 0 or opening else n - 1)
    return links


def message_keys(
    token: str,
    step: int,
    stage: int,
    replica: int,
    order: list[tuple[str, int]],
    links: list[int | None],
    stages: int,
) -> dict[tuple[str, int], tuple]:
    """Per pass of the stage replica that sends a message (``(kind, microbatch)``), the key the
    message travels under.

    The pass key itself when the sender's own tasks that read it are only passes that read
    nothing from another stage (:func:`_local_inputs`): they run as soon as the pass ends,
    holding the sender's copy, so Dask's active memory manager cannot drop it and make the
    sender fetch it back; this saves a task and a scheduler round trip per message. Otherwise
    (the pass is the stage's last, read by the per-step work, or its next pass also waits for
    another stage) a ``fwd-msg`` / ``bwd-msg`` task on the sender passes the value on, and the
    receiving pass is its only consumer.
    """
    out = {}
    last = len(order) - 1
    for n, (kind, u) in enumerate(order):
        if (kind == "F" and stage == stages - 1) or (kind == "B" and stage == 0):
            continue  # the last stage's activations and the first stage's partial sums stay
        readers = [m for m, link in enumerate(links) if link == n]
        direct = n != last and all(_local_inputs(order[m][0], stage, stages) for m in readers)
        name = "fwd" if kind == "F" else "bwd"
        out[(kind, u)] = pipeline_key(
            token, name if direct else f"{name}-msg", step, stage, replica, u
        )
    return out


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
    orders = {s: stage_order(schedule, stages, s, microbatches) for s in range(stages)}
    chains = {s: chain_links(orders[s], s, stages) for s in range(stages)}
    sent = {
        (kind, s, d, u): key
        for s in range(stages)
        for d in range(replicas)
        for (kind, u), key in message_keys(token, step, s, d, orders[s], chains[s], stages).items()
    }
    for d in range(replicas):
        for s in range(stages):
            for n, (kind, u) in enumerate(orders[s]):
                link = chains[s][n]
                after = None
                if link is not None:
                    name = "fwd" if orders[s][link][0] == "F" else "bwd"
                    after = TaskRef(pipeline_key(token, name, step, s, d, orders[s][link][1]))
                if kind == "F":
                    key = pipeline_key(token, "fwd", step, s, d, u)
                    if s == 0:
                        inputs = TaskRef(pipeline_key(token, "x", step, 0, d, u))
                    else:
                        inputs = TaskRef(sent[("F", s - 1, d, u)])
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
                else:
                    key = pipeline_key(token, "bwd", step, s, d, u)
                    incoming = None
                    if s < stages - 1:
                        incoming = TaskRef(sent[("B", s + 1, d, u)])
                    tasks[key] = Task(key, ws.backward_pass, token, step, u, incoming, after)
                message = sent.get((kind, s, d, u))
                if message is not None and message != key:
                    _send(tasks, message, key)
            last_pass[(s, d)] = key
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
