"""The distributed sampled network (D-SLIDE): an output shard and a hidden block per worker;
only activations, softmax statistics and partial gradients move between workers."""

from __future__ import annotations

import operator
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict

import dask
import dask.array as da
import numpy as np

from dasknn.exceptions import ModelClosedError, NonFiniteLossError, StepTimeoutError
from dasknn.runtime.comm_report import CommReport, counts_of
from dasknn.runtime.distributed_model import DistributedModel
from dasknn.runtime.keys import parse_sampled_key, sampled_key
from dasknn.runtime.measure import read_transfers
from dasknn.runtime.placement import KeyPlacement, by_sender
from dasknn.runtime.step_timeout import DEFAULT_STEP_TIMEOUT
from dasknn.runtime.waiting import WorkerLostError, gather_watching, watch_workers
from dasknn.sampled.checks import check_features, check_k, check_labels, check_positive_int
from dasknn.sampled.layers import merge_top_k
from dasknn.sampled.model import (
    SampledMLP,
    SampledTraining,
    predicted_precision_at_k,
    training_optimizer,
)
from dasknn.sampled.persistence import (
    SAMPLED_FILE,
    LayerRecord,
    SampledRecord,
)
from dasknn.sampled.schedule import DecaySchedule, training_schedule
from dasknn.sampled_parallel._steps import ShardLabels
from dasknn.sampled_parallel._taskgraph import (
    PHASES,
    message_priority,
    predict_graph,
    step_bytes,
    train_graph,
)
from dasknn.sampled_parallel._worker_state import (
    ShardState,
    install_shard,
    read_shard,
    read_shard_state,
)

__all__ = ["DistributedSampledMLP"]

#: The ways a step's messages travel that this model has: a task graph a step.
MESSAGES = ("tasks",)
#: Training steps ``fit`` submits in one go, each queued behind the one before (fewer where an
#: epoch ends or a checkpoint is due).
STEPS_PER_CALL = 64


