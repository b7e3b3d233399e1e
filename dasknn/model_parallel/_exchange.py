"""Training steps whose layer messages go straight from worker to worker (``messages="posted"``).

In the default mode (:mod:`dasknn.model_parallel._taskgraph`) every layer step of every part is a
task and every message a task result the scheduler routes: each layer costs a scheduler round
trip (task finished, next task assigned, its input fetched from the peer). Here a step is one
task per worker, which runs that worker's parts through the forward and backward layer chain
itself (the same per-part functions as the tasks of the default mode,
:func:`~dasknn.model_parallel._steps.forward_task` and
:func:`~dasknn.model_parallel._steps.backward_task`) and exchanges the messages directly: a
message for a part on another worker is posted to that worker's
:class:`~dasknn.runtime.postbox.Postbox`, a Dask actor (one per worker and model, documented API:
its method calls go from worker to worker without the scheduler), which leaves it in the
receiving model plugin's mailbox, where the receiving part waits for it. The task runs in the
posted run loop of every mode (:class:`~dasknn.runtime.posted.PostedTask`): it waits for its
posts before it ends, reports every message its worker received to the communication monitor in
one event as it ends (so the volume is measured as in the default mode), and a worker whose step
fails posts its error to the others (under their :func:`failed_key` of the step), whose waits
then raise it too, unless its step was dropped (every worker's was). Microbatches interleave
within the task: the worker computes microbatch ``i + 1`` of a layer while the messages of
microbatch ``i`` travel.

The scheduler still sees one task per worker and step, its data dependencies (the plans, data
blocks and postboxes on the workers) and the order of steps; it no longer sees the layer steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from dask.task_spec import List, Task, TaskRef

from dasknn.model_parallel._layout import Layout
from dasknn.model_parallel._plan import CommPlan
from dasknn.model_parallel._steps import (
    Route,
    StepContext,
    backward_task,
    combine_logsumexp,
    forward_task,
)
from dasknn.model_parallel._worker_state import ModelState
from dasknn.runtime import keys
from dasknn.runtime.keys import phase_names, step_key
from dasknn.runtime.posted import PostedTask

__all__ = ["ActorStepTemplate", "WorkerProgram", "failed_key", "postbox_key", "worker_step"]

NO_RECEIVER = -1
SOFTMAX_STATS = -3
#: The family of the model-parallel postbox keys (:func:`dasknn.runtime.keys.postbox_key`).
MODEL_POSTBOXES = "model"


def postbox_key(token: str, generation: int, worker: int) -> str:
    """The key of the :class:`Postbox` actor of the model ``token`` on worker number ``worker``
    in the model's placement number ``generation`` (:func:`dasknn.runtime.keys.postbox_key`)."""
    return keys.postbox_key(MODEL_POSTBOXES, token, worker, generation)


@dataclass(frozen=True)
class WorkerProgram:
    """What one worker runs in a step: its parts and the routes of their messages (static).

    Every route takes all incoming messages from the mailbox (sources ``None``) and posts every
    outgoing message itself (``local`` lists all receiving parts, on this worker or not).
    """

    parts: tuple
    forward: dict  # (k, m) -> Route of the forward of layer k (k < L)
    last_forward: dict  # m -> Route of the forward of layer L
    backward: dict  # (k, m) -> Route of the backward of layer k
    root: bool  # whether this worker hosts part 0 (combines the softmax statistics)


