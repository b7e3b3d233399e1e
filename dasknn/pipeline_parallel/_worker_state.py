"""A pipeline stage replica on its worker and the tasks that run there.

:class:`StageState` (plugin kind ``"pipeline"``) holds the stage's compressed states
(:class:`~dasknn.compressed.CompressedStack`), the activations stashed from a microbatch's forward
pass for its backward pass, and every pass's timing. A posted step (:func:`run_stage`) takes its
passes' arrays, the messages it posts among them, from the stage's
:class:`~dasknn.runtime.buffers.BufferPool` and gives them back once its passes are done and its
posts delivered; task results are fresh arrays. The states change only inside the plugin.
"""

from __future__ import annotations

import resource
import threading
import time

import numpy as np
import sparse

from dasknn.compressed import CompressedStack
from dasknn.compressed.stack import Take
from dasknn.model.compressed_mlp import first_nonfinite_layer, nonfinite_loss_error
from dasknn.runtime.affinity import migrations
from dasknn.runtime.alignment import local_copy
from dasknn.runtime.buffers import BufferPool
from dasknn.runtime.keys import parse_pipeline_key, pipeline_key
from dasknn.runtime.model_plugin import ModelPlugin
from dasknn.runtime.postbox import Mailbox
from dasknn.runtime.posted import PostedTask

__all__ = [
    "microbatch_columns",
    "StageState",
    "drop_steps",
    "first_nonfinite_stashed",
    "install_stage",
    "layer_copy",
    "on_stage",
    "read_step",
    "run_stage",
    "snapshot_stage",
]


