"""The task graph of one data-parallel step, for every architecture, and its exact traffic.

Workers ``0 .. N-1`` are grouped into machines; the first worker of a machine is its chief.
Every worker computes the gradient of its share of the global batch (:mod:`.steps`). Then, by
architecture:

- **sparse variable on parameter servers** (``hybrid``, ``ps``): each chief gathers its
  machine's distinct ids (``to-chief-indices``), asks each shard's server once for the rows it
  holds (``pull-indices``: int64 offsets), gets them (``pull``), hands each worker its rows
  (``from-chief``), sums the workers' row gradients (``to-chief``) and pushes them to the servers
  in the order of its pull, values only (``push``); each server sums what the machines pushed
  and steps its rows.
- **sparse variable by allgather** (``ar``): each chief sums its machine's row gradients
  (``to-chief-indices``, ``to-chief``), the chiefs allgather the ids (``allgather-indices``) and
  the rows (``allgather``), and each chief hands its workers the global ids and sums
  (``from-chief-indices``, ``from-chief``); every replica steps those rows.
- **dense variables by allreduce** (``hybrid``, ``ar``, ``ar-dense``, which also treats the
  embedding's gradient as a dense ``V x d`` array): the gradients of all dense variables form one
  flat buffer, variable ``"dense"`` in the keys (tensor fusion, as Horovod's: one collective
  instead of one per variable); each chief sums its machine's buffer (``to-chief``), the chiefs
  allreduce it (``reduce-scatter``, ``allgather``; the two hops of
  :func:`dasknn.runtime.collectives.build_allreduce`) and hand the sum back (``from-chief``).
- **dense variables on parameter servers** (``ps``): variable ``v`` is served by worker
  ``v mod N``; each chief pulls it whole (``pull``) and hands it on (``from-chief``), and pushes
  its machine's summed gradient (``push``) to the server, which steps it.

Every message key is a :func:`dasknn.runtime.keys.dp_key`; the builder records the size of each
message from the batch ids alone (:attr:`StepGraph.predicted`), which is what the transfer
monitor must measure.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
from dask.task_spec import Task, TaskRef

from dasknn.data_parallel import steps
from dasknn.data_parallel.steps import DENSE, EMBEDDING, StepContext
from dasknn.runtime.collectives import build_allgather, build_allreduce, chunk_bounds
from dasknn.runtime.keys import dp_key

__all__ = ["ARCHITECTURES", "StepGraph", "Topology", "build_step"]

ARCHITECTURES = ("hybrid", "ps", "ar", "ar-dense")
INDEX_BYTES = 8
STEP = "step"


@dataclass(frozen=True)
class Topology:
    """Workers grouped into machines.

    Attributes
    ----------
    machines : tuple of tuple of int
        The workers of each machine, ascending; machines ordered by their first worker, which is
        the machine's chief.
    """

    machines: tuple[tuple[int, ...], ...]

    @property
    def n_workers(self) -> int:
        return sum(len(m) for m in self.machines)

    @property
    def chiefs(self) -> list[int]:
        return [m[0] for m in self.machines]

    def machine_of(self, worker: int) -> int:
        for index, members in enumerate(self.machines):
            if worker in members:
                return index
        raise KeyError(worker)

    def chief_of(self, worker: int) -> int:
        return self.machines[self.machine_of(worker)][0]


@dataclass
class StepGraph:
    """The tasks of one step.

    Attributes
    ----------
    tasks : dict
        ``{key: Task}``; the batch keys are outside references.
    outputs : list
        Per worker, the key of its :func:`~dasknn.data_parallel.steps.finish` (its loss sum).
    predicted : dict
        ``{(variable, phase, sender, receiver): [bytes, messages]}`` of every message.
    """

    tasks: dict = field(default_factory=dict)
    outputs: list = field(default_factory=list)
    predicted: dict = field(default_factory=lambda: defaultdict(lambda: [0, 0]))


class _Builder:
    def __init__(self, ctx: StepContext, topology: Topology) -> None:
        self.ctx = ctx
        self.topology = topology
        self.graph = StepGraph()
        #: Per worker, the local tasks that end its part of the step (its ``finish`` waits for
        #: them; every other task of the step is upstream of some worker's ``finish``).
        self.final: dict[int, list] = defaultdict(list)

    def key(self, variable, phase, sender, receiver, part=-1):
        return dp_key(self.ctx.token, self.ctx.step, variable, phase, sender, receiver, part)

    def task(self, key, func, *args, nbytes: int = 0):
        """Add a task; a key whose sender and receiver differ is a message of ``nbytes``."""
        self.graph.tasks[key] = Task(key, func, *args)
        if key[4] != key[5]:
            counter = self.graph.predicted[(key[2], key[3], key[4], key[5])]
            counter[0] += int(nbytes)
            counter[1] += 1
        return TaskRef(key)

    def forward(self, key, ref: TaskRef, nbytes: int = 0) -> TaskRef:
        """The message ``key`` carrying the value of ``ref`` unchanged; ``ref`` itself when the
        key's sender and receiver are the same worker (no task is needed)."""
        if key[4] == key[5]:
            return ref
        return self.task(key, steps.identity, ref, nbytes=nbytes)

    def collective_key(self, variable, renames=None):
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


