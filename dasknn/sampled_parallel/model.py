"""The distributed sampled network (D-SLIDE): one shard of the output layer and one block of the
hidden layer per worker, weights that never move, active sets chosen per shard with exact
budgets, and only activations, softmax statistics and partial gradients between workers."""

from __future__ import annotations

from collections import deque
from dataclasses import asdict

import dask
import numpy as np

from dasknn.exceptions import StepTimeoutError, WorkerLostError
from dasknn.runtime.cluster import scheduler_workers
from dasknn.runtime.distributed_model import DistributedModel
from dasknn.runtime.keys import new_token, sampled_key
from dasknn.runtime.measure import read_transfers, reset_transfers
from dasknn.runtime.step_timeout import (
    DEFAULT_STEP_TIMEOUT,
    check_step_timeout,
    step_timeout_error,
)
from dasknn.runtime.waiting import (
    gather_watching,
    watch_workers,
)
from dasknn.sampled.checks import check_features, check_k, check_labels, check_positive_int
from dasknn.sampled.layers import merge_top_k
from dasknn.sampled.model import (
    SampledMLP,
    epoch_batches,
    label_rows,
    predicted_precision_at_k,
)
from dasknn.sampled.schedule import DecaySchedule, training_schedule
from dasknn.sampled_parallel.steps import ShardLabels
from dasknn.sampled_parallel.taskgraph import (
    SenderPlacement,
    message_priority,
    predict_graph,
    step_bytes,
    train_graph,
)
from dasknn.sampled_parallel.worker_state import (
    ShardState,
    install_shard,
    plugin_name,
    shard_state,
)

__all__ = ["DistributedSampledMLP"]


def _column_bounds(hidden: int, workers: int) -> np.ndarray:
    base, extra = divmod(hidden, workers)
    sizes = np.full(workers, base, dtype=np.int64)
    sizes[:extra] += 1
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