class StageState(ModelPlugin):
    """One stage replica of a pipeline model on a worker (see the module docstring)."""

    kind = "pipeline"

    def setup(self, worker) -> None:
        self.stack: CompressedStack | None = None
        self.stage = self.replica = self.first_layer = 0
        self.last = False
        # input_activation: the previous stage's last, applied here to its pre-activations
        self.loss = self.output_activation = self.input_activation = None
        self.stash: dict[tuple[int, int], tuple] = {}  # (step, microbatch): forward's outputs
        # the last stage's targets and delta factor per microbatch, for its backward pass
        self.targets: dict[tuple[int, int], tuple[np.ndarray, float]] = {}
        # per step, each pass's (kind, microbatch, start, end) and (kind, microbatch, thread CPU
        # seconds, minor page faults, involuntary context switches, CPU migrations)
        self.events: dict[int, list[tuple[str, int, float, float]]] = {}
        self.usage: dict[int, list[tuple[str, int, float, int, int, int]]] = {}
        self.mailbox = Mailbox()  # messages posted by the neighbouring stages
        self.buffers = BufferPool()  # the arrays of posted steps, reused from step to step
        # what the postbox calls: leave a message, keep its transfer report for the step task
        self.deliver, self.hold_receipt = self.mailbox.deliver, self.mailbox.hold_receipt
        self.dropped_step = 0  # the latest step drop_steps ended
        self.in_flight = 0
        self.peak: dict[int, int] = {}
        self.lock = threading.Lock()
        # the step whose gradients the buffer holds; backward passes accumulate one at a time
        self.gradient_step = 0
        self.gradient_lock = threading.Lock()

    def teardown(self, worker) -> None:
        """Forget the stage; a step task waiting for a message, or waiting later, raises
        ``RuntimeError``."""
        self.mailbox.close()
        self.setup(worker)

    def record(self, step: int, kind: str, microbatch: int, start: tuple) -> None:
        """Keep the pass's times and its thread's usage since ``start`` (:func:`_clock`)."""
        end = _clock()
        self.events.setdefault(step, []).append((kind, microbatch, start[0], end[0]))
        self.usage.setdefault(step, []).append(
            (kind, microbatch, *(b - a for a, b in zip(start[1:], end[1:], strict=True)))
        )

    def _stage_forward(self, inputs, take: Take = np.empty) -> tuple:
        """``(inputs, received, layers)``: the stage's feature-major inputs (the previous stage's
        last activation applied to ``received``, a local copy of its message, on stage > 0) and
        their ``(z, a)`` per layer (the last layer's activation left to the next stage), arrays
        of ``take``."""
        received = None
        if self.input_activation is not None:
            received = local_copy(inputs, take)
            out = take(received.shape, received.dtype)
            inputs = self.input_activation.forward(received, out=out)
        return inputs, received, self.stack.forward(inputs, self.last, take)

    def forward(
        self, step: int, microbatch: int, scale, loss_scale, inputs, labels, take: Take = np.empty
    ):
        """Forward pass of one microbatch from its feature-major samples (stage 0) or the previous
        stage's last pre-activations ``inputs``, its outputs stashed for its backward pass. The
        last stage keeps ``labels`` (``(n_out, rows)``) and the output delta's factor ``scale *
        loss_scale`` (the microbatch's share of the batch times fp16's loss scale, else 1) and
        returns the loss times ``scale`` (:class:`~dasknn.exceptions.NonFiniteLossError`, naming
        the first layer whose outputs are not finite, if it is not); the others return their last
        pre-activations, the message to the next stage. Its arrays are ``take``'s."""
        start = _clock()
        inputs, received, layers = self._stage_forward(inputs, take)
        with self.lock:
            self.stash[(step, microbatch)] = (inputs, layers, received)
            self.in_flight += 1
            self.peak[step] = max(self.peak.get(step, 0), self.in_flight)
        if self.last:
            zt, at = layers[-1]
            value = self.loss.value_t(zt, at, labels)
            if not np.isfinite(value):
                raise nonfinite_loss_error(step, value, [a for _, a in layers], self.first_layer)
            self.targets[(step, microbatch)] = (labels, scale * loss_scale)
            result = value * scale
        else:
            result = layers[-1][1]
        self.record(step, "F", microbatch, start)
        return result

    def backward(self, step: int, microbatch: int, incoming, take: Take = np.empty):
        """Backward pass of one microbatch from ``incoming``, the next stage's message (the last
        stage: from the labels its forward pass kept); the step's first on the stage stores the
        gradients, the others add to them, one at a time. Returns the message to the previous
        stage (``None`` on stage 0): the deltas of its last pre-activations. Its arrays are
        ``take``'s."""
        start = _clock()
        with self.lock:
            xt, layers, received = self.stash.pop((step, microbatch))
            self.in_flight -= 1
        if self.last:
            labels, factor = self.targets.pop((step, microbatch))
            zt, at = layers[-1]
            deltat = self.loss.output_delta_t(zt, at, labels, self.output_activation)
            deltat *= factor
        else:  # the next stage applied the derivative of this stage's last activation
            deltat = local_copy(incoming, take)
        with self.gradient_lock:
            first = self.gradient_step != step
            self.gradient_step = step
            out = self.stack.backward(
                xt, layers, deltat, first=first, input_delta=self.stage > 0, take=take
            )
        if out is not None:
            slope = take(received.shape, received.dtype)
            out *= self.input_activation.derivative(received, xt, out=slope)
        self.record(step, "B", microbatch, start)
        return out

    def gradient(self) -> np.ndarray:
        """A copy of the stage's accumulated gradient buffer (the allreduce's contribution)."""
        return self.stack.grad.copy()

    def gradients_finite(self, summed) -> bool:
        """Whether the stage's gradient is finite (fp16's overflow check): the allreduced ``summed``
        with replicas, the stage's accumulated buffer otherwise."""
        if summed is None:
            return self.stack.gradients_finite()
        return bool(np.isfinite(summed.astype(np.float32)).all())

    def update(self, step: int, optimizer, summed, inv_scale: float, apply: bool) -> int:
        """The stage's optimizer step from the allreduced ``summed`` (``None``: its own gradient)
        times ``inv_scale`` (fp16: one over the loss scale); nothing unless ``apply`` (fp16: a
        gradient overflowed somewhere)."""
        start = _clock()
        if apply:
            if summed is not None:
                self.stack.grad[...] = summed
            self.stack.apply(optimizer, inv_scale)
        self.record(step, "U", -1, start)
        return step

    def infer(self, inputs):
        """The stage's forward pass of a row block for a prediction (nothing stashed or recorded):
        the last pre-activations (the message to the next stage) or, on the last stage, the block's
        row-major ``(z_L, a_L)``."""
        zt, at = self._stage_forward(inputs)[2][-1]
        return (zt.T, at.T) if self.last else zt


