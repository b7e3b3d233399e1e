"""The task graph of one data-parallel step, and of an inference pass (:func:`build_inference`:
the step's pull of the rows, then every worker's :func:`~._steps.infer` on its share of the
windows), with their exact traffic. See docs/data_parallel.md.
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

__all__ = [
    "ARCHITECTURES",
    "PREDICT",
    "StepGraph",
    "build_inference",
    "build_step",
    "inference_step",
]

ARCHITECTURES = ("hybrid", "ps", "ar", "ar-dense")
INDEX_BYTES = 8
STEP = "step"
#: The prefix of the phases of an inference pass's messages (``predict-pull``, ...).
PREDICT = "predict-"


@dataclass
class StepGraph:
    """The tasks of one step.

    Attributes
    ----------
    tasks : dict
        ``{key: Task}``; the batch keys are outside references.
    outputs : list
        Per worker, the key of its :func:`~dasknn.data_parallel._steps.finish` (its loss sum).
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


@dataclass(frozen=True)
class _DenseRide:
    """``hybrid`` with the servers exactly the chiefs: dense chunk ``j`` is reduced on chief ``j``,
    riding the sparse push there and the next prefetch reply back."""

    bounds: list[int]
    itemsize: int

    def chunk(self, j: int) -> tuple[int, int]:
        return self.bounds[j], self.bounds[j + 1]

    def nbytes(self, j: int) -> int:
        return (self.bounds[j + 1] - self.bounds[j]) * self.itemsize


