"""The distributed sampled network (D-SLIDE): one shard of the output layer and one block of the
hidden layer per worker, weights that never move, active sets chosen per shard with exact
budgets, and only activations, softmax statistics and partial gradients between workers."""

from __future__ import annotations

import operator
from collections import Counter, deque
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
    STATE_KEYS,
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

#: Training steps ``fit`` submits in one go, each queued behind the one before on every worker
#: (a group ends earlier where an epoch ends or a checkpoint is due).
STEPS_PER_CALL = 64


def _column_bounds(hidden: int, workers: int) -> np.ndarray:
    base, extra = divmod(hidden, workers)
    sizes = np.full(workers, base, dtype=np.int64)
    sizes[:extra] += 1
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


class DistributedSampledMLP(SampledTraining, DistributedModel):
    """A :class:`~dasknn.sampled.SampledMLP` spread over the workers of a Dask cluster, one shard
    a worker (D-SLIDE, Yan et al. 2022).

    Worker ``p`` (in sorted address order, or the order of ``workers``) owns output shard ``p``
    of the model (its neurons, weights, bias, Adam state, hash family and tables) and block ``p``
    of the hidden neurons. The parameters are sent once, here; after that a training step moves
    only the hidden activations, each shard's softmax statistics and the partial gradients of the
    hidden activations (see :func:`~dasknn.sampled_parallel._taskgraph.step_bytes`). The model
    selects the same active sets, and computes the same values, as the one-process model with
    ``shards=P``, so :meth:`gather` after ``fit`` equals the one-process model after the same
    ``fit``.

    ``fit(..., checkpoint=DIR)`` writes checkpoints (the file of :meth:`save`, read from the
    workers); when a shard worker is lost during such a call, the model waits up to
    ``step_timeout`` for a worker of the cluster to take its place (a nanny restarts a killed
    worker; a spare one serves as well), places the newest checkpoint on its workers again and
    trains on: the call ends with the values of an uninterrupted one. See docs/reliability.md.

    Parameters
    ----------
    model : SampledMLP
        An initialized model with one shard a worker used; its parameters, hyperparameters,
        step and epoch counts and loss curve are copied, and, once it has taken a step, its
        optimizer state and hash tables too, so that training goes on as it would.
    client : distributed.Client, cluster, JobqueueSpec, str or None
        Where to run: a client, a cluster object, batch jobs to start, a scheduler address, or
        ``None`` for a new local cluster on 127.0.0.1; what the model opens it closes in
        :meth:`close`.
    workers : list of str, optional
        The workers to use, one a shard (default: the first ``model.shards`` of the cluster's
        workers, sorted).
    messages : {"tasks"}
        How a step's messages travel: as the results of a task graph a step (the model's only
        way).
    step_timeout : float
        Seconds the results of a step (``train_step``, each batch of ``fit`` and
        ``partial_fit``), of a block of ``predict`` or of :meth:`gather` may take before they
        are a :class:`~dasknn.exceptions.StepTimeoutError` naming the shard workers they wait
        for and their state. The call's futures are released, and after a training step that
        timed out the model is unusable (:class:`~dasknn.exceptions.ModelFailedError`). A shard
        worker that leaves the cluster is a :class:`~dasknn.exceptions.WorkerLostError` within a
        poll instead.

    Raises
    ------
    ValueError
        If the model has no parameters, the cluster has fewer workers than the model has shards,
        ``workers`` are not as many as the shards, ``messages`` is not ``"tasks"``, or
        ``step_timeout`` is not a positive finite number of seconds.
    """

    def __init__(
        self,
        model: SampledMLP,
        client=None,
        *,
        workers: list[str] | None = None,
        messages: str = "tasks",
        step_timeout: float = DEFAULT_STEP_TIMEOUT,
    ) -> None:
        model._check_fitted()
        if messages not in MESSAGES:
            raise ValueError(f"messages must be one of {MESSAGES} for this model, got {messages!r}")
        self.messages = messages
        with self._connecting(client, step_timeout):
            self.workers = self._shard_workers(model, workers)
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
        self.columns = _column_bounds(model.hidden, len(self.workers))
        self.n_steps_ = model.n_steps_
        self.epochs_ = model.epochs_
        self.loss_curve_: list[float] = list(model.loss_curve_)
        self._params = model._params_json()  # the hyperparameters, for the records
        self._calls = 0
        #: Rows of the training steps and prediction blocks run since the last reset_comm, by
        #: (phase kind, rows): the comm report's prediction.
        self._counted: Counter[tuple[str, int]] = Counter()
        self._placement = KeyPlacement(self.workers, by_sender(parse_sampled_key))
        self._register(
            ShardState(self.token), lambda: self._install(model, with_state=model.n_steps_ > 0)
        )

    def _shard_workers(self, model: SampledMLP, workers: list[str] | None) -> list[str]:
        """The workers of the shards, checked against the model's shard count."""
        if workers is None:
            known = self._use_workers(None)
            if len(known) < model.shards:
                raise ValueError(
                    f"the model has {model.shards} shards but the cluster has {len(known)} "
                    f"workers: make the model with shards={len(known)}"
                )
            return known[: model.shards]
        chosen = self._use_workers(workers)
        if len(chosen) != model.shards:
            raise ValueError(
                f"the model has {model.shards} shards but {len(chosen)} distinct workers "
                f"were given: make the model with shards={len(chosen)}"
            )
        if model.hidden < len(chosen):
            raise ValueError(f"more workers ({len(chosen)}) than hidden neurons ({model.hidden})")
        return chosen

    def _install(self, model: SampledMLP, with_state: bool = False) -> None:
        """Send every worker its shard (``with_state``: with its optimizer state and hash
        tables) and install it there, each call within what is left of
        ``step_timeout`` and watched
        (:meth:`~dasknn.runtime.distributed_model.DistributedModel._placing`); if placing fails,
        the payloads and installs already submitted are cancelled
        (:meth:`~dasknn.runtime.distributed_model.DistributedModel._cancelled_if_failed`)."""
        params = model.parameters()
        config = asdict(model.sampling_config())
        futures = []
        placed = []  # the payloads and their installs
        with self._cancelled_if_failed(placed):
            for p, worker in enumerate(self.workers):
                ids = self.shard_map_.ids(p)
                lo, hi = self.columns[p], self.columns[p + 1]
                payload = {
                    "hidden_weights": np.ascontiguousarray(params["hidden_weights"][:, lo:hi]),
                    "hidden_bias": params["hidden_bias"][lo:hi].copy(),
                    "ids": ids,
                    "output_weights": params["output_weights"][ids],
                    "output_bias": params["output_bias"][ids],
                    "columns": self.columns,
                    "config": config,
                    "hogwild": model.hogwild,
                    "update_all_rows": model.hidden_update == "all",
                }
                if with_state:
                    payload.update(_shard_state(model, p, lo, hi))
                [data] = self._placing(
                    lambda payload=payload, worker=worker: self.client.scatter(
                        [payload], workers=[worker], hash=False
                    )
                )
                futures.append(
                    self.client.submit(
                        install_shard,
                        self.token,
                        p,
                        data,
                        workers=[worker],
                        allow_other_workers=False,
                        pure=False,
                    )
                )
                placed += [data, futures[-1]]
            self._placing(lambda: self.client.gather(futures))

    def _lost_while_placed(self) -> WorkerLostError | None:
        """A :class:`WorkerLostError` naming the shard workers that left while the model was
        placed, or ``None``."""
        return watch_workers(
            self.client, self.workers, "its shard of the model could not be placed"
        )()

    def _worker_roles(self) -> dict[str, str]:
        """``{address: "shard P"}`` of every shard worker."""
        return {w: f"shard {p}" for p, w in enumerate(self.workers)}

    @property
    def nworkers(self) -> int:
        """Workers holding a shard, one shard each."""
        return len(self.workers)

    # ------------------------------------------------------------ steps
    def _submit(self, tasks: dict, outputs: list) -> list:
        """Submit a graph of this model's keys, each placed on its sender's worker; returns the
        futures of ``outputs``."""
        with dask.annotate(
            workers=self._placement, allow_other_workers=False, priority=message_priority
        ):
            return self.client.get(tasks, outputs, sync=False)

    def _check_training(self, X, Y):
        self._check_open()
        X = check_features(X, self.n_features_in_, self.dtype)
        ptr, ids, _ = check_labels(Y, X.shape[0], self.n_labels_, training=True)
        self.shard_map_.check_budgets(ptr, ids, self.active_fraction)
        return X, ptr, ids

    def _submit_batch(self, X, ptr, ids, after: list | None) -> list:
        """Submit one training step on the batch ``(X, ptr, ids)``, queued behind the step whose
        output keys are ``after`` (if any); returns the futures of the workers' loss shares."""
        target = (1.0 / np.diff(ptr)).astype(self.dtype)
        labels = [
            ShardLabels(p_ptr, p_ids, target)
            for p_ptr, p_ids in self.shard_map_.split_labels(ptr, ids)
        ]
        tasks, outputs = train_graph(
            self.token,
            self._calls,
            self.n_steps_,
            [X] * self.nworkers,
            labels,
            self.optimizer_,
            1.0 if self.schedule_ is None else self.schedule_.scale(self.n_steps_),
            after,
        )
        self._calls += 1
        self.n_steps_ += 1
        self._counted["train", X.shape[0]] += 1
        return self._submit(tasks, outputs)

    def _steps_per_call(self) -> int:
        return STEPS_PER_CALL

    def _train_batches(self, batches: list, after, optimizer) -> list[float]:
        """Submit the steps of ``batches`` (``(X, ptr, ids)`` each) one behind the other, each
        before the previous one has returned, so that the workers go from one step to the next
        without waiting for the client; returns their mean losses. A loss that is not finite
        stops the submissions: the steps under way finish, then it is a
        :class:`NonFiniteLossError` naming its step. Any other error releases the steps under
        way, and the model refuses further use if some were (a checkpoint restored clears
        that)."""
        losses: list[float] = []
        running: deque = deque()
        try:
            for X, ptr, ids in batches:
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
        """The mean loss of a training step of ``rows`` rows whose loss shares are
        ``futures``."""
        return float(np.sum(self._gather(futures, training=True)) / rows)

    def _gather(self, futures, training: bool = False) -> list:
        """The results of a call's ``futures``; :class:`WorkerLostError` naming a shard worker
        that left the cluster meanwhile, :class:`StepTimeoutError` naming the shard workers whose
        results did not arrive within ``step_timeout`` (after a ``training`` step, the model is
        then unusable)."""
        try:
            return gather_watching(
                self.client,
                futures,
                self.workers,
                self._lost_shards,
                timeout=self.step_timeout,
                timed_out=self._results_timed_out,
            )
        except StepTimeoutError as error:
            if training:
                self._failed = str(error)
            raise

    def _lost_shards(self, lost: list[str]) -> str:
        """What the ``lost`` workers held, for the :class:`WorkerLostError`."""
        roles = self._worker_roles()
        held = ", ".join(roles[w] for w in lost)
        return (
            f"it held {held} of the model; those shards are gone: a fit call with checkpoint= "
            "restores its last checkpoint on a worker that replaces it; otherwise close the "
            "model and start again from a saved copy"
        )

    def _results_timed_out(self, unfinished) -> StepTimeoutError:
        """The :class:`StepTimeoutError` naming the shard workers of the futures ``unfinished``."""
        waiting = [self._placement(future.key)[0] for future in unfinished]
        return self._timeout_error("the shards' results did not arrive", waiting)

    # ------------------------------------------------------------ training
    def train_step(self, X, Y, *, lr: float | None = None, optimizer=None) -> float:
        """One step on the batch ``(X, Y)``; returns its loss before the update. The learning
        rate is constant unless the model's ``decay_horizon`` is given; ``lr`` / ``optimizer``
        as in :meth:`fit`."""
        self._check_open()
        chosen = training_optimizer(self.optimizer_, lr, optimizer)
        X, ptr, ids = self._check_training(X, Y)
        self.optimizer_ = chosen
        self.schedule_ = training_schedule(self.lr_decay, self.decay_horizon, self.n_steps_, None)
        losses = self._gather(self._submit_batch(X, ptr, ids, None), training=True)
        return float(np.sum(losses) / X.shape[0])

    # ------------------------------------------------------------ inference
    def predict(self, X, k: int = 1, batch_size: int = 1024) -> np.ndarray:
        """Exact top ``k`` labels of every row (a top ``k`` per shard on its worker, merged
        here): ``(n, k)`` global ids, best first."""
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
        """Precision@1 against the labels ``Y`` (higher is better, as scikit-learn expects);
        :meth:`precision_at_k` gives the others."""
        return self.precision_at_k(X, Y, k=1)

    # ------------------------------------------------------------ state and bytes
    def _shard_parameters(self) -> list[dict]:
        """Every worker's copies of its parameters (``read_shard``), within ``step_timeout``."""
        self._check_open()
        parts = self._gather(
            [
                self.client.submit(
                    read_shard,
                    self.token,
                    key=sampled_key(self.token, self._calls, "parameters", p, p),
                    workers=[w],
                    allow_other_workers=False,
                    pure=False,
                )
                for p, w in enumerate(self.workers)
            ]
        )
        self._calls += 1
        return parts

    def gather(self) -> SampledMLP:
        """The one-process model with the current parameters, hyperparameters, optimizer state,
        hash tables, step and epoch counts and loss curve, read from the workers: it trains on
        as this model would."""
        return SampledMLP._of_record(self._record())

    # ------------------------------------------------------------ checkpoints
    _checkpoint_format = SAMPLED_FILE

    def _identity(self) -> dict:
        return {
            "params": dict(self._params),
            "n_features": self.n_features_in_,
            "n_labels": self.n_labels_,
        }

    def _record(self) -> SampledRecord:
        """The model as the one-process model with ``shards=P`` records it, read from the
        workers (their blocks of the hidden layer put together), within ``step_timeout``."""
        self._check_open()
        parts = self._gather(
            [
                self.client.submit(
                    read_shard_state,
                    self.token,
                    key=sampled_key(self.token, self._calls, "state", p, p),
                    workers=[w],
                    allow_other_workers=False,
                    pure=False,
                )
                for p, w in enumerate(self.workers)
            ]
        )
        self._calls += 1
        hidden = LayerRecord(
            np.concatenate([p["hidden_weights"] for p in parts], axis=1),
            np.concatenate([p["hidden_bias"] for p in parts]),
            self._joined_states([p["hidden_slots"] for p in parts]),
        )
        shards = [
            LayerRecord(
                p["output_weights"], p["output_bias"], self._states_of(*p["output_slots"]),
                p["rebuilds"], p["tables"],
            )  # fmt: skip
            for p in parts
        ]
        return SampledRecord(
            params=dict(self._params),
            n_features=self.n_features_in_,
            n_labels=self.n_labels_,
            hidden=hidden,
            shards=shards,
            optimizer=self.optimizer_,
            n_steps=self.n_steps_,
            epochs=self.epochs_,
            loss_curve=list(self.loss_curve_),
        )

    def _states_of(self, optimizer, states: dict) -> dict | None:
        """A layer's optimizer states when they belong to ``optimizer_`` (else ``None``)."""
        if optimizer != self.optimizer_ or set(states) != set(STATE_KEYS):
            return None
        return states

    def _joined_states(self, blocks: list) -> dict | None:
        """The optimizer state of the whole hidden layer from those of its blocks (columns of
        the weights, entries of the bias, in worker order)."""
        held = [self._states_of(*block) for block in blocks]
        if any(states is None for states in held):
            return None
        out = {}
        for key, axis in (("weights", 1), ("bias", 0)):
            first = held[0][key]
            arrays = {
                name: np.concatenate([states[key].arrays[name] for states in held], axis=axis)
                for name in first.arrays
            }
            out[key] = type(first)(first.step, arrays)
        return out

    def _restore(self, record: SampledRecord) -> None:
        """Place the values, optimizer state, hash tables, counts and loss curve of ``record``
        (this network) on the workers. A shard worker that left is replaced by one of the
        cluster's others (waiting up to ``step_timeout`` for one, as when a nanny restarts it),
        which takes its shard; the model's plugin is registered anew on every worker.

        Raises
        ------
        ValueError
            If ``record`` does not hold (as :meth:`SampledMLP.load` checks it).
        WorkerLostError
            If no worker comes to replace a lost one within ``step_timeout``.
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

    _estimator_class = SampledMLP

    def _take_state(self, estimator: SampledMLP) -> None:
        """Nothing: the constructor took the loaded model's state."""

    def to_dask(self) -> dict[str, da.Array]:
        """The parameters as dask arrays, each chunk made by a task on the worker that owns it:
        ``hidden_weights`` ``(n_features, H)`` chunked by the workers' blocks of hidden neurons,
        ``hidden_bias`` likewise, and ``output_weights`` ``(N, H)`` / ``output_bias`` whose rows
        are in shard order (shard ``p``'s rows are ``shard_map_.ids(p)``, chunked by shard). A
        snapshot: the values of the last step that finished when the chunks are computed."""
        self._check_open()
        call = self._calls
        self._calls += 1
        blocks = {name: [] for name in ("hidden_weights", "hidden_bias", "output_weights",
                                        "output_bias")}  # fmt: skip
        for p, worker in enumerate(self.workers):
            part = self.client.submit(
                read_shard, self.token, key=sampled_key(self.token, call, "snapshot", p, p),
                workers=[worker], allow_other_workers=False, pure=False,
            )  # fmt: skip
            width = int(self.columns[p + 1] - self.columns[p])
            rows = len(self.shard_map_.ids(p))
            shapes = {
                "hidden_weights": (self.n_features_in_, width),
                "hidden_bias": (width,),
                "output_weights": (rows, self.hidden),
                "output_bias": (rows,),
            }
            for name, shape in shapes.items():
                entry = self.client.submit(
                    operator.getitem, part, name, key=sampled_key(self.token, call, name, p, p),
                    workers=[worker], allow_other_workers=False, pure=False,
                )  # fmt: skip
                blocks[name].append(da.from_delayed(entry, shape=shape, dtype=self.dtype))
        return {
            "hidden_weights": da.concatenate(blocks["hidden_weights"], axis=1),
            "hidden_bias": da.concatenate(blocks["hidden_bias"]),
            "output_weights": da.concatenate(blocks["output_weights"], axis=0),
            "output_bias": da.concatenate(blocks["output_bias"]),
        }

    def predicted_bytes(self, batch: int) -> dict[str, int]:
        """Bytes per phase of one training step of ``batch`` rows."""
        return step_bytes(batch, self.hidden, self.nworkers, self.dtype.itemsize)

    def comm_report(self) -> CommReport:
        """Bytes and messages between workers since the model started or :meth:`reset_comm`,
        as the transfer monitor measured them, beside the formula of every training step
        (:func:`~dasknn.sampled_parallel._taskgraph.step_bytes`, ``P (P - 1)`` messages a phase)
        and of every prediction block (phase ``predict-hidden``: ``(P - 1) B H s`` bytes)."""
        self._check_open()
        measured = counts_of(read_transfers(self.client, self.token))
        pairs = self.nworkers * (self.nworkers - 1)
        predicted: Counter = Counter()
        messages: Counter = Counter()
        for (kind, rows), count in self._counted.items():
            if kind == "train":
                per_phase = self.predicted_bytes(rows)
            else:
                per_phase = {
                    "predict-hidden": (self.nworkers - 1) * rows * self.hidden
                    * self.dtype.itemsize
                }  # fmt: skip
            for phase, nbytes in per_phase.items():
                predicted[phase] += count * nbytes
                messages[phase] += count * pairs
        table = {
            (None, phase, None, None): (predicted[phase], messages[phase])
            for phase in predicted
            if predicted[phase] or messages[phase]
        }
        steps = sum(c for (kind, _), c in self._counted.items() if kind == "train")
        return CommReport(measured, table, steps=steps, details={"phases": list(PHASES)})

    def reset_comm(self) -> None:
        """Forget the traffic measured and predicted so far."""
        super().reset_comm()
        self._counted.clear()


def _shard_state(model: SampledMLP, p: int, lo: int, hi: int) -> dict:
    """What worker ``p`` takes of ``model``'s state besides its parameters: the optimizer state
    of its hidden block (columns ``lo:hi``) and of its shard, the shard's rebuilds and tables."""
    shard = model.shards_[p]
    record = model._record()
    hidden = record.hidden.states
    if hidden is not None:
        hidden = {
            "weights": type(hidden["weights"])(
                hidden["weights"].step,
                {n: np.ascontiguousarray(a[:, lo:hi]) for n, a in hidden["weights"].arrays.items()},
            ),
            "bias": type(hidden["bias"])(
                hidden["bias"].step,
                {n: a[lo:hi].copy() for n, a in hidden["bias"].arrays.items()},
            ),
        }
    return {
        "optimizer": model.optimizer_,
        "hidden_states": hidden,
        "output_states": record.shards[p].states,
        "rebuilds": shard.rebuilds,
        "tables": shard.tables.arrays(),
    }
