"""``DistributedSparseMLP``: a SparseMLP trained model-parallel on Dask (docs/training.md)."""

from __future__ import annotations

import hashlib
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager

import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp

from dasknn.exceptions import ModelClosedError, StepTimeoutError, WorkerLostError
from dasknn.model.estimator import SparseEstimator
from dasknn.model.layer_source import LayerSource
from dasknn.model.persistence import ModelRecord, add_pattern, read_model
from dasknn.model.sparse_mlp import SparseMLP
from dasknn.model.validation import check_in_flight
from dasknn.model_parallel._comm import predicted_counts, wire_bytes
from dasknn.model_parallel._exchange import ActorStepTemplate, postbox_key
from dasknn.model_parallel._layout import (
    PLACING,
    Layout,
    Snapshot,
    chunk_entries,
    gather_network,
    original_pattern,
    place_network,
    scatter_pinned,
    snapshot_network,
    worker_of_parts,
)
from dasknn.model_parallel._microbatches import auto_microbatches, check_microbatches, split_rows
from dasknn.model_parallel._plan import (
    CommPlan,
    LayerPartPlan,
    iter_layers,
    normalize_partition,
    renumbering,
)
from dasknn.model_parallel._steps import StepContext
from dasknn.model_parallel._taskgraph import StepPriority, StepTemplate, part_of
from dasknn.model_parallel._worker_state import ModelState, read_parts
from dasknn.optim import Optimizer, ParamState, resolve_optimizer
from dasknn.runtime.background import OneAtATime
from dasknn.runtime.comm_report import CommReport, counts_of
from dasknn.runtime.distributed_model import DistributedModel
from dasknn.runtime.faults import (
    POLL_SECONDS,
    lost_error,
    lost_workers,
    part_roles,
    part_workers_lost,
    running_workers,
    wait_for_step,
)
from dasknn.runtime.measure import read_transfers
from dasknn.runtime.model_span import held_in_span, new_span
from dasknn.runtime.placement import KeyPlacement
from dasknn.runtime.step_timeout import DEFAULT_STEP_TIMEOUT
from dasknn.runtime.waiting import call_at_most, gather_at_most

__all__ = ["DistributedSparseMLP"]


def _clear_on_worker(dask_worker, name):
    return dask_worker.plugins[name].clear_steps() if name in dask_worker.plugins else 0


def _timings_on_worker(dask_worker, name):
    return dask_worker.plugins[name].read_timings()


def _reset_timings_on_worker(dask_worker, name):
    dask_worker.plugins[name].reset_timings()


def _digested(weights: Iterable[sp.csr_matrix], digest) -> Iterator[sp.csr_matrix]:
    """``weights``, each added to ``digest`` as it passes (as
    :func:`~dasknn.model.persistence.pattern_digest` adds them), in a thread of its own while
    the caller uses the weight (hashing releases the GIL: about 9 ms a 2 M-entry layer)."""
    with OneAtATime("dasknn-digest") as hasher:  # in order, at most one layer held for it
        for weight in weights:
            hasher.submit(add_pattern, digest, weight)
            yield weight


def _hypergraph_partition(model: SparseMLP | LayerSource, nparts: int) -> list[np.ndarray]:
    """The hypergraph partition of ``model``'s neurons into ``nparts`` parts (one: all in 0); a
    :class:`LayerSource` is partitioned a layer at a time as it is made."""
    if nparts == 1:
        return [np.zeros(n, dtype=np.int64) for n in model.layer_sizes]
    from graph import partition_layers

    return partition_layers(model.iter_weights(), nparts).parts


