"""The task graph of a data-parallel step (:func:`build_step`) and of an inference pass
(:func:`build_inference`), with the bytes of every message. See docs/data_parallel.md.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field, replace

import numpy as np
from dask.task_spec import Task, TaskRef

from dasknn.data_parallel import _steps as steps
from dasknn.data_parallel._plan import StepPlan, Topology
from dasknn.data_parallel._steps import DENSE, SPARSE, StepContext
from dasknn.runtime.collectives import build_allgather, build_allreduce, chunk_bounds
from dasknn.runtime.keys import dp_key

__all__ = ["ARCHITECTURES", "STEP", "StepGraph", "build_inference", "build_step", "inference_step"]

ARCHITECTURES = ("hybrid", "ps", "ar", "ar-dense")
INDEX_BYTES = 8
STEP = "step"
#: The least bytes of rows a server sends ahead of its update (``prefetch``): a message costs
#: both workers fixed CPU time (packing, a wake-up of the sending and receiving socket threads,
#: a mailbox delivery), which outweighs the link time saved by a smaller one where workers
#: share cores (docs/data_parallel.md, "Rows sent ahead").
PREFETCH_MIN_BYTES = 256 * 2**10


@dataclass
class StepGraph:
    """The tasks of one step or pass.

    Attributes
    ----------
    tasks : dict
        ``{key: Task}``.
    outputs : list
        Per worker, the key of its result (a step: the loss sum of its ``finish``).
    predicted : dict
        ``{(variable, phase, sender, receiver): [bytes, messages]}`` of every message.
    carried : dict
        ``{(variable, phase, sender, receiver, other variable): bytes}`` riding ``variable``'s
        messages.
    """

    tasks: dict = field(default_factory=dict)
    outputs: list = field(default_factory=list)
    predicted: dict = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    carried: dict = field(default_factory=lambda: defaultdict(int))


class _Builder:
    """A graph under construction; ``prefix`` starts every phase (``"predict-"`` for a pass)."""

    def __init__(self, ctx: StepContext, topology: Topology, plan: StepPlan, prefix="") -> None:
        self.ctx, self.topology, self.plan, self.prefix = ctx, topology, plan, prefix
        self.item = np.dtype(ctx.spec.dtype).itemsize
        #: Bytes of one row of each sparse variable.
        self.row = {v: shape[1] * self.item for v, shape in ctx.spec.sparse_shapes().items()}
        #: ``hybrid``, ``ps``: per server, its ``[(variable, shard), ...]`` (its messages' parts).
        self.served: dict[int, list] = defaultdict(list)
        for variable, shards in (ctx.shards or {}).items():
            for p in range(shards.n_shards):
                self.served[shards.owner(p)].append((variable, p))
        self.served = dict(sorted(self.served.items()))
        self.graph = StepGraph()
        self.final: dict[int, list] = defaultdict(list)  # per worker, what its finish waits for
        # per worker, (variable, summed gradient) of the replicas its finish steps
        self.replica_steps: dict[int, list] = defaultdict(list)
        #: The replies of the next step's rows this step leaves unchanged (run first).
        self.prefetches: list[TaskRef] = []

    def key(self, variable, phase, sender, receiver, step=None) -> tuple:
        step = self.ctx.step if step is None else step
        return dp_key(self.ctx.token, step, variable, self.prefix + phase, sender, receiver)

    def _count(self, key, nbytes: int) -> None:
        counter = self.graph.predicted[key[2:6]]
        counter[0] += int(nbytes)
        counter[1] += 1

    def task(self, where, func, *args, nbytes=0, carried=None, step=None) -> TaskRef:
        """Add ``func(*args)`` as ``key(*where)``; between two workers it is a message of
        ``nbytes``, of which ``carried`` (``{variable: bytes}``) belong to other variables."""
        key = self.key(*where, step=step)
        self.graph.tasks[key] = Task(key, func, *args)
        if key[4] != key[5]:
            self._count(key, nbytes)
            for variable, extra in (carried or {}).items():
                self.graph.carried[(*key[2:6], variable)] += int(extra)
        return TaskRef(key)

    def forward(self, where, ref: TaskRef, nbytes: int) -> TaskRef:
        """The message ``where`` carrying ``ref``'s value, or ``ref`` itself on one worker."""
        if where[2] == where[3]:
            return ref
        return self.task(where, steps.identity, ref, nbytes=nbytes)

    def collective(self, build, variable, inputs, bytes_of, *args, renames=None) -> list:
        """``build(None, inputs, *args, key=...)`` (a collective of :mod:`dasknn.runtime`) among
        the chiefs, its phases renamed by ``renames``; ``bytes_of(phase, a, b)`` is the size of a
        message from chief ``a`` to chief ``b``. Returns the references to the results."""
        chiefs, renames = self.topology.chiefs, renames or {}

        def key(phase, a, b):
            return self.key(variable, renames.get(phase, phase), chiefs[a], chiefs[b])

        graph = build(None, [ref.key for ref in inputs], *args, key=key)
        for k, task in graph.tasks.items():
            self.graph.tasks[k] = task
            if k[4] != k[5]:
                self._count(k, bytes_of(k[3], chiefs.index(k[4]), chiefs.index(k[5])))
        return [TaskRef(k) for k in graph.outputs]


