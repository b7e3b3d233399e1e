"""``DistributedSparseMLP``: a :class:`~dasknn.model.SparseMLP` trained model-parallel on Dask.

Each layer is split by neurons across the parts of a partition; part ``m`` lives on worker
``m % W``, where the model's worker plugin owns its weights, biases and optimizer state. A training
step is one task graph (forward, loss, backward and the optimizer's update of every layer)
submitted at once; only the packed messages of the communication plan move between workers, and a
scheduler plugin counts them.
"""

from __future__ import annotations

import uuid

import dask
import numpy as np
from tqdm.auto import tqdm

from dasknn.model.sparse_mlp import SparseMLP
from dasknn.model.validation import (
    check_batch_size,
    check_epochs,
    check_in_flight,
    check_inputs,
    check_targets,
    epoch_batches,
)
from dasknn.optim import Optimizer, resolve_optimizer
from dasknn.parallel.comm import (
    CommReport,
    install_comm_monitor,
    read_transfers,
    reset_transfers,
    wire_bytes,
)
from dasknn.parallel.layout import (
    Layout,
    Snapshot,
    gather_network,
    place_network,
    scatter_pinned,
    snapshot_network,
    worker_of_parts,
)
from dasknn.parallel.plan import build_comm_plan, normalize_partition
from dasknn.parallel.steps import StepContext
from dasknn.parallel.taskgraph import PartPlacement, StepTemplate
from dasknn.parallel.worker_memory import PLUGIN_NAME as REUSE_MEMORY_PLUGIN
from dasknn.parallel.worker_memory import ReuseFreedMemory
from dasknn.parallel.worker_state import ModelState, plugin_name

__all__ = ["DistributedSparseMLP"]


def _clear_on_worker(dask_worker, name):
    return dask_worker.plugins[name].clear_steps() if name in dask_worker.plugins else 0


def _timings_on_worker(dask_worker, name):
    return dask_worker.plugins[name].read_timings()


def _reset_timings_on_worker(dask_worker, name):
    dask_worker.plugins[name].reset_timings()