class DistributedSampledMLP(DistributedModel):
    """A :class:`~dasknn.sampled.SampledMLP` spread over the workers of a Dask cluster, one shard
    a worker (D-SLIDE, Yan et al. 2022).

    Worker ``p`` (in sorted address order, or the order of ``workers``) owns output shard ``p``
    of the model (its neurons, weights, bias, Adam state, hash family and tables) and block ``p``
    of the hidden neurons. The parameters are sent once, here; after that a training step moves
    only the hidden activations, each shard's softmax statistics and the partial gradients of the
    hidden activations (see :func:`~dasknn.sampled_parallel.taskgraph.step_bytes`). The model
    selects the same active sets, and computes the same values, as the one-process model with
    ``shards=P``.

    Parameters
    ----------
    model : SampledMLP
        An initialized model whose ``shards`` equals the number of workers; its parameters and
        hyperparameters are copied (not its optimizer state).
    client : distributed.Client
    workers : list of str, optional
        The workers to use, one a shard (default: all, sorted).
    step_timeout : float
        Seconds the results of a step (``train_step``, each batch of ``fit`` and
        ``partial_fit``), of a block of ``predict`` or of ``parameters`` may take before they
        are a :class:`~dasknn.exceptions.StepTimeoutError` naming the shard workers
        they wait for and their state (not heard from for N s: stopped or overloaded; paused
        at the memory limit; running). The call's futures are released, and after a training
        step that timed out the model is unusable. A shard worker that leaves the cluster is a
        :class:`~dasknn.exceptions.WorkerLostError` within a poll instead.

    Raises
    ------
    ValueError
        If the model has no parameters, its shards and the workers differ in number, or
        ``step_timeout`` is not a positive finite number of seconds.
    """

    def __init__(
        self,
        model: SampledMLP,
        client,
        workers: list[str] | None = None,
        step_timeout: float = DEFAULT_STEP_TIMEOUT,
    ) -> None:
        self.step_timeout = check_step_timeout(step_timeout)
        model._check_fitted()
        known = sorted(scheduler_workers(client))
        workers = list(known if workers is None else workers)
        unknown = [w for w in workers if w not in known]
        if unknown:
            raise ValueError(f"not workers of this cluster: {unknown}")
        if len(workers) != model.shards or len(set(workers)) != len(workers):
            raise ValueError(
                f"the model has {model.shards} shards but {len(set(workers))} distinct workers "
                f"were given: make the model with shards={len(set(workers))}"
            )
        if model.hidden < len(workers):
            raise ValueError(f"more workers ({len(workers)}) than hidden neurons ({model.hidden})")
        self.client = client
        self.workers = workers
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
        self.columns = _column_bounds(model.hidden, len(workers))
        self.token = new_token()
        self.plugin_name = plugin_name(self.token)
        self.n_steps_ = model.n_steps_
        self.epochs_ = model.epochs_
        self.loss_curve_: list[float] = []
        self._calls = 0
        self._placement = SenderPlacement(workers)
        self._open = False
        # why the model is unusable: a training step that timed out, perhaps applied on some
        # shards only
        self._failed: str | None = None
        self._register(ShardState(self.token), lambda: self._install(model))

    def _install(self, model: SampledMLP) -> None:
        """Send every worker its shard and install it there, each call within what is left of
        ``step_timeout`` and watched
        (:meth:`~dasknn.runtime.distributed_model.DistributedModel._placing`); if placing fails, the
        payloads and installs already submitted are cancelled
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

    # ------------------------------------------------------------ basics
    def close(self) -> None:
        """Remove the model's plugin (with the parameters it owns) and its transfer records;
        closing twice does nothing."""
        if self._open:
            self._open = False
            self._unregister()  # also forgets the model's transfer records

    def _check_open(self) -> None:
        if not self._open:
            raise ValueError("the distributed model is closed")
        if self._failed is not None:
            raise RuntimeError(
                f"the distributed model is unusable after a failed step ({self._failed}); close "
                "it and start again from a copy of its parameters"
            )

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

    # ------------------------------------------------------------ training
    def _check_training(self, X, Y):
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
        return self._submit(tasks, outputs)

    def _gather(self, futures, training: bool = False) -> list:
        """The results of a call's ``futures``; ``RuntimeError`` naming a shard worker that left
        the cluster meanwhile, :class:`StepTimeoutError` naming the shard workers whose results
        did not arrive within ``step_timeout`` (after a ``training`` step, the model is then
        unusable)."""
        try:
            return gather_watching(
                self.client,
                futures,
                self.workers,
                "the shards it held are gone; close the model and start again from a copy of "
                "its parameters",
                timeout=self.step_timeout,
                timed_out=self._timeout_error,
            )
        except StepTimeoutError as error:
            if training:
                self._failed = str(error)
            raise

    def _timeout_error(self, unfinished) -> StepTimeoutError:
        """The :class:`StepTimeoutError` naming the shard workers of the futures ``unfinished``."""
        waiting = [self._placement(future.key)[0] for future in unfinished]
        return step_timeout_error(
            self.client,
            "the shards' results did not arrive",
            self.step_timeout,
            waiting,
            self._worker_roles(),
        )

    def _worker_roles(self) -> dict[str, str]:
        """``{address: "shard P"}`` of every shard worker."""
        return {w: f"shard {p}" for p, w in enumerate(self.workers)}

    def train_step(self, X, Y) -> float:
        """One step on the batch ``(X, Y)``; returns its loss before the update. The learning
        rate is constant unless the model's ``decay_horizon`` is given."""
        self._check_open()
        X, ptr, ids = self._check_training(X, Y)
        self.schedule_ = training_schedule(self.lr_decay, self.decay_horizon, self.n_steps_, None)
        losses = self._gather(self._submit_batch(X, ptr, ids, None), training=True)
        return float(np.sum(losses) / X.shape[0])

    def fit(
        self, X, Y, epochs: int = 1, batch_size: int = 256, shuffle: bool = True
    ) -> DistributedSampledMLP:
        """Train ``epochs`` epochs of mini-batches (the batches of
        :meth:`SampledMLP.fit`, and its learning-rate schedule); returns the model.

        Each step is submitted before the previous one has returned, queued behind it on every
        worker, so the workers go from one step to the next without waiting for the client."""
        return self._fit(X, Y, epochs, batch_size, shuffle, whole=True)

    def partial_fit(self, X, Y, batch_size: int = 256, shuffle: bool = True):
        """One epoch over ``(X, Y)``; returns the model. The learning rate stays constant
        unless the model's ``decay_horizon`` is given."""
        return self._fit(X, Y, 1, batch_size, shuffle, whole=False)

    def _fit(self, X, Y, epochs, batch_size, shuffle, whole: bool) -> DistributedSampledMLP:
        """``epochs`` epochs; ``whole``: the call's steps are the schedule's (``fit``)."""
        self._check_open()
        check_positive_int("epochs", epochs)
        check_positive_int("batch_size", batch_size)
        X, ptr, ids = self._check_training(X, Y)
        steps = epochs * -(-X.shape[0] // batch_size) if whole else None
        self.schedule_ = training_schedule(
            self.lr_decay, self.decay_horizon, self.n_steps_, steps
        )
        for _ in range(epochs):
            total = 0.0
            running: deque = deque()
            try:
                for rows in epoch_batches(
                    X.shape[0], batch_size, self.seed, self.epochs_, shuffle
                ):
                    batch_ptr, batch_ids = label_rows(ptr, ids, rows)
                    after = [f.key for f in running[-1]] if running else None
                    running.append(self._submit_batch(X[rows], batch_ptr, batch_ids, after))
                    if len(running) > 1:
                        total += float(np.sum(self._gather(running.popleft(), training=True)))
                while running:
                    total += float(np.sum(self._gather(running.popleft(), training=True)))
            except BaseException:
                # the step queued behind the failed one, released at once (the error's
                # traceback holds this frame)
                for future in (f for step in running for f in step):
                    future.release()
                raise
            self.epochs_ += 1
            self.loss_curve_.append(total / X.shape[0])
        return self

    # ------------------------------------------------------------ inference
    def predict(self, X, k: int = 1, batch_size: int = 1024) -> np.ndarray:
        """Exact top ``k`` labels of every row (a top ``k`` per shard, merged here)."""
        self._check_open()
        k = check_k(k)
        X = check_features(X, self.n_features_in_, self.dtype)
        out = []
        for start in range(0, X.shape[0], batch_size):
            block = X[start : start + batch_size]
            tasks, outputs = predict_graph(self.token, self._calls, [block] * self.nworkers, k)
            self._calls += 1
            out.append(merge_top_k(self._gather(self._submit(tasks, outputs)), k))
        return np.concatenate(out)

    def precision_at_k(self, X, Y, k: int = 1) -> float:
        """Precision@k of :meth:`predict` against the labels ``Y``."""
        return predicted_precision_at_k(self, X, Y, k)

    # ------------------------------------------------------------ state and bytes
    def parameters(self) -> dict[str, np.ndarray]:
        """Copies of the current parameters, keyed as :meth:`SampledMLP.parameters`."""
        self._check_open()
        parts = self._gather(
            [
                self.client.submit(
                    _parameters_on_worker,
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
        out_w = np.empty((self.n_labels_, self.hidden), dtype=self.dtype)
        out_b = np.empty(self.n_labels_, dtype=self.dtype)
        for p, part in enumerate(parts):
            ids = self.shard_map_.ids(p)
            out_w[ids] = part["output_weights"]
            out_b[ids] = part["output_bias"]
        return {
            "hidden_weights": np.concatenate([p["hidden_weights"] for p in parts], axis=1),
            "hidden_bias": np.concatenate([p["hidden_bias"] for p in parts]),
            "output_weights": out_w,
            "output_bias": out_b,
        }

    def predicted_bytes(self, batch: int) -> dict[str, int]:
        """Bytes per phase of one training step of ``batch`` rows."""
        return step_bytes(batch, self.hidden, self.nworkers, self.dtype.itemsize)

    def transfers(self) -> dict[str, int]:
        """Bytes moved between workers so far, by phase, as the monitor measured them."""
        out: dict[str, int] = {}
        for _, phase, _, _, nbytes, _ in read_transfers(self.client, self.token):
            out[phase] = out.get(phase, 0) + nbytes
        return out

    def reset_transfers(self) -> None:
        """Forget the bytes measured so far (:meth:`transfers` starts again from 0)."""
        reset_transfers(self.client, self.token)


def _parameters_on_worker(token: str) -> dict:
    """Task: copies of the worker's parameters."""
    state = shard_state(token)
    return {
        "hidden_weights": state.hidden.weights.copy(),
        "hidden_bias": state.hidden.bias.copy(),
        "output_weights": state.shard.weights.copy(),
        "output_bias": state.shard.bias.copy(),
    }