def _clock() -> tuple[float, float, int, int, int]:
    """Wall-clock seconds, and the calling thread's CPU seconds, minor page faults, involuntary
    context switches and migrations between CPUs so far."""
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return time.perf_counter(), time.thread_time(), usage.ru_minflt, usage.ru_nivcsw, migrations()


def install_stage(dask_worker, token: str, spec: dict) -> int:
    """For ``Client.run``: build the stage replica ``spec`` describes (``stage``, ``replica``,
    ``first_layer`` 1-based, ``last``, ``layers`` as ``(values, index, shape)``, ``biases``,
    ``activations``, ``input_activation`` (``None`` on stage 0), ``precision``, ``compute``,
    ``loss``, ``output_activation``, optionally ``optimizer`` with ``optimizer_state``, a
    ``(weights, bias)`` pair per layer); returns its weights."""
    state: StageState = StageState.on_worker(token, dask_worker)
    state.stack = CompressedStack(
        spec["layers"], spec["biases"], spec["activations"], spec["precision"], spec["compute"]
    )
    if spec.get("optimizer") is not None:
        for layer, pair in zip(state.stack.layers, spec["optimizer_state"], strict=True):
            layer.restore_optimizer_state(spec["optimizer"], pair)
    state.stage, state.replica = spec["stage"], spec["replica"]
    state.first_layer, state.last = spec["first_layer"], spec["last"]
    state.loss, state.output_activation = spec["loss"], spec["output_activation"]
    state.input_activation = spec["input_activation"]
    return sum(layer.nnz for layer in state.stack.layers)


def microbatch_columns(values: np.ndarray, rows: np.ndarray, take: Take = np.empty) -> np.ndarray:
    """The rows ``rows`` of the sample-major ``values`` held for a training call (inputs
    ``(N, n_in)``, targets ``(N, n_out)`` or labels ``(N,)``), feature-major and C-contiguous
    in an array of ``take``: a microbatch's inputs or targets. The rows are gathered first
    (whole rows, in order of memory, into another array of ``take``) and transposed after:
    gathering feature-major columns at shuffled positions reads a cache line an entry."""
    shape = (len(rows), *values.shape[1:])
    gathered = np.take(values, rows, axis=0, out=take(shape, values.dtype), mode="clip")
    out = take(shape[::-1], values.dtype)
    out[...] = gathered.T
    return out


def on_stage(function, token: str, after, *args):
    """Task: ``function(state, *args)`` on this worker's stage replica of model ``token``;
    ``after`` are the stage's tasks it runs after (only ordered after, not read)."""
    return function(StageState.on_worker(token), *args)


def run_stage(
    token: str, step: int, order, scale, loss_scale, rows, inputs, labels, previous, following
) -> list[float]:
    """Task (``messages="posted"``): every pass of the stage replica in step ``step`` in the
    schedule's ``order``, in a :class:`~dasknn.runtime.posted.PostedTask`; returns the losses
    of the microbatches (last stage; empty otherwise). A pass takes its message from the mailbox
    and posts its result under its pass key to the postbox of the ``following`` (forward) or
    ``previous`` (backward) stage (``None`` at the ends); a failed pass posts its error to both
    under their ``failed`` key of the step. ``scale``, ``loss_scale``: as for
    :meth:`StageState.forward`; ``inputs``, ``labels``: the training call's inputs (stage 0)
    and targets (last stage) held on the worker, ``None`` elsewhere, of which microbatch ``u``
    takes the rows ``rows[u]`` (:func:`microbatch_columns`, the rows in range)."""
    state = StageState.on_worker(token)
    s, d = state.stage, state.replica

    def key(kind: str, stage: int, u: int = -1) -> tuple:
        return pipeline_key(token, kind, step, stage, d, u)

    def neighbours() -> list:  # a dropped step's other stages were dropped as well
        if state.dropped_step >= step:
            return []
        boxes = ((previous, s - 1), (following, s + 1))
        return [(box, key("failed", t)) for box, t in boxes if box is not None]

    failed, losses, taken = key("failed", s), [], []
    take = state.buffers.taker(taken)
    # a drop_steps of this step ends the waits, whether it came before them or during them
    with PostedTask(state.mailbox, {"previous": previous, "following": following}, True) as task:
        task.drop_ended(lambda k: parse_pipeline_key(k).step >= step)
        with task.failing(neighbours, f"stage {s} of replica {d} failed in step {step}"):
            if state.dropped_step >= step:
                raise RuntimeError(
                    f"step {step} was dropped before stage {s} of replica {d} ran it"
                )
            for kind, u in order:
                if kind == "F":
                    # the targets first: gathered while the message may still be on its way
                    y = microbatch_columns(labels, rows[u], take) if state.last else None
                    if s == 0:
                        x = microbatch_columns(inputs, rows[u], take)
                    else:
                        x = task.take(key("fwd", s - 1, u), failed)
                    result = state.forward(step, u, scale, loss_scale, x, y, take)
                    if state.last:
                        losses.append(result)
                    else:
                        task.post(("following",), key("fwd", s, u), result)
                else:
                    incoming = None if state.last else task.take(key("bwd", s + 1, u), failed)
                    out = state.backward(step, u, incoming, take)
                    if s > 0:
                        task.post(("previous",), key("bwd", s, u), out)
            task.wait_posted(task.posts)
    state.buffers.give(taken)  # every pass done and every post delivered (a failure: dropped)
    return losses