class DistributedSparseMLP(SparseEstimator, DistributedModel):
    """A sparse MLP whose layers are split by neurons across Dask workers.

    Its estimator API and defaults are those of :class:`SparseMLP`; the methods that run on the
    workers also take ``in_flight``.

    Parameters
    ----------
    model : SparseMLP or LayerSource
        The network; its weights are copied to the workers (the model is not changed). A
        :class:`~dasknn.model.LayerSource` is read a layer at a time in three passes (the
        partition when none is given, the renumbering, the placement), so the client never
        holds more than two of its layers.
    client : distributed.Client, cluster, JobqueueSpec, str or None
        Where to run (see :class:`~dasknn.runtime.distributed_model.DistributedModel`); ``None``
        (the default) starts a local cluster. What the model opens it closes.
    partition : graph.NetworkPartition, sequence of L + 1 int arrays, or None
        ``parts[k][j]`` is the part owning neuron ``j`` of layer ``k`` (``k = 0``: inputs).
        ``None`` (the default): the hypergraph partition of ``graph.partition_network`` (made
        by ``graph.partition_layers`` as the layers pass), one part per used worker (seconds
        for large networks; deterministic).
    nparts : int, optional
        Number of parts (default ``partition.nparts`` or the largest id plus one; with
        ``partition=None``, the number of used workers).
    separate_packing : bool
        A pack task per message (two scheduler round trips per layer); for measurement only.
    reuse_memory : bool
        Keep the workers' freed step buffers for reuse while the model is placed
        (:class:`~dasknn.runtime.worker_memory.ReuseFreedMemory`; glibc's thresholds go back to
        the worker's own at ``close()``). Default ``True``; ``False`` leaves malloc alone.
    microbatches : int, optional
        Row blocks per training step, interleaved through the layers (the same step); ``None``
        (the default): :func:`~dasknn.model_parallel._microbatches.auto_microbatches`.
    workers : sequence of str, optional
        The workers to use (part ``m`` on ``workers[m % W]``); default every worker, sorted.
        ``ValueError`` for an address not in the cluster, or a repeated one.
    messages : {"posted", "tasks"}
        ``"posted"`` (the default): one task per worker and step, messages posted to postbox
        actors; ``"tasks"``: one task per part and layer, messages moved by Dask. Forward passes
        always use tasks. See docs/runtime.md.
    step_timeout : float
        Seconds a step, a prediction block or the placement may wait before a
        :class:`~dasknn.exceptions.StepTimeoutError`; a worker that leaves is a
        :class:`~dasknn.exceptions.WorkerLostError` at once, while a worker asked to retire
        (``retire_workers``, an adaptive cluster scaling down) hands its parts to the others
        after the step and then leaves. See docs/reliability.md.

    Attributes
    ----------
    plan : CommPlan
        Renumbering and per-layer communication plan.
    part_workers : list of str
        Worker address of every part.
    optimizer_ : Optimizer or None
        The optimizer of the last training step (its state lives on the workers).
    n_steps_ : int
        Training steps done by this object.
    """

    def __init__(
        self,
        model: SparseMLP | LayerSource,
        client=None,
        *,
        partition=None,
        nparts: int | None = None,
        separate_packing: bool = False,
        reuse_memory: bool = True,
        microbatches: int | None = None,
        workers: Sequence[str] | None = None,
        messages: str = "posted",
        step_timeout: float = DEFAULT_STEP_TIMEOUT,
    ) -> None:
        self.microbatches = check_microbatches(microbatches)
        for name, flag in (("separate_packing", separate_packing), ("reuse_memory", reuse_memory)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        if messages not in ("posted", "tasks"):
            raise ValueError(f"messages must be 'posted' or 'tasks', got {messages!r}")
        self.messages = messages
        parts = None
        if partition is not None:
            parts, nparts = normalize_partition(partition, model.layer_sizes, nparts)
        try:
            with self._connecting(client, step_timeout):  # closed again if this fails
                self._setup(model, parts, nparts, workers)
                self._separate_packing = separate_packing
                self._watch_retirements()
                self._register(
                    ModelState(self.token),
                    lambda: self._place(self._layers, model.biases, reuse_memory),
                )
        finally:
            self._layers = None

    def _setup(
        self, model: SparseMLP | LayerSource, parts: list | None, nparts: int | None, workers
    ) -> None:
        """Set the workers, partition and renumbering; ``_layers`` makes the layers' chunks for
        the placement, which completes :attr:`plan` with their part plans as they pass."""
        self._chosen = None if workers is None else list(workers)
        workers = self._use_workers(workers)
        if parts is None:
            nparts = len(workers) if nparts is None else nparts
            parts, nparts = normalize_partition(
                _hypergraph_partition(model, nparts), model.layer_sizes, nparts
            )
        self.activation = model.activation
        self.output_activation = model.output_activation
        self.loss = model.loss
        self.dtype = model.dtype
        self.layer_sizes = list(model.layer_sizes)
        #: The Dask span of every training task (see :mod:`dasknn.runtime.model_span`).
        self._span = new_span(f"dasknn-{self.token}")
        self._parts = parts
        digest = hashlib.sha256()  # of the pattern (the checkpoints' identity), as it passes
        orders, offsets = renumbering(_digested(model.iter_weights(), digest), parts, nparts)
        self._pattern_digest = digest.hexdigest()
        self.plan = CommPlan(nparts, orders, offsets, [])
        self._layers = self._planning(iter_layers(model.iter_weights(), orders, offsets))
        self.part_workers = worker_of_parts(workers, nparts)
        self._layout: Layout | None = None
        self._snapshot: Snapshot | None = None
        self._templates: dict = {}
        self._separate_packing = False
        self._step = 0
        self._reset_step = 0
        #: Batches since the last reset by (rows, backward, microbatches), for the comm report.
        self._batches: Counter[tuple[int, bool, int]] = Counter()
        self._placement = KeyPlacement(self.part_workers, part_of)
        self._priority = StepPriority(self.token, model.n_layers)
        self._next_check = 0.0  # when a finished step looks next at its workers (monotonic)
        self._training_rows: tuple[np.ndarray, np.ndarray] | None = None  # of the fit call

    @property
    def weights(self) -> list:
        """The renumbered weights after the last step: per layer a dask array of GCXS chunks,
        one per part on its worker (copied there on the first read after a step)."""
        return self._current_snapshot().weights

    @property
    def biases(self) -> list:
        """The renumbered biases, chunked like the columns of :attr:`weights` (see there)."""
        return self._current_snapshot().biases

    def to_dask(self) -> dict[str, da.Array]:
        """``{"weights_k": ..., "bias_k": ...}`` for k = 1..L: :attr:`weights` and :attr:`biases`
        (renumbered). Costs one task per chunk on the workers; nothing is gathered."""
        snapshot = self._current_snapshot()
        out: dict[str, da.Array] = {}
        for k, (weight, bias) in enumerate(zip(snapshot.weights, snapshot.biases, strict=True), 1):
            out[f"weights_{k}"] = weight
            out[f"bias_{k}"] = bias
        return out

    def _current_snapshot(self) -> Snapshot:
        self._check_open()
        if self._snapshot is None or self._snapshot.version != self.n_steps_:
            snapshot, copies = snapshot_network(self.client, self._layout, self.n_steps_)
            holders = sorted(set(self._layout.part_workers))
            self._copies_made(copies, holders, "the weights' copies were not made")
            self._snapshot = snapshot
        return self._snapshot

    @property
    def nparts(self) -> int:
        """Number of parts."""
        return self.plan.nparts

    @property
    def n_layers(self) -> int:
        """Number of weight layers ``L``."""
        return self.plan.n_layers

    @property
    def n_inputs(self) -> int:
        """Width ``n_0`` of an input sample."""
        return self.layer_sizes[0]

    @property
    def n_outputs(self) -> int:
        """Width ``n_L`` of the output layer."""
        return self.layer_sizes[-1]

    def __repr__(self) -> str:
        return (
            f"DistributedSparseMLP(layer_sizes={self.layer_sizes}, nparts={self.nparts}, "
            f"workers={len(set(self.part_workers))}, loss={self.loss.name!r})"
        )

    def _planning(
        self, layers: Iterator[tuple[list[LayerPartPlan], list]]
    ) -> Iterator[tuple[list[LayerPartPlan], list]]:
        """``layers`` (of :func:`iter_layers`), each layer's part plans added to :attr:`plan` as
        it passes."""
        for layer_plans, chunks in layers:
            self.plan.layers.append(layer_plans)
            yield layer_plans, chunks

    def _place(self, layers, biases, reuse_memory: bool) -> None:
        """Register the memory plugin if ``reuse_memory``, then :meth:`_place_network`."""
        if reuse_memory:
            self._reuse_freed_memory()
        self._place_network(layers, biases)

    def _place_network(self, layers, biases, states: dict | None = None) -> None:
        """Place ``layers`` (part plans and chunks, :func:`iter_layers`), ``biases`` and optimizer
        ``states`` on the part workers a few layers at a time and start the postboxes, within
        what is left of ``step_timeout``.

        Raises
        ------
        WorkerLostError
            As soon as a part worker has left the cluster, naming it and its parts.
        StepTimeoutError
            Naming the workers that did not take the network in time, with parts and state.
        """
        try:
            self._layout = place_network(
                self.client, self.token, self.plan, layers, biases, self.part_workers,
                self.dtype, states, self._generation, self._placement_left(), self._span,
            )  # fmt: skip
            # in both modes: they keep Dask from retiring a part worker before _hand_over
            keys = {
                postbox_key(self.token, self._generation, w): address
                for w, address in enumerate(sorted(set(self.part_workers)))
            }
            self._postboxes = self._start_postboxes(keys, span=self._span)
        except TimeoutError:
            raise self._placement_timed_out() from None

    def _worker_roles(self) -> dict[str, str]:
        """``{address: "parts 0, 2"}``: the parts of every part worker."""
        return part_roles(self.part_workers)

    def _lost_while_placed(self) -> WorkerLostError | None:
        """The error naming the part workers lost during placement, or ``None``."""
        return part_workers_lost(self.client, self.part_workers, PLACING)

    def _template(self, kind: str):
        if kind == "train" and self.messages == "posted":
            if kind not in self._templates:
                postboxes = [future.key for future in self._postboxes]
                self._templates[kind] = ActorStepTemplate(
                    self.token, self.plan, self._layout, postboxes
                )
            return self._templates[kind]
        if kind not in self._templates:
            softmax = self.loss.name == "softmax_cross_entropy"
            self._templates[kind] = StepTemplate(
                self.token,
                self.plan,
                self._layout,
                kind,
                softmax=softmax,
                separate_packing=self._separate_packing,
            )
        return self._templates[kind]

    def step_microbatches(self, batch: int) -> int:
        """The number of microbatches a training step of ``batch`` rows is split into."""
        chosen = self.microbatches
        if chosen is None:
            chosen = auto_microbatches(batch, len(set(self.part_workers)))
        return min(chosen, batch)

    def _context(
        self, optimizer: Optimizer | None, batch: int = 0, microbatches: int = 1
    ) -> StepContext:
        """The next step's context (a forward pass when ``optimizer`` is ``None``)."""
        self._step += 1
        posted = self.messages == "posted" and optimizer is not None
        return StepContext(
            token=self.token,
            step=self._step,
            n_layers=self.n_layers,
            activation=self.activation.name,
            output_activation=self.output_activation.name,
            loss=self.loss.name,
            optimizer=optimizer,
            dtype=self.dtype.name,
            training=optimizer is not None,
            microbatches=microbatches,
            batch=batch,
            part_workers=tuple(self.part_workers) if posted else (),
        )

    def _feature_blocks(self, values: np.ndarray, layer: int) -> list[np.ndarray]:
        """Every part's columns of the row block ``values``, feature-major ((n_m, N) each)."""
        order, offsets = self.plan.orders[layer], self.plan.offsets[layer]
        return [
            np.ascontiguousarray(values[:, order[offsets[m] : offsets[m + 1]]].T)
            for m in range(self.nparts)
        ]

    def _scatter_blocks(self, name: str, values: np.ndarray, layer: int) -> dict:
        """Scatter :meth:`_feature_blocks` to the part workers; ``{m: future}``."""
        self._check_open()
        blocks = self._feature_blocks(values, layer)
        data = {(f"dasknn-{name}-{self.token}", self._step + 1, m): b for m, b in enumerate(blocks)}
        try:
            futures = scatter_pinned(
                self.client, data, self.part_workers, lambda key: key[-1], self.step_timeout,
                watch=f"the {name} blocks were scattered",
            )
        except Exception as exc:
            self._raise_if_lost()
            if isinstance(exc, TimeoutError):
                raise self._timeout_error(
                    f"the workers did not take the {name} blocks", self.part_workers
                ) from None
            raise exc
        return {key[-1]: future for key, future in futures.items()}

    def _submit(self, dsk: dict, keys: list):
        annotations = {
            "workers": self._placement,
            "allow_other_workers": False,
            "priority": self._priority,
            "span": self._span,
        }
        with dask.annotate(**annotations):
            return self.client.get(dsk, keys, sync=False)

    def _inputs(self, x_blocks, y_blocks=None) -> dict:
        inputs = {}
        for m in range(self.nparts):
            inputs[("x", m)] = x_blocks[m].key
            if y_blocks is not None:
                inputs[("y", m)] = y_blocks[m].key
        return inputs

    def _submit_step(self, x_blocks, y_blocks, rows, batch, optimizer, previous):
        """Submit a step on ``rows`` (``None``: all); ``(futures, batch, microbatches)``."""
        template = self._template("train")
        blocks = split_rows(rows, batch, self.step_microbatches(batch))
        ctx = self._context(optimizer, batch, len(blocks))
        dsk = template.graph(ctx, self._inputs(x_blocks, y_blocks), blocks, previous)
        if self.messages == "posted":
            return self._submit(dsk, template.output_keys(ctx.step)), batch, len(blocks)
        return self._submit(dsk, template.output_keys(ctx.step, len(blocks))), batch, len(blocks)

    def train_step(
        self, X, Y, *, lr: float | None = None, optimizer: Optimizer | None = None
    ) -> float:
        """One training step on the batch ``(X, Y)`` as :meth:`SparseMLP.train_step`, every part
        updated on its worker (the optimizer state lives there); returns the loss before the
        update. ``ValueError`` before anything is scheduled on malformed arguments."""
        x, y = self._check_xy(X, Y)
        optimizer = resolve_optimizer(lr, optimizer)
        self._hand_over_retiring()
        x_blocks = self._scatter_blocks("x", x, 0)
        y_blocks = self._scatter_blocks("y", y, self.n_layers)
        pending = self._submit_step(x_blocks, y_blocks, None, x.shape[0], optimizer, None)
        return self._finish(pending, optimizer)

    @contextmanager
    def _training_data(self, x: np.ndarray, y: np.ndarray) -> Iterator[tuple[dict, dict]]:
        """:meth:`_held_blocks` for one call, released when it ends however it ends (a kept
        traceback would otherwise keep the keys on the cluster)."""
        data = self._held_blocks(x, y)
        self._training_rows = (x, y)
        try:
            yield data
        finally:
            self._training_rows = None
            for blocks in data:
                for future in blocks.values():
                    future.release()

    def _held_blocks(self, x: np.ndarray, y: np.ndarray) -> tuple[dict, dict]:
        """Every part's columns of ``x`` and ``y``, scattered and held in the model's span;
        ``({m: future}, {m: future})``."""
        scattered = {("x", m): f for m, f in self._scatter_blocks("x", x, 0).items()}
        for m, future in self._scatter_blocks("y", y, self.n_layers).items():
            scattered[("y", m)] = future
        workers = {name: self.part_workers[name[1]] for name in scattered}
        held = held_in_span(self.client, scattered, workers, self._span)
        return tuple({m: held[(name, m)] for m in range(self.nparts)} for name in ("x", "y"))

    def _train_batches(
        self, data: tuple[dict, dict], batches: list[np.ndarray], optimizer: Optimizer
    ) -> Iterator[float]:
        """The losses of ``batches``, step ``t + 1`` submitted before step ``t`` is collected."""
        x_blocks, y_blocks = data
        pending = None
        for rows in batches:
            leaving = self._retiring()
            if leaving:
                if pending:
                    yield self._finish(pending, optimizer)
                    pending = None
                if self._hand_over(leaving):
                    self._replace_data(data)
            previous = None
            if pending:
                previous = {}
                for future in pending[0]:
                    previous.setdefault(future.key[3], []).append(future.key)
            submitted = self._submit_step(x_blocks, y_blocks, rows, len(rows), optimizer, previous)
            if pending:
                yield self._finish(pending, optimizer)
            pending = submitted
        if pending:
            yield self._finish(pending, optimizer)

    def _replace_data(self, data: tuple[dict, dict]) -> None:
        """Scatter the fit call's ``data`` again to the parts' workers after a hand-over
        (:meth:`~dasknn.runtime.distributed_model.DistributedModel._hand_over`), releasing
        the blocks held before."""
        for blocks, held in zip(data, self._held_blocks(*self._training_rows), strict=True):
            for future in blocks.values():
                future.release()
            blocks.update(held)

    def _finish(self, pending, optimizer: Optimizer) -> float:
        """Collect a step's loss."""
        futures, batch, blocks = pending
        loss = float(sum(self._collect(futures)))
        self.n_steps_ += 1
        self._batches[(batch, True, blocks)] += 1
        self.optimizer_ = optimizer
        return loss

    def _output_blocks(
        self, x: np.ndarray, batch_size: int, in_flight: int
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Row blocks ``(a_L, a_L)`` of ``x`` in order (``a_L`` stands for ``z_L`` wherever the
        loss reads it), ``batch_size`` rows each, ``in_flight`` blocks on the workers at once."""
        in_flight = check_in_flight(in_flight)
        self._check_open()
        template = self._template("predict")
        pending: deque = deque()
        for start in range(0, x.shape[0], batch_size):
            chunk = x[start : start + batch_size]
            x_blocks = self._scatter_blocks("x", chunk, 0)  # kept alive until collected
            ctx = self._context(None)
            dsk = template.graph(ctx, self._inputs(x_blocks), [None])
            futures = self._submit(dsk, template.output_keys(ctx.step))
            pending.append((futures, chunk.shape[0], x_blocks))
            if len(pending) == in_flight:
                out = self._finish_block(*pending.popleft()[:2])
                yield out, out
        while pending:
            out = self._finish_block(*pending.popleft()[:2])
            yield out, out

    def _finish_block(self, futures, rows: int) -> np.ndarray:
        """Collect one forward block's output parts: ``a_L`` of its rows, in neuron order."""
        parts = self._collect(futures)
        self._batches[(rows, False, 1)] += 1
        out = np.empty((rows, self.n_outputs), dtype=self.dtype)
        out[:, self.plan.orders[self.n_layers]] = np.concatenate(parts, axis=0).T
        return out

    def predict(self, X, batch_size: int = 1024, in_flight: int = 2) -> np.ndarray:
        """Predictions for ``X`` as :meth:`SparseMLP.predict`, ``batch_size`` rows per block,
        ``in_flight`` blocks on the workers at once."""
        return self._predictions(self._input_blocks(X, batch_size, in_flight=in_flight))

    def _predict_proba(self, X, batch_size: int = 1024, in_flight: int = 2) -> np.ndarray:
        return self._probabilities(self._input_blocks(X, batch_size, in_flight=in_flight))

    def evaluate(self, X, Y, batch_size: int = 1024, in_flight: int = 2) -> float:
        """Mean loss over ``(X, Y)`` without training, as :meth:`SparseMLP.evaluate`."""
        return self._mean_loss(*self._labelled_blocks(X, Y, batch_size, in_flight=in_flight))

    def score(self, X, Y, batch_size: int = 1024, in_flight: int = 2) -> float:
        """As :meth:`SparseMLP.score`: accuracy for softmax models, else ``-evaluate(X, Y)``."""
        return self._score(*self._labelled_blocks(X, Y, batch_size, in_flight=in_flight))

    def gather(self) -> SparseMLP:
        """A :class:`SparseMLP` of the current weights and biases (no optimizer state)."""
        weights, biases = gather_network(self.client, self._current_snapshot(), self.plan)
        return SparseMLP(
            weights,
            biases,
            activation=self.activation,
            output_activation=self.output_activation,
            loss=self.loss,
            dtype=self.dtype,
        )

    def predicted_bytes(
        self, batch: int, backward: bool = True, between: str = "workers"
    ) -> dict[tuple[int, str], int]:
        """Predicted bytes of one batch per ``(layer, phase)``: ``words * batch * itemsize``
        over the plan's messages between workers (``between="workers"``) or all (``"parts"``)."""
        itemsize = self.dtype.itemsize
        result = {}
        for k in range(1, self.n_layers + 1):
            words = sum(
                w
                for m, n, w in self.plan.messages(k)
                if between == "parts" or self.part_workers[m] != self.part_workers[n]
            )
            result[(k, "forward")] = words * batch * itemsize
            if backward:
                result[(k, "backward")] = (words if k >= 2 else 0) * batch * itemsize
        return result

    def comm_report(self) -> CommReport:
        """Measured against predicted traffic between workers since :meth:`reset_comm`, keyed
        ``(layer, phase, sender, receiver)``, phases ``forward``, ``backward``, ``other``.
        ``details``: ``predicted_parts``, ``wire_messages``, ``wire_payload``, ``wire_total``,
        ``serialization_overhead`` (zero when posted). Costs a call to the scheduler and workers."""
        self._check_open()
        measured = counts_of(read_transfers(self.client, self.token))
        predicted: dict = {}
        parts_bytes = 0
        for (batch, backward, blocks), count in sorted(self._batches.items()):
            posted = backward and self.messages == "posted"
            one = predicted_counts(
                self.plan, self.part_workers, batch, self.dtype.itemsize, backward, blocks,
                posted=posted, softmax=backward and self.loss.name == "softmax_cross_entropy",
            )  # fmt: skip
            for key, (nbytes, messages) in one.items():
                b, m = predicted.get(key, (0, 0))
                predicted[key] = (b + nbytes * count, m + messages * count)
            parts_bytes += count * sum(
                self.predicted_bytes(batch, backward, between="parts").values()
            )
        messages, payload, wire = wire_bytes(self.client, self.token, self._reset_step + 1)
        details = {
            "predicted_parts": parts_bytes,
            "wire_messages": messages,
            "wire_payload": payload,
            "wire_total": wire,
            "serialization_overhead": wire - payload,
        }
        return CommReport(measured, predicted, sum(self._batches.values()), details)

    def reset_comm(self) -> None:
        """Zero the model's traffic counts and worker timings."""
        super().reset_comm()
        self.client.run(_reset_timings_on_worker, name=self.plugin_name)
        self._batches = Counter()
        self._reset_step = self._step

    def timings(self) -> dict[str, dict[str, float]]:
        """Seconds each worker spent on local products, update and packing since the last reset."""
        return self.client.run(_timings_on_worker, name=self.plugin_name)

    def _collect(self, futures) -> list:
        """A step's results within ``step_timeout``; on failure mark the model failed, free the
        workers' step state, raise :class:`WorkerLostError` or :class:`StepTimeoutError`."""
        try:
            parts = [future.key[3] for future in futures]
            wait_for_step(
                self.client, futures, self.part_workers, parts, self.step_timeout,
                handing_over=True,
            )  # fmt: skip
            if time.monotonic() >= self._next_check:  # a short step had no look at its workers
                self._next_check = time.monotonic() + POLL_SECONDS
                lost = lost_workers(self.client, self.part_workers, handing_over=True)
                if lost:
                    raise lost_error(self.part_workers, lost)
            try:
                return gather_at_most(self.client, futures, self.step_timeout)
            except TimeoutError:
                # a lost part worker takes precedence (a checkpoint recovers it)
                lost = lost_workers(self.client, self.part_workers, self._retirements)
                if lost:
                    raise lost_error(self.part_workers, lost) from None
                holders = sorted({self.part_workers[m] for m in parts})
                raise self._timeout_error(
                    "the results of a finished step did not arrive", holders
                ) from None
        except StepTimeoutError as exc:
            self._failed = str(exc)
            raise
        except Exception as exc:
            self._failed = f"{type(exc).__name__}: {exc}"
            self._raise_if_lost(futures)
            self._clear_workers(self.step_timeout)
            raise

    def _raise_if_lost(self, futures=()) -> None:
        """Raise :class:`WorkerLostError` if a part worker left or was asked to leave."""
        lost = lost_workers(self.client, self.part_workers, self._retirements)
        if lost:
            self._failed = str(lost_error(self.part_workers, lost))
            self._leaving.update(lost)
            self._let_go(lost, futures)
            # not held in a local: a reference cycle would keep the callers' futures alive
            raise lost_error(self.part_workers, lost) from None

    def _anchors_released(self) -> None:
        """Forget the posted step template (it names the released postboxes) and drop the
        steps in flight on the part workers."""
        self._templates.pop("train", None)
        self._clear_workers(self.step_timeout)

    def _clear_workers(self, seconds: float) -> None:
        """Drop the steps in flight on the running part workers, waiting at most ``seconds``."""
        workers = sorted(set(running_workers(self.client)) & set(self.part_workers))
        if workers:
            call_at_most(
                lambda: self.client.run(_clear_on_worker, name=self.plugin_name, workers=workers),
                seconds,
            )

    # ------------------------------------------------------------------ checkpoints
    def _identity(self) -> dict:
        return {
            "layer_sizes": self.layer_sizes,
            "pattern": self._pattern_digest,
            "activation": self.activation.name,
            "output_activation": self.output_activation.name,
            "loss": self.loss.name,
            "dtype": self.dtype.name,
        }

    def _record(self) -> ModelRecord:
        """The parameters, optimizer state and partition from the workers, in original order,
        read within ``step_timeout``; a part worker that left the cluster (also before the read)
        is a :class:`WorkerLostError` naming it and its parts, at once."""
        self._check_open()
        owned: dict = {}
        held = self._run_on(
            read_parts, sorted(set(self.part_workers)), "the part workers did not send the model",
            token=self.token,
        )  # fmt: skip
        for parts in held.values():
            owned.update(parts)
        weights, biases, states = [], [], []
        optimizer = owned[(1, 0)].optimizer
        for k in range(1, self.n_layers + 1):
            read = [owned[(k, m)] for m in range(self.nparts)]
            order, offsets = self.plan.orders[k], self.plan.offsets[k]
            indptr, indices, position = original_pattern(
                [(part.indptr, part.indices) for part in read], self.plan.orders[k - 1], order,
                offsets,
            )  # fmt: skip
            values = np.concatenate([part.values for part in read])[position]
            bias = np.empty(self.layer_sizes[k], dtype=self.dtype)
            for m, part in enumerate(read):
                bias[order[offsets[m] : offsets[m + 1]]] = part.bias
            w_state, b_state = ParamState(), ParamState()
            if optimizer is not None:
                w_state = ParamState(read[0].weight_state.step, {
                    name: np.concatenate([p.weight_state.arrays[name] for p in read])[position]
                    for name in read[0].weight_state.arrays
                })  # fmt: skip
                b_state = optimizer.init_state(bias)
                b_state.step = read[0].bias_state.step
                for m, part in enumerate(read):
                    for name, array in part.bias_state.arrays.items():
                        b_state.arrays[name][order[offsets[m] : offsets[m + 1]]] = array
            shape = (self.layer_sizes[k - 1], self.layer_sizes[k])
            weights.append(sp.csr_matrix((values, indices, indptr), shape=shape))
            biases.append(bias)
            states.append((w_state, b_state))
        return ModelRecord(
            weights=weights,
            biases=biases,
            activation=self.activation.name,
            output_activation=self.output_activation.name,
            loss=self.loss.name,
            dtype=self.dtype.name,
            optimizer=optimizer,
            optimizer_state=states if optimizer is not None else [],
            partition=self._parts,
            nparts=self.nparts,
        )

    def _part_states(self, record: ModelRecord) -> dict:
        """``{(k, m): (optimizer, weight state, bias state)}`` of every chunk, from ``record``."""
        if record.optimizer is None:
            return {}
        states = {}
        for k, (w_state, b_state) in enumerate(record.optimizer_state, start=1):
            entries = chunk_entries(record.weights[k - 1], self.plan, k)
            order, offsets = self.plan.orders[k], self.plan.offsets[k]
            for m in range(self.nparts):
                columns = order[offsets[m] : offsets[m + 1]]
                states[(k, m)] = (
                    record.optimizer,
                    ParamState(w_state.step, {n: a[entries[m]] for n, a in w_state.arrays.items()}),
                    ParamState(b_state.step, {n: a[columns] for n, a in b_state.arrays.items()}),
                )
        return states

    def _restore(self, record: ModelRecord) -> None:
        """Place ``record`` on the workers there are now, replacing the model's plugin."""
        if not self._open:
            raise ModelClosedError(f"this {type(self).__name__} is closed")
        self._snapshot = None
        self._templates.clear()
        self._layout.futures.clear()
        self._step += 1  # no key of an earlier step or data block is used again
        self.client.wait_for_workers(1, timeout=self.step_timeout)
        workers = running_workers(self.client, self._leaving)
        if self._chosen is not None:  # in the order chosen: part m on chosen[m % W]
            workers = [w for w in self._chosen if w in workers]
        self.part_workers = worker_of_parts(workers, self.nparts)
        self._placement = KeyPlacement(self.part_workers, part_of)
        layers = iter_layers(record.weights, self.plan.orders, self.plan.offsets)
        self._place_anew(  # the new plugin also refuses tasks of earlier steps
            ModelState(self.token, first_step=self._step + 1),
            lambda: self._place_network(layers, record.biases, self._part_states(record)),
        )
        self.optimizer_ = record.optimizer

    def _rebalancing(self, workers: list[str]) -> Callable[[], None]:
        """The parts go to ``workers``, part ``m`` on ``workers[m % W]`` (:meth:`rebalance`)."""

        def take() -> None:
            self._chosen = list(workers)

        return take

    _estimator_class = SparseMLP

    @classmethod
    def _load_options(cls, path, options: dict) -> dict:
        """``options``, with the stored partition unless they give a ``partition``."""
        record = read_model(path)
        if "partition" in options or record.partition is None:
            return options
        return {**options, "partition": record.partition, "nparts": record.nparts}

    def _before_close(self) -> None:
        """Release the client's references to arrays, templates and postboxes."""
        super()._before_close()
        self._snapshot = None
        self._templates.clear()
        if self._layout is not None:
            self._layout.futures.clear()
            self._layout = None