def _sizes(ctx: StepContext) -> tuple[dict, dict]:
    """``({variable: shape}, {variable: bytes})`` of every variable and of :data:`DENSE`."""
    shapes = dict(zip(ctx.spec.dense_names(), ctx.spec.dense_shapes(), strict=True))
    shapes[DENSE] = (sum(int(np.prod(shape)) for shape in shapes.values()),)
    shapes.update(ctx.spec.sparse_shapes())
    item = np.dtype(ctx.spec.dtype).itemsize
    return shapes, {name: int(np.prod(shape)) * item for name, shape in shapes.items()}


def _inputs(b: _Builder, dense_servers: dict, size: dict, prefetched: bool) -> list[list]:
    """Per worker, the rows of every sparse variable (:func:`_pull_rows`), then (``ps``) the
    dense values, its :func:`~._steps.compute` or :func:`~._steps.infer` takes."""
    pulled: dict = defaultdict(list)
    if b.ctx.architecture == "ps":
        pulled = _pull_dense(b, size, dense_servers)
    rows_of = _pull_rows(b, prefetched)
    return [[of[i] for of in rows_of.values()] + pulled[i] for i in range(b.topology.n_workers)]


def build_step(
    ctx: StepContext,
    topology: Topology,
    plan: StepPlan,
    dense_servers: dict[str, int],
    prefetched: bool = False,
    next_plan: StepPlan | None = None,
) -> StepGraph:
    """The graph of one step; every message key has exactly one consumer, on its receiver.

    Parameters
    ----------
    ctx : StepContext
    topology : Topology
    plan : StepPlan
        The step's plan; ``plan.batches[i]`` travels with worker ``i``'s first task.
    dense_servers : dict
        ``ps``: the worker serving each dense variable.
    prefetched : bool, default False
        ``hybrid``, ``ps``: the previous step left this step's rows on the chiefs.
    next_plan : StepPlan, optional
        ``hybrid``, ``ps``: the next step's plan, whose rows this step prefetches.
    """
    b = _Builder(ctx, topology, plan)
    arch, chiefs, names = ctx.architecture, topology.chiefs, ctx.spec.dense_names()
    sparse = list(ctx.spec.sparse_shapes())
    shapes, size = _sizes(ctx)
    computed = []
    for i, values in enumerate(_inputs(b, dense_servers, size, prefetched)):
        where = (STEP, "compute", i, i)
        computed.append(b.task(where, steps.compute, ctx, plan.batches[i], *values))
        b.final[i].append(computed[i])
    if arch == "ps":
        dense = names
    else:  # one fused buffer of every dense variable, allreduced at once
        dense = ([DENSE] if names else []) + (sparse if arch == "ar-dense" else [])
    sums = {name: _machine_sums(b, name, computed, size[name]) for name in dense}
    ride = None  # the servers are the chiefs: the reduction of DENSE rides the sparse messages
    if arch == "hybrid" and DENSE in sums and len(chiefs) > 1 and list(b.served) == chiefs:
        ride = list(itertools.pairwise(chunk_bounds(shapes[DENSE][0], len(chiefs))))

    if arch in ("hybrid", "ps"):
        updates = _push_rows(b, computed, ride, sums.get(DENSE))
        if next_plan is not None:  # the servers send the next step's rows (and dense chunks)
            ctx_next, after = replace(ctx, step=ctx.step + 1), {s: [u] for s, u in updates.items()}
            changed = _changed_rows(b)
            reduced = [
                _serve_and_assemble(b, ctx_next, next_plan, index, after, ride, changed)
                for index in range(len(chiefs))
            ]
            if ride is None:
                for c, assembled in zip(chiefs, reduced, strict=True):
                    b.final[c].append(assembled)
        elif ride is not None:  # each server sends the other chiefs its reduced dense chunk
            outputs = [updates[c] for c in chiefs]
            chunk_bytes = [(hi - lo) * b.item for lo, hi in ride]
            reduced = b.collective(
                build_allgather, DENSE, outputs, lambda phase, a, c: chunk_bytes[a], False
            )
        if ride is not None:
            _hand_out_dense(b, DENSE, reduced, size[DENSE])
    elif arch == "ar":
        for v in sparse:
            _allgather_rows(b, v, computed)

    for name in dense:
        if arch == "ps":
            server = dense_servers[name]
            pushed = [
                b.forward((name, "push", c, server), s, nbytes=size[name])
                for c, s in zip(chiefs, sums[name], strict=True)
            ]
            where = (name, "update", server, server)
            b.final[server].append(b.task(where, steps.update_served, ctx, name, *pushed))
        elif ride is None or name != DENSE:
            _allreduce_dense(b, name, shapes[name], sums[name], size[name])

    for i in range(topology.n_workers):
        stepped = [name for name, _ in b.replica_steps[i]]
        grads = [grad for _, grad in b.replica_steps[i]]
        finish = b.task((STEP, "finish", i, i), steps.finish, ctx, stepped, *grads, *b.final[i])
        b.graph.outputs.append(finish.key)
    # the replies that wait for nothing first: the servers send them before the step's compute
    first = {ref.key: b.graph.tasks[ref.key] for ref in b.prefetches}
    b.graph.tasks = first | {k: t for k, t in b.graph.tasks.items() if k not in first}
    return b.graph


