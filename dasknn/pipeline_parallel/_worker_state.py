"""What a pipeline stage keeps on its worker, and the tasks that run there.

:class:`StageState` is the :class:`~dasknn.runtime.model_plugin.ModelPlugin` (kind
``"pipeline"``) registered by :class:`~dasknn.pipeline_parallel.DistributedCompressedMLP` under
:meth:`StageState.plugin_name` of the model's token and removed by its ``close()``. On each
worker of the model it owns one stage replica: its layers' compressed states
(:class:`~dasknn.compressed.CompressedStack`: master weights, gradients accumulated over the
step's microbatches, optimizer state), the activations of the microbatches in flight (stashed by
the forward pass for the backward pass), and the start and end of every pass, from which the
bubble is measured; tasks find it with :meth:`StageState.on_worker`. Tasks never change a value
Dask holds: messages are fresh arrays, and the states change only inside the plugin.
"""

from __future__ import annotations

import resource
import threading
import time

import numpy as np
import sparse

from dasknn.compressed import CompressedStack
from dasknn.model.compressed_mlp import first_nonfinite_layer, nonfinite_loss_error
from dasknn.runtime.affinity import migrations
from dasknn.runtime.alignment import local_copy
from dasknn.runtime.keys import parse_pipeline_key, pipeline_key
from dasknn.runtime.model_plugin import ModelPlugin
from dasknn.runtime.postbox import Mailbox
from dasknn.runtime.posted import PostedTask

__all__ = [
    "StageState",
    "all_finite",
    "backward_pass",
    "drop_steps",
    "first_nonfinite_stashed",
    "forward_pass",
    "gradient",
    "gradients_finite",
    "infer",
    "install_stage",
    "layer_copy",
    "read_step",
    "run_stage",
    "snapshot_stage",
    "update",
]


class StageState(ModelPlugin):
    """One stage replica of a pipeline model on a worker (see the module docstring)."""

    kind = "pipeline"

    def setup(self, worker) -> None:
        self.stack: CompressedStack | None = None
        self.stage = self.replica = self.first_layer = 0
        self.last = False
        self.loss = self.output_activation = None
        # the previous stage's last activation, applied here to its pre-activations (stage > 0)
        self.input_activation = None
        self.stash: dict[tuple[int, int], tuple] = {}
        # the last stage's targets and delta factor per microbatch, for its backward pass
        self.targets: dict[tuple[int, int], tuple[np.ndarray, float]] = {}
        self.events: dict[int, list[tuple[str, int, float, float]]] = {}
        # per step and pass: (kind, microbatch, CPU seconds of its thread, minor page faults,
        # involuntary context switches, migrations between CPUs)
        self.usage: dict[int, list[tuple[str, int, float, int, int, int]]] = {}
        # messages posted by the neighbouring stages (messages="posted")
        self.mailbox = Mailbox()
        # the latest step whose tasks drop_steps ended (a stage of it was lost)
        self.dropped_step = 0
        self.in_flight = 0
        self.peak: dict[int, int] = {}
        self.lock = threading.Lock()
        # the step whose gradients the buffer holds; backward passes accumulate one at a time
        self.gradient_step = 0
        self.gradient_lock = threading.Lock()

    def teardown(self, worker) -> None:
        """Forget the stage, and end the message waits of a step task still under way (that of
        a stage that was stopped while the other stages dropped the step) with
        ``RuntimeError``."""
        self.mailbox.clear()
        self.stash.clear()
        self.targets.clear()
        self.events.clear()
        self.usage.clear()
        self.stack = None

    def deliver(self, key: tuple, value) -> None:
        """Leave a message posted to this stage in its mailbox (the postbox calls it)."""
        self.mailbox.deliver(key, value)

    def hold_receipt(self, key: tuple, sender: str, nbytes: int) -> None:
        """Keep the transfer report of a message posted to this stage for the step task that
        reports them all (the postbox calls it)."""
        self.mailbox.hold_receipt(key, sender, nbytes)

    def record(self, step: int, kind: str, microbatch: int, start: tuple) -> None:
        """Keep the pass's wall-clock start and end, and its thread's CPU time, minor page
        faults, involuntary context switches and migrations since ``start`` (:func:`_clock`)."""
        end = _clock()
        self.events.setdefault(step, []).append((kind, microbatch, start[0], end[0]))
        self.usage.setdefault(step, []).append(
            (kind, microbatch, *(b - a for a, b in zip(start[1:], end[1:], strict=True)))
        )


