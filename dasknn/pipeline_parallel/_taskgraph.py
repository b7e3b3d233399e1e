"""The task graph of one pipeline (and data-parallel) training step and of a prediction: each
stage replica's passes pinned to its worker in schedule order, each stage's gradients allreduced
across replicas (:func:`~dasknn.runtime.collectives.build_allreduce`), fp16 steps applied
everywhere or nowhere. Details: docs/samo.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
from dask.task_spec import List, Task, TaskRef

from dasknn.pipeline_parallel._schedule import stage_order
from dasknn.pipeline_parallel._worker_state import StageState as Stage
from dasknn.pipeline_parallel._worker_state import microbatch_columns, on_stage, run_stage
from dasknn.runtime.collectives import build_allreduce
from dasknn.runtime.keys import parse_collective_key, parse_pipeline_key, pipeline_key
from dasknn.runtime.placement import KeyPlacement

__all__ = [
    "StepGraph",
    "accumulate_dtype",
    "build_inference",
    "build_step",
    "chain_links",
    "final_passes",
    "local_keys",
]


def _stage_replica(collectives: dict[str, int], key) -> tuple[int, int]:
    """The ``(stage, replica)`` whose worker runs ``key`` (``collectives``: the stage of each
    allreduce token); with :class:`~dasknn.runtime.placement.KeyPlacement`, the ``workers=``
    annotation of a step's or prediction's keys."""
    pipeline = parse_pipeline_key(key)
    if pipeline is not None:
        return pipeline.stage, pipeline.replica
    collective = parse_collective_key(key)
    return collectives[collective.token], collective.sender


def _priority(position: dict, last: int, key) -> int:
    """``priority=`` annotation of a step's keys: the microbatches' inputs and targets first,
    then a stage's passes (and their marks) by their ``position`` in its schedule, earlier
    higher, then the per-step work."""
    pipeline = parse_pipeline_key(key)
    if pipeline is None:
        return -last
    if pipeline.kind in ("x", "y"):  # what the first passes wait for
        return 1
    kind = pipeline.kind.removesuffix("-done")
    return -position.get((pipeline.stage, kind, pipeline.microbatch), last)


def _done(value) -> None:
    """Nothing: the mark that a pass ended (see :func:`local_keys`)."""
    return None


def chain_links(order: list[tuple[str, int]]) -> list[tuple[int, ...]]:
    """Per pass of a stage's ``order``, the positions of the passes of the stage it runs after.

    A run's first pass follows the last one or two passes before it (two if of one kind), its
    second the same ones, every later pass the pass two before it; so the next pass of a run is
    already on the worker while one runs (docs/samo.md).
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
    """Positions of the passes the step's later work runs after: the last one and, if of the
    same kind, the one before it."""
    last = len(order) - 1
    if last >= 1 and order[last - 1][0] == order[last][0]:
        return (last, last - 1)
    return (last,)


def local_keys(token: str, step: int, stage: int, replica: int, order: list, stages: int) -> list:
    """Per pass of the stage replica's ``order``, the key the stage's own later tasks wait for:
    the pass key, or, if the pass sends a message and a task of the sender waiting for it may
    wait for something else too, its ``fwd-done`` / ``bwd-done`` mark, which keeps the sender's
    copy from the active memory manager (docs/samo.md)."""
    links = chain_links(order)
    final = final_passes(order)
    sends = {"F": stage < stages - 1, "B": stage > 0}
    reads = {"F": stage > 0, "B": stage < stages - 1}
    out = []
    for n, (kind, u) in enumerate(order):
        name = "fwd" if kind == "F" else "bwd"
        readers = [m for m, link in enumerate(links) if n in link]
        at_once = n not in final and all(
            links[m] == (n,) and not reads[order[m][0]] for m in readers
        )
        kind_key = name if at_once or not sends[kind] else f"{name}-done"
        out.append(pipeline_key(token, kind_key, step, stage, replica, u))
    return out