_passes = itertools.count(1)


def inference_step() -> int:
    """A new step number for an inference pass: negative, unique in this process."""
    return -next(_passes)


def build_inference(
    ctx: StepContext, topology: Topology, plan: StepPlan, dense_servers: dict[str, int], output
) -> StepGraph:
    """The graph of one inference pass: the rows (``ps``: and the dense values) pulled as a step
    pulls them, then every worker's :func:`~._steps.infer` ``(output)``, one of
    :data:`~._steps.OUTPUTS`, of its windows (``outputs[i]``: worker ``i``'s result). ``ctx.step``
    is negative and unique to the pass (:func:`inference_step`), ``plan`` the pass's
    (:func:`~._plan.plan_inference`); the phases are a step's prefixed with ``"predict-"``."""
    b = _Builder(ctx, topology, plan, prefix="predict-")
    for i, values in enumerate(_inputs(b, dense_servers, _sizes(ctx)[1], prefetched=False)):
        infer = b.task((STEP, "infer", i, i), steps.infer, ctx, plan.batches[i], output, *values)
        b.graph.outputs.append(infer.key)
    return b.graph


def _machine_sums(b: _Builder, name: str, computed: list, nbytes: int) -> list[TaskRef]:
    """Per machine, the task after which its chief holds its workers' summed ``name`` gradient."""
    sums = []
    for members in b.topology.machines:
        c = members[0]
        if len(members) == 1 and name == DENSE:
            sums.append(computed[c])
        elif len(members) == 1:
            sums.append(b.task((name, "sum", c, c), steps.dense_gradient, b.ctx, name, computed[c]))
        else:
            grads = []
            for m in members:
                where, args = (name, "to-chief", m, c), (b.ctx, name, computed[m])
                grads.append(b.task(where, steps.dense_gradient, *args, nbytes=nbytes))
            sums.append(b.task((name, "sum", c, c), steps.chief_sum, b.ctx, *grads))
    return sums