class ActorStepTemplate:
    """The structure of a training step in ``messages="posted"`` mode: one task per worker.

    Parameters
    ----------
    token : str
    plan : CommPlan
    layout : Layout
    postboxes : sequence of str
        The key of the :class:`Postbox` actor of every worker hosting parts (sorted addresses).
    """

    def __init__(self, token: str, plan: CommPlan, layout: Layout, postboxes) -> None:
        self.names = phase_names(token)
        self.postboxes = tuple(postboxes)
        self.n_layers = L = plan.n_layers
        self.nparts = P = plan.nparts
        self.part_workers = tuple(layout.part_workers)
        self.workers = sorted(set(layout.part_workers))
        self._plan_keys = layout.plan_keys
        self.programs = []
        for address in self.workers:
            parts = tuple(m for m in range(P) if layout.part_workers[m] == address)
            forward, backward, last = {}, {}, {}
            for m in parts:
                for k in range(L + 1):
                    senders = plan.layers[k - 1][m].senders() if k >= 1 else []
                    if k < L:
                        receivers = tuple(sorted(plan.layers[k][m].send))
                        forward[(k, m)] = Route(sources=(None,) * len(senders), local=receivers)
                    else:
                        last[m] = Route(sources=(None,) * len(senders))
                for k in range(1, L + 1):
                    returning = sorted(plan.layers[k][m].send) if k < L else []
                    owners = tuple(plan.layers[k - 1][m].senders()) if k >= 2 else ()
                    backward[(k, m)] = Route(sources=(None,) * len(returning), local=owners)
            root = bool(parts) and parts[0] == 0
            self.programs.append(WorkerProgram(parts, forward, last, backward, root))

    def key(self, step: int, worker: int) -> tuple:
        """Key of the task of worker number ``worker`` in ``step`` (part field: its first part,
        which places it)."""
        return step_key(self.names["run"], step, -1, self.programs[worker].parts[0], -1, 0)

    def output_keys(self, step: int) -> list[tuple]:
        """One key per worker hosting parts; each returns the loss share of its parts."""
        return [self.key(step, w) for w, p in enumerate(self.programs) if p.parts]

    def graph(
        self, ctx: StepContext, inputs: dict, rows: list, previous: dict | None = None
    ) -> dict:
        """The task graph of step ``ctx.step`` (see :meth:`StepTemplate.graph
        <dasknn.model_parallel._taskgraph.StepTemplate.graph>` for the arguments)."""
        postboxes = List(*(TaskRef(key) for key in self.postboxes))
        dsk = {}
        for w, program in enumerate(self.programs):
            if not program.parts:
                continue
            key = self.key(ctx.step, w)
            layers = range(self.n_layers)
            plans = List(*(TaskRef(self._plan_keys[k][m]) for m in program.parts for k in layers))
            xs = List(*(TaskRef(inputs[("x", m)]) for m in program.parts))
            ys = List(*(TaskRef(inputs[("y", m)]) for m in program.parts))
            after = List(*(TaskRef(k) for k in (previous or {}).get(program.parts[0], ())))
            dsk[key] = Task(
                key,
                worker_step,
                ctx,
                program,
                tuple(self.workers),
                plans,
                xs,
                ys,
                rows,
                postboxes,
                after,
            )
        return dsk


def worker_step(
    ctx: StepContext,
    program: WorkerProgram,
    workers: tuple,
    plans: list,
    xs: list,
    ys: list,
    rows: list,
    postboxes: list,
    after=None,
) -> float:
    """Task: one training step of the parts on this worker; returns their loss share.

    Parameters
    ----------
    ctx : StepContext
        With ``part_workers`` set, so messages to parts on other workers are posted.
    program : WorkerProgram
    workers : tuple of str
        The addresses of the workers, in the order of ``postboxes``.
    plans : list
        ``plans[j * L + k]``: the plan of part ``program.parts[j]`` for layer ``k + 1``.
    xs, ys : list
        Every part's input and target block (``program.parts`` order).
    rows : list
        The batch columns of every microbatch.
    postboxes : list
        The :class:`Postbox` actor of every worker.
    after : list
        Ignored: this worker's task of the previous step, which must end first.
    """
    owner = ModelState.on_worker(ctx.token)
    L = ctx.n_layers
    index = {m: j for j, m in enumerate(program.parts)}
    me = workers.index(owner.address)

    def plan(k: int, m: int):
        """The plan of part ``m`` for layer ``k + 1`` (``None`` outside ``0..L-1``)."""
        return plans[index[m] * L + k] if 0 <= k < L else None

    def others() -> list:
        if owner.first_step > ctx.step:  # dropped: every worker's step was dropped as well
            return []
        return [(box, failed_key(ctx.token, ctx.step, w)) for w, box in enumerate(postboxes)
                if w != me]  # fmt: skip

    with PostedTask(owner.mailbox, dict(zip(workers, postboxes, strict=True))) as task:
        task.drop_ended(lambda key: key[1] >= ctx.step)  # step keys: the step second
        owner.posting, owner.failed = task, failed_key(ctx.token, ctx.step, me)
        try:
            with task.failing(others, f"worker {owner.address} failed in step {ctx.step}"):
                loss = _step(owner, ctx, program, workers, plan, xs, ys, rows)
                task.wait_posted(task.posts)
        finally:
            owner.posting = owner.failed = None
    return loss


