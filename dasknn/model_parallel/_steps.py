"""The functions that run on the workers: one part's share of a layer step.

Every task of a step is ``forward_task`` or ``backward_task`` for one ``(layer k, part m)`` and one
*destination worker*: it makes sure part ``m``'s work for layer ``k`` is done on this worker (the
first task of ``(k, m)`` to run does it, the others find it done) and returns the messages for the
receiving parts on that worker, stacked (:class:`Route` says which) — the only values Dask moves
between workers. Messages for parts on this worker are left in the worker's mailbox instead, where
their receivers take them. A task with no destination returns a small value (the loss share, the
output block, or nothing). Once a part's partial sums of layer ``k >= 2`` are computed (with the
old weights), its update of layer ``k`` (the gradient, then the step of the model's optimizer) is
handed to the model's background thread on the worker (the kernels release the GIL), so the update
runs while the task thread waits for the next layer's messages instead of delaying them; the
part's last task of the step updates layer 1 and waits for all of its updates. With
``messages="posted"`` the waits are inside the task, so the task thread itself runs the queued
updates while a message it needs has not arrived
(:meth:`~dasknn.model_parallel._worker_state.ModelState.queue_idle`), and no second thread takes
cores from the products. A step may be cut
into microbatches (row blocks, :attr:`StepContext.microbatches`): each task works on one block,
and a layer's gradients are summed over the blocks on the update thread before the optimizer's
step. With ``messages="posted"`` (:mod:`dasknn.model_parallel._exchange`) one task per worker calls
these functions for its parts, and messages for parts on other workers are posted there.

Everything a task reads or changes besides its arguments belongs to the model's worker plugin
(:class:`~dasknn.model_parallel._worker_state.ModelState`, found with its ``on_worker``): the
weight values, biases and optimizer state of the parts on this worker, and the intermediate
values of a part (``x_in``, ``z``, ``a`` per layer, partial sums) keyed by step and part, so
one task per message suffices and the critical path of a layer is one task plus one transfer.
The intermediate values are feature-major, shape ``(neurons, B)`` (the layout of the kernels),
so a message is a gather of whole rows: the forward rows for part ``n`` are ``a[send[n]]``, the
backward ones a contiguous slice of the partial sums.
A forward pass without training (``StepContext.training`` false) keeps only the latest layer.
The input and target blocks arrive feature-major too (``(n_m, N)``, batch columns taken here).
No task changes a value Dask holds: the only Dask data a task reads are its arguments (plans,
input blocks, messages), and what it returns is never changed afterwards (new arrays, or slices
of partial sums that are only read). All per-element arithmetic on
the sparse chunks is in the numba kernels of :mod:`dasknn.kernels.training` and
:mod:`dasknn.kernels.optimizers`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from dasknn.kernels.training import masked_outer_grad, spmm_backward, spmm_forward
from dasknn.model.activations import get_activation
from dasknn.model.losses import get_loss
from dasknn.model_parallel._plan import LayerPartPlan
from dasknn.model_parallel._worker_state import (
    GradientSum,
    MicrobatchStep,
    ModelState,
    PartLayer,
    PartStep,
)
from dasknn.optim import Optimizer
from dasknn.runtime.keys import phase_names, step_key

__all__ = [
    "Route",
    "StepContext",
    "backward_task",
    "combine_logsumexp",
    "forward_task",
]


@dataclass(frozen=True)
class StepContext:
    """What every task of one step needs besides its data (small; travels in the graph)."""

    token: str
    step: int
    n_layers: int
    activation: str
    output_activation: str
    loss: str
    #: The optimizer of a training step (``None`` for a forward pass).
    optimizer: Optimizer | None
    dtype: str
    #: ``False`` for a forward pass only: a part then keeps just the activations of its latest
    #: layer, not every layer's ``x_in``, ``z`` and ``a`` for a backward pass.
    training: bool = True
    #: Row blocks the step's batch is split into; each runs through the layer chain as its own
    #: tasks, and the gradients of a layer are summed over them before the update.
    microbatches: int = 1
    #: Rows of the whole step's batch (the ``B`` of the mean loss); 0 for a forward pass.
    batch: int = 0
    #: ``messages="posted"``: the worker address of every part; messages for parts on other
    #: workers are posted there (:mod:`dasknn.model_parallel._exchange`). Empty: they are task
    #: results.
    part_workers: tuple = ()


@dataclass(frozen=True)
class Route:
    """Where a task's incoming messages come from and where its part's messages go (static).

    Attributes
    ----------
    sources : tuple
        Per sender of the messages the part takes in (plan order): ``None`` for a part on this
        worker, whose message waits in the worker's mailbox, or ``(i, lo, hi)``: rows ``lo:hi`` of
        the task's ``i``-th piece argument (one message array per sending part and worker).
    local : tuple of int
        Receiving parts on this worker: their messages are left in the mailbox, not sent.
    to : tuple of int
        Receiving parts on the task's destination worker, in the order their messages are
        stacked in the array the task returns.
    """

    sources: tuple = ()
    local: tuple = ()
    to: tuple = ()


def _input_block(x, rows):
    """The batch columns ``rows`` of a feature-major data block (all of it for ``None``)."""
    return x if rows is None else np.ascontiguousarray(x[:, rows])


def _message_key(ctx, i: int, phase: str, k: int, sender: int, receiver: int) -> tuple:
    """The mailbox key of the message of ``(phase, k, sender)`` for part ``receiver``."""
    return step_key(phase_names(ctx.token)[phase], ctx.step, k, sender, receiver, i)


def _post(owner: ModelState, ctx, i: int, phase: str, k: int, sender: int, messages: dict) -> None:
    """Leave ``{receiver: rows}`` of ``sender`` for microbatch ``i`` in this worker's mailbox or,
    for a part on another worker (``ctx.part_workers``), post it to that worker's mailbox."""
    for receiver, rows in messages.items():
        key = _message_key(ctx, i, phase, k, sender, receiver)
        address = ctx.part_workers[receiver] if ctx.part_workers else owner.address
        if address == owner.address:
            owner.deliver(key, rows)
        else:
            owner.post(address, key, rows)