def _pull_dense(b: _Builder, size: dict, servers: dict) -> dict:
    """``ps``: each chief pulls every dense variable and hands it on; ``{worker: [values]}``."""
    pulled = defaultdict(list)
    for name in b.ctx.spec.dense_names():
        server = servers[name]
        for members in b.topology.machines:
            c = members[0]
            value = b.task(
                (name, "pull", server, c), steps.serve_dense, b.ctx, name, nbytes=size[name]
            )
            # the messages to its workers are made from the value held on the chief
            if server != c:
                value = b.task((name, "pulled", c, c), steps.identity, value)
            for m in members:
                pulled[m].append(b.forward((name, "from-chief", c, m), value, nbytes=size[name]))
    return pulled


def _changed_rows(b: _Builder) -> dict:
    """``{(variable, shard): offsets}``: the rows of each shard this step's update changes (the
    union of every machine's pull)."""
    changed = {}
    for variable, machines in b.plan.machines.items():
        for p in range(len(machines[0].offsets or ())):
            changed[(variable, p)] = np.unique(np.concatenate([m.offsets[p] for m in machines]))
    return changed


def _sent_ahead(b: _Builder, parts: list, offsets: list, changed: dict) -> list | None:
    """Per shard ``parts[i]``, which rows of ``offsets[i]`` the step leaves unchanged (a boolean
    mask), where they come to :data:`PREFETCH_MIN_BYTES` or more; else ``None``."""
    kept = [~np.isin(o, changed[part]) for part, o in zip(parts, offsets, strict=True)]
    nbytes = sum(b.row[v] * int(k.sum()) for (v, _), k in zip(parts, kept, strict=True))
    return kept if nbytes >= PREFETCH_MIN_BYTES else None


def _serve_and_assemble(
    b: _Builder, ctx, plan, index: int, after: dict, ride=None, changed: dict | None = None
) -> TaskRef:
    """Every server's fused reply to machine ``index``'s pull of ``plan``'s rows (after
    ``after[server]``) and the chief's task assembling them; with ``ride`` the replies carry the
    servers' reduced dense chunks, and the task returns the reduced dense buffer.

    ``changed`` (the next step's pull, made in this step: :func:`_changed_rows` of this step):
    the rows this step's update leaves as they are go in a reply of their own (phase
    ``prefetch``, where they come to :data:`PREFETCH_MIN_BYTES`) that waits for nothing, so the
    server sends them before its step begins and they travel while the chief computes; the
    fused reply after the update holds the rest."""
    c = b.topology.chiefs[index]
    rows = {v: plan.machines[v][index] for v in ctx.spec.sparse_shapes()}
    replies, remote, local, tails, unchanged = [], [], None, [], []
    for j, (server, parts) in enumerate(b.served.items()):
        offsets = [rows[v].offsets[p] for v, p in parts]
        positions = [rows[v].shard_pos[p] for v, p in parts]
        if server == c:
            local = (parts, offsets, positions)
            continue
        kept = None if changed is None else _sent_ahead(b, parts, offsets, changed)
        late = None
        if kept is not None:
            late = [np.flatnonzero(~k) for k in kept]
            ahead = [o[k] for o, k in zip(offsets, kept, strict=True)]
            nbytes = sum(b.row[v] * len(o) for (v, _), o in zip(parts, ahead, strict=True))
            where = (SPARSE, "prefetch", server, c)
            ref = b.task(where, steps.serve_unchanged_rows, ctx, parts, ahead, nbytes=nbytes,
                         step=ctx.step)  # fmt: skip
            b.prefetches.append(ref)
            unchanged.append((ref, (parts, [p[k] for p, k in zip(positions, kept, strict=True)])))
            positions = [p[i] for p, i in zip(positions, late, strict=True)]
        sent = offsets if late is None else [o[i] for o, i in zip(offsets, late, strict=True)]
        nbytes = sum(b.row[v] * len(o) for (v, _), o in zip(parts, sent, strict=True))
        dense, extra, then = None, {}, after.get(server, [])
        if ride is not None:  # the reply carries the server's reduced dense chunk
            tails.append(ride[j][1] - ride[j][0])
            (dense,), extra, then = then, {DENSE: tails[-1] * b.item}, []
        where = (SPARSE, "pull", server, c)
        args = (ctx, parts, c, offsets, late, dense, *then)
        nbytes += sum(extra.values())
        replies.append(
            b.task(where, steps.serve_rows, *args, nbytes=nbytes, carried=extra, step=ctx.step)
        )
        remote.append((parts, positions))
    sizes = {v: len(r.union) for v, r in rows.items()}
    own = after.get(c, []) if local is not None else []
    remote += [shape for _, shape in unchanged]
    replies += [ref for ref, _ in unchanged]
    args = (ctx, c, sizes, local, remote, None if ride is None else (index, tails))
    where = (SPARSE, "assemble", c, c)
    return b.task(where, steps.assemble_rows, *args, *replies, *own, step=ctx.step)