def drop_steps(dask_worker, token: str, step: int) -> None:
    """For ``Client.run``: end the stage replica's steps up to ``step`` (another stage of it was
    lost): its messages are forgotten, and its task of the step stops waiting, or fails at once
    if not started, with ``RuntimeError``, telling no neighbour (they are dropped alike)."""
    state = StageState.on_worker(token, dask_worker)
    state.dropped_step = max(state.dropped_step, step)  # before the waits end: they read it
    state.mailbox.clear()


def first_nonfinite_stashed(dask_worker, token: str, step: int) -> int | None:
    """For ``Client.run``: the first layer (1-based, in the whole network) whose stashed outputs
    of a microbatch of ``step`` are not finite, or ``None`` (a microbatch whose loss is not
    finite stays stashed on every stage: its backward pass never runs)."""
    state = StageState.on_worker(token, dask_worker)
    with state.lock:
        stashed = [layers for (s, _), (_, layers, _) in state.stash.items() if s == step]
    boundary = state.stack.activations[-1]  # a stage before the last leaves it to the next one
    found = [
        first_nonfinite_layer(
            [a for _, a in layers[:-1]] + [boundary.forward(layers[-1][0])], state.first_layer
        )
        for layers in stashed
    ]
    return min((layer for layer in found if layer is not None), default=None)


def snapshot_stage(dask_worker, token: str) -> dict:
    """For ``Client.run``: copies of the stage's states, ``{"optimizer": the last update's or
    None, "layers": [(master values, index, bias, weight state, bias state)]}`` (the states
    ``None`` before the first update)."""
    stack = StageState.on_worker(token, dask_worker).stack
    layers = []
    for layer in stack.layers:
        pair = layer.optimizer_state
        states = (None, None) if pair is None else (pair[0].copy(), pair[1].copy())
        layers.append((layer.master.copy(), layer.index.copy(), layer.bias.copy(), *states))
    return {"optimizer": stack.optimizer, "layers": layers}


def read_step(dask_worker, token: str, step: int) -> dict:
    """For ``Client.run``: ``step``'s ``events`` and ``usage`` of this worker (see
    :meth:`StageState.setup`) and the most microbatches it held at once (``peak``)."""
    state = StageState.on_worker(token, dask_worker)
    return {
        "events": list(state.events.get(step, [])),
        "usage": list(state.usage.get(step, [])),
        "peak": state.peak.get(step, 0),
    }


def layer_copy(token: str, layer: int, part: str):
    """Task: a copy of the stage's ``layer`` (0-based within the stage): its master weights as a
    pydata-sparse ``GCXS`` matrix ``(n_in, n_out)`` (``part`` ``"weights"``) or its bias
    (``"bias"``)."""
    held = StageState.on_worker(token).stack.layers[layer]
    if part == "bias":
        return held.bias.copy()
    columns = held.index.astype(np.int64) % held.shape[1]  # the flat index is row-major
    return sparse.GCXS(
        (held.master.copy(), columns, held.row_ptr.copy()), shape=held.shape, compressed_axes=(0,)
    )