class DistributedSampledMLP(SampledTraining, DistributedModel):
    """A :class:`~dasknn.sampled.SampledMLP` spread over a Dask cluster, one shard a worker
    (D-SLIDE, Yan et al. 2022); see docs/sampled.md.

    Worker ``p`` (sorted address order, or the order of ``workers``) owns output shard ``p``
    (neurons, weights, bias, Adam state, hash tables) and block ``p`` of the hidden neurons; the
    parameters are sent once, and a step moves only hidden activations, softmax statistics and
    partial hidden gradients (:func:`~dasknn.sampled_parallel._taskgraph.step_bytes`). Active sets
    and values equal the one-process model's with ``shards=P``. ``fit(..., checkpoint=DIR)``
    recovers from a lost shard worker: it waits up to ``step_timeout`` for a replacement, places
    the newest checkpoint again and trains on to the values of an uninterrupted call
    (docs/reliability.md).

    Parameters
    ----------
    model : SampledMLP
        An initialized model with one shard a worker; its parameters, hyperparameters, counts,
        loss curve and (once it has stepped) optimizer state and hash tables are copied.
    client : distributed.Client, cluster, JobqueueSpec, str or None
        Where to run (``None``: a new local cluster on 127.0.0.1); what the model opens it closes
        in :meth:`close`.
    workers : list of str, optional
        One worker a shard (default: the first ``model.shards`` of the cluster's, sorted).
    messages : {"tasks"}
        How a step's messages travel: a task graph a step (the only way).
    step_timeout : float
        Seconds a step, a ``predict`` block or :meth:`gather` may wait for results before a
        :class:`~dasknn.exceptions.StepTimeoutError` naming the shard workers waited for (after a
        training step the model is then unusable); a shard worker that leaves is a
        :class:`~dasknn.exceptions.WorkerLostError` within a poll, while one asked to retire
        hands its shard to a spare worker between two steps and then leaves (see
        docs/reliability.md).
    reuse_memory : bool
        Keep the workers' freed step buffers for reuse while the model is placed
        (:class:`~dasknn.runtime.worker_memory.ReuseFreedMemory`; glibc's thresholds go back to
        the worker's own at ``close()``). Default ``True``; ``False`` leaves malloc alone.

    Raises
    ------
    ValueError
        If the model has no parameters, the cluster has fewer workers than the model has shards,
        ``workers`` are not as many as the shards, ``messages`` is not ``"tasks"``,
        ``step_timeout`` is not a positive finite number, or ``reuse_memory`` is not a bool.
    """

    _needs_spares = True

    def __init__(
        self,
        model: SampledMLP,
        client=None,
        *,
        workers: list[str] | None = None,
        messages: str = "tasks",
        step_timeout: float = DEFAULT_STEP_TIMEOUT,
        reuse_memory: bool = True,
    ) -> None:
        model._check_fitted()
        if messages not in MESSAGES:
            raise ValueError(f"messages must be one of {MESSAGES} for this model, got {messages!r}")
        if not isinstance(reuse_memory, bool):
            raise ValueError(f"reuse_memory must be True or False, got {reuse_memory!r}")
        self.messages = messages
        self.reuse_memory = reuse_memory
        with self._connecting(client, step_timeout):
            self.workers = self._shard_workers(model, workers)
            self._watch_retirements()
        self.optimizer_ = model.optimizer_
        self.lr_decay = model.lr_decay
        self.decay_horizon = model.decay_horizon
        self.schedule_: DecaySchedule | None = None
        self.dtype = np.dtype(model.dtype)
        self.hidden = model.hidden
        self.active_fraction = model.active_fraction
        self.seed = model.seed
        self.shard_map_ = model.shard_map_
        self.n_features_in_ = model.n_features_in_
        self.n_labels_ = model.n_labels_
        sizes = [len(b) for b in np.array_split(np.arange(model.hidden), len(self.workers))]
        self.columns = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.n_steps_ = model.n_steps_
        self.epochs_ = model.epochs_
        self.loss_curve_: list[float] = list(model.loss_curve_)
        self._params = model._params_json()  # the hyperparameters, for the records
        self._calls = 0
        #: Steps and prediction blocks since the last reset_comm by (kind, rows): the prediction.
        self._counted: Counter[tuple[str, int]] = Counter()
        self._placement = KeyPlacement(self.workers, by_sender(parse_sampled_key))
        self._register(
            ShardState(self.token), lambda: self._install(model, with_state=model.n_steps_ > 0)
        )

    def _shard_workers(self, model: SampledMLP, workers: list[str] | None) -> list[str]:
        """The workers of the shards, checked against the model's shard count."""
        chosen = self._use_workers(workers)
        if workers is None:
            if len(chosen) < model.shards:
                raise ValueError(
                    f"the model has {model.shards} shards but the cluster has {len(chosen)} "
                    f"workers: make the model with shards={len(chosen)}"
                )
            return chosen[: model.shards]
        if len(chosen) != model.shards:
            raise ValueError(
                f"the model has {model.shards} shards but {len(chosen)} distinct workers "
                f"were given: make the model with shards={len(chosen)}"
            )
        if model.hidden < len(chosen):
            raise ValueError(f"more workers ({len(chosen)}) than hidden neurons ({model.hidden})")
        return chosen

    def _install(self, model: SampledMLP, with_state: bool = False) -> None:
        """Send every worker its shard (``with_state``: with optimizer state and hash tables)
        and install it, within what is left of ``step_timeout`` (:meth:`_placing`); on failure
        the payloads and installs submitted are cancelled."""
        if self.reuse_memory:
            self._reuse_freed_memory()
        record = model._record()
        config = asdict(model.sampling_config())
        futures: list = []
        placed: list = []
        with self._cancelled_if_failed(placed):
            for p, worker in enumerate(self.workers):
                lo, hi = self.columns[p], self.columns[p + 1]
                shard = record.shards[p]
                payload = {
                    "hidden_weights": np.ascontiguousarray(record.hidden.weights[:, lo:hi]),
                    "hidden_bias": record.hidden.bias[lo:hi].copy(),
                    "ids": self.shard_map_.ids(p),
                    "output_weights": shard.weights,
                    "output_bias": shard.bias,
                    "columns": self.columns,
                    "config": config,
                    "hogwild": model.hogwild,
                    "update_all_rows": model.hidden_update == "all",
                }
                if with_state:
                    payload.update(
                        optimizer=model.optimizer_,
                        hidden_states=_columns(record.hidden.states, lo, hi),
                        output_states=shard.states,
                        rebuilds=shard.rebuilds,
                        tables=shard.tables,
                    )
                [data] = self._placing(
                    lambda payload=payload, worker=worker: self.client.scatter(
                        [payload], workers=[worker], hash=False
                    )
                )
                futures.append(
                    self.client.submit(
                        install_shard, self.token, p, data, workers=[worker],
                        allow_other_workers=False, pure=False,
                    )  # fmt: skip
                )
                placed += [data, futures[-1]]
            self._placing(lambda: self.client.gather(futures))
        self._start_anchors(self.workers)  # keep Dask from retiring a worker before the hand-over

    def _lost_while_placed(self) -> WorkerLostError | None:
        return watch_workers(
            self.client, self.workers, "its shard of the model could not be placed"
        )()

    def _worker_roles(self) -> dict[str, str]:
        return {w: f"shard {p}" for p, w in enumerate(self.workers)}

    @property
    def nworkers(self) -> int:
        """Workers holding a shard, one shard each."""
        return len(self.workers)

    # ------------------------------------------------------------ steps
    def _submit(self, tasks: dict, outputs: list) -> list:
        """Submit a graph, each key on its sender's worker; returns the futures of ``outputs``."""
        with dask.annotate(
            workers=self._placement, allow_other_workers=False, priority=message_priority
        ):
            return self.client.get(tasks, outputs, sync=False)

    def _on_each(self, func, phase: str) -> list:
        """Futures of ``func(token)`` on every shard worker, in shard order."""
        call, self._calls = self._calls, self._calls + 1
        return [
            self.client.submit(
                func, self.token, key=sampled_key(self.token, call, phase, p, p), workers=[w],
                allow_other_workers=False, pure=False,
            )  # fmt: skip
            for p, w in enumerate(self.workers)
        ]

    def _check_training(self, X, Y):
        self._check_open()
        X = check_features(X, self.n_features_in_, self.dtype)
        ptr, ids, _ = check_labels(Y, X.shape[0], self.n_labels_, training=True)
        self.shard_map_.check_budgets(ptr, ids, self.active_fraction)
        return X, ptr, ids

    def _submit_batch(self, X, ptr, ids, after: list | None) -> list:
        """Submit one training step, queued behind the step whose output keys are ``after``;
        returns the futures of the workers' loss shares."""
        target = (1.0 / np.diff(ptr)).astype(self.dtype)
        labels = [ShardLabels(*part, target) for part in self.shard_map_.split_labels(ptr, ids)]
        scale = 1.0 if self.schedule_ is None else self.schedule_.scale(self.n_steps_)
        tasks, outputs = train_graph(
            self.token, self._calls, self.n_steps_, [X] * self.nworkers, labels, self.optimizer_,
            scale, after,
        )  # fmt: skip
        self._calls += 1
        self.n_steps_ += 1
        self._counted["train", X.shape[0]] += 1
        return self._submit(tasks, outputs)

    def _steps_per_call(self) -> int:
        return STEPS_PER_CALL

    def _train_batches(self, batches: list, after, optimizer) -> list[float]:
        """Submit the steps of ``batches`` (``(X, ptr, ids)`` each) one behind the other, without
        waiting for the client between them; returns their mean losses. A loss that is not
        finite stops the submissions (the steps under way finish) and is a
        :class:`NonFiniteLossError`; any other error releases the steps under way and, if there
        were some, leaves the model unusable (a checkpoint restored clears that)."""
        losses: list[float] = []
        running: deque = deque()
        try:
            for X, ptr, ids in batches:
                leaving = self._retiring()
                if leaving:  # the steps under way finish, then the shards move
                    while running:
                        losses.append(self._step_loss(*running.popleft()))
                    if losses and not np.isfinite(losses[-1]):
                        break
                    self._hand_over(leaving)
                keys = [f.key for f in running[-1][1]] if running else None
                running.append((X.shape[0], self._submit_batch(X, ptr, ids, keys)))
                if len(running) > 1:
                    losses.append(self._step_loss(*running.popleft()))
                    if not np.isfinite(losses[-1]):
                        break
            while running:
                losses.append(self._step_loss(*running.popleft()))
        except BaseException as error:
            for future in (f for _, step in running for f in step):
                future.release()
            if running:
                why = "interrupted" if isinstance(error, KeyboardInterrupt) else "stopped"
                self._failed = f"a fit call was {why} with steps under way"
            raise
        NonFiniteLossError.check(losses, self.n_steps_ - len(losses) + 1)
        return losses

    def _step_loss(self, rows: int, futures) -> float:
        return float(np.sum(self._gather(futures, training=True)) / rows)

    def _gather(self, futures, training: bool = False) -> list:
        """The results of ``futures``, or a :class:`WorkerLostError` / :class:`StepTimeoutError`
        naming the shard workers (after a ``training`` step's timeout the model is unusable)."""
        try:
            return gather_watching(
                self.client, futures, self.workers, self._lost_shards,
                timeout=self.step_timeout, timed_out=self._results_timed_out,
            )  # fmt: skip
        except StepTimeoutError as error:
            if training:
                self._failed = str(error)
            raise

    def _lost_shards(self, lost: list[str]) -> str:
        held = ", ".join(self._worker_roles()[w] for w in lost)
        return (
            f"it held {held} of the model; those shards are gone: a fit call with checkpoint= "
            "restores its last checkpoint on a worker that replaces it; otherwise close the "
            "model and start again from a saved copy"
        )

    def _results_timed_out(self, unfinished) -> StepTimeoutError:
        waiting = [self._placement(future.key)[0] for future in unfinished]
        return self._timeout_error("the shards' results did not arrive", waiting)

    # ------------------------------------------------------------ training
    def train_step(self, X, Y, *, lr: float | None = None, optimizer=None) -> float:
        """One step on the batch ``(X, Y)``; returns its loss before the update. The learning
        rate is constant unless ``decay_horizon`` is given; ``lr`` / ``optimizer`` as in
        :meth:`fit`."""
        self._check_open()
        chosen = training_optimizer(self.optimizer_, lr, optimizer)
        X, ptr, ids = self._check_training(X, Y)
        self._hand_over_retiring()
        self.optimizer_ = chosen
        self.schedule_ = training_schedule(self.lr_decay, self.decay_horizon, self.n_steps_, None)
        return self._step_loss(X.shape[0], self._submit_batch(X, ptr, ids, None))

    # ------------------------------------------------------------ inference
    def predict(self, X, k: int = 1, batch_size: int = 1024) -> np.ndarray:
        """Exact top ``k`` labels of every row, ``(n, k)`` global ids, best first (a top ``k``
        per shard on its worker, merged here)."""
        self._check_open()
        k = check_k(k, self.n_labels_)
        check_positive_int("batch_size", batch_size)
        X = check_features(X, self.n_features_in_, self.dtype)
        out = []
        for start in range(0, X.shape[0], batch_size):
            block = X[start : start + batch_size]
            tasks, outputs = predict_graph(self.token, self._calls, [block] * self.nworkers, k)
            self._calls += 1
            self._counted["predict", block.shape[0]] += 1
            out.append(merge_top_k(self._gather(self._submit(tasks, outputs)), k))
        return np.concatenate(out)

    def precision_at_k(self, X, Y, k: int = 1) -> float:
        """Precision@k of :meth:`predict` against the labels ``Y``."""
        return predicted_precision_at_k(self, X, Y, k)

    def score(self, X, Y) -> float:
        """Precision@1 against the labels ``Y`` (higher is better)."""
        return self.precision_at_k(X, Y, k=1)

    # ------------------------------------------------------------ state and checkpoints
    def gather(self) -> SampledMLP:
        """The one-process model with the workers' current state (parameters, optimizer state,
        hash tables, counts, loss curve): it trains on as this model would."""
        return SampledMLP._of_record(self._record())

    _checkpoint_format = SAMPLED_FILE

    def _params_json(self) -> dict:
        return dict(self._params)

    def _record(self) -> SampledRecord:
        """The record of the one-process model with ``shards=P``, read from the workers within
        ``step_timeout``."""
        self._check_open()
        parts = self._gather(self._on_each(read_shard_state, "state"))
        held = [self._slot_states(p["hidden_slots"]) for p in parts]
        hidden = LayerRecord(
            np.concatenate([p["hidden_weights"] for p in parts], axis=1),
            np.concatenate([p["hidden_bias"] for p in parts]),
            None if None in held else {
                key: type(held[0][key])(held[0][key].step, {
                    name: np.concatenate([h[key].arrays[name] for h in held], axis=axis)
                    for name in held[0][key].arrays
                })
                for key, axis in (("weights", 1), ("bias", 0))
            },
        )  # fmt: skip
        shards = [
            LayerRecord(
                p["output_weights"], p["output_bias"], self._slot_states(p["output_slots"]),
                p["rebuilds"], p["tables"],
            )  # fmt: skip
            for p in parts
        ]
        return SampledRecord(
            params=self._params_json(), n_features=self.n_features_in_, n_labels=self.n_labels_,
            hidden=hidden, shards=shards, optimizer=self.optimizer_, n_steps=self.n_steps_,
            epochs=self.epochs_, loss_curve=list(self.loss_curve_),
        )  # fmt: skip

    def _restore(self, record: SampledRecord) -> None:
        """Place ``record`` (this network) on the workers, a lost shard worker replaced by a
        running one (waiting up to ``step_timeout``) and the plugin registered anew.

        Raises
        ------
        ValueError
            If ``record`` does not hold (as :meth:`SampledMLP.load` checks it).
        WorkerLostError
            If no worker replaces a lost one within ``step_timeout``.
        """
        if not self._open:
            raise ModelClosedError(f"this {type(self).__name__} is closed")
        model = SampledMLP._of_record(record)
        self.workers = self._replace_lost(self.workers)
        self._placement = KeyPlacement(self.workers, by_sender(parse_sampled_key))
        self._place_anew(ShardState(self.token), lambda: self._install(model, with_state=True))
        self.optimizer_ = model.optimizer_
        self.n_steps_, self.epochs_ = model.n_steps_, model.epochs_
        self.loss_curve_ = list(model.loss_curve_)

    def _rebalancing(self, workers: list[str]) -> Callable[[], None]:
        """Shard ``p`` on ``workers[p]``, the shard count kept (:meth:`rebalance`).

        Raises
        ------
        ValueError
            If ``workers`` are fewer than the model's shards.
        """
        if len(workers) < len(self.workers):
            raise ValueError(
                f"the model has {len(self.workers)} shards, one a worker, but {len(workers)} "
                "workers were given"
            )
        placed = list(workers[: len(self.workers)])

        def take() -> None:
            self.workers = placed

        return take

    _estimator_class = SampledMLP

    def _take_state(self, estimator: SampledMLP) -> None:
        """Nothing: the constructor took the loaded model's state."""

    def to_dask(self) -> dict[str, da.Array]:
        """The parameters as dask arrays, each chunk a copy made before this returns (a
        snapshot) by a task on its worker and held there: ``hidden_weights``
        ``(n_features, H)`` and ``hidden_bias`` chunked by hidden block, ``output_weights``
        ``(N, H)`` and ``output_bias`` with rows in shard order (shard ``p``:
        ``shard_map_.ids(p)``).

        Raises
        ------
        WorkerLostError, StepTimeoutError
            When a worker is lost, or the copies are not made within ``step_timeout``.
        """
        self._check_open()
        call = self._calls
        parts = self._on_each(read_shard, "snapshot")
        self._copies_made(parts, self.workers, "the parameters' copies were not made")
        blocks: dict[str, list] = {}
        for p, (worker, part) in enumerate(zip(self.workers, parts, strict=True)):
            width = int(self.columns[p + 1] - self.columns[p])
            rows = len(self.shard_map_.ids(p))
            for name, shape in (
                ("hidden_weights", (self.n_features_in_, width)), ("hidden_bias", (width,)),
                ("output_weights", (rows, self.hidden)), ("output_bias", (rows,)),
            ):  # fmt: skip
                entry = self.client.submit(
                    operator.getitem, part, name, key=sampled_key(self.token, call, name, p, p),
                    workers=[worker], allow_other_workers=False, pure=False,
                )  # fmt: skip
                block = da.from_delayed(entry, shape=shape, dtype=self.dtype)
                blocks.setdefault(name, []).append(block)
        return {
            name: da.concatenate(chunks, axis=1 if name == "hidden_weights" else 0)
            for name, chunks in blocks.items()
        }

    def predicted_bytes(self, batch: int) -> dict[str, int]:
        """Bytes per phase of one training step of ``batch`` rows."""
        return step_bytes(batch, self.hidden, self.nworkers, self.dtype.itemsize)

    def comm_report(self) -> CommReport:
        """Measured bytes and messages between workers since the start or :meth:`reset_comm`,
        beside :func:`~dasknn.sampled_parallel._taskgraph.step_bytes` for every training step
        and ``(P - 1) B H s`` bytes (phase ``predict-hidden``) for every prediction block,
        ``P (P - 1)`` messages a phase."""
        self._check_open()
        measured = counts_of(read_transfers(self.client, self.token))
        pairs = self.nworkers * (self.nworkers - 1)
        predicted: Counter = Counter()
        messages: Counter = Counter()
        for (kind, rows), count in self._counted.items():
            if kind == "train":
                per_phase = self.predicted_bytes(rows)
            else:
                hidden = (self.nworkers - 1) * rows * self.hidden * self.dtype.itemsize
                per_phase = {"predict-hidden": hidden}
            for phase, nbytes in per_phase.items():
                predicted[phase] += count * nbytes
                messages[phase] += count * pairs
        table = {(None, ph, None, None): (predicted[ph], messages[ph]) for ph in predicted
                 if predicted[ph] or messages[ph]}  # fmt: skip
        steps = sum(c for (kind, _), c in self._counted.items() if kind == "train")
        return CommReport(measured, table, steps=steps, details={"phases": list(PHASES)})

    def reset_comm(self) -> None:
        """Forget the traffic measured and predicted so far."""
        super().reset_comm()
        self._counted.clear()


def _columns(states: dict | None, lo: int, hi: int) -> dict | None:
    """The optimizer states of the hidden layer's columns ``lo:hi`` (weights) / entries (bias)."""
    if states is None:
        return None
    weights, bias = states["weights"], states["bias"]
    return {
        "weights": type(weights)(
            weights.step, {n: np.ascontiguousarray(a[:, lo:hi]) for n, a in weights.arrays.items()}
        ),
        "bias": type(bias)(bias.step, {n: a[lo:hi].copy() for n, a in bias.arrays.items()}),
    }