def _pull_rows(b: _Builder, prefetched: bool) -> dict:
    """``{variable: {worker: rows}}``: ``hybrid``, ``ps``: the servers send each chief its
    machine's rows unless ``prefetched``, the chief hands them on (a one-worker machine: the
    assembling task, or ``None``); otherwise ``None`` (the replicas)."""
    rows_of = {v: dict.fromkeys(range(b.topology.n_workers)) for v in b.ctx.spec.sparse_shapes()}
    if b.ctx.architecture not in ("hybrid", "ps"):
        return rows_of
    for index, members in enumerate(b.topology.machines):
        c = members[0]
        assembled = None if prefetched else _serve_and_assemble(b, b.ctx, b.plan, index, {})
        for variable, of in rows_of.items():
            if len(members) == 1:
                of[c] = assembled
                continue
            row = b.row[variable]
            for m, pos in zip(members, b.plan.machines[variable][index].member_pos, strict=True):
                where = (variable, "from-chief", c, m)
                args = (b.ctx, variable, pos, assembled)
                of[m] = b.task(where, steps.rows_for, *args, nbytes=row * len(pos))
    return rows_of


def _summed_rows(b: _Builder, variable: str, computed: list, own_sums: bool = True) -> dict:
    """Each chief's sum of its machine's row gradients (a one-worker machine: its own gradient,
    with ``own_sums`` made a task of its own)."""
    row = b.row[variable]
    summed = {}
    for index, members in enumerate(b.topology.machines):
        c = members[0]
        machine = b.plan.machines[variable][index]
        if len(members) == 1:
            summed[c] = computed[c]
            if own_sums:
                where = (variable, "sum", c, c)
                summed[c] = b.task(where, steps.own_rows_sum, b.ctx, variable, computed[c])
            continue
        grads = []
        for m, pos in zip(members, machine.member_pos, strict=True):
            where, args = (variable, "to-chief", m, c), (b.ctx, variable, "grad_rows", computed[m])
            grads.append(b.task(where, steps.kept, *args, nbytes=row * len(pos)))
        args = (b.ctx, variable, machine.union, machine.member_pos, *grads)
        summed[c] = b.task((variable, "sum", c, c), steps.chief_rows_sum, *args)
    return summed


