"""``DistributedEmbeddingMLP``: an :class:`~dasknn.model.EmbeddingMLP` trained data-parallel.

Every step splits the global batch over the workers (contiguous row blocks) and takes the exact
gradient of the global mean loss, so a run equals the one-process run step for step.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

import dask.array as da
import numpy as np

from dasknn.data_parallel._hybrid import (
    ARCHITECTURES,
    build_inference,
    build_step,
    inference_step,
)
from dasknn.data_parallel._plan import StepPlan, Topology, plan_inference, plan_step
from dasknn.data_parallel._posted import step_tasks, worker_programs
from dasknn.data_parallel._report import split_carried
from dasknn.data_parallel._search import SearchReport, brute_force, search_partitions
from dasknn.data_parallel._shards import STRATEGIES, ShardMap
from dasknn.data_parallel._steps import StepContext
from dasknn.data_parallel._variables import VariableStats, classify
from dasknn.data_parallel._worker_state import (
    ReplicaState,
    clear_mailbox,
    install_values,
    read_array,
    read_states,
    read_values,
)
from dasknn.exceptions import StepTimeoutError
from dasknn.model.embedding_mlp import EmbeddingMLP, split_output_table
from dasknn.model.embedding_network import EMBEDDING, SOFTMAX
from dasknn.model.embedding_persistence import (
    EMBEDDING_FILE,
    EmbeddingRecord,
    spec_identity,
)
from dasknn.model.sampled_softmax import sample_candidates
from dasknn.model.validation import check_batch_size, check_count
from dasknn.model.window_estimator import WindowEstimator, check_windows
from dasknn.optim import SGD, Optimizer, OptimizerSlots, ParamState
from dasknn.runtime.comm_report import CommReport, counts_of
from dasknn.runtime.distributed_model import DistributedModel
from dasknn.runtime.keys import DP_KIND, parse_dp_key, postbox_key
from dasknn.runtime.measure import read_transfers, reset_transfers
from dasknn.runtime.placement import KeyPlacement, by_sender
from dasknn.runtime.step_timeout import DEFAULT_STEP_TIMEOUT

__all__ = ["DistributedEmbeddingMLP"]

SEARCH_MODES = ("model", "brute-force")
MESSAGES = ("posted", "tasks")
#: Consecutive training steps of ``fit`` per submitted task under ``messages="posted"``.
DEFAULT_STEPS_PER_TASK = 20
#: Seconds of steps ``fit`` hands the model at once under ``messages="posted"``, as tasks
#: submitted one behind the other: the client looks at the losses, the progress, retiring
#: workers and checkpoints between two such calls.
CALL_SECONDS = 3.0
#: The most tasks ``fit`` submits one behind the other in one call.
MAX_TASKS_PER_CALL = 10


def _tasks_per_call(steps_per_task: int, step_seconds: float | None) -> int:
    """Tasks of ``steps_per_task`` steps for a call of about :data:`CALL_SECONDS` when a step
    takes ``step_seconds`` (rounded; ``None``, not measured yet: 1), between 1 and
    :data:`MAX_TASKS_PER_CALL`."""
    if step_seconds is None:
        return 1
    if step_seconds <= 0:
        return MAX_TASKS_PER_CALL
    tasks = round(CALL_SECONDS / (step_seconds * steps_per_task))
    return int(min(MAX_TASKS_PER_CALL, max(1, tasks)))


def _topology(workers: list[str], machines) -> Topology:
    """Group the workers by the ``machines`` map (default: one machine per worker)."""
    if machines is None:
        return Topology(tuple((i,) for i in range(len(workers))))
    if not isinstance(machines, dict):
        raise ValueError("machines must be a dict {worker address: machine name}")
    unknown = sorted(set(machines) - set(workers))
    if unknown:
        raise ValueError(f"machines names workers that the model does not train on: {unknown}")
    missing = sorted(set(workers) - set(machines))
    if missing:
        raise ValueError(f"machines leaves out workers of the model: {missing}")
    groups: dict = {}
    for index, worker in enumerate(workers):
        groups.setdefault(machines[worker], []).append(index)
    return Topology(tuple(tuple(g) for g in sorted(groups.values())))


def _same_rows(a: StepPlan, b: StepPlan) -> bool:
    """Whether two plans have every machine read the same rows of every sparse variable."""
    return all(
        np.array_equal(x.union, y.union)
        for name in a.machines
        for x, y in zip(a.machines[name], b.machines[name], strict=True)
    )


class DistributedEmbeddingMLP(WindowEstimator, DistributedModel):
    """An embedding MLP trained data-parallel on the workers of a Dask cluster.

    It has the model's ``fit``, ``partial_fit``, ``train_step`` and inference methods, plus
    ``comm_report``, ``search``, ``gather``, ``to_dask``, ``save``/``load`` and ``close``.
    Inference runs on the workers, one pass (a scheduler round trip) per ``batch_size``
    windows split as a step's batch; only per-window results or per-worker sums reach the
    client.

    Parameters
    ----------
    model : EmbeddingMLP
        The one-process model; its values are copied (the model is not changed).
    client : distributed.Client, cluster, JobqueueSpec, str or None
        Where to run (see :class:`~dasknn.runtime.distributed_model.DistributedModel`); ``None``
        (the default) starts a local cluster. What the model opens it closes.
    architecture : {"hybrid", "ps", "ar", "ar-dense"}
        ``"hybrid"`` (the default): embedding on parameter-server shards, dense variables
        replicated and allreduced; ``"ps"``: every variable on servers; ``"ar"``: everything
        replicated, row gradients allgathered; ``"ar-dense"``: gradients densified, allreduced.
    sparse_partitions : int or "auto", optional
        Shards of the embedding (``hybrid``, ``ps``): ``1..V``, or ``"auto"`` to :meth:`search`
        at the first step. Default: one per machine.
    shard_rows : {"mod", "div"}
        Row ``r`` in shard ``r mod P`` (the default), or consecutive blocks.
    machines : dict, optional
        ``{worker address: machine name}`` of every worker: a machine sums its workers'
        gradients before sending. Default: one machine per worker.
    workers : list of str, optional
        The workers to train on (default: every worker of the cluster).
    search_steps, search_warmup : int
        Steps timed per shard count by the search (default 6), the first discarded (default 2).
    search_mode : {"model", "brute-force"}
        The cost-model search (the default), or timing every count from 1 to ``2 N``.
    messages : {"posted", "tasks"}
        ``"posted"`` (the default): one task per worker runs its part of the step and posts
        each message to the receiving worker's postbox (:mod:`dasknn.runtime.posted`);
        ``"tasks"``: a Dask task per piece of work and message.
    steps_per_task : int, optional
        Steps of ``fit`` per task under ``"posted"`` (default
        :data:`DEFAULT_STEPS_PER_TASK`; 1, the only value, under ``"tasks"``). ``fit`` hands
        the model about :data:`CALL_SECONDS` of steps at once (one task before a step was
        timed), whose tasks are submitted one behind the other, each worker's task waiting for
        its task before: the client makes the next task while the workers run.
    step_timeout : float
        Seconds a step (under ``fit``, one task's steps), ``gather`` or an inference pass may
        take before a :class:`~dasknn.exceptions.StepTimeoutError` naming the workers waited
        for, their roles and state; the model is then unusable. A worker that leaves is a
        :class:`~dasknn.exceptions.WorkerLostError` within a poll, while a worker asked to
        retire hands its values to a spare worker between two tasks (with no spare, the model
        is laid out on the workers that stay) and then leaves (see docs/reliability.md).
        Placing the values takes at most as long. A positive finite number (default
        :data:`~dasknn.runtime.step_timeout.DEFAULT_STEP_TIMEOUT`).
    reuse_memory : bool
        Keep the workers' freed step buffers for reuse while the model is placed
        (:class:`~dasknn.runtime.worker_memory.ReuseFreedMemory`; glibc's thresholds go back to
        the worker's own at ``close()``). Default ``True``; ``False`` leaves malloc alone.

    Raises
    ------
    ValueError
        Before anything is scheduled, for any argument out of its range.
    """

    _needs_spares = True

    def __init__(
        self,
        model: EmbeddingMLP,
        client=None,
        *,
        architecture: str = "hybrid",
        sparse_partitions: int | str | None = None,
        shard_rows: str = "mod",
        machines: dict | None = None,
        workers: list[str] | None = None,
        search_steps: int = 6,
        search_warmup: int = 2,
        search_mode: str = "model",
        messages: str = "posted",
        steps_per_task: int | None = None,
        step_timeout: float = DEFAULT_STEP_TIMEOUT,
        reuse_memory: bool = True,
    ) -> None:
        if not isinstance(reuse_memory, bool):
            raise ValueError(f"reuse_memory must be True or False, got {reuse_memory!r}")
        self.reuse_memory = reuse_memory
        if not isinstance(model, EmbeddingMLP):
            raise ValueError(f"model must be an EmbeddingMLP, got {type(model).__name__}")
        if architecture not in ARCHITECTURES:
            raise ValueError(
                f"unknown architecture {architecture!r}; expected one of {ARCHITECTURES}"
            )
        if shard_rows not in STRATEGIES:
            raise ValueError(f"unknown shard_rows {shard_rows!r}; expected one of {STRATEGIES}")
        if search_mode not in SEARCH_MODES:
            raise ValueError(f"unknown search_mode {search_mode!r}; expected one of {SEARCH_MODES}")
        if messages not in MESSAGES:
            raise ValueError(f"unknown messages {messages!r}; expected one of {MESSAGES}")
        self.messages = messages
        if steps_per_task is None:
            steps_per_task = DEFAULT_STEPS_PER_TASK if messages == "posted" else 1
        self.n_steps_per_task = check_count("steps_per_task", steps_per_task)
        #: Seconds a step of the last call of two steps or more took (``None``: none yet).
        self._step_seconds: float | None = None
        if messages == "tasks" and self.n_steps_per_task != 1:
            raise ValueError(
                f'steps_per_task must be 1 under messages="tasks" (one graph a step), '
                f"got {steps_per_task!r}"
            )
        self.search_steps = check_count("search_steps", search_steps)
        self.search_warmup = check_count("search_warmup", search_warmup, 0)
        if self.search_steps <= self.search_warmup:
            raise ValueError(
                f"search_steps ({search_steps}) must exceed the discarded warm-up steps "
                f"search_warmup ({search_warmup})"
            )
        if isinstance(workers, str):
            raise ValueError(f"workers must be a list of worker addresses, got {workers!r}")
        self.spec = model.spec
        self.architecture = architecture
        self.shard_rows = shard_rows
        self.search_mode = search_mode
        with self._connecting(client, step_timeout):
            self.workers = sorted(self._use_workers(workers))
            self.topology = _topology(self.workers, machines)
            self._machines = machines
            rows = self._max_shards()
            self._search_pending = sparse_partitions == "auto"
            if sparse_partitions in ("auto", None):  # "auto": until the search at the first step
                self.n_shards = min(len(self.topology.machines), rows)
            else:  # checks the count
                ShardMap(rows, sparse_partitions, len(self.workers), shard_rows)
                self.n_shards = int(sparse_partitions)
            self._watch_retirements()
        self.dense_servers = self._dense_servers()
        self.variables = classify(self.spec)
        self.stats = VariableStats(self.variables)
        self.predicted: dict = defaultdict(lambda: [0, 0])
        self.carried: dict = defaultdict(int)
        self._search: SearchReport | None = None
        self._step = 0
        self.n_steps_ = model.n_steps_
        #: The plan of the step whose rows the last step prefetched.
        self._prefetched = None
        self._version = 0
        self._gathered: tuple[int, EmbeddingMLP] | None = None
        self._placement = KeyPlacement(self.workers, by_sender(parse_dp_key))
        #: Every address that has held worker number ``i`` (a replaced one keeps its number).
        self._numbers = {w: i for i, w in enumerate(self.workers)}
        self._register(ReplicaState(self.token), lambda: self._install(model))

    # ------------------------------------------------------------------ basics
    def __repr__(self) -> str:
        return (
            f"DistributedEmbeddingMLP(architecture={self.architecture!r}, "
            f"workers={len(self.workers)}, machines={len(self.topology.machines)}, "
            f"shards={self.n_shards})"
        )

    def _max_shards(self) -> int:
        """The most shards a sparse variable can be cut into (its fewest rows)."""
        return min(shape[0] for shape in self.spec.sparse_shapes().values())

    @property
    def shard_maps(self) -> dict[str, ShardMap] | None:
        """The shards of every sparse variable (``hybrid``, ``ps``), ``None`` otherwise."""
        if self.architecture not in ("hybrid", "ps"):
            return None
        return {
            name: ShardMap(shape[0], self.n_shards, len(self.workers), self.shard_rows)
            for name, shape in self.spec.sparse_shapes().items()
        }

    # ------------------------------------------------------------------ placement
    def _install(self, model: EmbeddingMLP, with_state: bool = False) -> None:
        """Tune the workers' malloc (``reuse_memory``), place ``model``'s values, and make each
        worker's postbox (``messages="posted"``), each call within what is left of
        ``step_timeout`` and watched
        (:meth:`~dasknn.runtime.distributed_model.DistributedModel._placing`)."""
        if self.reuse_memory:
            self._reuse_freed_memory()
        self._place(model, self.n_shards, with_state)
        if self.messages == "posted":
            self._postboxes = self._start_postboxes(
                {
                    postbox_key(DP_KIND, self.token, index, self._generation or None): worker
                    for index, worker in enumerate(self.workers)
                }
            )
        else:  # the postboxes keep Dask from retiring a worker before the hand-over
            self._start_anchors(self.workers)

    def _place_again(self, model: EmbeddingMLP, n_shards: int, with_state: bool = False) -> None:
        """:meth:`_place` after the constructor (the search, a restored checkpoint), within
        ``step_timeout`` of its own; if it fails, the model is unusable."""
        self._place_anew(None, lambda: self._place(model, n_shards, with_state))

    def _place(self, model: EmbeddingMLP, n_shards: int, with_state: bool = False) -> None:
        """Copy ``model``'s values to the workers with ``n_shards`` shards (fresh optimizer
        state, or with ``with_state`` the model's), each worker's within what is left of the
        placement's ``step_timeout`` and watched
        (:meth:`~dasknn.runtime.distributed_model.DistributedModel._placing`)."""
        self.n_shards = n_shards
        self.n_steps_ = model.n_steps_
        arch = self.architecture
        dense = dict(zip(self.spec.dense_names(), model.dense_variables(), strict=True))
        sparse = {EMBEDDING: model.embedding}
        if self.spec.sampled:
            sparse[SOFTMAX] = model.output_table()
        payload = {w: ({}, {}, {}) for w in self.workers}
        full = _variable_states(model) if with_state else {}
        held_states: dict = {w: {"replicas": {}, "shards": {}, "served": {}} for w in self.workers}
        for index, worker in enumerate(self.workers):
            replicas, shards, served = payload[worker]
            if arch != "ps":
                replicas.update(dense)
            if arch in ("ar", "ar-dense"):
                replicas.update(sparse)
            else:
                for name, shard_map in self.shard_maps.items():
                    for p in shard_map.shards_of(index):
                        shards[(name, p)] = sparse[name][shard_map.rows(p)]
            if arch == "ps":
                served.update({n: v for n, v in dense.items() if self.dense_servers[n] == index})
            mine = held_states[worker]
            for where, names in (("replicas", replicas), ("served", served)):
                mine[where] = {n: (model.optimizer, full[n]) for n in names if n in full}
            for name, p in shards:
                if name in full:
                    rows = self.shard_maps[name].rows(p)
                    arrays = {n: a[rows] for n, a in full[name].arrays.items()}
                    piece = ParamState(full[name].step, arrays)
                    mine["shards"][(name, p)] = (model.optimizer, piece)
        for worker, (replicas, shards, served) in payload.items():
            states = held_states[worker] if full else None
            self._install_on(worker, install_values, replicas=replicas, shards=shards,
                             served=served, states=states)  # fmt: skip
        self.optimizer_ = model.optimizer if full else None
        self._prefetched = None
        self._version += 1

    def gather(self) -> EmbeddingMLP:
        """A one-process :class:`EmbeddingMLP` with the current values (no optimizer state)."""
        self._check_open()
        if self._gathered is not None and self._gathered[0] == self._version:
            return self._gathered[1].copy()
        what = "the values did not arrive"
        held = self._run_on(read_values, self.workers, what, token=self.token)
        first = held[self.workers[0]]
        dense = {}
        for worker in self.workers:
            dense.update(held[worker]["served"])
        dense.update(first["replicas"])
        names = self.spec.dense_names()
        sparse = dict(first["replicas"])
        if EMBEDDING not in sparse:
            for name, shard_map in self.shard_maps.items():
                sparse[name] = np.empty(self.spec.sparse_shapes()[name], dtype=self.spec.dtype)
                for worker in self.workers:
                    for (variable, p), values in held[worker]["shards"].items():
                        if variable == name:
                            sparse[name][shard_map.rows(p)] = values
        weights = [dense[n] for n in names[0::2]]
        biases = [dense[n] for n in names[1::2]]
        if self.spec.sampled:
            weight, bias = split_output_table(sparse[SOFTMAX])
            weights.append(weight)
            biases.append(bias)
        model = EmbeddingMLP._from_values(self.spec, sparse[EMBEDDING], weights, biases)
        model.n_steps_ = self.n_steps_
        self._gathered = (self._version, model)
        return model.copy()

    # ------------------------------------------------------------------ checkpoints
    _checkpoint_format = EMBEDDING_FILE
    _estimator_class = EmbeddingMLP

    def _identity(self) -> dict:
        return spec_identity(self.spec)

    def _gather_states(self) -> OptimizerSlots:
        """The optimizer state of every variable, read from the workers, under the keys of the
        one-process model (:meth:`EmbeddingMLP._state_params`)."""
        held = self._run_on(
            read_states, self.workers, "the optimizer states did not arrive", token=self.token
        )
        first = held[self.workers[0]]
        full: dict[str, tuple] = dict(first["replicas"])
        for worker in self.workers:
            full.update(held[worker]["served"])
        for name, shard_map in (self.shard_maps or {}).items():
            if name in full:
                continue
            pieces = {p: v for w in self.workers for (n, p), v in held[w]["shards"].items()
                      if n == name}  # fmt: skip
            if not pieces:
                continue
            optimizer, some = next(iter(pieces.values()))
            rows = self.spec.sparse_shapes()[name][0]
            arrays = {n: np.empty((rows, *a.shape[1:]), a.dtype) for n, a in some.arrays.items()}
            for p, (_, state) in pieces.items():
                for n, a in state.arrays.items():
                    arrays[n][shard_map.rows(p)] = a
            full[name] = (optimizer, ParamState(some.step, arrays))
        if not full:
            return OptimizerSlots()
        optimizer = next(iter(full.values()))[0]
        states = {name: state for name, (_, state) in full.items() if name != SOFTMAX}
        if SOFTMAX in full:  # the output table [W_out^T | b_out]: the weight's and bias's states
            table = full[SOFTMAX][1]
            states["softmax-weight"] = ParamState(
                table.step, {n: a[:, :-1] for n, a in table.arrays.items()}
            )
            states["softmax-bias"] = ParamState(
                table.step, {n: a[:, -1:] for n, a in table.arrays.items()}
            )
        return OptimizerSlots(optimizer, states)

    def _record(self) -> EmbeddingRecord:
        """The values, step count and optimizer state, read from the workers."""
        model = self.gather()
        model._slots = self._gather_states()
        return model._record()

    def _restore(self, record: EmbeddingRecord) -> None:
        """Place the values, step count and optimizer state of ``record`` (this network) on the
        workers, a lost worker's place taken by another (:meth:`_replace_lost`).

        Raises
        ------
        WorkerLostError
            If no worker comes to replace a lost one within ``step_timeout``.
        """
        self._check_open()
        model = EmbeddingMLP._of_record(record)
        placed = list(self._placement.workers)  # where the values are (rebalance: were)
        self.workers = self._replace_lost(self.workers)
        if placed == self.workers:
            self._place_again(model, self.n_shards, with_state=True)
            return
        self._step += self._steps_per_call() + 1  # no key of the failed steps is used again
        self._numbers.update({w: i for i, w in enumerate(self.workers)})
        self._gathered = None
        self._placement = KeyPlacement(self.workers, by_sender(parse_dp_key))
        self._place_anew(ReplicaState(self.token), lambda: self._install(model, with_state=True))

    def _rebalancing(self, workers: list[str]) -> Callable[[], None]:
        """A replica on every one of ``workers`` (sorted), the shards and served variables
        spread over them as the constructor spreads them, the shard count kept
        (:meth:`rebalance`).

        Raises
        ------
        ValueError
            If the model was given ``machines`` that do not name every one of ``workers``.
        """
        workers = sorted(workers)
        machines = self._machines
        if machines is not None:
            missing = sorted(set(workers) - set(machines))
            if missing:
                raise ValueError(
                    f"the model's machines map does not name the workers {missing}: rebalance "
                    "onto workers it names"
                )
            machines = {w: machines[w] for w in workers}
        topology = _topology(workers, machines)

        def take() -> None:
            self.workers, self.topology = workers, topology
            self.dense_servers = self._dense_servers()

        return take

    def _dense_servers(self) -> dict[str, int]:
        """``{dense variable: worker number}``: the dense variables served round robin by the
        model's workers."""
        return {
            name: index % len(self.workers) for index, name in enumerate(self.spec.dense_names())
        }

    # ------------------------------------------------------------------ steps
    def _plan(self, ids: np.ndarray, labels: np.ndarray, step: int) -> StepPlan:
        """The client's plan of training step ``step`` on ``(ids, labels)`` (its candidate
        classes drawn under the sampled softmax)."""
        s = self.spec
        candidates = None
        if s.sampled:
            seed = s.sampler_seed
            candidates = sample_candidates(s.n_classes, s.n_sampled, s.sampler, seed, step)
        return plan_step(
            s, self.topology, self.shard_maps, ids, labels, candidates, self.architecture
        )

    def _step_plans(self, batches: list, after) -> tuple[list, list]:
        """The plans of consecutive steps on ``batches`` (``[(ids, labels), ...]``) and, per
        step, the plan of the step whose rows it prefetches: the next one's, the last step's
        that of ``after`` (the ``(ids, labels)`` of the step after it) if given (``hybrid``,
        ``ps``; ``None`` otherwise)."""
        plans = [self._plan(ids, y, self.n_steps_ + k) for k, (ids, y) in enumerate(batches)]
        if self.architecture not in ("hybrid", "ps"):
            return plans, [None] * len(plans)
        following = plans[1:] + [None]
        if after is not None:
            following[-1] = self._plan(*after, self.n_steps_ + len(batches))
        return plans, following

    def _step_graph(
        self, k: int, plan: StepPlan, next_plan, prefetched, optimizer: Optimizer, windows: int
    ):
        """The graph of the ``k``-th step from now (``windows`` in its batch), which prefetches
        the rows of ``next_plan``, after a step that prefetched those of ``prefetched``."""
        ctx = StepContext(
            token=self.token,
            step=self._step + 1 + k,
            spec=self.spec,
            architecture=self.architecture,
            optimizer=optimizer,
            denominator=windows,
            shards=self.shard_maps,
            pooled=self.messages == "posted",
        )
        same = prefetched is not None and _same_rows(prefetched, plan)
        return build_step(ctx, self.topology, plan, self.dense_servers, same, next_plan)

    def _run_steps(self, batches: list, optimizer: Optimizer, after=None) -> list[float]:
        """Consecutive steps on ``batches`` (``[(ids, labels), ...]``); with ``after``, the next
        step's ``(ids, labels)``, the servers send the chiefs its rows at the end of the last one
        (``hybrid``, ``ps``). Under ``messages="posted"`` the steps go in tasks of
        ``steps_per_task`` steps a worker, submitted one behind the other (each worker's task
        waits for its one before; the client makes a task's programs while the workers run the
        ones before); under ``"tasks"``, one batch in one graph. Returns each step's mean loss."""
        self._check_workers()
        began = time.perf_counter()
        plans, following = self._step_plans(batches, after)
        counted: list[tuple[dict, dict]] = []  # (predicted, carried) of each step made

        def graph_of(k: int):
            prefetched = following[k - 1] if k else self._prefetched
            graph = self._step_graph(
                k, plans[k], following[k], prefetched, optimizer, batches[k][0].shape[0]
            )
            counted.append((graph.predicted, graph.carried))
            return graph

        per_task = self.n_steps_per_task
        starts = range(0, len(batches), per_task)
        boxes = [box.key for box in self._postboxes] if self.messages == "posted" else []

        def submission(start: int):
            def make(before):
                if self.messages == "tasks":
                    graph = graph_of(start)
                    return graph.tasks, graph.outputs
                steps = range(start, min(start + per_task, len(batches)))
                programs = [
                    worker_programs(graph.tasks, graph.outputs, len(self.workers))
                    for graph in map(graph_of, steps)
                ]
                numbers = [self._step + 1 + k for k in steps]
                return step_tasks(self.token, numbers, programs, boxes, before)

            return make

        try:
            results = self._gather_graphs(
                [submission(start) for start in starts], "the step did not finish"
            )
        except StepTimeoutError as error:
            self._failed = str(error)
            self._clear_mailboxes()
            raise
        except BaseException:
            self._clear_mailboxes()
            raise
        if self.messages == "posted":  # each worker's task: per step, the values of its outputs
            n, per_step = len(self.workers), []
            for first in range(0, len(results), n):  # the tasks of one submission
                steps = zip(*results[first : first + n], strict=True)
                per_step += [[v for values in step for v in values] for step in steps]
        else:
            per_step = [results]
        for (predicted, carried), plan in zip(counted, plans, strict=True):
            for key, counter in predicted.items():
                total = self.predicted[key]
                total[0] += counter[0]
                total[1] += counter[1]
            for key, nbytes in carried.items():
                self.carried[key] += nbytes
            self.stats.record(plan)
        if len(batches) > 1:  # a one-step call's time is mostly the submission's own
            self._step_seconds = (time.perf_counter() - began) / len(batches)
        self._step += len(batches)
        self._version += 1
        self.n_steps_ += len(batches)
        self.optimizer_ = optimizer
        self._prefetched = following[-1]
        return [
            float(sum(losses)) / ids.shape[0]
            for losses, (ids, _) in zip(per_step, batches, strict=True)
        ]

    def _clear_mailboxes(self) -> None:
        """End the waits of a failed step on the workers still present (``"posted"``)."""
        if self.messages == "posted":
            self._run_on_answering(clear_mailbox, self.workers)

    def _steps_per_call(self) -> int:
        """``"posted"``: about :data:`CALL_SECONDS` of steps at the time a step of the last call
        of two steps or more took, in whole tasks of ``steps_per_task`` steps, at least one
        and at most :data:`MAX_TASKS_PER_CALL` (one task before any was timed); ``"tasks"``: 1."""
        if self.messages == "tasks":
            return 1
        return self.n_steps_per_task * _tasks_per_call(self.n_steps_per_task, self._step_seconds)

    def _held(self, worker: str) -> str:
        """What ``worker`` holds for the model, in words."""
        shard_maps = self.shard_maps
        index = self.workers.index(worker)
        shards = shard_maps[EMBEDDING].shards_of(index) if shard_maps is not None else []
        served = [n for n, s in self.dense_servers.items() if s == index]
        held = f"shards {shards} of the embedding" if shards else "no embedding shard"
        if shards and self.spec.sampled:
            held += " and of the softmax table"
        if self.architecture == "ps" and served:
            held += f" and the dense variables {served}"
        return held

    def _worker_roles(self) -> dict[str, str]:
        """``{address: "replica R, what it holds"}`` of every worker."""
        return {w: f"replica {self.workers.index(w)}, {self._held(w)}" for w in self.workers}

    def _train_batch(self, ids: np.ndarray, labels: np.ndarray, optimizer: Optimizer) -> float:
        return self._train_batches([(ids, labels)], None, optimizer)[0]

    def _train_batches(self, batches: list, after, optimizer: Optimizer) -> list[float]:
        """The steps of one task (:meth:`_run_steps`), after the values of workers being
        retired were handed over (between two tasks)."""
        self._check_open()
        if self._search_pending:
            self.search(*batches[0], optimizer=optimizer)
        self._hand_over_retiring()
        return self._run_steps(batches, optimizer, after)

    # ------------------------------------------------------------------ inference
    def _infer_pass(self, ids: np.ndarray, labels: np.ndarray | None, output: str) -> list:
        """One inference pass on the workers over checked windows ``ids`` (and ``labels``):
        per worker, in order, :func:`~dasknn.data_parallel._steps.infer` ``(output)`` of its
        share of the windows (:func:`~dasknn.data_parallel._hybrid.build_inference`), the
        messages' bytes added to the predicted traffic."""
        self._check_open()
        self._check_workers()
        shards = self.shard_maps
        plan = plan_inference(self.spec, self.topology, shards, ids, labels)
        ctx = StepContext(
            token=self.token,
            step=inference_step(),
            spec=self.spec,
            architecture=self.architecture,
            optimizer=None,
            denominator=ids.shape[0],
            shards=shards,
        )
        graph = build_inference(ctx, self.topology, plan, self.dense_servers, output)
        results = self._gather_graph(graph.tasks, graph.outputs, "the inference did not finish")
        for key, counter in graph.predicted.items():
            total = self.predicted[key]
            total[0] += counter[0]
            total[1] += counter[1]
        return results

    def _infer(self, ids: np.ndarray, labels: np.ndarray | None, output: str, batch_size) -> list:
        """:meth:`_infer_pass` over ``batch_size`` windows at a time (checked first); every
        pass's per-worker results, in window order."""
        batch_size = check_batch_size(batch_size)
        results = []
        for start in range(0, ids.shape[0], batch_size):
            part = None if labels is None else labels[start : start + batch_size]
            results += self._infer_pass(ids[start : start + batch_size], part, output)
        return results

    def _logits(self, ids: np.ndarray) -> np.ndarray:
        """The logits of checked windows, computed on the workers in one pass (used by
        :meth:`decision_function`, one pass a block)."""
        return np.concatenate(self._infer_pass(ids, None, "logits"), axis=0)

    def predict(self, X, batch_size: int = 1024) -> np.ndarray:
        """The most probable class of each window, int64 (B,), computed on the workers
        ``batch_size`` windows a pass (see the class); ``ValueError`` on malformed input."""
        return np.concatenate(self._infer(self._windows(X), None, "labels", batch_size))

    def predict_proba(self, X, batch_size: int = 1024) -> np.ndarray:
        """``softmax(z)`` (B, n_classes), computed on the workers as :meth:`predict`."""
        return np.concatenate(self._infer(self._windows(X), None, "proba", batch_size), axis=0)

    def evaluate(self, X, y, batch_size: int = 1024) -> float:
        """Mean cross-entropy (nats) of ``(X, y)``, summed on the workers; no update."""
        ids, labels = self._check_xy(X, y)
        return float(sum(self._infer(ids, labels, "loss", batch_size))) / ids.shape[0]

    def score(self, X, y, batch_size: int = 1024) -> float:
        """Accuracy of :meth:`predict` against ``y``, counted on the workers."""
        ids, labels = self._check_xy(X, y)
        return sum(self._infer(ids, labels, "correct", batch_size)) / ids.shape[0]

    def _windows(self, X) -> np.ndarray:
        return check_windows(X, self.spec.vocab_size, self.spec.context)

    # ------------------------------------------------------------------ shard-count search
    def _time_steps(self, ids, labels, optimizer) -> float:
        """Median seconds of the timed steps (after the warm-up) on the batch ``(ids, labels)``."""
        times = []
        for k in range(self.search_steps):
            start = time.perf_counter()
            last = k == self.search_steps - 1
            self._run_steps([(ids, labels)], optimizer, None if last else (ids, labels))
            times.append(time.perf_counter() - start)
        return float(np.median(times[self.search_warmup :]))

    def search(
        self, X, y, optimizer: Optimizer | None = None, mode: str | None = None
    ) -> SearchReport:
        """Choose the number of shards by timing steps on the batch ``(X, y)`` (the values are
        restored afterwards; the steps do not count as training). ``mode``: ``"model"`` (at most
        5 counts) or ``"brute-force"`` (1 to ``2 N``); default the model's ``search_mode``.

        Raises
        ------
        ValueError
            On malformed data, or for an architecture without shards (``ar``, ``ar-dense``).
        """
        self._check_open()
        if self.architecture not in ("hybrid", "ps"):
            raise ValueError(f"architecture {self.architecture!r} has no shards to search for")
        mode = mode or self.search_mode
        if mode not in SEARCH_MODES:
            raise ValueError(f"unknown search mode {mode!r}; expected one of {SEARCH_MODES}")
        ids, labels = self._check_xy(X, y)
        optimizer = optimizer or SGD(lr=0.0)  # timing only: the values are restored anyway
        saved = self.gather()
        predicted, carried, stats = self.predicted, self.carried, self.stats
        self.predicted, self.stats = defaultdict(lambda: [0, 0]), VariableStats(self.variables)
        self.carried = defaultdict(int)

        def measure(p: int) -> float:
            self._place_again(saved, p)
            return self._time_steps(ids, labels, optimizer)

        rows = self._max_shards()
        if mode == "model":
            report = search_partitions(
                measure,
                min(len(self.topology.machines), rows),
                rows,
                servers=len(self.workers),
            )
        else:
            report = brute_force(measure, range(1, min(2 * len(self.workers), rows) + 1))
        self._place_again(saved, report.choice)
        self._search_pending = False
        reset_transfers(self.client, self.token)
        self.predicted, self.carried, self.stats = predicted, carried, stats
        self._search = report
        return report

    def search_report(self) -> SearchReport | None:
        """The last search's samples, fit and choice (``None`` if none ran)."""
        return self._search

    # ------------------------------------------------------------------ reports
    def comm_report(self) -> CommReport:
        """Measured beside predicted traffic since the start or :meth:`reset_comm`, keyed
        ``(variable, phase, sender, receiver)``; bytes a message carries for another variable
        are listed under that one (:func:`~dasknn.data_parallel._report.split_carried`).
        ``details``: ``architecture``, ``machine_of``, ``alpha`` and ``model_alpha`` (the
        fraction of each variable a worker touched per step). The messages of a worker that
        another replaced (a restored checkpoint, a hand-over) count under its number, named by
        the address that holds it now."""
        self._check_open()
        measured: dict = {}
        for key, (nbytes, count) in counts_of(read_transfers(self.client, self.token)).items():
            numbered = (key[0], key[1], self._numbers[key[2]], self._numbers[key[3]])
            total = measured.get(numbered, (0, 0))
            measured[numbered] = (total[0] + nbytes, total[1] + count)
        measured = split_carried(measured, self.carried)
        predicted = split_carried({k: tuple(v) for k, v in self.predicted.items()}, self.carried)

        def by_address(table: dict) -> dict:
            return {
                (v, phase, self.workers[a], self.workers[b]): value
                for (v, phase, a, b), value in table.items()
            }

        details = {
            "architecture": self.architecture,
            "machine_of": {w: self.topology.machine_of(i) for i, w in enumerate(self.workers)},
            "alpha": self.stats.alpha(),
            "model_alpha": self.stats.model_alpha(),
        }
        return CommReport(
            by_address(measured), by_address(predicted), steps=self.stats.samples,
            details=details,
        )  # fmt: skip

    def reset_comm(self) -> None:
        """Zero the measured and predicted counts."""
        super().reset_comm()
        self.predicted = defaultdict(lambda: [0, 0])
        self.carried = defaultdict(int)
        self.stats = VariableStats(self.variables)

    # ------------------------------------------------------------------ parameters
    def to_dask(self) -> dict[str, da.Array]:
        """The parameters as dask arrays, each chunk a copy made before this returns (a
        snapshot) by a task on its holder and held there: ``embedding`` (and ``softmax``)
        chunked by shard under ``hybrid`` and ``ps``, rows in shard order
        (``shard_maps[name].rows(p)``), else worker 0's replica; ``dense_{i}`` (as
        ``EmbeddingMLP.dense_variables()``) from worker 0 or their server.

        Raises
        ------
        WorkerLostError, StepTimeoutError
            When a holder is lost, or the copies are not made within ``step_timeout``.
        """
        self._check_open()
        sparse_shapes = self.spec.sparse_shapes()
        out: dict[str, da.Array] = {}
        copies: list = []

        def chunk(worker: str, where: str, name, shape) -> da.Array:
            future = self.client.submit(
                read_array, self.token, where, name, workers=[worker],
                allow_other_workers=False, pure=False,
            )  # fmt: skip
            copies.append(future)
            return da.from_delayed(future, shape=shape, dtype=self.spec.dtype)

        shard_maps = self.shard_maps
        for name, shape in sparse_shapes.items():
            if shard_maps is None:
                out[name] = chunk(self.workers[0], "replicas", name, shape)
                continue
            shard_map = shard_maps[name]
            blocks = []
            for p in range(shard_map.n_shards):
                rows = len(shard_map.rows(p))
                holder = next(
                    w for i, w in enumerate(self.workers) if p in shard_map.shards_of(i)
                )
                blocks.append(chunk(holder, "shards", (name, p), (rows, *shape[1:])))
            out[name] = da.concatenate(blocks, axis=0)
        shapes = self.spec.dense_shapes()
        for i, name in enumerate(self.spec.dense_names()):
            if self.architecture == "ps":
                where, worker = "served", self.workers[self.dense_servers[name]]
            else:
                where, worker = "replicas", self.workers[0]
            out[f"dense_{i}"] = chunk(worker, where, name, tuple(shapes[i]))
        self._copies_made(copies, self.workers, "the values' copies were not made")
        return out


def _variable_states(model: EmbeddingMLP) -> dict[str, ParamState]:
    """``model``'s optimizer state by distributed variable: the one-process keys, with the
    output layer's weight and bias states joined into the output table's
    (``[W_out^T | b_out]``, the sampled softmax)."""
    states = dict(model._slots.states) if model.optimizer is not None else {}
    weight, bias = states.pop("softmax-weight", None), states.pop("softmax-bias", None)
    if weight is not None and bias is not None:
        states[SOFTMAX] = ParamState(
            weight.step,
            {n: np.hstack([weight.arrays[n], bias.arrays[n]]) for n in weight.arrays},
        )
    return states