def _row_bytes(ctx: StepContext) -> int:
    return ctx.spec.embed_dim * np.dtype(ctx.spec.dtype).itemsize


def build_step(
    ctx: StepContext,
    topology: Topology,
    batches: list[tuple],
    unique_ids: list[np.ndarray],
    dense_servers: dict[str, int],
) -> StepGraph:
    """The graph of one step (see the module docstring).

    Every message key has exactly one consumer, on its receiver: once fetched, no task on the
    sender needs it again (Dask's active memory manager may drop either replica of a key held
    twice, and a later local consumer would fetch it back).

    Parameters
    ----------
    ctx : StepContext
    topology : Topology
    batches : list of tuple
        Per worker, its ``(ids, labels, batch_union)``, carried by its first task (the client
        sends it with the graph: no worker-to-worker traffic).
    unique_ids : list of int64 arrays
        Per worker, the sorted distinct ids of its windows (for the traffic prediction).
    dense_servers : dict
        ``ps``: the worker serving each dense variable.
    """
    b = _Builder(ctx, topology)
    arch = ctx.architecture
    item = np.dtype(ctx.spec.dtype).itemsize
    row = _row_bytes(ctx)
    n = topology.n_workers
    unions = [np.unique(np.concatenate([unique_ids[m] for m in ms])) for ms in topology.machines]
    names = ctx.spec.dense_names()
    shapes = dict(zip(names, ctx.spec.dense_shapes(), strict=True))
    shapes[EMBEDDING] = (ctx.spec.vocab_size, ctx.spec.embed_dim)
    size = {name: int(np.prod(shape)) * item for name, shape in shapes.items()}

    prepared = [
        b.task(b.key(EMBEDDING, "prepare", i, i), steps.prepare, ctx, batches[i]) for i in range(n)
    ]
    pulled = _pull_dense(b, names, size, dense_servers) if arch == "ps" else defaultdict(list)
    rows_of: dict[int, TaskRef | None] = dict.fromkeys(range(n))
    union_of = {}
    if arch != "ar-dense":  # the chiefs collect their machine's ids
        for members in topology.machines:
            c = members[0]
            ids = [
                b.forward(
                    b.key(EMBEDDING, "to-chief-indices", m, c),
                    prepared[m],
                    nbytes=INDEX_BYTES * len(unique_ids[m]),
                )
                for m in members
            ]
            union_of[c] = b.task(b.key(EMBEDDING, "union", c, c), steps.chief_union, ctx, *ids)
    if arch in ("hybrid", "ps"):
        rows_of = _pull_rows(b, union_of, unions, unique_ids, row)

    computed = [
        b.task(
            b.key(EMBEDDING, "compute", i, i),
            steps.compute,
            ctx,
            prepared[i],
            rows_of[i],
            *pulled[i],
        )
        for i in range(n)
    ]
    for i in range(n):
        b.final[i].append(computed[i])
    if arch in ("hybrid", "ps"):
        _push_rows(b, union_of, computed, unions, unique_ids, row)
    elif arch == "ar":
        _allgather_rows(b, union_of, computed, unions, unique_ids, row)

    if arch == "ps":
        dense = names
    else:  # one fused buffer of every dense variable, allreduced at once
        dense = [DENSE] + ([EMBEDDING] if arch == "ar-dense" else [])
        shapes[DENSE] = (sum(int(np.prod(shapes[name])) for name in names),)
        size[DENSE] = shapes[DENSE][0] * item
    for name in dense:
        sums = []
        for members in topology.machines:
            c = members[0]
            grads = [
                b.task(
                    b.key(name, "to-chief", m, c),
                    steps.dense_gradient,
                    ctx,
                    name,
                    computed[m],
                    nbytes=size[name],
                )
                for m in members
            ]
            sums.append(b.task(b.key(name, "sum", c, c), steps.chief_sum, ctx, *grads))
        if arch == "ps":
            server = dense_servers[name]
            pushed = [
                b.forward(b.key(name, "push", c, server), s, nbytes=size[name])
                for c, s in zip(topology.chiefs, sums, strict=True)
            ]
            update = b.key(name, "update", server, server)
            b.final[server].append(b.task(update, steps.update_served, ctx, name, *pushed))
        else:
            _allreduce_dense(b, name, shapes[name], sums, size[name])

    for i in range(n):
        finish = b.task(b.key(STEP, "finish", i, i), steps.finish, ctx, *b.final[i])
        b.graph.outputs.append(finish.key)
    return b.graph


