"""Pipeline and data parallelism of a pruned network on compressed states (SAMO on Dask, after
AxoNN): :class:`DistributedCompressedMLP` runs ``replicas`` replicas of ``stages`` runs of layers,
``microbatches`` flowing through each replica's stages; the compressed gradients are summed across
replicas, so a step equals the one-process step on the whole batch.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from numbers import Integral

import dask.array as da
import numpy as np
import sparse

from dasknn.compressed import LossScaler
from dasknn.exceptions import NonFiniteLossError, StepTimeoutError, WorkerLostError
from dasknn.model.compressed_mlp import (
    CompressedMLP,
    LayerShapes,
)
from dasknn.model.compressed_persistence import (
    COMPRESSED_FILE,
    CompressedRecord,
    compressed_identity,
)
from dasknn.model.estimator import OutputBlocks, SparseEstimator
from dasknn.model.validation import check_count
from dasknn.optim import Optimizer, resolve_optimizer
from dasknn.pipeline_parallel import _worker_state as ws
from dasknn.pipeline_parallel._plan import balanced_bounds
from dasknn.pipeline_parallel._plan import check_bounds as _check_bounds
from dasknn.pipeline_parallel._schedule import check_schedule
from dasknn.pipeline_parallel._taskgraph import accumulate_dtype, build_inference, build_step
from dasknn.pipeline_parallel._timeline import (
    IdleBreakdown,
    IdleSources,
    handover_seconds,
    idle_sources,
)
from dasknn.runtime.affinity import PLUGIN_NAME as PIN_CORES_PLUGIN
from dasknn.runtime.affinity import PinCores, host_slots, pin_by_default
from dasknn.runtime.comm_report import CommReport, Key
from dasknn.runtime.distributed_model import DistributedModel
from dasknn.runtime.keys import PIPELINE, pipeline_key, postbox_key
from dasknn.runtime.measure import read_transfers, reset_transfers
from dasknn.runtime.scatter import scatter_released_if_given_up
from dasknn.runtime.step_timeout import DEFAULT_STEP_TIMEOUT

__all__ = [
    "FOLD_TOKENS",
    "LOSS_ERRORS",
    "POLL_SECONDS",
    "SETTLE_POLL_SECONDS",
    "DistributedCompressedMLP",
    "IdleBreakdown",
    "balanced_bounds",
]

#: Seconds between two checks, while data are scattered to the stages and a step's results
#: gathered, that the stage workers are still in the cluster.
POLL_SECONDS = 0.25
#: A step's errors that may come from a lost stage worker, before the scheduler has noticed the
#: loss: a result cancelled with the worker, a stage that could not reach it (its postbox actor
#: lost, a closed connection) or was dropped with the step.
LOSS_ERRORS = (concurrent.futures.CancelledError, RuntimeError, OSError)
_RECOVERY = (
    " (a fit call given fit(checkpoint=DIR) restores its last checkpoint and goes on; otherwise "
    "close the model and start again from a saved copy)"
)
#: What a lost stage worker takes with it, said by :class:`WorkerLostError`: during a step, and
#: while the model's states or records are read.
LOST_IN_STEP = "the step failed and the weights of those layers are gone" + _RECOVERY
LOST_WHILE_READ = "the weights of those layers are gone" + _RECOVERY
#: Allreduce tokens (one per stage and step with replicas) whose transfer counts are kept on the
#: scheduler before the model moves them into its own table and forgets them there.
FOLD_TOKENS = 64
#: Seconds between two checks, at the end of ``fit``, that the scheduler forgot the last step.
SETTLE_POLL_SECONDS = 0.005
#: ``what`` of the allreduce's rows in :meth:`DistributedCompressedMLP.comm_report`.
GRADIENTS = "gradients"


def _known_keys(dask_scheduler, keys: list) -> list:
    """The ``keys`` the scheduler still knows."""
    return [key for key in keys if key in dask_scheduler.tasks]


def _by_replica(where: tuple[int, int]) -> tuple[int, int]:
    """Stage replicas ``(s, d)`` ordered as ``workers`` lists them: replica, then stage."""
    s, d = where
    return d, s


class DistributedCompressedMLP(LayerShapes, SparseEstimator, DistributedModel):
    """A compressed model trained with pipeline stages and data-parallel replicas on Dask.

    Parameters
    ----------
    estimator : CompressedMLP
        The pruned model (its values, precision, compute and fp16 loss scale are copied, not
        its optimizer state).
    client : distributed.Client, str, Cluster, JobqueueSpec or None
        Where to run (see :class:`~dasknn.runtime.distributed_model.DistributedModel`); ``None``
        (the default) starts a local cluster. What the model opens it closes.
    stages : int
        Runs of consecutive layers, ``1 <= stages <= n_layers`` (default 1).
    replicas : int
        Replicas of every stage (default 1).
    microbatches : int
        Microbatches per replica and step (default 1); they must divide the replica's rows.
    schedule : {"gpipe", "1f1b"}
    bounds : sequence of (first, stop), optional
        The layers of each stage, contiguous and covering the network (default
        :func:`balanced_bounds`).
    reuse_memory : bool
        Keep the workers' freed step buffers for reuse while the model is placed
        (:class:`~dasknn.runtime.worker_memory.ReuseFreedMemory`; glibc's thresholds go back to
        the worker's own at ``close()``). Default ``True``; ``False`` leaves malloc alone.
    pin_cores : bool, optional
        Bind each stage worker to a core of its own (:class:`~dasknn.runtime.affinity.PinCores`)
        until ``close()``. Default ``None``: on for a local cluster of the model's own on a
        machine with more cores than stage workers.
    workers : sequence of str, optional
        Worker addresses (default: the cluster's, sorted); replica ``d``'s stage ``s`` runs on
        ``workers[d * stages + s]``.
    messages : {"posted", "tasks"}
        ``"posted"`` (the default): one task per stage replica posts each boundary message to
        the receiving worker's postbox; ``"tasks"``: a task per pass.
    step_timeout : float
        Seconds a step, a prediction or a read of the workers (``replica``, ``gather``,
        ``to_dask``, ``step_report``) may take before a
        :class:`~dasknn.exceptions.StepTimeoutError` naming the stage workers waited for, their
        roles and state; after a failed step the model is unusable. A stage worker that leaves
        is a :class:`~dasknn.exceptions.WorkerLostError` within a poll, while one asked to
        retire hands its stage to a spare worker between two steps and then leaves (see
        docs/reliability.md).

    Raises
    ------
    ValueError
        Before anything is installed, for an argument out of its range or more stage replicas
        than workers.

    Attributes
    ----------
    n_steps_ : int
        Training steps taken (a step that raised
        :class:`~dasknn.exceptions.NonFiniteLossError` counts).
    optimizer_ : Optimizer or None
        The optimizer of the last step.
    scaler : LossScaler or None
        fp16's dynamic loss scale.
    workers : dict
        ``{(stage, replica): address}``.
    """

    _poll_seconds = POLL_SECONDS
    _loss_errors = LOSS_ERRORS
    _lost_outcome = LOST_IN_STEP
    _needs_spares = True

    def __init__(
        self,
        estimator: CompressedMLP,
        client=None,
        *,
        stages: int = 1,
        replicas: int = 1,
        microbatches: int = 1,
        schedule: str = "gpipe",
        bounds: Sequence[tuple[int, int]] | None = None,
        reuse_memory: bool = True,
        pin_cores: bool | None = None,
        workers: Sequence[str] | None = None,
        messages: str = "posted",
        step_timeout: float = DEFAULT_STEP_TIMEOUT,
    ) -> None:
        model = estimator
        if not isinstance(model, CompressedMLP):
            raise ValueError(f"estimator must be a CompressedMLP, got {type(model).__name__}")
        self.stages = check_count("stages", stages)
        self.replicas = check_count("replicas", replicas)
        self.microbatches = check_count("microbatches", microbatches)
        self.schedule = check_schedule(schedule)
        if messages not in ("posted", "tasks"):
            raise ValueError(f"messages must be 'posted' or 'tasks', got {messages!r}")
        self.messages = messages
        for name, flag in (("reuse_memory", reuse_memory), ("pin_cores", pin_cores)):
            if not isinstance(flag, bool) and not (name == "pin_cores" and flag is None):
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        self.reuse_memory = reuse_memory
        self.pin_cores = pin_cores
        if self.stages > model.n_layers:
            raise ValueError(
                f"{self.stages} stages for a network of {model.n_layers} layers: at most one per "
                "layer"
            )
        if bounds is None:
            bounds = balanced_bounds(model, self.stages)
        self.bounds = _check_bounds(bounds, self.stages, model.n_layers)
        with self._connecting(client, step_timeout):
            available = self._use_workers(workers)
            needed = self.stages * self.replicas
            if needed > len(available):
                raise ValueError(
                    f"stages * replicas = {needed} workers needed, {len(available)} available"
                )
            self._watch_retirements()
        if self.pin_cores is None:
            self.pin_cores = pin_by_default(self._own_cluster, needed)
        self.loss = model.loss
        self.dtype = model.dtype
        self.precision = model.precision
        self.compute = model.compute
        self.scaler = None
        if model.scaler is not None:
            self.scaler = LossScaler(model.scaler.scale, model.scaler.growth_interval)
        self.activation = model.activation
        self.output_activation = model.output_activation
        self.layer_shapes = list(model.layer_shapes)
        self.workers = {
            (s, d): available[d * self.stages + s]
            for s in range(self.stages)
            for d in range(self.replicas)
        }
        self._nnz = model.nnz
        self._network = compressed_identity(model._record())
        self._master_dtype = model.stack.layers[0].master.dtype
        self._grad_sizes = [
            sum(
                model.stack.layers[k].grad_w.size + model.stack.layers[k].grad_b.size
                for k in range(a, b)
            )
            for a, b in self.bounds
        ]
        self._key_offset = 0  # added to n_steps_ in a step's keys: no key is used twice
        self._inference_calls = 0  # predictions made (their keys' number)
        self._snapshots = 0  # to_dask calls (their keys' number)
        # the traffic since the start or reset_comm: steps and rows trained, row blocks and rows
        # predicted, the allreduce tokens still counted on the scheduler, and those moved here
        self._comm_steps = self._comm_rows = 0
        self._comm_blocks = self._comm_predicted_rows = 0
        self._reduce_tokens: list[str] = []
        self._reduced: dict[Key, list[int]] = {}
        self._last_keys: list = []  # the last step's keys the client held
        self._data_calls = 0  # placements of training data (their keys' number)
        self._training_rows: tuple[np.ndarray, np.ndarray] | None = None  # of the fit call
        self._postboxes: dict = {}
        self._register(ws.StageState(self.token), lambda: self._install(model))

    def _install(self, model: CompressedMLP, with_state: bool = False) -> None:
        """Register the plugins asked for, install every stage (``with_state``: with the
        model's optimizer state) and start the postboxes, within the placement's time."""
        if self.reuse_memory:
            self._reuse_freed_memory()
        if self.pin_cores:
            slots = host_slots(self.workers[key] for key in sorted(self.workers, key=_by_replica))
            self._add_plugin(PinCores(slots), PIN_CORES_PLUGIN)
        layers = model.stack.layers
        activations = model.stack.activations
        for (s, d), address in self.workers.items():
            a, b = self.bounds[s]
            spec = {
                "stage": s,
                "replica": d,
                "first_layer": a + 1,
                "last": s == self.stages - 1,
                "layers": [
                    (layers[k].master, layers[k].index, layers[k].shape) for k in range(a, b)
                ],
                "biases": [layers[k].bias for k in range(a, b)],
                "activations": activations[a:b],
                "input_activation": activations[a - 1] if s > 0 else None,
                "precision": model.precision,
                "compute": model.compute,
                "loss": model.loss,
                "output_activation": model.output_activation,
            }
            held = [layers[k].optimizer_state for k in range(a, b)]
            if with_state and model.optimizer is not None and None not in held:
                spec["optimizer"], spec["optimizer_state"] = model.optimizer, held
            self._install_on(address, ws.install_stage, spec=spec)
        if self.messages == "posted":
            boxes = self._start_postboxes(
                {
                    postbox_key(PIPELINE, self.token, where, self._generation): address
                    for where, address in self.workers.items()
                }
            )
            self._postboxes = dict(zip(self.workers, boxes, strict=True))
        else:  # the postboxes keep Dask from retiring a worker before the hand-over
            self._start_anchors(list(self.workers.values()))

    # ------------------------------------------------------------------ life
    def _before_close(self) -> None:
        """Release the postboxes and forget the allreduce counts still on the scheduler."""
        super()._before_close()
        tokens, self._reduce_tokens = self._reduce_tokens, []
        for token in tokens:
            reset_transfers(self.client, token)

    # ------------------------------------------------------------------ training
    def _check_rows(self, rows: int) -> int:
        parts = self.replicas * self.microbatches
        if rows % parts:
            raise ValueError(
                f"a batch of {rows} rows does not split into replicas * microbatches = "
                f"{parts} equal microbatches"
            )
        return rows // parts

    def _place_data(self, x: np.ndarray, y: np.ndarray) -> dict:
        """Scatter ``x`` to every replica's first stage and ``y`` to its last, held there for
        the steps on them (each step's tasks take their microbatches' rows,
        :func:`~._worker_state.microbatch_columns`); ``{("x" or "y", d): future}``."""
        self._data_calls += 1
        last = self.stages - 1
        by_worker: dict[str, dict] = {}
        for name, s, values in (("x", 0, x), ("y", last, y)):
            for d in range(self.replicas):
                key = pipeline_key(self.token, f"data-{name}", self._data_calls, s, d)
                by_worker.setdefault(self.workers[(s, d)], {})[key] = values
        deadline = time.monotonic() + self.step_timeout
        what = "the training data did not reach its stages"
        scattered = self._scatter(by_worker, deadline, LOST_WHILE_READ, what)
        return {(f.key[1].removeprefix("data-"), f.key[4]): f for f in scattered}

    @contextmanager
    def _holding(self, x: np.ndarray, y: np.ndarray) -> Iterator[list]:
        """``x`` and ``y`` held on the stages (:meth:`_place_data`) for a call's steps, as a
        one-item list of its dict (placed again after a hand-over), released when the call ends
        however it ends."""
        held = [self._place_data(x, y)]
        self._training_rows = (x, y)
        try:
            yield held
        finally:  # also when the error (whose traceback holds this frame) is kept
            self._training_rows = None
            for future in held[0].values():
                future.release()

    def _train_batch(self, data: dict, rows: np.ndarray, optimizer: Optimizer) -> float:
        """One step on the columns ``rows`` of the ``data`` held on the stages
        (:meth:`_place_data`), the ``replicas * microbatches`` microbatches consecutive."""
        self._check_open()
        per = self._check_rows(len(rows))
        deadline = time.monotonic() + self.step_timeout
        self.n_steps_ += 1
        step, m = self.n_steps_ + self._key_offset, self.microbatches
        inputs = {
            (name, d): (data[(name, d)].key, [rows[(d * m + u) * per :][:per] for u in range(m)])
            for name, d in data
        }
        graph = None
        try:
            graph = build_step(
                self.token,
                step,
                self.stages,
                self.replicas,
                self.microbatches,
                self.schedule,
                self.workers,
                optimizer,
                per / len(rows),
                self._grad_sizes,
                accumulate_dtype(self.precision.storage),
                None if self.scaler is None else self.scaler.scale,
                {where: future.key for where, future in self._postboxes.items()} or None,
                data=inputs,
            )
            wanted = graph.loss_keys + graph.update_keys
            if graph.verdict_key is not None:
                wanted.append(graph.verdict_key)
            self._last_keys = list(wanted)
            try:
                results = self._gather_graph(
                    graph.tasks, wanted, "the step did not finish", graph.placement,
                    graph.priority, max(deadline - time.monotonic(), 0.0),
                )  # fmt: skip
            except NonFiniteLossError as error:
                raise self._locate_nonfinite(error) from None
        except StepTimeoutError as error:
            self._failed = str(error)
            self._drop_steps(step)
            raise
        except WorkerLostError:
            self._drop_steps(step)
            raise
        finally:
            if graph is not None:  # counted on the scheduler: forgotten by reset_comm or close
                self._reduce_tokens += graph.collective_tokens
        if self.scaler is not None:
            self.scaler.update(bool(results[-1]))
        self._comm_steps += 1
        self._comm_rows += len(rows)
        if len(self._reduce_tokens) >= FOLD_TOKENS:
            self._fold_reductions()
        self.optimizer_ = optimizer
        losses = results[: len(graph.loss_keys)]
        if self.messages == "posted":  # each last stage's task: the losses of its microbatches
            losses = [value for replica in losses for value in replica]
        return float(sum(losses))

    def _worker_roles(self) -> dict[str, str]:
        """``{address: "stage S of replica D, layers A to B"}`` of every stage worker."""
        roles = {}
        for (s, d), address in self.workers.items():
            a, b = self.bounds[s]
            layers = f"layer {b}" if b == a + 1 else f"layers {a + 1} to {b}"
            roles[address] = f"stage {s} of replica {d}, {layers}"
        return roles

    def _scatter(self, by_worker: dict, deadline: float, outcome: str, what: str) -> list:
        """Scatter ``by_worker`` (``{address: {key: array}}``) to the stage workers, one after
        the other, before the ``deadline`` (``time.monotonic()``), :meth:`_watched` (``outcome``,
        ``what``: as its); returns the futures (released here if one scatter fails)."""
        scattered: list = []
        try:
            for address, values in by_worker.items():
                scattering = scatter_released_if_given_up(self.client, values, workers=[address])
                left = max(deadline - time.monotonic(), 0.0)
                held = self._watched(scattering, [address], what, outcome, left, graced=Exception)
                scattered += held.values()
        except BaseException:
            for future in scattered:
                future.release()
            raise
        return scattered

    def _drop_steps(self, step: int) -> None:
        """End ``step``'s tasks (waiting for posted messages) on the stage workers that answer."""
        if self.messages == "posted":
            self._run_on_answering(ws.drop_steps, self.workers.values(), step=step)

    def _locate_nonfinite(self, error: NonFiniteLossError) -> NonFiniteLossError:
        """The last stage's error, naming instead the layer of an earlier stage whose outputs
        were already not finite (the earliest such layer of the step's stashed microbatches)."""
        earlier = [address for (s, _), address in self.workers.items() if s < self.stages - 1]
        step = error.step - self._key_offset  # the training step the keys' step stands for
        if not earlier:
            return NonFiniteLossError(step, error.value, error.layer)
        what = "the earlier stages did not say which outputs are not finite"
        found = self._run_on(ws.first_nonfinite_stashed, earlier, what, token=self.token,
                             step=error.step)  # fmt: skip
        layer = min((v for v in found.values() if v is not None), default=error.layer)
        return NonFiniteLossError(step, error.value, min(layer, error.layer))

    def train_step(
        self, X, Y, *, lr: float | None = None, optimizer: Optimizer | None = None
    ) -> float:
        """One step on the batch ``(X, Y)``; returns its loss before the update.

        Raises
        ------
        ValueError
            Before anything is scheduled, for malformed arguments or rows that do not split
            into ``replicas * microbatches`` equal microbatches.
        NonFiniteLossError
            Naming the step and the first layer whose outputs are not finite.
        """
        x, y = self._check_xy(X, Y)
        optimizer = resolve_optimizer(lr, optimizer)
        self._check_rows(x.shape[0])
        self._check_open()
        self._hand_over_retiring()  # between two steps: the stages of retiring workers move
        with self._holding(x, y) as data:
            loss = self._train_batch(data[0], np.arange(x.shape[0]), optimizer)
        return loss

    @contextmanager
    def _training_data(self, x: np.ndarray, y: np.ndarray) -> Iterator[list]:
        """The fit call's ``x`` and ``y`` held on the stages for its steps (:meth:`_holding`);
        once it ends, the scheduler is left to forget them (:meth:`_settle`)."""
        with self._holding(x, y) as held:
            yield held
        self._last_keys += [future.key for future in held[0].values()]
        self._settle()

    def _train_batches(self, data, batches, optimizer: Optimizer) -> Iterator[float]:
        for idx in batches:
            self._check_rows(len(idx))
        for idx in batches:
            self._check_open()
            if self._hand_over_retiring():  # the stages of retiring workers moved: the data too
                old, data[0] = data[0], self._place_data(*self._training_rows)
                for future in old.values():
                    future.release()
            yield self._train_batch(data[0], idx, optimizer)
        self._settle()

    def _settle(self) -> None:
        """Wait until the scheduler has forgotten the last step's keys (released as the step
        ended) or a fit call's data, released, polling every :data:`SETTLE_POLL_SECONDS` for
        at most ``step_timeout``: a ``fit`` returns with nothing of the model left to do on the
        scheduler."""
        keys, self._last_keys = self._last_keys, []
        deadline = time.monotonic() + self.step_timeout
        while keys and time.monotonic() < deadline:
            keys = self.client.run_on_scheduler(_known_keys, keys=keys)
            if keys:
                time.sleep(SETTLE_POLL_SECONDS)

    # ------------------------------------------------------------------ checkpoints
    _checkpoint_format = COMPRESSED_FILE
    _estimator_class = CompressedMLP

    def _identity(self) -> dict:
        return self._network

    def _record(self) -> CompressedRecord:
        """The model of replica 0 (values, biases, optimizer state, steps, loss scale) as a
        record, read from its stage workers."""
        return self.gather()._record()

    def _restore(self, record: CompressedRecord) -> None:
        """Install the values, optimizer state, step count and loss scale of ``record`` (the
        same network), a lost stage worker's place taken by another (:meth:`_replace_lost`)."""
        self._check_open()
        model = CompressedMLP._from_record(record, "checkpoint")
        self.workers = dict(
            zip(self.workers, self._replace_lost(list(self.workers.values())), strict=True)
        )
        self._key_offset += self.n_steps_ - record.steps + 1
        self._last_keys = []
        self._place_anew(ws.StageState(self.token), lambda: self._install(model, with_state=True))
        self._take_counts(model)

    def _rebalancing(self, workers: list[str]) -> Callable[[], None]:
        """Stage ``s`` of replica ``d`` on ``workers[d * stages + s]``, as the constructor
        places them (:meth:`rebalance`).

        Raises
        ------
        ValueError
            If ``workers`` are fewer than ``stages * replicas``.
        """
        needed = self.stages * self.replicas
        if needed > len(workers):
            raise ValueError(f"stages * replicas = {needed} workers needed, {len(workers)} given")
        placed = {(s, d): workers[d * self.stages + s] for s, d in self.workers}

        def take() -> None:
            self.workers = placed

        return take

    def _take_counts(self, model: CompressedMLP) -> None:
        """The step count, loss scale and optimizer of ``model`` become the model's."""
        self.n_steps_ = model.steps_
        self.optimizer_ = model.optimizer
        if model.scaler is not None:
            self.scaler = LossScaler(model.scaler.scale, model.scaler.growth_interval)
            self.scaler.good_steps = model.scaler.good_steps
            self.scaler.skipped_steps = model.scaler.skipped_steps

    def _take_state(self, estimator: CompressedMLP) -> None:
        """Also take its step count and loss scale."""
        super()._take_state(estimator)
        self._take_counts(estimator)

    # ------------------------------------------------------------------ results
    def replica(self, d: int = 0) -> CompressedMLP:
        """The model as held by replica ``d``: a one-process :class:`CompressedMLP` with its
        optimizer state, step count and fp16 loss scale, that trains on from here.

        Raises
        ------
        ValueError
            If ``d`` is not a replica's number.
        WorkerLostError, StepTimeoutError, ModelClosedError, ModelFailedError
            See ``step_timeout`` in the class.
        """
        self._check_open()
        if isinstance(d, bool) or not isinstance(d, Integral) or not 0 <= d < self.replicas:
            raise ValueError(f"replica must be an integer in [0, {self.replicas}), got {d!r}")
        addresses = [self.workers[(s, int(d))] for s in range(self.stages)]
        what = "the stages' weights did not arrive"
        snapshots = self._run_on(ws.snapshot_stage, addresses, what, LOST_WHILE_READ,
                                 token=self.token)  # fmt: skip
        values, indices, biases, states, optimizers = [], [], [], [], []
        for address in addresses:
            held = snapshots[address]
            optimizers.append(held["optimizer"])
            for v, i, b, state_w, state_b in held["layers"]:
                values.append(v)
                indices.append(i)
                biases.append(b)
                states.append((state_w, state_b))
        model = CompressedMLP.from_compressed(
            values,
            indices,
            self.layer_shapes,
            biases,
            activation=self.activation,
            output_activation=self.output_activation,
            loss=self.loss,
            precision=self.precision.name,
            compute=self.compute,
            **({} if self.scaler is None else {"loss_scale": self.scaler.scale}),
        )
        model.steps_ = self.n_steps_
        if self.scaler is not None:
            model.scaler.growth_interval = self.scaler.growth_interval
            model.scaler.good_steps = self.scaler.good_steps
            model.scaler.skipped_steps = self.scaler.skipped_steps
        held_states = all(w is not None and b is not None for w, b in states)
        same = all(o == optimizers[0] for o in optimizers)
        if optimizers[0] is not None and same and held_states:
            for layer, pair in zip(model.stack.layers, states, strict=True):
                layer.restore_optimizer_state(optimizers[0], pair)
        return model

    def gather(self) -> CompressedMLP:
        """The trained model in one process (replica 0; errors as :meth:`replica`)."""
        return self.replica(0)

    def to_dask(self) -> dict[str, da.Array]:
        """The parameters as dask arrays: ``weights_{k}`` (one ``(n_in, n_out)`` GCXS chunk of
        the master values) and ``bias_{k}`` of every layer ``k`` (0-based), each chunk a copy
        made before this returns (a snapshot) by a task on the layer's stage worker of replica
        0 and held there. Errors as :meth:`replica`."""
        self._check_open()
        self._snapshots += 1
        call = self._snapshots
        meta_w = sparse.GCXS.from_numpy(np.empty((0, 0), self._master_dtype), compressed_axes=(0,))
        meta_b = np.empty(0, self._master_dtype)
        arrays, futures = {}, []
        for s, (first, stop) in enumerate(self.bounds):
            address = self.workers[(s, 0)]
            pinned = {"workers": [address], "allow_other_workers": False, "pure": False}
            for k in range(first, stop):
                n_in, n_out = self.layer_shapes[k]
                for name, part, chunks, meta in (
                    (f"weights_{k}", "weights", ((n_in,), (n_out,)), meta_w),
                    (f"bias_{k}", "bias", ((n_out,),), meta_b),
                ):
                    key = f"dasknn-{name}-{self.token}-v{call}"
                    chunk = (key,) + (0,) * len(chunks)
                    future = self.client.submit(
                        ws.layer_copy, self.token, k - first, part, key=chunk, **pinned
                    )
                    futures.append(future)
                    arrays[name] = da.Array(
                        {chunk: future}, key, chunks=chunks, dtype=self._master_dtype, meta=meta
                    )
        addresses = [self.workers[(s, 0)] for s in range(self.stages)]
        self._copies_made(futures, addresses, "the layers' copies were not made", LOST_WHILE_READ)
        return arrays

    def _output_blocks(self, x: np.ndarray, batch_size: int) -> OutputBlocks:
        """Row blocks ``(z_L, a_L)`` of ``x``, ``batch_size`` rows each, block ``j`` through
        the stages of replica ``j % replicas``, within ``step_timeout`` in all (errors as
        :meth:`replica`)."""
        self._check_open()
        deadline = time.monotonic() + self.step_timeout
        self._inference_calls += 1
        call = self._inference_calls
        starts = list(range(0, x.shape[0], batch_size))
        by_worker: dict[str, dict] = {}
        for j, start in enumerate(starts):
            key = pipeline_key(self.token, "infer-x", call, 0, j % self.replicas, j)
            block = np.ascontiguousarray(x[start : start + batch_size].T)
            by_worker.setdefault(self.workers[(0, j % self.replicas)], {})[key] = block
        scattered: list = []
        try:
            what = "the rows did not reach stage 0"
            scattered = self._scatter(by_worker, deadline, LOST_WHILE_READ, what)
            tasks, outputs, placement = build_inference(
                self.token, call, self.stages, self.replicas, len(starts), self.workers
            )
            blocks = self._gather_graph(
                tasks, outputs, "the predictions did not arrive", placement,
                seconds=max(deadline - time.monotonic(), 0.0), outcome=LOST_WHILE_READ,
            )  # fmt: skip
        finally:
            for future in scattered:
                future.release()
        self._comm_blocks += len(starts)
        self._comm_predicted_rows += x.shape[0]
        return blocks

    def step_report(self) -> dict:
        """The passes of the last step per stage replica: ``{(s, d): {"events": [(kind, u,
        start, end)], "peak": most microbatches held at once}}`` (errors as :meth:`replica`)."""
        self._check_open()
        what = "the stages' records of the last step did not arrive"
        records = self._run_on(ws.read_step, self.workers.values(), what, LOST_WHILE_READ,
                               token=self.token, step=self.n_steps_ + self._key_offset)  # fmt: skip
        return {where: records[address] for where, address in self.workers.items()}

    def idle_fractions(self) -> dict[tuple[int, int], float]:
        """Per stage replica, the fraction of the last step's forward-backward span (first pass
        started to last pass ended, over all stages of its replica) in which it ran no pass."""
        return {key: parts.idle for key, parts in self.idle_breakdown().items()}

    def idle_breakdown(self) -> dict[tuple[int, int], IdleBreakdown]:
        """Per stage replica, its idle fraction in the last step split into the pipeline bubble
        and the stage imbalance (see :class:`IdleBreakdown`)."""
        out = {}
        for d, passes in enumerate(self._passes()):
            begin = min(e[2] for events in passes.values() for e in events)
            end = max(e[3] for events in passes.values() for e in events)
            busy = {s: sum(e[3] - e[2] for e in events) for s, events in passes.items()}
            slowest = max(busy.values())
            handover = handover_seconds(passes)
            for s in range(self.stages):
                out[(s, d)] = IdleBreakdown(
                    idle=1.0 - busy[s] / (end - begin),
                    bubble=1.0 - slowest / (end - begin),
                    imbalance=(slowest - busy[s]) / (end - begin),
                    busy=busy[s],
                    handover=handover[s] / (end - begin),
                )
        return out

    def idle_sources(self) -> dict[tuple[int, int], IdleSources]:
        """Per stage replica, its idle fraction in the last step split into the schedule's
        formula, the stages' unequal mean passes, the passes' variation and the handover, against
        the ideal timeline of the schedule (see :mod:`dasknn.pipeline_parallel._timeline`)."""
        out = {}
        for d, passes in enumerate(self._passes()):
            for s, sources in idle_sources(passes, self.schedule, self.microbatches).items():
                out[(s, d)] = sources
        return out

    def _passes(self) -> list[dict]:
        """Per replica, ``{stage: its forward and backward passes in the last step}``."""
        report = self.step_report()
        return [
            {s: [e for e in report[(s, d)]["events"] if e[0] in "FB"] for s in range(self.stages)}
            for d in range(self.replicas)
        ]

    def comm_report(self) -> CommReport:
        """Measured beside predicted traffic since the start or :meth:`reset_comm`, keyed
        ``(what, phase, sender, receiver)``: ``(layer, "forward" | "backward" | "predict")``
        across the stage boundary after ``layer`` (``rows n_b s`` bytes in ``m D`` messages a
        step, one a predicted block) and ``("gradients", "allreduce")`` across replicas
        (``2 (D - 1) (nnz + biases) s_g`` bytes in ``2 S D (D - 1)`` messages a step).
        ``details``: stages, replicas, microbatches, rows, blocks and the fp16 overflow flags
        (``flag_bytes``, ``flag_messages``). A lost stage worker is a
        :class:`~dasknn.exceptions.WorkerLostError`."""
        self._check_open()
        self._check_workers(outcome=LOST_WHILE_READ)
        self._fold_reductions()
        measured: dict[Key, list[int]] = {key: list(v) for key, v in self._reduced.items()}
        flags = [0, 0]
        for stage, phase, sender, receiver, nbytes, count in read_transfers(
            self.client, self.token
        ):
            if phase in ("forward", "predict"):  # sent by the boundary's earlier stage
                what = self.bounds[stage][1]
            elif phase == "backward":  # sent by its later stage
                what = self.bounds[stage][0]
            else:
                flags[0] += nbytes
                flags[1] += count
                continue
            row = measured.setdefault((what, phase, sender, receiver), [0, 0])
            row[0] += nbytes
            row[1] += count
        S, D, m = self.stages, self.replicas, self.microbatches
        steps, rows = self._comm_steps, self._comm_rows
        itemsize = self.dtype.itemsize
        predicted: dict[Key, tuple[int, int]] = {}
        for _, stop in self.bounds[:-1]:
            width = self.layer_shapes[stop - 1][1]
            predicted[(stop, "forward", None, None)] = (rows * width * itemsize, steps * m * D)
            predicted[(stop, "backward", None, None)] = (rows * width * itemsize, steps * m * D)
            predicted[(stop, "predict", None, None)] = (
                self._comm_predicted_rows * width * itemsize,
                self._comm_blocks,
            )
        if D > 1:
            n_bias = sum(shape[1] for shape in self.layer_shapes)
            per_step = 2 * (D - 1) * (self._nnz + n_bias) * self.precision.storage.itemsize
            predicted[(GRADIENTS, "allreduce", None, None)] = (
                steps * per_step,
                steps * 2 * S * D * (D - 1),
            )
        details = {
            "stages": S,
            "replicas": D,
            "microbatches": m,
            "rows": rows,
            "predicted_rows": self._comm_predicted_rows,
            "predicted_blocks": self._comm_blocks,
            "flag_bytes": flags[0],
            "flag_messages": flags[1],
        }
        return CommReport(
            {key: (b, c) for key, (b, c) in measured.items()}, predicted, steps, details
        )

    def reset_comm(self) -> None:
        """Forget the traffic counted so far (:meth:`comm_report` counts from here)."""
        super().reset_comm()
        tokens, self._reduce_tokens = self._reduce_tokens, []
        for token in tokens:
            reset_transfers(self.client, token)
        self._reduced = {}
        self._comm_steps = self._comm_rows = 0
        self._comm_blocks = self._comm_predicted_rows = 0

    def _fold_reductions(self) -> None:
        """Move the allreduce counts of the finished steps from the scheduler's monitor (one
        token per stage and step) into the model's table, and forget them there."""
        tokens, self._reduce_tokens = self._reduce_tokens, []
        for token in tokens:
            for _, _, sender, receiver, nbytes, count in read_transfers(self.client, token):
                row = self._reduced.setdefault((GRADIENTS, "allreduce", sender, receiver), [0, 0])
                row[0] += nbytes
                row[1] += count
            reset_transfers(self.client, token)