class _Builder:
    """The step graph under construction: keys, tasks and the predicted bytes of every message."""

    def __init__(self, ctx: StepContext, topology: Topology, plan: StepPlan) -> None:
        self.ctx = ctx
        self.topology = topology
        self.plan = plan
        self.graph = StepGraph()
        #: Per worker, the local tasks its ``finish`` waits for.
        self.final: dict[int, list] = defaultdict(list)
        #: Per worker, ``(variable, summed gradient)`` of the replicas its ``finish`` steps.
        self.replica_steps: dict[int, list] = defaultdict(list)

    def key(self, variable, phase, sender, receiver, part=-1, step=None):
        """The key of a task of this step (or of ``step``)."""
        step = self.ctx.step if step is None else step
        return dp_key(self.ctx.token, step, variable, phase, sender, receiver, part)

    def task(self, key, func, *args, nbytes: int = 0, carried: dict | None = None):
        """Add a task; a key between two workers is a message of ``nbytes`` (see ``carried``)."""
        self.graph.tasks[key] = Task(key, func, *args)
        if key[4] != key[5]:
            message = (key[2], key[3], key[4], key[5])
            counter = self.graph.predicted[message]
            counter[0] += int(nbytes)
            counter[1] += 1
            for variable, carried_bytes in (carried or {}).items():
                self.graph.carried[(*message, variable)] += int(carried_bytes)
        return TaskRef(key)

    def forward(self, key, ref: TaskRef, nbytes: int = 0) -> TaskRef:
        """The message ``key`` carrying ``ref``'s value, or ``ref`` itself on the same worker."""
        if key[4] == key[5]:
            return ref
        return self.task(key, steps.identity, ref, nbytes=nbytes)

    def collective_key(self, variable, renames=None):
        """``key(phase, a, b)`` of a collective among chiefs ``a``, ``b`` (see ``renames``)."""
        chiefs = self.topology.chiefs
        renames = renames or {}

        def key(phase, a, b):
            return self.key(variable, renames.get(phase, phase), chiefs[a], chiefs[b])

        return key

    def add_collective(self, graph, variable: str, bytes_of) -> list:
        """Add a collective's tasks, recording its messages with ``bytes_of(phase, a, b)``."""
        chiefs = self.topology.chiefs
        for k, t in graph.tasks.items():
            self.graph.tasks[k] = t
            if k[4] != k[5]:
                a, b = chiefs.index(k[4]), chiefs.index(k[5])
                counter = self.graph.predicted[(variable, k[3], k[4], k[5])]
                counter[0] += int(bytes_of(k[3], a, b))
                counter[1] += 1
        return [TaskRef(k) for k in graph.outputs]

    def row_bytes(self, variable: str) -> int:
        """Bytes of one row of a sparse variable."""
        return self.ctx.spec.sparse_shapes()[variable][1] * np.dtype(self.ctx.spec.dtype).itemsize


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
        The client's plan of the step; ``plan.batches[i]`` travels with worker ``i``'s first task.
    dense_servers : dict
        ``ps``: the worker serving each dense variable.
    prefetched : bool
        ``hybrid``, ``ps``: the previous step left this step's rows on the chiefs.
    next_plan : StepPlan, optional
        ``hybrid``, ``ps``: the plan of the next step, whose rows this step prefetches.
    """
    b = _Builder(ctx, topology, plan)
    arch = ctx.architecture
    item = np.dtype(ctx.spec.dtype).itemsize
    n = topology.n_workers
    names = ctx.spec.dense_names()
    sparse = list(ctx.spec.sparse_shapes())
    shapes = dict(zip(names, ctx.spec.dense_shapes(), strict=True))
    shapes.update(ctx.spec.sparse_shapes())
    size = {name: int(np.prod(shape)) * item for name, shape in shapes.items()}

    pulled = _pull_dense(b, names, size, dense_servers) if arch == "ps" else defaultdict(list)
    rows_of = {v: dict.fromkeys(range(n)) for v in sparse}
    if arch in ("hybrid", "ps"):
        rows_of = _pull_rows(b, prefetched)
    computed = [
        b.task(
            b.key(STEP, "compute", i, i),
            steps.compute,
            ctx,
            plan.batches[i],
            *[rows_of[v][i] for v in sparse],
            *pulled[i],
        )
        for i in range(n)
    ]
    for i in range(n):
        b.final[i].append(computed[i])

    if arch == "ps":
        dense = names
    else:  # one fused buffer of every dense variable, allreduced at once
        dense = ([DENSE] if names else []) + (sparse if arch == "ar-dense" else [])
        shapes[DENSE] = (sum(int(np.prod(shapes[name])) for name in names),)
        size[DENSE] = shapes[DENSE][0] * item
    sums = {name: _machine_sums(b, name, computed, size[name]) for name in dense}
    ride = None
    if arch == "hybrid" and DENSE in sums and _servers_are_chiefs(b):
        ride = _DenseRide(chunk_bounds(shapes[DENSE][0], len(topology.machines)), item)

    if arch in ("hybrid", "ps"):
        updates = _push_rows(b, computed, ride, sums.get(DENSE))
        reduced = None
        if next_plan is not None:
            reduced = _prefetch_rows(b, next_plan, updates, ride)
        elif ride is not None:
            reduced = _return_chunks(b, ride, updates)
        if ride is not None:
            _hand_out_dense(b, DENSE, reduced, size[DENSE])
    elif arch == "ar":
        for v in sparse:
            _allgather_rows(b, v, computed)

    for name in dense:
        if arch == "ps":
            server = dense_servers[name]
            pushed = [
                b.forward(b.key(name, "push", c, server), s, nbytes=size[name])
                for c, s in zip(topology.chiefs, sums[name], strict=True)
            ]
            update = b.key(name, "update", server, server)
            b.final[server].append(b.task(update, steps.update_served, ctx, name, *pushed))
        elif not (ride is not None and name == DENSE):
            _allreduce_dense(b, name, shapes[name], sums[name], size[name])

    for i in range(n):
        stepped = [name for name, _ in b.replica_steps[i]]
        grads = [grad for _, grad in b.replica_steps[i]]
        key = b.key(STEP, "finish", i, i)
        finish = b.task(key, steps.finish, ctx, stepped, *grads, *b.final[i])
        b.graph.outputs.append(finish.key)
    return b.graph


_passes = itertools.count(1)


def inference_step() -> int:
    """A new step number for an inference pass: negative (apart from the training steps) and
    unique in this process."""
    return -next(_passes)


class _InferenceBuilder(_Builder):
    """The graph of an inference pass: a step's builder whose phases are prefixed with
    :data:`PREDICT`."""

    def key(self, variable, phase, sender, receiver, part=-1, step=None):
        return super().key(variable, PREDICT + phase, sender, receiver, part, step)


def build_inference(
    ctx: StepContext,
    topology: Topology,
    plan: StepPlan,
    dense_servers: dict[str, int],
    output: str,
) -> StepGraph:
    """The graph of one inference pass (see the module docstring): ``hybrid`` and ``ps`` pull
    each machine's rows from the servers as a step does (``ps`` the dense variables too), and
    every worker computes :func:`~.steps.infer` ``(output)`` of its windows.

    Parameters
    ----------
    ctx : StepContext
        ``ctx.step`` negative and unique to the pass (its keys and its scratch).
    topology : Topology
    plan : StepPlan
        The client's plan of the pass (:func:`~.plan.plan_inference`).
    dense_servers : dict
        ``ps``: the worker serving each dense variable.
    output : str
        One of :data:`~.steps.OUTPUTS`.

    Returns
    -------
    StepGraph
        ``outputs[i]`` is the key of worker ``i``'s result; ``predicted`` the pass's messages.
    """
    b = _InferenceBuilder(ctx, topology, plan)
    sparse = list(ctx.spec.sparse_shapes())
    rows_of = {v: dict.fromkeys(range(topology.n_workers)) for v in sparse}
    if ctx.architecture in ("hybrid", "ps"):
        rows_of = _pull_rows(b, prefetched=False)
    pulled = defaultdict(list)
    if ctx.architecture == "ps":
        item = np.dtype(ctx.spec.dtype).itemsize
        names, shapes = ctx.spec.dense_names(), ctx.spec.dense_shapes()
        size = {n: int(np.prod(shape)) * item for n, shape in zip(names, shapes, strict=True)}
        pulled = _pull_dense(b, names, size, dense_servers)
    for i in range(topology.n_workers):
        values = [rows_of[v][i] for v in sparse] + pulled[i]
        key = b.key(STEP, "infer", i, i)
        b.task(key, steps.infer, ctx, plan.batches[i], output, *values)
        b.graph.outputs.append(key)
    return b.graph


def _machine_sums(b: _Builder, name: str, computed: list, nbytes: int) -> list[TaskRef]:
    """Per machine, the task after which its chief holds its workers' summed ``name`` gradient."""
    ctx = b.ctx
    sums = []
    for members in b.topology.machines:
        c = members[0]
        if len(members) == 1 and name == DENSE:
            sums.append(computed[c])
            continue
        if len(members) == 1:
            key = b.key(name, "sum", c, c)
            sums.append(b.task(key, steps.dense_gradient, ctx, name, computed[c]))
            continue
        grads = [
            b.task(
                b.key(name, "to-chief", m, c),
                steps.dense_gradient,
                ctx,
                name,
                computed[m],
                nbytes=nbytes,
            )
            for m in members
        ]
        sums.append(b.task(b.key(name, "sum", c, c), steps.chief_sum, ctx, *grads))
    return sums