class DistributedSparseMLP:
    """A sparse MLP whose layers are split by neurons across Dask workers.

    Parameters
    ----------
    model : SparseMLP
        The network; its weights are copied to the workers (the model itself is not changed).
    client : distributed.Client
    partition : graph.NetworkPartition or sequence of L + 1 int arrays
        ``parts[k][j]`` is the part owning neuron ``j`` of layer ``k`` (``k = 0``: inputs).
    nparts : int, optional
        Number of parts (defaults to ``partition.nparts`` or the largest id plus one).
    separate_packing : bool
        Use a separate pack task per message after each part's product task (two scheduler
        round trips per layer instead of one); only to measure the default's saving.
    reuse_memory : bool
        Opt in to :class:`~dasknn.parallel.worker_memory.ReuseFreedMemory` on the workers, so the
        buffers a step frees are reused by the next layer instead of being returned to the OS and
        faulted in again (faster steps, but a process-wide malloc setting that stays in the worker
        processes: use it on a cluster of your own). ``False`` (the default) leaves the workers'
        malloc as it is.

    Attributes
    ----------
    plan : CommPlan
        Renumbering and per-layer communication plan.
    part_workers : list of str
        Worker address of every part.
    plugin_name : str
        Name of the model's :class:`~dasknn.parallel.worker_state.ModelState` worker plugin.

    Notes
    -----
    The model holds worker plugins and keys on the cluster until :meth:`close`; use it as a
    context manager (``with model.distribute(client, partition) as dist:``) to close it.
    """

    def __init__(
        self,
        model: SparseMLP,
        client,
        partition,
        nparts: int | None = None,
        separate_packing: bool = False,
        reuse_memory: bool = False,
    ) -> None:
        parts, nparts = normalize_partition(partition, model.layer_sizes, nparts)
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        self.client = client
        self.activation = model.activation
        self.output_activation = model.output_activation
        self.loss = model.loss
        self.dtype = model.dtype
        self.layer_sizes = list(model.layer_sizes)
        self.token = uuid.uuid4().hex[:16]
        self.plan, chunks = build_comm_plan(model.weights, parts, nparts)
        self.part_workers = worker_of_parts(workers, nparts)
        self.plugin_name = plugin_name(self.token)
        self._plugins: list[str] = []
        self._layout: Layout | None = None
        self._snapshot: Snapshot | None = None
        self._templates: dict[str, StepTemplate] = {}
        self._separate_packing = separate_packing
        self._step = 0
        self._version = 0  # training steps completed
        self._reset_step = 0
        self._batches: list[tuple[int, bool]] = []
        self._placement = PartPlacement(self.part_workers)
        install_comm_monitor(client)
        try:
            if reuse_memory:
                name = f"{REUSE_MEMORY_PLUGIN}-{self.token}"
                client.register_plugin(ReuseFreedMemory(), name=name)
                self._plugins.append(name)
            client.register_plugin(ModelState(self.token), name=self.plugin_name)
            self._plugins.append(self.plugin_name)
            self._layout = place_network(
                client, self.token, self.plan, chunks, model.biases, self.part_workers, self.dtype
            )
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ basics
    def __enter__(self) -> DistributedSparseMLP:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def weights(self) -> list:
        """The renumbered weights as of the last completed training step: per layer a dask array
        of pydata-sparse GCXS chunks, one per part, each on its part's worker (see
        :attr:`part_workers`); :meth:`gather` returns them in the original order.

        Every read after a training step copies the values the workers own into new chunks (the
        arrays of a read are never changed afterwards); reads between steps share one copy.
        """
        return self._current_snapshot().weights

    @property
    def biases(self) -> list:
        """The renumbered biases as of the last completed training step, chunked like the columns
        of :attr:`weights` (see there)."""
        return self._current_snapshot().biases

    def _check_open(self) -> None:
        if self._layout is None:
            raise RuntimeError("the distributed model is closed")

    def _current_snapshot(self) -> Snapshot:
        self._check_open()
        if self._snapshot is None or self._snapshot.version != self._version:
            self._snapshot = snapshot_network(self.client, self._layout, self._version)
        return self._snapshot

    @property
    def nparts(self) -> int:
        """Number of parts."""
        return self.plan.nparts

    @property
    def n_layers(self) -> int:
        """Number of weight layers."""
        return self.plan.n_layers

    def __repr__(self) -> str:
        return (
            f"DistributedSparseMLP(layer_sizes={self.layer_sizes}, nparts={self.nparts}, "
            f"workers={len(set(self.part_workers))}, loss={self.loss.name!r})"
        )

    def _template(self, kind: str) -> StepTemplate:
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

    def _context(self, optimizer: Optimizer | None) -> StepContext:
        """The context of the next step: training with ``optimizer``, or a forward pass."""
        self._step += 1
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
        )

    def _feature_blocks(self, values: np.ndarray, layer: int) -> list[np.ndarray]:
        """Every part's columns of the row block ``values``, feature-major ((n_m, N) each)."""
        order, offsets = self.plan.orders[layer], self.plan.offsets[layer]
        return [
            np.ascontiguousarray(values[:, order[offsets[m] : offsets[m + 1]]].T)
            for m in range(self.nparts)
        ]

    def _scatter_blocks(self, name: str, values: np.ndarray, layer: int) -> dict:
        """Scatter every part's columns of ``values`` (by the parts of ``layer``), feature-major,
        to its worker; ``{m: future}``."""
        self._check_open()
        blocks = self._feature_blocks(values, layer)
        data = {(f"dasknn-{name}-{self.token}", self._step + 1, m): b for m, b in enumerate(blocks)}
        try:
            futures = scatter_pinned(self.client, data, self.part_workers, lambda key: key[-1])
        except Exception as exc:
            self._raise_if_lost(exc)
            raise
        return {key[-1]: future for key, future in futures.items()}

    def _submit(self, dsk: dict, keys: list):
        with dask.annotate(workers=self._placement, allow_other_workers=False):
            return self.client.get(dsk, keys, sync=False)

    def _inputs(self, x_blocks, x_rows, y_blocks=None, y_rows=None) -> dict:
        inputs = {}
        for m in range(self.nparts):
            inputs[("x", m)] = x_blocks[m].key
            inputs[("x_rows", m)] = x_rows
            if y_blocks is not None:
                inputs[("y", m)] = y_blocks[m].key
                inputs[("y_rows", m)] = y_rows
        return inputs

    def _check_xy(self, X, Y) -> tuple[np.ndarray, np.ndarray]:
        x = check_inputs(X, self.layer_sizes[0], self.dtype)
        y = check_targets(Y, x.shape[0], self.layer_sizes[-1], self.loss, self.dtype)
        return x, y

    # ------------------------------------------------------------------ training
    def _submit_step(self, x_blocks, y_blocks, rows, optimizer, previous):
        template = self._template("train")
        ctx = self._context(optimizer)
        dsk = template.graph(ctx, self._inputs(x_blocks, rows, y_blocks, rows), previous)
        batch = len(rows) if rows is not None else None
        return self._submit(dsk, template.output_keys(ctx.step)), batch

    def train_step(
        self, X, Y, lr: float | None = None, optimizer: Optimizer | None = None
    ) -> float:
        """One training step on the batch ``(X, Y)``; every part's weights, bias and optimizer
        state are updated on its worker.

        Parameters
        ----------
        X : array-like (B, n_0)
        Y : array-like (B, n_L), or integer labels (B,) for softmax cross-entropy
        lr : float, optional
            Learning rate of plain SGD (default 0.01); not together with ``optimizer``.
        optimizer : dasknn.optim.Optimizer, optional
            ``SGD(...)``, ``Adam(...)`` or ``AdamW(...)``. The state lives beside each part's
            weights on its worker; it is kept while later steps use an equal optimizer and started
            afresh for a different one.

        Returns
        -------
        float
            The loss of the batch before the update.

        Raises
        ------
        ValueError
            Before anything is scheduled, if ``X``, ``Y``, ``lr`` or ``optimizer`` are malformed.
        """
        x, y = self._check_xy(X, Y)
        optimizer = resolve_optimizer(lr, optimizer)
        x_blocks = self._scatter_blocks("x", x, 0)
        y_blocks = self._scatter_blocks("y", y, self.n_layers)
        futures, _ = self._submit_step(x_blocks, y_blocks, None, optimizer, None)
        shares = self._collect(futures)
        self._version += 1
        self._batches.append((x.shape[0], True))
        return float(sum(shares))

    def fit(
        self,
        X,
        Y,
        batch_size: int = 64,
        epochs: int = 1,
        lr: float | None = None,
        shuffle: bool = True,
        seed: int = 0,
        progress: bool = True,
        optimizer: Optimizer | None = None,
    ) -> list[float]:
        """Minibatch training over ``(X, Y)``, batch for batch the same steps as
        :meth:`SparseMLP.fit` (plain SGD with ``lr``, default 0.01, or ``optimizer`` as in
        :meth:`train_step`).

        The data is scattered once (each part's input and target columns to its worker); each
        step takes its rows there. The next step is submitted before the current one ends (it
        waits on the workers for the update it needs), so the client adds no gap between steps.

        Returns
        -------
        list of float
            Per epoch, the mean over samples of the batch losses.
        """
        x, y = self._check_xy(X, Y)
        optimizer = resolve_optimizer(lr, optimizer)
        batch_size, epochs = check_batch_size(batch_size), check_epochs(epochs)
        if epochs == 0:
            return []
        n = x.shape[0]
        x_blocks = self._scatter_blocks("x", x, 0)
        y_blocks = self._scatter_blocks("y", y, self.n_layers)
        rng = np.random.default_rng(seed)
        history = []
        try:
            for epoch in range(epochs):
                batches = epoch_batches(n, batch_size, rng, shuffle)
                bar = tqdm(
                    total=len(batches),
                    desc=f"epoch {epoch + 1}/{epochs}",
                    disable=not progress,
                    leave=False,
                )
                total = self._run_pipelined(x_blocks, y_blocks, batches, optimizer, bar)
                history.append(total / n)
                bar.close()
        finally:
            del x_blocks, y_blocks
        return history

    def _run_pipelined(self, x_blocks, y_blocks, batches, optimizer, bar) -> float:
        """Run the steps of ``batches`` with one step in flight ahead; returns sum(loss * B)."""
        total = 0.0
        pending = None
        for rows in batches:
            previous = [f.key for f in pending[0]] if pending else None
            submitted = self._submit_step(x_blocks, y_blocks, rows, optimizer, previous)
            if pending:
                total += self._finish(pending, bar)
            pending = submitted
        if pending:
            total += self._finish(pending, bar)
        return total

    def _finish(self, pending, bar) -> float:
        futures, batch = pending
        loss = float(sum(self._collect(futures)))
        self._version += 1
        self._batches.append((batch, True))
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4g}", refresh=False)
        return loss * batch

    # ------------------------------------------------------------------ inference
    def predict(self, X, batch_size: int = 1024, in_flight: int = 2) -> np.ndarray:
        """Network output for ``X`` (as :meth:`SparseMLP.predict`), computed on the workers.

        The samples go through in blocks of ``batch_size`` rows, ``in_flight`` blocks at a time:
        while one block's messages travel, the workers compute another's layers. A part keeps only
        its latest layer's activations of a block.
        """
        x = check_inputs(X, self.layer_sizes[0], self.dtype)
        batch_size = check_batch_size(batch_size)
        in_flight = check_in_flight(in_flight)
        template = self._template("predict")
        blocks, pending = [], []
        for start in range(0, x.shape[0], batch_size):
            chunk = x[start : start + batch_size]
            x_blocks = self._scatter_blocks("x", chunk, 0)  # kept alive until collected
            ctx = self._context(None)
            dsk = template.graph(ctx, self._inputs(x_blocks, None))
            futures = self._submit(dsk, template.output_keys(ctx.step))
            pending.append((futures, chunk.shape[0], x_blocks))
            if len(pending) == in_flight:
                blocks.append(self._finish_block(*pending.pop(0)[:2]))
        blocks.extend(self._finish_block(futures, rows) for futures, rows, _ in pending)
        return np.concatenate(blocks, axis=0)

    def _finish_block(self, futures, rows: int) -> np.ndarray:
        """Collect one forward block's output parts and return its predictions, in order."""
        parts = self._collect(futures)
        self._batches.append((rows, False))
        out = np.empty((rows, self.layer_sizes[-1]), dtype=self.dtype)
        out[:, self.plan.orders[self.n_layers]] = np.concatenate(parts, axis=0).T
        return self.loss.prediction(out, out)

    # ------------------------------------------------------------------ results
    def gather(self) -> SparseMLP:
        """A :class:`SparseMLP` with the current weights and biases, in the original order (no
        optimizer state)."""
        weights, biases = gather_network(self.client, self._current_snapshot(), self.plan)
        return SparseMLP(
            weights,
            biases,
            activation=self.activation,
            output_activation=self.output_activation,
            loss=self.loss,
            dtype=self.dtype,
        )

    def predicted_bytes(self, batch: int, backward: bool = True, between: str = "workers") -> dict:
        """Predicted payload of one batch per ``(layer, phase)``.

        ``between="workers"`` counts only messages between parts on different workers (what can
        be measured); ``"parts"`` counts every message of the plan.
        """
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
        """Measured (scheduler plugin) against predicted communication since the last reset."""
        records = read_transfers(self.client, self.token)
        report = CommReport(batches=len(self._batches))
        for batch, backward in self._batches:
            for key, value in self.predicted_bytes(batch, backward).items():
                row = report.layers.setdefault(key, {"measured": 0, "messages": 0, "predicted": 0})
                row["predicted"] += value
                report.predicted += value
            report.predicted_parts += sum(
                self.predicted_bytes(batch, backward, between="parts").values()
            )
        for layer, phase, sender, receiver, nbytes, messages in records:
            row = report.layers.setdefault(
                (layer, phase), {"measured": 0, "messages": 0, "predicted": 0}
            )
            row["measured"] += nbytes
            row["messages"] += messages
            pair = report.pairs.setdefault((sender, receiver), {"bytes": 0, "messages": 0})
            pair["bytes"] += nbytes
            pair["messages"] += messages
            if phase in ("forward", "backward"):
                report.payload += nbytes
            else:
                report.other += nbytes
        report.wire_messages, report.wire_payload, report.wire_total = wire_bytes(
            self.client, self.token, self._reset_step + 1
        )
        return report

    def reset_comm(self) -> None:
        """Start a new measurement: zero the plugin's records and the worker timings."""
        reset_transfers(self.client, self.token)
        self.client.run(_reset_timings_on_worker, name=self.plugin_name)
        self._batches = []
        self._reset_step = self._step

    def timings(self) -> dict[str, dict[str, float]]:
        """Seconds each worker spent on local products, update and packing since the last reset."""
        return self.client.run(_timings_on_worker, name=self.plugin_name)

    def _collect(self, futures) -> list:
        """Gather a step's results; on failure, free the workers' step state and say why."""
        try:
            return self.client.gather(futures)
        except Exception as exc:
            self._clear_workers()
            self._raise_if_lost(exc)
            raise

    def _raise_if_lost(self, cause: BaseException | None = None) -> None:
        """Raise ``RuntimeError`` naming the parts whose worker has left the cluster."""
        alive = set(self.client.scheduler_info(n_workers=-1)["workers"])
        lost = sorted(set(self.part_workers) - alive)
        if lost:
            parts = [m for m, w in enumerate(self.part_workers) if w in lost]
            raise RuntimeError(
                f"worker(s) {', '.join(lost)} holding parts {parts} of the model were lost, "
                "and their weights with them; distribute the model again"
            ) from cause

    def _clear_workers(self) -> None:
        alive = set(self.client.scheduler_info(n_workers=-1)["workers"])
        workers = sorted(alive & set(self.part_workers))
        if workers:
            self.client.run(_clear_on_worker, name=self.plugin_name, workers=workers)

    def close(self) -> None:
        """Remove everything the model installed on the cluster: its worker plugins (with the
        weights, biases and optimizer state they own), its keys and its communication records.
        The model cannot be used afterwards; closing twice does nothing."""
        self._snapshot = None
        self._templates.clear()
        if self._layout is not None:
            self._layout.futures.clear()
            self._layout = None
        while self._plugins:
            self.client.unregister_worker_plugin(self._plugins.pop())
        reset_transfers(self.client, self.token)