def _received(
    owner: ModelState, ctx, i: int, phase: str, k: int, part: int, senders, pieces, route: Route
) -> list:
    """The messages of ``(phase, k, s)`` for ``part`` in microbatch ``i`` from every ``s`` of
    ``senders``, in order: from the mailbox for senders on this worker, sliced out of ``pieces``
    for the others."""
    messages = []
    for s, source in zip(senders, route.sources, strict=True):
        if source is None:
            messages.append(owner.take(_message_key(ctx, i, phase, k, s, part)))
        else:
            index, lo, hi = source
            messages.append(pieces[index][lo:hi])
    return messages


def _stack(rows: list[np.ndarray]) -> np.ndarray:
    """One message array from the row blocks for the receivers on one worker."""
    return rows[0] if len(rows) == 1 else np.concatenate(rows, axis=0)


def _timed(seconds: dict, kind: str, func, *args) -> None:
    """Call ``func(*args)`` and add its duration to ``seconds[kind]``."""
    clock = time.perf_counter()
    func(*args)
    seconds[kind] += time.perf_counter() - clock


def _spmm_rows(x_in, sender, plan: LayerPartPlan, layer: PartLayer, z, accumulate: bool) -> None:
    """``z (+)= W.T @ x_in`` over the input rows of ``sender``'s group (all rows for ``None``)."""
    if sender is None:
        spmm_forward(x_in, plan.indptr, layer.indices, layer.values, z)
        return
    lo, hi = int(plan.groups[sender]), int(plan.groups[sender + 1])
    indptr = plan.indptr[lo : hi + 1]
    spmm_forward(x_in[lo:hi], indptr, layer.indices, layer.values, z, accumulate)