def _clock() -> tuple[float, float, int, int, int]:
    """Wall-clock seconds, and the calling thread's CPU seconds, minor page faults, involuntary
    context switches and migrations between CPUs so far."""
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return time.perf_counter(), time.thread_time(), usage.ru_minflt, usage.ru_nivcsw, migrations()


def install_stage(dask_worker, token: str, spec: dict) -> int:
    """For ``Client.run``: build the stage replica ``spec`` describes on ``dask_worker``.

    ``spec`` holds ``stage``, ``replica``, ``first_layer`` (1-based number of the stage's first
    layer), ``last``, ``layers`` (``(values, index, shape)`` each), ``biases``, ``activations``,
    ``input_activation`` (the previous stage's last activation, ``None`` on stage 0),
    ``precision``, ``compute``, ``loss`` and ``output_activation``, and optionally
    ``optimizer`` with ``optimizer_state`` (a ``(weights, bias)`` state pair per layer) to go on
    from. Returns the stage's weights.
    """
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


def forward_pass(
    token: str, step: int, microbatch: int, scale: float, loss_scale: float, inputs, labels, after
):
    """Forward pass of one microbatch through the stage.

    ``inputs`` are the feature-major inputs of the stage: the microbatch's samples on stage 0,
    the previous stage's last pre-activations after it, to which this stage applies that layer's
    activation (so each boundary's activation and its derivative run on the receiving stage, not
    on the sender); ``labels`` the last stage's feature-major
    targets ``(n_out, rows)``. The last stage computes the loss and returns it times ``scale``
    (the microbatch's share of the batch), and keeps the labels and the output delta's factor
    (``scale`` times ``loss_scale``, fp16's dynamic loss scale, 1 otherwise) for its backward
    pass, which computes the output delta: so the last stage's forward pass, which the schedule
    runs while the stage before runs its forward passes, holds only the loss; the others return
    their last pre-activations, the message to the next stage. ``after`` are the stage's passes
    this one runs after (only ordered after, not read).
    """
    state = StageState.on_worker(token)
    return _forward(state, step, microbatch, scale, loss_scale, inputs, labels)


def _forward(state: StageState, step: int, microbatch: int, scale, loss_scale, inputs, labels):
    """The forward pass of :func:`forward_pass` on the stage replica ``state``."""
    start = _clock()
    received = None
    if state.input_activation is not None:  # a message: copied here once, stashed for backward
        received = local_copy(inputs)
        inputs = state.input_activation.forward(received)
    layers = state.stack.forward(inputs, activate_last=state.last)
    with state.lock:
        state.stash[(step, microbatch)] = (inputs, layers, received)
        state.in_flight += 1
        state.peak[step] = max(state.peak.get(step, 0), state.in_flight)
    if state.last:
        zt, at = layers[-1]
        value = state.loss.value_t(zt, at, labels)
        if not np.isfinite(value):
            raise nonfinite_loss_error(step, value, [a for _, a in layers], state.first_layer)
        state.targets[(step, microbatch)] = (labels, scale * loss_scale)
        result = value * scale
    else:
        result = layers[-1][1]
    state.record(step, "F", microbatch, start)
    return result


def backward_pass(token: str, step: int, microbatch: int, incoming, after):
    """Backward pass of one microbatch (on the last stage from the output delta, computed here
    from the labels the forward pass kept): the stage's compressed gradients are stored (the step's
    first backward pass on the stage, whichever microbatch it is) or accumulated, one pass at a
    time; returns the deltas of the previous stage's last pre-activations (the partial sums of
    the stage's inputs times that layer's activation derivative), the message to the previous
    stage (``None`` on stage 0). ``incoming`` is the next stage's message (``None`` on the last
    stage)."""
    return _backward(StageState.on_worker(token), step, microbatch, incoming)