def _step(owner, ctx, program, workers, plan, xs, ys, rows) -> float:
    """The forward and backward layer chain of the worker's parts (see :func:`worker_step`)."""
    L, M = ctx.n_layers, ctx.microbatches
    index = {m: j for j, m in enumerate(program.parts)}
    for k in range(L):
        for i in range(M):
            for m in program.parts:
                inputs = {"x0": xs[index[m]], "x0_rows": rows[i]} if k == 0 else {}
                route = program.forward[(k, m)]
                forward_task(
                    ctx,
                    m,
                    k,
                    NO_RECEIVER,
                    plan(k - 1, m),
                    plan(k, m),
                    route=route,
                    microbatch=i,
                    **inputs,
                )
    lse = [None] * M
    if ctx.loss == "softmax_cross_entropy":
        lse = _logsumexp(owner, ctx, program, workers, plan, ys, rows)
    loss = 0.0
    for k in range(L, 0, -1):
        for i in range(M):
            for m in program.parts:
                last = {}
                if k == L:
                    last = {"y": ys[index[m]], "y_rows": rows[i], "lse": lse[i]}
                    last["forward_route"] = program.last_forward[m]
                share = backward_task(
                    ctx,
                    m,
                    k,
                    NO_RECEIVER,
                    plan(k - 1, m),
                    plan(k, m),
                    route=program.backward[(k, m)],
                    microbatch=i,
                    **last,
                )
                if k == 1:
                    loss += share
    return loss


def failed_key(token: str, step: int, worker: int) -> tuple:
    """The key under which worker number ``worker`` receives the error of a worker that failed
    in ``step``."""
    return step_key(phase_names(token)["failed"], step, -1, -1, worker, -1)


def _logsumexp(owner, ctx, program, workers, plan, ys, rows) -> list:
    """Every microbatch's row-wise log-sum-exp of the logits and target sums, (2, B_i): each
    part's statistics go to the worker of part 0, which combines and posts them back."""
    names = phase_names(ctx.token)
    L, root = ctx.n_layers, ctx.part_workers[0]
    index = {m: j for j, m in enumerate(program.parts)}
    for i in range(ctx.microbatches):
        for m in program.parts:
            stats = forward_task(
                ctx,
                m,
                L,
                SOFTMAX_STATS,
                plan(L - 1, m),
                None,
                y=ys[index[m]],
                y_rows=rows[i],
                route=program.last_forward[m],
                microbatch=i,
            )
            key = step_key(names["lse"], ctx.step, L, m, SOFTMAX_STATS, i)
            _send(owner, root, key, stats)
    result = []
    for i in range(ctx.microbatches):
        key = step_key(names["lse"], ctx.step, L, 0, NO_RECEIVER, i)
        if program.root:
            stats = [
                owner.take(step_key(names["lse"], ctx.step, L, m, SOFTMAX_STATS, i))
                for m in range(len(ctx.part_workers))
            ]
            combined = combine_logsumexp(*stats)
            for address in workers:
                _send(owner, address, key, combined)
        result.append(owner.take(key))
    return result


def _send(owner, address: str, key: tuple, value) -> None:
    """Leave ``key`` in this worker's mailbox or post it to the worker at ``address``."""
    if address == owner.address:
        owner.deliver(key, value)
    else:
        owner.post(address, key, value)