def _pull_dense(b: _Builder, names: list[str], size: dict, servers: dict) -> dict:
    """``ps``: each chief pulls every dense variable and hands it on; ``{worker: [values]}``."""
    ctx, topology = b.ctx, b.topology
    pulled = defaultdict(list)
    for name in names:
        server = servers[name]
        for members in topology.machines:
            c = members[0]
            value = b.task(
                b.key(name, "pull", server, c), steps.serve_dense, ctx, name, nbytes=size[name]
            )
            # the pulled value, local on the chief, is what its workers' messages are made from
            held = (
                value if server == c else b.task(b.key(name, "pulled", c, c), steps.identity, value)
            )
            for m in members:
                pulled[m].append(
                    b.forward(b.key(name, "from-chief", c, m), held, nbytes=size[name])
                )
    return pulled


def _served(b: _Builder) -> dict[int, list]:
    """Per server, its ``[(variable, shard), ...]``: the parts of its fused messages."""
    served = defaultdict(list)
    for variable in b.ctx.spec.sparse_shapes():
        shards = b.ctx.shards[variable]
        for p in range(shards.n_shards):
            served[shards.owner(p)].append((variable, p))
    return dict(sorted(served.items()))


def _servers_are_chiefs(b: _Builder) -> bool:
    """Whether the servers are exactly the chiefs of two or more machines (:class:`_DenseRide`)."""
    return len(b.topology.chiefs) > 1 and list(_served(b)) == b.topology.chiefs