def _ensure_forward(
    owner: ModelState, ctx, part, i, k, plan: LayerPartPlan, next_plan, x0, x0_rows, pieces, route
) -> MicrobatchStep:
    """Compute ``x_in``, ``z``, ``a`` of part ``part`` in layer ``k`` for microbatch ``i`` unless
    already done, and post the messages for the receiving parts on this worker
    (``route.local``).

    Layer 0 only stores the part's input columns (restricted to the batch rows) as ``a_0``.
    """
    part_step = owner.part_step(ctx.step, part)
    with part_step.lock:
        state = part_step.microbatch(i)
        if k in state.forward:
            return state
        if k == 0:
            a = _input_block(x0, x0_rows)
            state.forward[0] = (None, None, a)
            _post(owner, ctx, i, "fwd", 0, part, {n: a[next_plan.send[n]] for n in route.local})
            return state
        layer = owner.layers[(k, part)]
        clock = time.perf_counter()
        a_prev = state.forward[k - 1][2]
        groups = plan.groups
        batch = a_prev.shape[1]
        dtype = np.dtype(ctx.dtype)
        x_in = np.empty((int(groups[-1]), batch), dtype=dtype)
        x_in[groups[part] : groups[part + 1]] = a_prev[plan.own]
        z = np.empty((layer.shape[1], batch), dtype=dtype)
        senders = plan.senders()
        seconds = {"pack": time.perf_counter() - clock, "forward_product": 0.0}
        if ctx.part_workers and senders:
            # messages posted by other workers may still be on their way: the part's own input
            # rows first, then each sender's as its message is taken (waiting counts as neither)
            _timed(seconds, "forward_product", _spmm_rows, x_in, part, plan, layer, z, False)
            received = _received(owner, ctx, i, "fwd", k - 1, part, senders, pieces, route)
            for n, piece in zip(senders, received, strict=True):
                _timed(seconds, "pack", x_in.__setitem__, slice(groups[n], groups[n + 1]), piece)
                _timed(seconds, "forward_product", _spmm_rows, x_in, n, plan, layer, z, True)
        else:
            clock = time.perf_counter()
            received = _received(owner, ctx, i, "fwd", k - 1, part, senders, pieces, route)
            for n, piece in zip(senders, received, strict=True):
                x_in[groups[n] : groups[n + 1]] = piece
            seconds["pack"] += time.perf_counter() - clock
            _timed(seconds, "forward_product", _spmm_rows, x_in, None, plan, layer, z, False)
        clock = time.perf_counter()
        z += layer.bias[:, None]
        name = ctx.output_activation if k == ctx.n_layers else ctx.activation
        a = get_activation(name).forward(z)
        if ctx.training:
            state.forward[k] = (x_in, z, a)
        else:  # every task of layer k-1 has run (``after``): its values are no longer needed
            state.forward[k] = (None, None, a)
            del state.forward[k - 1]
        seconds["forward_product"] += time.perf_counter() - clock
        if route.local:
            messages = {n: a[next_plan.send[n]] for n in route.local}
            _timed(seconds, "pack", _post, owner, ctx, i, "fwd", k, part, messages)
        for kind, value in seconds.items():
            owner.add_time(kind, value)
    return state


def forward_task(
    ctx: StepContext,
    part: int,
    k: int,
    receiver: int,
    plan: LayerPartPlan,
    next_plan: LayerPartPlan | None,
    *pieces: np.ndarray,
    x0=None,
    x0_rows=None,
    y=None,
    y_rows=None,
    after=None,
    route: Route = Route(),
    microbatch: int = 0,
):
    """Part ``part``'s forward step of layer ``k`` for one microbatch; returns what ``receiver``
    needs.

    Layer ``k = 0`` takes the part's input columns ``x0`` (rows ``x0_rows`` of them when given);
    ``plan`` is then ``None``. The part's weights and bias are those its worker's
    :class:`~dasknn.model_parallel._worker_state.ModelState` owns.

    Parameters
    ----------
    receiver : int
        A worker (its index) hosting parts of layer ``k+1`` that need activations of this part:
        their rows ``next_plan.send[n]`` for ``n`` in ``route.to`` are returned, stacked; ``-1``
        for none (returns ``None``), ``-2`` for the output block ``a_L`` of this part, ``-3`` for
        this part's softmax statistics.
    pieces : arrays
        The messages of layer ``k-1`` from the senders on other workers (``route.sources``).
    x0, x0_rows : array, optional
        Layer 0 only: the part's input columns and the batch rows to take from them.
    y, y_rows : array, optional
        Softmax statistics only: the part's target columns and the batch rows.
    after : tuple
        Ignored: the part's tasks of the previous layer (or step) and those of the sending parts
        on this worker, which must run first.
    route : Route
    microbatch : int
        The row block of the step's batch this task works on (``0 <= microbatch <
        ctx.microbatches``); ``x0_rows`` and ``y_rows`` are its rows.
    """
    owner = ModelState.on_worker(ctx.token)
    state = _ensure_forward(
        owner, ctx, part, microbatch, k, plan, next_plan, x0, x0_rows, pieces, route
    )
    a = state.forward[k][2]
    if receiver >= 0:
        start = time.perf_counter()
        message = _stack([a[next_plan.send[n]] for n in route.to])
        owner.add_time("pack", time.perf_counter() - start)
        return message
    if receiver == -2:
        owner.drop_part_step(ctx.step, part)
        return a
    if receiver == -3:
        return _softmax_statistics(state.forward[k][1], _input_block(y, y_rows))
    return None


