"""Training steps whose layer messages go straight from worker to worker (``messages="posted"``):
one task per worker (:func:`worker_step`) runs its parts' layer chain with the functions of
:mod:`~dasknn.model_parallel._steps` in the posted run loop
(:class:`~dasknn.runtime.posted.PostedTask`), computing microbatch ``i + 1`` of a layer while the
messages of microbatch ``i`` travel to the other workers' postboxes (docs/training.md)."""

from __future__ import annotations

from dataclasses import dataclass

from dask.task_spec import List, Task, TaskRef

from dasknn.model_parallel._layout import Layout
from dasknn.model_parallel._plan import CommPlan
from dasknn.model_parallel._steps import (
    NO_RECEIVER,
    SOFTMAX_STATS,
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

def postbox_key(token: str, generation: int, worker: int) -> str:
    """The key of the :class:`Postbox` actor of the model ``token`` on worker number ``worker``
    in the model's placement number ``generation`` (:func:`dasknn.runtime.keys.postbox_key`)."""
    return keys.postbox_key("model", token, worker, generation)


def failed_key(token: str, step: int, worker: int) -> tuple:
    """The key under which worker number ``worker`` receives the error of a worker that failed
    in ``step``."""
    return step_key(phase_names(token)["failed"], step, -1, -1, worker, -1)


@dataclass(frozen=True)
class WorkerProgram:
    """What one worker runs in a step: its parts, the :class:`Route` of every ``forward`` and
    ``backward`` step ``(k, m)``, and whether it hosts part 0 (``root``, which combines the softmax
    statistics). Every route takes its messages from the mailbox and lists all receiving parts in
    ``local``."""

    parts: tuple
    forward: dict
    backward: dict
    root: bool


def _mailbox(senders: tuple) -> tuple:
    return (None,) * len(senders)


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
        self.name = phase_names(token)["run"]
        self.postboxes = tuple(postboxes)
        self.n_layers = L = plan.n_layers
        self.workers = tuple(sorted(set(layout.part_workers)))
        self._plan_keys = layout.plan_keys
        self.programs = []
        for address in self.workers:
            parts = tuple(m for m, w in enumerate(layout.part_workers) if w == address)
            forward, backward = {}, {}
            for m in parts:
                senders = [()] + [tuple(plan.layers[k - 1][m].senders()) for k in range(1, L + 1)]
                receivers = [tuple(sorted(plan.layers[k][m].send)) for k in range(L)] + [()]
                for k in range(L + 1):
                    forward[(k, m)] = Route(_mailbox(senders[k]), receivers[k])
                for k in range(1, L + 1):
                    backward[(k, m)] = Route(_mailbox(receivers[k]), senders[k] if k >= 2 else ())
            self.programs.append(WorkerProgram(parts, forward, backward, parts[0] == 0))

    def key(self, step: int, worker: int) -> tuple:
        """Key of worker number ``worker``'s task in ``step`` (placed by its first part)."""
        return step_key(self.name, step, -1, self.programs[worker].parts[0], -1, 0)

    def output_keys(self, step: int) -> list[tuple]:
        """One key per worker; each returns the loss share of its parts."""
        return [self.key(step, w) for w in range(len(self.programs))]

    def graph(self, ctx: StepContext, inputs: dict, rows: list, previous: dict | None = None):
        """The task graph of step ``ctx.step`` (see :meth:`StepTemplate.graph
        <dasknn.model_parallel._taskgraph.StepTemplate.graph>` for the arguments)."""
        postboxes = List(*(TaskRef(key) for key in self.postboxes))
        dsk = {}
        for w, program in enumerate(self.programs):
            key, parts = self.key(ctx.step, w), program.parts
            layers = range(self.n_layers)
            plans = List(*(TaskRef(self._plan_keys[k][m]) for m in parts for k in layers))
            xs = List(*(TaskRef(inputs[("x", m)]) for m in parts))
            ys = List(*(TaskRef(inputs[("y", m)]) for m in parts))
            after = List(*(TaskRef(k) for k in (previous or {}).get(parts[0], ())))
            dsk[key] = Task(
                key, worker_step, ctx, program, self.workers, plans, xs, ys, rows, postboxes, after
            )
        return dsk


def worker_step(
    ctx: StepContext, program: WorkerProgram, workers: tuple, plans: list, xs: list, ys: list,
    rows: list, postboxes: list, after=None,
) -> float:  # fmt: skip
    """Task: one training step of the parts on this worker; returns their loss share.

    ``ctx`` has ``part_workers`` set; ``workers`` are the addresses in the order of their
    ``postboxes``; ``plans[j * L + k]`` is the plan of part ``program.parts[j]`` for layer
    ``k + 1``; ``xs`` and ``ys`` hold every part's input and target block, ``rows`` the batch
    columns of every microbatch; ``after`` (ignored) is this worker's task of the previous step.
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

    x, y = dict(zip(program.parts, xs, strict=True)), dict(zip(program.parts, ys, strict=True))
    with PostedTask(owner.mailbox, dict(zip(workers, postboxes, strict=True))) as task:
        task.drop_ended(lambda key: key[1] >= ctx.step)  # step keys: the step second
        owner.posting, owner.failed = task, failed_key(ctx.token, ctx.step, me)
        delivered = False
        try:
            with task.failing(others, f"worker {owner.address} failed in step {ctx.step}"):
                loss = _step(owner, ctx, program, workers, plan, x, y, rows)
                task.wait_posted(task.posts)
            delivered = True
        finally:
            owner.end_posting(delivered)
            owner.posting = owner.failed = None
    return loss


def _step(owner, ctx, program, workers, plan, x, y, rows) -> float:
    """The forward and backward layer chain of the worker's parts (see :func:`worker_step`)."""
    L, M = ctx.n_layers, ctx.microbatches
    for k in range(L):
        for i in range(M):
            for m in program.parts:
                inputs = {"x0": x[m], "x0_rows": rows[i]} if k == 0 else {}
                forward_task(
                    ctx, m, k, NO_RECEIVER, plan(k - 1, m), plan(k, m),
                    route=program.forward[(k, m)], microbatch=i, **inputs,
                )  # fmt: skip
    lse = [None] * M
    if ctx.loss == "softmax_cross_entropy":
        lse = _logsumexp(owner, ctx, program, workers, plan, y, rows)
    loss = 0.0
    for k in range(L, 0, -1):
        for i in range(M):
            for m in program.parts:
                last = {}
                if k == L:
                    route = program.forward[(L, m)]
                    last = {"y": y[m], "y_rows": rows[i], "lse": lse[i], "forward_route": route}
                share = backward_task(
                    ctx, m, k, NO_RECEIVER, plan(k - 1, m), plan(k, m),
                    route=program.backward[(k, m)], microbatch=i, **last,
                )  # fmt: skip
                if k == 1:
                    loss += share
    return loss


def _logsumexp(owner, ctx, program, workers, plan, y, rows) -> list:
    """Every microbatch's row-wise log-sum-exp of the logits and target sums, (2, B_i): each
    part's statistics go to the worker of part 0, which combines and posts them back."""
    name, L, root = phase_names(ctx.token)["lse"], ctx.n_layers, ctx.part_workers[0]
    for i in range(ctx.microbatches):
        for m in program.parts:
            stats = forward_task(
                ctx, m, L, SOFTMAX_STATS, plan(L - 1, m), None, y=y[m], y_rows=rows[i],
                route=program.forward[(L, m)], microbatch=i,
            )  # fmt: skip
            owner.send(root, step_key(name, ctx.step, L, m, SOFTMAX_STATS, i), stats)
    result = []
    for i in range(ctx.microbatches):
        key = step_key(name, ctx.step, L, 0, NO_RECEIVER, i)
        if program.root:
            parts = range(len(ctx.part_workers))
            combined = combine_logsumexp(
                *(owner.take(step_key(name, ctx.step, L, m, SOFTMAX_STATS, i)) for m in parts)
            )
            for address in workers:
                owner.send(address, key, combined)
        result.append(owner.take(key))
    return result