def _serve_and_assemble(
    b: _Builder,
    ctx: StepContext,
    plan: StepPlan,
    index: int,
    after: dict,
    ride: _DenseRide | None = None,
) -> TaskRef:
    """Every server's fused reply to machine ``index``'s pull (after ``after[server]``) and the
    chief's task assembling the rows (with ``ride``: and the reduced dense buffer)."""
    c = b.topology.chiefs[index]
    rows = {v: plan.machines[v][index] for v in ctx.spec.sparse_shapes()}
    replies, remote, local, tails = [], [], None, []
    for j, (server, parts) in enumerate(_served(b).items()):
        offsets = [rows[v].offsets[p] for v, p in parts]
        positions = [rows[v].shard_pos[p] for v, p in parts]
        if server == c:
            local = (parts, offsets, positions)
            continue
        nbytes = sum(b.row_bytes(v) * len(o) for (v, _), o in zip(parts, offsets, strict=True))
        key = b.key(SPARSE, "pull", server, c, step=ctx.step)
        carried, extra, then = None, {}, after.get(server, [])
        if ride is not None:  # the reply carries the server's reduced dense chunk
            lo, hi = ride.chunk(j)
            tails.append(hi - lo)
            (carried,), extra, then = then, {DENSE: ride.nbytes(j)}, []
        task = b.task(
            key,
            steps.serve_rows,
            ctx,
            parts,
            c,
            offsets,
            carried,
            *then,
            nbytes=nbytes + sum(extra.values()),
            carried=extra,
        )
        replies.append(task)
        remote.append((parts, positions))
    sizes = {v: len(r.union) for v, r in rows.items()}
    return b.task(
        b.key(SPARSE, "assemble", c, c, step=ctx.step),
        steps.assemble_rows,
        ctx,
        c,
        sizes,
        local,
        remote,
        None if ride is None else (index, tails),
        *replies,
        *(after.get(c, []) if local is not None else []),
    )


def _pull_rows(b: _Builder, prefetched: bool) -> dict:
    """The servers send each chief its machine's rows unless prefetched; the chief hands them on.
    ``{variable: {worker: rows}}`` (a one-worker machine: the assembling task, or ``None``)."""
    rows_of = {v: {} for v in b.ctx.spec.sparse_shapes()}
    for index, members in enumerate(b.topology.machines):
        c = members[0]
        assembled = None
        if not prefetched:
            assembled = _serve_and_assemble(b, b.ctx, b.plan, index, {})
        for variable, of in rows_of.items():
            if len(members) == 1:
                of[c] = assembled
                continue
            plan = b.plan.machines[variable][index]
            row = b.row_bytes(variable)
            for position, m in enumerate(members):
                of[m] = b.task(
                    b.key(variable, "from-chief", c, m),
                    steps.rows_for,
                    b.ctx,
                    variable,
                    plan.member_pos[position],
                    assembled,
                    nbytes=row * len(plan.member_pos[position]),
                )
    return rows_of