def _softmax_statistics(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """One part's per-sample maxima of the logits, sums of ``exp(z - max)`` and target sums,
    (3, B), from its feature-major logits and targets."""
    stats = np.empty((3, z.shape[1]), dtype=np.float64)
    stats[2] = y.sum(axis=0)
    if z.shape[0] == 0:
        stats[0] = -np.inf
        stats[1] = 0.0
        return stats
    stats[0] = z.max(axis=0)
    stats[1] = np.exp(z - stats[0]).sum(axis=0)
    return stats


def combine_logsumexp(*stats: np.ndarray) -> np.ndarray:
    """From every part's :func:`_softmax_statistics`: the row-wise log-sum-exp of all logits and
    the row sums of the targets, shape (2, B)."""
    peaks = np.stack([s[0] for s in stats])
    top = peaks.max(axis=0)
    total = sum(s[1] * np.exp(s[0] - top) for s in stats)
    return np.stack([top + np.log(total), sum(s[2] for s in stats)])


def _output_delta(ctx: StepContext, z, a, y, lse) -> tuple[np.ndarray, float]:
    """``dJ/dz_L`` of this part's output neurons for one microbatch (feature-major) and its share
    of the loss, both scaled by ``1 / ctx.batch`` (the mean over the whole step's batch)."""
    loss = get_loss(ctx.loss)
    rows = z.shape[1]
    if loss.name == "softmax_cross_entropy":
        log_prob = z - lse[0].astype(z.dtype)
        delta = np.exp(log_prob) * lse[1].astype(z.dtype) - y
        delta /= ctx.batch
        return np.ascontiguousarray(delta, dtype=z.dtype), -float(np.vdot(y, log_prob)) / ctx.batch
    out = get_activation(ctx.output_activation)
    delta = loss.output_delta(z.T, a.T, y.T, out)  # divided by the microbatch's rows
    value = loss.value(z.T, a.T, y.T)
    if rows != ctx.batch:
        delta *= delta.dtype.type(rows / ctx.batch)
        value *= rows / ctx.batch
    return np.ascontiguousarray(delta.T), value


def backward_task(
    ctx: StepContext,
    part: int,
    k: int,
    receiver: int,
    plan: LayerPartPlan,
    next_plan: LayerPartPlan | None,
    *pieces: np.ndarray,
    forward_pieces: tuple = (),
    y=None,
    y_rows=None,
    lse=None,
    after=None,
    route: Route = Route(),
    forward_route: Route = Route(),
    microbatch: int = 0,
):
    """Part ``part``'s backward step of layer ``k`` for one microbatch; returns what ``receiver``
    needs.

    The delta of layer ``k`` is the sum of the part's own partial sums and those received from
    ``sorted(next_plan.send)`` (``pieces`` and the mailbox, as ``route.sources`` says) times
    ``f'(z_k)`` (at ``k = L``: the loss gradient from ``y``).
    Then the partial sums for layer ``k-1`` are computed with the old weights, and the
    microbatch's gradient of layer ``k`` goes to the background thread (with ``messages="posted"``:
    to the task thread's queue of work for its waits), which adds it to the layer's sum and, once
    every microbatch's gradient is in, applies ``ctx.optimizer``'s step (with the state the worker
    keeps beside the weights). In layer 1 the part's last microbatch to finish waits for all of
    the part's updates and then adds its own gradient and updates layer 1 itself.

    Parameters
    ----------
    receiver : int
        A worker (its index) hosting owners of rows of ``W_k``: the partial sums of the owners in
        ``route.to`` (slices ``plan.groups``) are returned, stacked; or ``-1`` for none (in layer
        1: the microbatch's last task of the step, which returns the microbatch's loss share).
        The partial sums for owners on this worker (``route.local``) are left in the mailbox.
    forward_pieces : tuple of arrays
        At ``k = L``: the forward messages of layer ``L`` from other workers (the forward of the
        last layer runs here), placed by ``forward_route``.
    microbatch : int
        The row block of the step's batch this task works on.
    """
    owner = ModelState.on_worker(ctx.token)
    i = microbatch
    part_step = owner.part_step(ctx.step, part)
    with part_step.lock:
        state = part_step.microbatch(i)
        if k not in state.backward_done:
            if k == ctx.n_layers:
                inputs = (None, None, None, forward_pieces, forward_route)
                _ensure_forward(owner, ctx, part, i, k, plan, *inputs)
            returning = sorted(next_plan.send) if k < ctx.n_layers else []

            def receive() -> list:
                return _received(owner, ctx, i, "bwd", k + 1, part, returning, pieces, route)

            layer = owner.layers[(k, part)]
            delta = _backward(
                owner, ctx, state, i, part, k, plan, layer, next_plan, receive, y, y_rows, lse,
                route,
            )
            x_in = state.forward.pop(k)[0]
            if k >= 2 and not ctx.part_workers:
                groups = plan.groups
                partial = state.partial[k]
                local = {n: partial[groups[n] : groups[n + 1]] for n in route.local}
                _post(owner, ctx, i, "bwd", k, part, local)
            if k >= 2 or part_step.finished + 1 < ctx.microbatches:
                job = (_accumulate, owner, ctx, part_step, x_in, delta, k, plan, layer)
                if ctx.part_workers:
                    owner.queue_idle(*job)
                else:
                    part_step.updates.append(owner.submit_update(*job, True))
            else:  # the part's last task of the step: every other update is queued before it
                for update in part_step.updates:
                    update.result()
                owner.run_idle()
                _accumulate(owner, ctx, part_step, x_in, delta, k, plan, layer)
        last = False
        if k == 1:
            part_step.finished += 1
            last = part_step.finished == ctx.microbatches
    if receiver >= 0:
        start = time.perf_counter()
        groups = plan.groups
        message = _stack([state.partial[k][groups[n] : groups[n + 1]] for n in route.to])
        owner.add_time("pack", time.perf_counter() - start)
        return message
    if last:
        owner.drop_part_step(ctx.step, part)
    return state.loss


def _backward(
    owner: ModelState, ctx, state: MicrobatchStep, i, part, k, plan, layer: PartLayer, next_plan,
    receive, y, y_rows, lse, route: Route,
):
    """Return ``delta_k`` of the part; keep its partial sums for layer ``k-1`` (old weights).

    ``receive()`` returns the other parts' partial sums of layer ``k + 1`` for this part (in the
    order of ``sorted(next_plan.send)``); it is called once the part's own share of ``grad_a`` and
    ``f'(z_k)`` are computed, so a message still on its way is waited for as late as possible.
    With ``ctx.part_workers`` (messages posted between workers) the partial sums for the owners
    in ``route.local`` are posted here, as each owner's rows are computed.
    """
    _, z, a = state.forward[k]
    start = time.perf_counter()
    if k == ctx.n_layers:
        delta, state.loss = _output_delta(ctx, z, a, _input_block(y, y_rows), lse)
    else:
        own = state.partial.pop(k + 1)
        grad_a = np.zeros_like(z)
        grad_a[next_plan.own] = own[next_plan.groups[part] : next_plan.groups[part + 1]]
        derivative = get_activation(ctx.activation).derivative(z, a)
        clock = time.perf_counter()
        pieces = receive()
        start += time.perf_counter() - clock  # waiting for the messages is no product
        for n, piece in zip(sorted(next_plan.send), pieces, strict=True):
            grad_a[next_plan.send[n]] += piece
        grad_a *= derivative
        delta = grad_a
    if k >= 2:
        partial = np.empty((int(plan.groups[-1]), z.shape[1]), dtype=z.dtype)
        state.partial[k] = partial
        if ctx.part_workers:
            # the other owners' rows first, each posted as soon as it is computed, so they
            # travel while this part computes its own rows
            groups = plan.groups
            for n in [n for n in route.local if n != part] + [part]:
                lo, hi = int(groups[n]), int(groups[n + 1])
                indptr = plan.indptr[lo : hi + 1]
                spmm_backward(delta, indptr, layer.indices, layer.values, partial[lo:hi])
                if n != part:
                    _post(owner, ctx, i, "bwd", k, part, {n: partial[lo:hi]})
        else:
            spmm_backward(delta, plan.indptr, layer.indices, layer.values, partial)
    state.backward_done.add(k)
    owner.add_time("backward_product", time.perf_counter() - start)
    return delta


def _accumulate(
    owner: ModelState,
    ctx,
    part_step: PartStep,
    x_in,
    delta,
    k: int,
    plan,
    layer: PartLayer,
    background: bool = False,
) -> None:
    """Add one microbatch's gradient of a part's chunk of layer ``k`` to the layer's sum; with
    the last microbatch's, apply the optimizer's step to the chunk."""
    start = time.perf_counter()
    grad_w = np.empty_like(layer.values)
    one = layer.values.dtype.type(1)
    masked_outer_grad(x_in, delta, plan.indptr, layer.indices, one, grad_w)
    grad_b = delta.sum(axis=1)
    total = part_step.gradients.get(k)
    if total is None:
        total = part_step.gradients[k] = GradientSum(0, grad_w, grad_b)
    else:
        total.weights += grad_w
        total.bias += grad_b
    total.count += 1
    if total.count == ctx.microbatches:
        del part_step.gradients[k]
        layer.apply(ctx.optimizer, total.weights, total.bias)
    seconds = time.perf_counter() - start
    owner.add_time("update", seconds)
    if background:
        owner.add_time("update_background", seconds)
