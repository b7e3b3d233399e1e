"""The task graph of one pipeline (and data-parallel) training step.

For every replica ``d`` and stage ``s`` the passes of the step are tasks pinned to the stage
replica's worker, run in the order of the schedule (:func:`stage_order`): a pass of a run of
passes of one kind runs after the pass two before it, the first passes of a run after the last of
the run before (:func:`chain_links`), so the next pass of a run is on the worker, its priority
ordering it, before the one before it ends. A forward task of stage ``s > 0`` reads the pass key of
stage ``s - 1``'s forward pass of its microbatch (its last pre-activations), a backward task of
stage ``s < S - 1`` that of stage ``s + 1``'s backward pass (those pre-activations' deltas): one
message each. The
sender's own tasks that must run after a sent pass but may wait for something else wait instead
for the pass's ``fwd-done`` / ``bwd-done`` task (:func:`local_keys`), which reads the pass, is
processing on the sender as soon as the pass ends, and returns nothing: Dask's active memory
manager keeps a replica that a task processing on its worker still needs, so the sender's copy
stays until then, nothing on the sender reads the pass later, and the sender never fetches a
message back. With ``D > 1`` replicas, each
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
from dask.task_spec import List, Task, TaskRef

from dasknn.pipeline_parallel import _worker_state as ws
from dasknn.pipeline_parallel._schedule import stage_order
from dasknn.runtime.collectives import build_allreduce
from dasknn.runtime.keys import parse_collective_key, parse_pipeline_key, pipeline_key

__all__ = [
    "SchedulePriority",
    "StepGraph",
    "build_inference",
    "build_step",
    "chain_links",
    "collective_token",
    "final_passes",
    "local_keys",
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
        kind = pipeline.kind.removesuffix("-done")  # a pass's mark right after the pass
        return -self.position.get((pipeline.stage, kind, pipeline.microbatch), self.last)


def _done(value) -> None:
    """Nothing: the mark that a pass ended (see :func:`local_keys`)."""
    return None


def _local_inputs(kind: str, stage: int, stages: int) -> bool:
    """Whether a pass reads nothing from another stage: a forward pass of the first stage (the
    microbatch, in memory before the step), a backward pass of the last (its output delta)."""
    return (kind == "F" and stage == 0) or (kind == "B" and stage == stages - 1)


def chain_links(order: list[tuple[str, int]]) -> list[tuple[int, ...]]:
    """Per pass of a stage's ``order``, the positions of the passes of the stage it runs after.

    The first pass of a run of passes of one kind runs after the last pass before the run, and
    after the one before that too if both are of one kind; the second pass of a run after the
    same passes as the first; every later pass after the pass two before it. So while a pass
    runs, the next one of its run is already on the worker (its inputs permitting), with no
    scheduler round trip between them, and a run's passes may end in any order: the run after it
    waits for the last two, which between them follow every earlier pass. The schedule's
    interleaving of forward and backward passes (1F1B's runs of one) is kept.
    """
    links: list[tuple[int, ...]] = []
    for n, (kind, _) in enumerate(order):
        if n == 0:
            links.append(())
        elif order[n - 1][0] != kind:  # a run starts: after the previous run's last passes
            pair = n >= 2 and order[n - 2][0] == order[n - 1][0]
            links.append((n - 1, n - 2) if pair else (n - 1,))
        elif n >= 2 and order[n - 2][0] == kind:  # inside a run: after the pass two before
            links.append((n - 2,))
        else:  # the run's second pass: after what the first runs after
            links.append(links[n - 1])
    return links


def final_passes(order: list[tuple[str, int]]) -> tuple[int, ...]:
    """Positions of the passes that the step's later work (gradients, update) runs after: the
    last one and, if of the same kind, the one before it (between them they follow every
    pass)."""
    last = len(order) - 1
    if last >= 1 and order[last - 1][0] == order[last][0]:
        return (last, last - 1)
    return (last,)


def local_keys(
    token: str,
    step: int,
    stage: int,
    replica: int,
    order: list[tuple[str, int]],
    stages: int,
) -> list[tuple]:
    """Per pass of the stage replica's ``order``, the key the stage's own later tasks wait for.

    The pass key itself, unless the pass sends a message (a forward pass before the last stage,
    a backward pass after the first) and a task of the sender that waits for it may wait for
    something else too: a pass that runs after another one as well or reads another stage's
    message, or the step's later work (:func:`final_passes`). Such tasks wait for the pass's
    ``fwd-done`` / ``bwd-done`` mark instead, a task that reads the pass key and so is
    processing on the sender as soon as the pass ends: the sender's copy of the message is
    needed by a task processing there until the mark ran, so Dask's active memory manager
    cannot drop it, and afterwards nothing on the sender reads it.
    """
    links = chain_links(order)
    final = final_passes(order)
    out = []
    for n, (kind, u) in enumerate(order):
        name = "fwd" if kind == "F" else "bwd"
        sends = (kind == "F" and stage < stages - 1) or (kind == "B" and stage > 0)
        readers = [m for m, link in enumerate(links) if n in link]
        at_once = n not in final and all(
            links[m] == (n,) and _local_inputs(order[m][0], stage, stages) for m in readers
        )
        kind_key = name if at_once or not sends else f"{name}-done"
        out.append(pipeline_key(token, kind_key, step, stage, replica, u))
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
    postboxes: dict[tuple[int, int], str] | None = None,
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
    postboxes : dict, optional
        ``{(stage, replica): key of its postbox actor}``: the step runs as one task per stage
        replica (``run`` keys, :func:`~dasknn.pipeline_parallel._worker_state.run_stage`) whose
        messages are posted worker to worker; each last stage's task returns the losses of its
        microbatches. Without it, a task per pass and each message a task result; each
        ``loss_keys`` entry is one microbatch's loss.
    """
    tasks: dict = {}
    loss_keys, update_keys, tokens, collectives = [], [], [], {}
    final: dict[tuple[int, int], List] = {}
    for d in range(replicas):
        for s in range(stages):
            order = stage_order(schedule, stages, s, microbatches)
            if postboxes is not None:
                key = pipeline_key(token, "run", step, s, d)
                tasks[key] = _run_task(
                    key, token, step, s, d, order, stages, scale, loss_scale, postboxes
                )
                if s == stages - 1:
                    loss_keys.append(key)
                final[(s, d)] = List(TaskRef(key))
                continue
            keys = [
                pipeline_key(token, "fwd" if kind == "F" else "bwd", step, s, d, u)
                for kind, u in order
            ]
            marks = local_keys(token, step, s, d, order, stages)
            for (kind, u), key, mark, link in zip(
                order, keys, marks, chain_links(order), strict=True
            ):
                after = List(*(TaskRef(marks[n]) for n in link))
                if kind == "F":
                    source = ("x", 0) if s == 0 else ("fwd", s - 1)
                    inputs = TaskRef(pipeline_key(token, source[0], step, source[1], d, u))
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
                    incoming = None
                    if s < stages - 1:
                        incoming = TaskRef(pipeline_key(token, "bwd", step, s + 1, d, u))
                    tasks[key] = Task(key, ws.backward_pass, token, step, u, incoming, after)
                if mark != key:
                    tasks[mark] = Task(mark, _done, TaskRef(key))
            final[(s, d)] = List(*(TaskRef(marks[n]) for n in final_passes(order)))
    summed_by_stage = []
    for s in range(stages):
        summed = [None] * replicas
        if replicas > 1:
            grads = []
            for d in range(replicas):
                key = pipeline_key(token, "grad", step, s, d)
                tasks[key] = Task(key, ws.gradient, token, step, final[(s, d)])
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
                tasks[key] = Task(
                    key, ws.gradients_finite, token, step, summed_by_stage[s][d], final[(s, d)]
                )
                flags.append(TaskRef(key))
        verdict = pipeline_key(token, "verdict", step, 0, 0)
        tasks[verdict] = Task(verdict, ws.all_finite, *flags)
        apply = TaskRef(verdict)
    inv_scale = 1.0 if loss_scale is None else 1.0 / loss_scale
    for s in range(stages):
        for d in range(replicas):
            key = pipeline_key(token, "update", step, s, d)
            summed = summed_by_stage[s][d]
            tasks[key] = Task(
                key, ws.update, token, step, optimizer, summed, inv_scale, apply, final[(s, d)]
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


def _run_task(key, token, step, s, d, order, stages, scale, loss_scale, postboxes) -> Task:
    """The task of stage replica ``(s, d)`` that runs all its passes of the step, its messages
    posted (:func:`~dasknn.pipeline_parallel._worker_state.run_stage`)."""
    m = len(order) // 2
    inputs = [TaskRef(pipeline_key(token, "x", step, 0, d, u)) for u in range(m)] if s == 0 else []
    labels = []
    if s == stages - 1:
        labels = [TaskRef(pipeline_key(token, "y", step, s, d, u)) for u in range(m)]
    previous = TaskRef(postboxes[(s - 1, d)]) if s > 0 else None
    following = TaskRef(postboxes[(s + 1, d)]) if s < stages - 1 else None
    return Task(
        key,
        ws.run_stage,
        token,
        step,
        order,
        scale,
        1.0 if loss_scale is None else loss_scale,
        List(*inputs),
        List(*labels),
        previous,
        following,
    )


def build_inference(
    token: str,
    call: int,
    stages: int,
    replicas: int,
    blocks: int,
    workers: dict[tuple[int, int], str],
) -> tuple[dict, list, Placement]:
    """The tasks of a prediction: row block ``j`` (its feature-major samples under the key
    ``pipeline_key(token, "infer-x", call, 0, d, j)`` on stage 0 of replica ``d = j %
    replicas``) runs through that replica's stages, one ``infer`` task per stage
    (:func:`~dasknn.pipeline_parallel._worker_state.infer`), each reading the previous stage's
    (one message per boundary and block). Returns the tasks, the keys of the last stage's
    results (``(z_L, a_L)`` of each block, in order) and the placement of every key."""
    tasks: dict = {}
    outputs = []
    for j in range(blocks):
        d = j % replicas
        source = pipeline_key(token, "infer-x", call, 0, d, j)
        for s in range(stages):
            key = pipeline_key(token, "infer", call, s, d, j)
            tasks[key] = Task(key, ws.infer, token, TaskRef(source))
            source = key
        outputs.append(source)
    return tasks, outputs, Placement(workers, {})


def accumulate_dtype(storage: np.dtype) -> np.dtype:
    """float32 for 16-bit storage, the storage dtype otherwise."""
    return np.dtype(np.float32) if storage.itemsize == 2 else np.dtype(storage)