def _backward(state: StageState, step: int, microbatch: int, incoming):
    """The backward pass of :func:`backward_pass` on the stage replica ``state``."""
    start = _clock()
    with state.lock:
        xt, layers, received = state.stash.pop((step, microbatch))
        state.in_flight -= 1
    if state.last:
        labels, factor = state.targets.pop((step, microbatch))
        zt, at = layers[-1]
        deltat = state.loss.output_delta_t(zt, at, labels, state.output_activation)
        deltat *= factor
    else:  # the next stage applied the derivative of this stage's last activation
        deltat = local_copy(incoming)
    with state.gradient_lock:
        first = state.gradient_step != step
        state.gradient_step = step
        out = state.stack.backward(xt, layers, deltat, first=first, input_delta=state.stage > 0)
    if out is not None:  # the derivative of the previous stage's last activation
        out *= state.input_activation.derivative(received, xt)
    state.record(step, "B", microbatch, start)
    return out


def run_stage(
    token: str,
    step: int,
    order: list[tuple[str, int]],
    scale: float,
    loss_scale: float,
    inputs: list,
    labels: list,
    previous,
    following,
) -> list[float]:
    """Task (``messages="posted"``): every pass of the stage replica in step ``step``, in the
    schedule's ``order``; returns the losses of the microbatches (last stage; empty otherwise).

    A forward pass of stage ``s > 0`` takes the message ``pipeline_key(token, "fwd", step, s - 1,
    d, u)`` from the mailbox, a backward pass of ``s < S - 1`` the message ``("bwd", s + 1)``; a
    pass that sends posts its result under its own pass key to the ``following`` (forward) or
    ``previous`` (backward) stage's postbox, while this stage goes on with its next pass; the task
    runs in the posted run loop (:class:`~dasknn.runtime.posted.PostedTask`), which reports every
    message the stage received in one event as it ends. The task ends once every post was
    delivered. If a pass fails, the stage posts the error to both
    neighbours (under their ``failed`` key of the step), whose waits then raise it too, so no
    stage of the replica waits for a message that will not come.

    Parameters
    ----------
    order : list of (kind, microbatch)
        :func:`~dasknn.pipeline_parallel._schedule.stage_order` of this stage.
    scale, loss_scale : float
        As for :func:`forward_pass`.
    inputs, labels : list
        Per microbatch, the stage's inputs (stage 0) and targets (last stage); empty otherwise.
    previous, following : Postbox or None
        The postboxes of the stage before and after (``None`` at the ends).
    """
    state = StageState.on_worker(token)
    s, d = state.stage, state.replica
    failed = pipeline_key(token, "failed", step, s, d)
    losses = []
    # a drop_steps of this step ends the waits, whether it came before them or during them
    with PostedTask(state.mailbox, {"previous": previous, "following": following}, True) as task:
        task.drop_ended(lambda key: parse_pipeline_key(key).step >= step)

        def neighbours() -> list:
            if state.dropped_step >= step:  # a dropped step's other stages were dropped as well
                return []
            return [
                (box, pipeline_key(token, "failed", step, t, d))
                for box, t in ((previous, s - 1), (following, s + 1))
                if box is not None
            ]

        with task.failing(neighbours, f"stage {s} of replica {d} failed in step {step}"):
            if state.dropped_step >= step:
                raise RuntimeError(
                    f"step {step} was dropped before stage {s} of replica {d} ran it"
                )
            for kind, u in order:
                if kind == "F":
                    if s == 0:
                        received = inputs[u]
                    else:
                        received = task.take(pipeline_key(token, "fwd", step, s - 1, d, u), failed)
                    targets = labels[u] if state.last else None
                    result = _forward(state, step, u, scale, loss_scale, received, targets)
                    if state.last:
                        losses.append(result)
                    else:
                        key = pipeline_key(token, "fwd", step, s, d, u)
                        task.post(("following",), key, result)
                else:
                    incoming = None
                    if not state.last:
                        key = pipeline_key(token, "bwd", step, s + 1, d, u)
                        incoming = task.take(key, failed)
                    out = _backward(state, step, u, incoming)
                    if s > 0:
                        task.post(("previous",), pipeline_key(token, "bwd", step, s, d, u), out)
            task.wait_posted(task.posts)
    return losses