def _summed_rows(b: _Builder, variable: str, computed: list, own_sums: bool = True) -> dict:
    """Each chief's sum of its machine's row gradients (a one-worker machine: its own gradient)."""
    row = b.row_bytes(variable)
    summed = {}
    for index, members in enumerate(b.topology.machines):
        c = members[0]
        plan = b.plan.machines[variable][index]
        if len(members) == 1:
            summed[c] = computed[c]
            if own_sums:
                key = b.key(variable, "sum", c, c)
                summed[c] = b.task(key, steps.own_rows_sum, b.ctx, variable, computed[c])
            continue
        grads = [
            b.task(
                b.key(variable, "to-chief", m, c),
                steps.sparse_gradient,
                b.ctx,
                variable,
                computed[m],
                nbytes=row * len(plan.member_pos[position]),
            )
            for position, m in enumerate(members)
        ]
        summed[c] = b.task(
            b.key(variable, "sum", c, c),
            steps.chief_rows_sum,
            b.ctx,
            variable,
            plan.union,
            plan.member_pos,
            *grads,
        )
    return summed


def _push_rows(
    b: _Builder, computed: list, ride: _DenseRide | None, dense_sums: list | None
) -> dict:
    """Each chief pushes its machine's summed row gradients to each other server in pull order (with
    ``ride``: and the server's dense chunk); ``{server: its update}``."""
    ctx, topology = b.ctx, b.topology
    sums = [_summed_rows(b, v, computed, own_sums=False) for v in ctx.spec.sparse_shapes()]
    # the task after which a chief holds all its machine's sums
    ready = {c: [s[c] for s in sums] for c in topology.chiefs}
    updates = {}
    for j, (server, parts) in enumerate(_served(b).items()):
        chunk = None if ride is None else ride.chunk(j)
        carried = {} if ride is None else {DENSE: ride.nbytes(j)}
        pushes, local = [], None
        for index, members in enumerate(topology.machines):
            c = members[0]
            alone = len(members) == 1
            positions = [b.plan.machines[v][index].shard_pos[p] for v, p in parts]
            if c == server:
                local = (alone, positions)
                continue
            nbytes = sum(
                b.row_bytes(v) * len(pos) for (v, _), pos in zip(parts, positions, strict=True)
            )
            pushes.append(
                b.task(
                    b.key(SPARSE, "push", c, server),
                    steps.push_rows,
                    ctx,
                    alone,
                    [(v, pos) for (v, _), pos in zip(parts, positions, strict=True)],
                    chunk,
                    None if ride is None else dense_sums[index],
                    *ready[c],
                    nbytes=nbytes + sum(carried.values()),
                    carried=carried,
                )
            )
        own = ready[server] if local is not None else []
        own_dense = None if ride is None else dense_sums[j]
        key = b.key(SPARSE, "update", server, server)
        updates[server] = b.task(
            key,
            steps.update_rows,
            ctx,
            server,
            parts,
            topology.chiefs,
            local,
            chunk,
            own_dense,
            *pushes,
            *own,
        )
        b.final[server].append(updates[server])
    return updates


def _prefetch_rows(
    b: _Builder, next_plan: StepPlan, updates: dict, ride: _DenseRide | None
) -> list[TaskRef] | None:
    """Each updated server sends each chief the next step's rows (with ``ride``: and its reduced
    dense chunk; per chief, the task returning the reduced buffer)."""
    ctx_next = replace(b.ctx, step=b.ctx.step + 1)
    after = {server: [update] for server, update in updates.items()}
    assembled = [
        _serve_and_assemble(b, ctx_next, next_plan, index, after, ride)
        for index in range(len(b.topology.chiefs))
    ]
    if ride is not None:
        return assembled
    for c, task in zip(b.topology.chiefs, assembled, strict=True):
        b.final[c].append(task)
    return None