def _pull_dense(b: _Builder, names: list[str], size: dict, servers: dict) -> dict:
    """``ps``: each chief pulls every dense variable whole and hands it to its workers;
    ``{worker: [values in the order of names]}``."""
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


def _pull_rows(b: _Builder, union_of: dict, unions: list, unique_ids: list, row: int) -> dict:
    """Each chief pulls its machine's rows from the shards and hands each worker its rows;
    ``{worker: rows}``."""
    ctx, topology, shards = b.ctx, b.topology, b.ctx.shards
    rows_of = {}
    for index, members in enumerate(topology.machines):
        c = members[0]
        counts = np.bincount(shards.shard_of(unions[index]), minlength=shards.n_shards)
        replies = []
        for p in range(shards.n_shards):
            o = shards.owner(p)
            request = b.task(
                b.key(EMBEDDING, "pull-indices", c, o, p),
                steps.pull_indices,
                ctx,
                p,
                union_of[c],
                nbytes=INDEX_BYTES * counts[p],
            )
            replies.append(
                b.task(
                    b.key(EMBEDDING, "pull", o, c, p),
                    steps.serve_rows,
                    ctx,
                    p,
                    c,
                    request,
                    nbytes=row * counts[p],
                )
            )
        assembled = b.task(
            b.key(EMBEDDING, "assemble", c, c), steps.assemble_rows, ctx, union_of[c], *replies
        )
        for position, m in enumerate(members):
            rows_of[m] = b.task(
                b.key(EMBEDDING, "from-chief", c, m),
                steps.rows_for,
                ctx,
                position,
                assembled,
                nbytes=row * len(unique_ids[m]),
            )
    return rows_of


def _summed_rows(b: _Builder, union_of, computed, unique_ids, row) -> dict:
    """Each chief's sum of its machine's row gradients (returns the machine's ids)."""
    summed = {}
    for members in b.topology.machines:
        c = members[0]
        grads = [
            b.forward(
                b.key(EMBEDDING, "to-chief", m, c),
                computed[m],
                nbytes=row * len(unique_ids[m]),
            )
            for m in members
        ]
        summed[c] = b.task(
            b.key(EMBEDDING, "sum", c, c), steps.chief_rows_sum, b.ctx, union_of[c], *grads
        )
    return summed