def drop_steps(dask_worker, token: str, step: int) -> None:
    """For ``Client.run``: end the stage replica's steps up to ``step`` (another stage of the
    step was lost with its worker): its messages are forgotten, its task of the step stops
    waiting for messages and posts, or fails at once if it has not started, with
    ``RuntimeError``, and tells no neighbour (every stage still there is dropped the same way)."""
    state = StageState.on_worker(token, dask_worker)
    state.dropped_step = max(state.dropped_step, step)  # before the waits end: they read it
    state.mailbox.clear()


def gradient(token: str, step: int, after) -> np.ndarray:
    """A copy of the stage's accumulated gradient buffer (the allreduce's contribution)."""
    return StageState.on_worker(token).stack.grad.copy()


def gradients_finite(token: str, step: int, summed, after) -> bool:
    """Whether the stage's gradient is finite (fp16's overflow check): the allreduced ``summed``
    with replicas, the stage's accumulated buffer otherwise."""
    if summed is None:
        return StageState.on_worker(token).stack.gradients_finite()
    return bool(np.isfinite(summed.astype(np.float32)).all())


def all_finite(*flags: bool) -> bool:
    """Whether every stage replica's gradient is finite: the step is applied everywhere or
    nowhere."""
    return all(flags)


def update(token: str, step: int, optimizer, summed, inv_scale: float, apply: bool, after) -> int:
    """The optimizer step of the stage, from the allreduced gradient ``summed`` (or the stage's
    own with one replica) times ``inv_scale`` (fp16: one over the loss scale); nothing when
    ``apply`` is false (fp16: a gradient overflowed somewhere, the step is skipped)."""
    state = StageState.on_worker(token)
    start = _clock()
    if apply:
        if summed is not None:
            state.stack.grad[...] = summed
        state.stack.apply(optimizer, inv_scale)
    state.record(step, "U", -1, start)
    return step


def first_nonfinite_stashed(dask_worker, token: str, step: int) -> int | None:
    """For ``Client.run``: the first layer (1-based, in the whole network) whose stashed outputs
    of a microbatch of ``step`` are not finite; ``None`` if there is none. The forward pass of a
    microbatch whose loss is not finite stays stashed on every stage, as its backward never runs.
    """
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
    found = [layer for layer in found if layer is not None]
    return min(found, default=None)


def snapshot_stage(dask_worker, token: str) -> dict:
    """For ``Client.run``: copies of the stage's states, ``{"optimizer": the optimizer of the
    last update or None, "layers": [(master values, index, bias, weight state, bias state)]}``
    (the states ``None`` before the first update)."""
    stack = StageState.on_worker(token, dask_worker).stack

    layers = []
    for layer in stack.layers:
        pair = layer.optimizer_state
        state_w, state_b = (None, None) if pair is None else (pair[0].copy(), pair[1].copy())
        values = (layer.master.copy(), layer.index.copy(), layer.bias.copy())
        layers.append((*values, state_w, state_b))
    return {"optimizer": stack.optimizer, "layers": layers}


def read_step(dask_worker, token: str, step: int) -> dict:
    """For ``Client.run``: the passes of ``step`` on this worker (``events``: kind, microbatch,
    start, end; ``usage``: kind, microbatch, CPU seconds of the thread, minor page faults,
    involuntary context switches, migrations between CPUs), and
    the most microbatches it held at once (``peak``)."""
    state = StageState.on_worker(token, dask_worker)
    return {
        "events": list(state.events.get(step, [])),
        "usage": list(state.usage.get(step, [])),
        "peak": state.peak.get(step, 0),
    }


def infer(token: str, inputs):
    """Task: the stage's forward pass of a row block for a prediction (nothing is stashed or
    recorded). ``inputs`` are the feature-major samples (stage 0) or the previous stage's last
    pre-activations, to which this stage applies that layer's activation, as in training.
    Returns the last pre-activations (a stage before the last: the message to the next) or,
    on the last stage, the block's row-major ``(z_L, a_L)``."""
    state = StageState.on_worker(token)
    if state.input_activation is not None:
        inputs = state.input_activation.forward(local_copy(inputs))
    layers = state.stack.forward(inputs, activate_last=state.last)
    zt, at = layers[-1]
    return (zt.T, at.T) if state.last else zt


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