def _return_chunks(b: _Builder, ride: _DenseRide, updates: dict) -> list[TaskRef]:
    """With nothing to prefetch, each server sends the other chiefs its reduced dense chunk."""
    chiefs = b.topology.chiefs
    results = []
    for index, c in enumerate(chiefs):
        received = [
            b.task(
                b.key(DENSE, "allgather", s, c),
                steps.identity,
                updates[s],
                nbytes=ride.nbytes(j),
            )
            for j, s in enumerate(chiefs)
            if s != c
        ]
        key = b.key(DENSE, "result", c, c)
        results.append(b.task(key, steps.join_chunks, index, updates[c], *received))
    return results


def _allreduce_dense(b: _Builder, name: str, shape: tuple, sums: list, nbytes: int) -> None:
    """The chiefs allreduce their machines' sums of a dense gradient and hand the total on."""
    ctx, topology = b.ctx, b.topology
    item = np.dtype(ctx.spec.dtype).itemsize
    results = sums
    if len(topology.machines) > 1:
        bounds = chunk_bounds(int(np.prod(shape)), len(topology.machines))

        def chunk_bytes(phase, a, c):
            j = c if phase == "reduce-scatter" else a
            return (bounds[j + 1] - bounds[j]) * item

        graph = build_allreduce(None, [r.key for r in sums], shape, key=b.collective_key(name))
        results = b.add_collective(graph, name, chunk_bytes)
    _hand_out_dense(b, name, results, nbytes)


def _hand_out_dense(b: _Builder, name: str, results: list, nbytes: int) -> None:
    """Each chief hands its workers a dense variable's summed gradient (``results[machine]``)."""
    for members, result in zip(b.topology.machines, results, strict=True):
        c = members[0]
        for m in members:
            value = b.forward(b.key(name, "from-chief", c, m), result, nbytes=nbytes)
            b.replica_steps[m].append((name, value))


def _allgather_rows(b: _Builder, variable: str, computed: list) -> None:
    """``ar``: the chiefs' summed row gradients allgathered and handed to every worker."""
    ctx, topology = b.ctx, b.topology
    row = b.row_bytes(variable)
    summed = _summed_rows(b, variable, computed)
    ids = [summed[c] for c in topology.chiefs]
    values = [
        b.task(
            b.key(variable, "union-grad", c, c), steps.chief_union_grad, ctx, variable, summed[c]
        )
        for c in topology.chiefs
    ]
    unions = [m.union for m in b.plan.machines[variable]]
    sizes = [len(u) for u in unions]
    if len(topology.machines) > 1:
        renames = {"allgather": "allgather-indices", "result": "result-indices"}
        keys = b.collective_key(variable, renames)
        graph = build_allgather(None, [r.key for r in ids], False, key=keys)
        ids = b.add_collective(graph, variable, lambda phase, a, c: INDEX_BYTES * sizes[a])
        graph = build_allgather(
            None, [r.key for r in values], False, key=b.collective_key(variable)
        )
        values = b.add_collective(graph, variable, lambda phase, a, c: row * sizes[a])
    total = len(np.unique(np.concatenate(unions)))
    for members, id_ref, value_ref in zip(topology.machines, ids, values, strict=True):
        c = members[0]
        combined = b.task(
            b.key(variable, "combine", c, c),
            steps.combine_gathered,
            ctx,
            variable,
            id_ref,
            value_ref,
            *sizes,
        )
        grad = b.task(
            b.key(variable, "global-grad", c, c), steps.global_grad, ctx, variable, combined
        )
        for m in members:
            union = b.forward(
                b.key(variable, "from-chief-indices", c, m),
                combined,
                nbytes=INDEX_BYTES * total,
            )
            value = b.forward(b.key(variable, "from-chief", c, m), grad, nbytes=row * total)
            apply = b.key(variable, "apply", m, m)
            b.final[m].append(b.task(apply, steps.apply_replica_rows, ctx, variable, union, value))