def _push_rows(b: _Builder, union_of, computed, unions, unique_ids, row) -> None:
    """Each chief pushes its machine's summed row gradients to the shards (values only, in the
    order of its pull); each server steps its shards' rows."""
    ctx, topology, shards = b.ctx, b.topology, b.ctx.shards
    summed = _summed_rows(b, union_of, computed, unique_ids, row)
    pushes = defaultdict(list)
    for index, members in enumerate(topology.machines):
        c = members[0]
        counts = np.bincount(shards.shard_of(unions[index]), minlength=shards.n_shards)
        for p in range(shards.n_shards):
            pushes[p].append(
                b.task(
                    b.key(EMBEDDING, "push", c, shards.owner(p), p),
                    steps.push_rows,
                    ctx,
                    p,
                    summed[c],
                    nbytes=row * counts[p],
                )
            )
    for p in range(shards.n_shards):
        o = shards.owner(p)
        update = b.key(EMBEDDING, "update", o, o, p)
        b.final[o].append(b.task(update, steps.update_shard, ctx, p, topology.chiefs, *pushes[p]))


def _allreduce_dense(b: _Builder, name: str, shape: tuple, sums: list, nbytes: int) -> None:
    """The chiefs allreduce their machines' sums of a dense gradient, hand the total to their
    workers, and every replica steps."""
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
    for members, result in zip(topology.machines, results, strict=True):
        c = members[0]
        for m in members:
            value = b.forward(b.key(name, "from-chief", c, m), result, nbytes=nbytes)
            apply = b.key(name, "apply", m, m)
            b.final[m].append(b.task(apply, steps.apply_replica, ctx, name, value))


def _allgather_rows(b: _Builder, union_of, computed, unions, unique_ids, row) -> None:
    """``ar``: the chiefs' summed row gradients allgathered and handed to every worker."""
    ctx, topology = b.ctx, b.topology
    summed = _summed_rows(b, union_of, computed, unique_ids, row)
    ids = [summed[c] for c in topology.chiefs]
    values = [
        b.task(b.key(EMBEDDING, "union-grad", c, c), steps.chief_union_grad, ctx, summed[c])
        for c in topology.chiefs
    ]
    sizes = [len(u) for u in unions]
    if len(topology.machines) > 1:
        renames = {"allgather": "allgather-indices", "result": "result-indices"}
        keys = b.collective_key(EMBEDDING, renames)
        graph = build_allgather(None, [r.key for r in ids], False, key=keys)
        ids = b.add_collective(graph, EMBEDDING, lambda phase, a, c: INDEX_BYTES * sizes[a])
        graph = build_allgather(
            None, [r.key for r in values], False, key=b.collective_key(EMBEDDING)
        )
        values = b.add_collective(graph, EMBEDDING, lambda phase, a, c: row * sizes[a])
    total = len(np.unique(np.concatenate(unions)))
    for members, id_ref, value_ref in zip(topology.machines, ids, values, strict=True):
        c = members[0]
        combined = b.task(
            b.key(EMBEDDING, "combine", c, c),
            steps.combine_gathered,
            ctx,
            id_ref,
            value_ref,
            *sizes,
        )
        grad = b.task(b.key(EMBEDDING, "global-grad", c, c), steps.global_grad, ctx, combined)
        for m in members:
            union = b.forward(
                b.key(EMBEDDING, "from-chief-indices", c, m),
                combined,
                nbytes=INDEX_BYTES * total,
            )
            value = b.forward(b.key(EMBEDDING, "from-chief", c, m), grad, nbytes=row * total)
            apply = b.key(EMBEDDING, "apply", m, m)
            b.final[m].append(b.task(apply, steps.apply_replica_rows, ctx, union, value))