def _push_rows(b: _Builder, computed: list, ride, dense_sums) -> dict:
    """Each chief pushes its machine's summed row gradients to every other server in pull order
    (with ``ride``: and the server's chunk of ``dense_sums``); ``{server: its update}``."""
    ctx, topology = b.ctx, b.topology
    sums = [_summed_rows(b, v, computed, own_sums=False) for v in ctx.spec.sparse_shapes()]
    ready = {c: [s[c] for s in sums] for c in topology.chiefs}  # then a chief holds its sums
    updates = {}
    for j, (server, parts) in enumerate(b.served.items()):
        chunk = None if ride is None else ride[j]
        carried = {} if ride is None else {DENSE: (chunk[1] - chunk[0]) * b.item}
        pushes, local = [], None
        for index, members in enumerate(topology.machines):
            c, alone = members[0], len(members) == 1
            positions = [b.plan.machines[v][index].shard_pos[p] for v, p in parts]
            if c == server:
                local = (alone, positions)
                continue
            rows = [(v, pos) for (v, _), pos in zip(parts, positions, strict=True)]
            nbytes = sum(b.row[v] * len(pos) for v, pos in rows) + sum(carried.values())
            dense = None if ride is None else dense_sums[index]
            args = (ctx, alone, rows, chunk, dense, *ready[c])
            where = (SPARSE, "push", c, server)
            pushes.append(b.task(where, steps.push_rows, *args, nbytes=nbytes, carried=carried))
        own = ready[server] if local is not None else []
        dense = None if ride is None else dense_sums[j]
        args = (ctx, server, parts, topology.chiefs, local, chunk, dense, *pushes, *own)
        updates[server] = b.task((SPARSE, "update", server, server), steps.update_rows, *args)
        b.final[server].append(updates[server])
    return updates


def _allreduce_dense(b: _Builder, name: str, shape: tuple, sums: list, nbytes: int) -> None:
    """The chiefs allreduce their machines' sums of a dense gradient and hand the total on."""
    results = sums
    if len(b.topology.machines) > 1:
        bounds = chunk_bounds(int(np.prod(shape)), len(b.topology.machines))
        chunks = [(hi - lo) * b.item for lo, hi in itertools.pairwise(bounds)]

        def bytes_of(phase, a, c):  # a reduce-scatter message holds the receiver's chunk
            return chunks[c if phase == "reduce-scatter" else a]

        results = b.collective(build_allreduce, name, sums, bytes_of, shape)
    _hand_out_dense(b, name, results, nbytes)


def _hand_out_dense(b: _Builder, name: str, results: list, nbytes: int) -> None:
    """Each chief hands its workers a dense variable's summed gradient (``results[machine]``)."""
    for members, result in zip(b.topology.machines, results, strict=True):
        for m in members:
            value = b.forward((name, "from-chief", members[0], m), result, nbytes=nbytes)
            b.replica_steps[m].append((name, value))


def _allgather_rows(b: _Builder, variable: str, computed: list) -> None:
    """``ar``: the chiefs' summed row gradients allgathered and handed to every worker."""
    ctx, chiefs = b.ctx, b.topology.chiefs
    row = b.row[variable]
    summed = _summed_rows(b, variable, computed)
    ids = [summed[c] for c in chiefs]
    values = [
        b.task((variable, "union-grad", c, c), steps.kept, ctx, variable, "union_grad", summed[c])
        for c in chiefs
    ]
    unions = [m.union for m in b.plan.machines[variable]]
    sizes = [len(u) for u in unions]
    if len(chiefs) > 1:
        renames = {"allgather": "allgather-indices", "result": "result-indices"}
        index_bytes = [INDEX_BYTES * size for size in sizes]
        ids = b.collective(
            build_allgather, variable, ids, lambda p, a, c: index_bytes[a], False, renames=renames
        )
        values = b.collective(
            build_allgather, variable, values, lambda p, a, c: row * sizes[a], False
        )
    total = len(np.unique(np.concatenate(unions)))
    for members, id_ref, value_ref in zip(b.topology.machines, ids, values, strict=True):
        c = members[0]
        args = (ctx, variable, id_ref, value_ref, *sizes)
        combined = b.task((variable, "combine", c, c), steps.combine_gathered, *args)
        args = (ctx, variable, "global_grad", combined)
        grad = b.task((variable, "global-grad", c, c), steps.kept, *args)
        for m in members:
            where = (variable, "from-chief-indices", c, m)
            union = b.forward(where, combined, nbytes=INDEX_BYTES * total)
            value = b.forward((variable, "from-chief", c, m), grad, nbytes=row * total)
            where = (variable, "apply", m, m)
            b.final[m].append(b.task(where, steps.apply_replica_rows, ctx, variable, union, value))