@dataclass
class StepGraph:
    """A step's tasks, the keys to read back, and the placement and priority of every key."""

    tasks: dict
    loss_keys: list
    update_keys: list
    placement: KeyPlacement
    priority: partial
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
    *,
    data: dict[tuple[str, int], tuple],
) -> StepGraph:
    """The step's graph on the inputs and targets ``data`` names: ``{("x" or "y", d): (key of
    the values held on the first or last stage worker of replica d, [rows of microbatch u,
    ...])}``, of which each microbatch takes its rows (:func:`~._worker_state.microbatch_columns`):
    in the stage's :func:`~._worker_state.run_stage` task with ``postboxes``, otherwise in the
    tasks ``pipeline_key(token, "x", step, 0, d, u)`` and ``pipeline_key(token, "y", step, S - 1,
    d, u)`` that the passes read.

    ``workers``: ``{(stage, replica): address}``; ``scale``: each microbatch's share of the
    batch; ``grad_sizes``: the length of each stage's gradient buffer; ``accumulate``: the dtype
    the allreduce sums in. fp16's ``loss_scale`` multiplies the output deltas and is divided out
    of the updates, and a step whose gradients overflow anywhere is skipped everywhere (the
    verdict is the value of ``verdict_key``). With ``postboxes`` (``{(stage, replica): key of
    its postbox actor}``), a :func:`~._worker_state.run_stage` task a stage replica, the last
    stage's returning its microbatches' losses; without, a task a pass, a loss key a microbatch.
    """

    def pkey(kind: str, s: int, d: int, u: int = -1) -> tuple:
        return pipeline_key(token, kind, step, s, d, u)

    tasks: dict = {}
    loss_keys, update_keys, tokens, collectives = [], [], [], {}
    final: dict[tuple[int, int], List] = {}  # per stage replica, what its later work runs after
    factor, last = 1.0 if loss_scale is None else loss_scale, stages - 1
    orders = [stage_order(schedule, stages, s, microbatches) for s in range(stages)]
    for (name, d), (held, rows) in data.items() if postboxes is None else ():
        for u, chosen in enumerate(rows):  # a task a pass: the microbatch's inputs a task
            key = pkey(name, 0 if name == "x" else last, d, u)
            tasks[key] = Task(key, microbatch_columns, TaskRef(held), chosen)
    for d in range(replicas):
        for s, order in enumerate(orders):
            if postboxes is not None:  # one run_stage task, its messages posted
                run = pkey("run", s, d)
                rows = tuple(data[("x", d)][1])
                inputs = TaskRef(data[("x", d)][0]) if s == 0 else None
                labels = TaskRef(data[("y", d)][0]) if s == last else None
                boxes = [
                    TaskRef(postboxes[(t, d)]) if 0 <= t <= last else None for t in (s - 1, s + 1)
                ]
                args = (token, step, order, scale, factor, rows, inputs, labels, *boxes)
                tasks[run] = Task(run, run_stage, *args)
                if s == last:
                    loss_keys.append(run)
                final[(s, d)] = List(TaskRef(run))
                continue
            marks = local_keys(token, step, s, d, order, stages)
            for (kind, u), mark, link in zip(order, marks, chain_links(order), strict=True):
                key = pkey("fwd" if kind == "F" else "bwd", s, d, u)
                after = List(*(TaskRef(marks[n]) for n in link))
                if kind == "F":
                    inputs = TaskRef(pkey("x", 0, d, u) if s == 0 else pkey("fwd", s - 1, d, u))
                    labels = TaskRef(pkey("y", s, d, u)) if s == last else None
                    args = (Stage.forward, token, after, step, u, scale, factor, inputs, labels)
                    if s == last:
                        loss_keys.append(key)
                else:
                    incoming = TaskRef(pkey("bwd", s + 1, d, u)) if s < last else None
                    args = (Stage.backward, token, after, step, u, incoming)
                tasks[key] = Task(key, on_stage, *args)
                if mark != key:
                    tasks[mark] = Task(mark, _done, TaskRef(key))
            final[(s, d)] = List(*(TaskRef(marks[n]) for n in final_passes(order)))
    summed = {(s, d): None for s in range(stages) for d in range(replicas)}
    for s in range(stages if replicas > 1 else 0):  # each stage's gradients allreduced
        grads = [pkey("grad", s, d) for d in range(replicas)]
        for d, key in enumerate(grads):
            tasks[key] = Task(key, on_stage, Stage.gradient, token, final[(s, d)])
        name = f"{token}s{s}n{step}"  # the allreduce of stage s in this step
        graph = build_allreduce(name, grads, (grad_sizes[s],), accumulate)
        tasks.update(graph.tasks)
        summed.update({(s, d): TaskRef(out) for d, out in enumerate(graph.outputs)})
        tokens.append(name)
        collectives[name] = s
    apply, verdict = True, None
    if loss_scale is not None:
        for (s, d), value in summed.items():
            key = pkey("finite", s, d)
            tasks[key] = Task(key, on_stage, Stage.gradients_finite, token, final[(s, d)], value)
        verdict = pkey("verdict", 0, 0)
        tasks[verdict] = Task(verdict, all, List(*(TaskRef(pkey("finite", *w)) for w in summed)))
        apply = TaskRef(verdict)
    for (s, d), value in summed.items():
        key = pkey("update", s, d)
        args = (Stage.update, token, final[(s, d)], step, optimizer, value, 1.0 / factor, apply)
        tasks[key] = Task(key, on_stage, *args)
        update_keys.append(key)
    position = {
        (s, "fwd" if kind == "F" else "bwd", u): n
        for s, order in enumerate(orders)
        for n, (kind, u) in enumerate(order)
    }
    priority = partial(_priority, position, 2 * microbatches)
    placement = KeyPlacement(dict(workers), partial(_stage_replica, collectives))
    return StepGraph(tasks, loss_keys, update_keys, placement, priority, tokens, verdict)


def build_inference(
    token: str, call: int, stages: int, replicas: int, blocks: int, workers: dict
) -> tuple[dict, list, KeyPlacement]:
    """The tasks of a prediction: row block ``j`` (key ``pipeline_key(token, "infer-x", call, 0,
    d, j)``, replica ``d = j % replicas``) through that replica's stages, a
    :meth:`~._worker_state.StageState.infer` task a stage. Returns the tasks, the last stage's
    result keys (``(z_L, a_L)`` a block, in order) and every key's placement."""
    tasks: dict = {}
    outputs = []
    for j in range(blocks):
        d = j % replicas
        source = pipeline_key(token, "infer-x", call, 0, d, j)
        for s in range(stages):
            key = pipeline_key(token, "infer", call, s, d, j)
            tasks[key] = Task(key, on_stage, Stage.infer, token, None, TaskRef(source))
            source = key
        outputs.append(source)
    return tasks, outputs, KeyPlacement(dict(workers), partial(_stage_replica, {}))


def accumulate_dtype(storage: np.dtype) -> np.dtype:
    """float32 for 16-bit storage, the storage dtype otherwise."""
    return np.dtype(np.float32) if storage.itemsize == 2 else np.dtype(storage)
