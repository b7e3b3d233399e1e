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
part's last task of the step updates layer 1 and waits for all of its updates.

Everything a task reads or changes besides its arguments belongs to the model's worker plugin
(:class:`~dasknn.model_parallel.worker_state.ModelState`, found with
:func:`~dasknn.model_parallel.worker_state.model_state`): the weight values, biases and optimizer
state of the parts on this worker, and the intermediate values of a part (``x_in``, ``z``, ``a`` per
layer, partial sums) keyed by step and part, so one task per message suffices and the critical
path of a layer is one task plus one transfer. The intermediate values are feature-major, shape
``(neurons, B)`` (the layout of the kernels), so a message is a gather of whole rows: the forward
rows for part ``n`` are ``a[send[n]]``, the backward ones a contiguous slice of the partial sums.
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
from dasknn.model_parallel.plan import LayerPartPlan
from dasknn.model_parallel.worker_state import ModelState, PartLayer, PartStep, model_state
from dasknn.optim import Optimizer

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


def _post(owner: ModelState, ctx, phase: str, k: int, sender: int, messages: dict) -> None:
    """Leave ``{receiver: rows}`` of ``sender`` in the worker's mailbox."""
    mailbox = owner.mailbox
    for receiver, rows in messages.items():
        mailbox[(ctx.step, phase, k, sender, receiver)] = rows


def _received(
    owner: ModelState, ctx, phase: str, k: int, part: int, senders, pieces, route: Route
) -> list:
    """The messages of ``(phase, k, s)`` for ``part`` from every ``s`` of ``senders``, in order:
    from the mailbox for senders on this worker, sliced out of ``pieces`` for the others."""
    mailbox = owner.mailbox
    messages = []
    for s, source in zip(senders, route.sources, strict=True):
        if source is None:
            messages.append(mailbox.pop((ctx.step, phase, k, s, part)))
        else:
            i, lo, hi = source
            messages.append(pieces[i][lo:hi])
    return messages


def _stack(rows: list[np.ndarray]) -> np.ndarray:
    """One message array from the row blocks for the receivers on one worker."""
    return rows[0] if len(rows) == 1 else np.concatenate(rows, axis=0)


def _ensure_forward(
    owner: ModelState, ctx, part, k, plan: LayerPartPlan, next_plan, x0, x0_rows, pieces, route
) -> PartStep:
    """Compute ``x_in``, ``z``, ``a`` of part ``part`` in layer ``k`` unless already done, and
    post the messages for the receiving parts on this worker (``route.local``).

    Layer 0 only stores the part's input columns (restricted to the batch rows) as ``a_0``.
    """
    state = owner.part_step(ctx.step, part)
    with state.lock:
        if k in state.forward:
            return state
        if k == 0:
            a = _input_block(x0, x0_rows)
            state.forward[0] = (None, None, a)
            _post(owner, ctx, "fwd", 0, part, {n: a[next_plan.send[n]] for n in route.local})
            return state
        layer = owner.layers[(k, part)]
        start = time.perf_counter()
        a_prev = state.forward[k - 1][2]
        groups = plan.groups
        batch = a_prev.shape[1]
        dtype = np.dtype(ctx.dtype)
        x_in = np.empty((int(groups[-1]), batch), dtype=dtype)
        x_in[groups[part] : groups[part + 1]] = a_prev[plan.own]
        senders = plan.senders()
        received = _received(owner, ctx, "fwd", k - 1, part, senders, pieces, route)
        for n, piece in zip(senders, received, strict=True):
            x_in[groups[n] : groups[n + 1]] = piece
        middle = time.perf_counter()
        z = np.empty((layer.shape[1], batch), dtype=dtype)
        spmm_forward(x_in, plan.indptr, layer.indices, layer.values, z)
        z += layer.bias[:, None]
        name = ctx.output_activation if k == ctx.n_layers else ctx.activation
        a = get_activation(name).forward(z)
        if ctx.training:
            state.forward[k] = (x_in, z, a)
        else:  # every task of layer k-1 has run (``after``): its values are no longer needed
            state.forward[k] = (None, None, a)
            del state.forward[k - 1]
        end = time.perf_counter()
        if route.local:
            _post(owner, ctx, "fwd", k, part, {n: a[next_plan.send[n]] for n in route.local})
        owner.add_time("pack", middle - start + time.perf_counter() - end)
        owner.add_time("forward_product", end - middle)
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
):
    """Part ``part``'s forward step of layer ``k``; returns what ``receiver`` needs.

    Layer ``k = 0`` takes the part's input columns ``x0`` (rows ``x0_rows`` of them when given);
    ``plan`` is then ``None``. The part's weights and bias are those its worker's
    :class:`~dasknn.model_parallel.worker_state.ModelState` owns.

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
    """
    owner = model_state(ctx.token)
    state = _ensure_forward(owner, ctx, part, k, plan, next_plan, x0, x0_rows, pieces, route)
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
    """``dJ/dz_L`` of this part's output neurons (feature-major) and its share of the loss."""
    loss = get_loss(ctx.loss)
    batch = z.shape[1]
    if loss.name == "softmax_cross_entropy":
        log_prob = z - lse[0].astype(z.dtype)
        delta = np.exp(log_prob) * lse[1].astype(z.dtype) - y
        delta /= batch
        return np.ascontiguousarray(delta, dtype=z.dtype), -float(np.vdot(y, log_prob)) / batch
    out = get_activation(ctx.output_activation)
    delta = loss.output_delta(z.T, a.T, y.T, out)
    return np.ascontiguousarray(delta.T), loss.value(z.T, a.T, y.T)


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
):
    """Part ``part``'s backward step and update of layer ``k``; returns what ``receiver`` needs.

    The delta of layer ``k`` is the sum of the part's own partial sums and those received from
    ``sorted(next_plan.send)`` (``pieces`` and the mailbox, as ``route.sources`` says) times
    ``f'(z_k)`` (at ``k = L``: the loss gradient from ``y``).
    Then the partial sums for layer ``k-1`` are computed with the old weights, and the update of
    the weights and bias of layer ``k`` (``ctx.optimizer``'s step, with the state the worker keeps
    beside them) goes to the background thread; in layer 1 this part's last task of the step
    (``receiver == -1``) updates inline and waits for every update.

    Parameters
    ----------
    receiver : int
        A worker (its index) hosting owners of rows of ``W_k``: the partial sums of the owners in
        ``route.to`` (slices ``plan.groups``) are returned, stacked; or ``-1`` for none (in layer
        1: the part's last task of the step, which updates layer 1, returns the part's loss share
        and frees its state). The partial sums for owners on this worker (``route.local``) are
        left in the mailbox.
    forward_pieces : tuple of arrays
        At ``k = L``: the forward messages of layer ``L`` from other workers (the forward of the
        last layer runs here), placed by ``forward_route``.
    """
    owner = model_state(ctx.token)
    state = owner.part_step(ctx.step, part)
    with state.lock:
        if k not in state.backward_done:
            if k == ctx.n_layers:
                inputs = (None, None, None, forward_pieces, forward_route)
                _ensure_forward(owner, ctx, part, k, plan, *inputs)
            received = ()
            if k < ctx.n_layers:
                returning = sorted(next_plan.send)
                received = _received(owner, ctx, "bwd", k + 1, part, returning, pieces, route)
            layer = owner.layers[(k, part)]
            delta = _backward(
                owner, ctx, state, part, k, plan, layer, next_plan, received, y, y_rows, lse
            )
            x_in = state.forward.pop(k)[0]
            if k >= 2:
                groups = plan.groups
                partial = state.partial[k]
                local = {n: partial[groups[n] : groups[n + 1]] for n in route.local}
                _post(owner, ctx, "bwd", k, part, local)
                update = owner.submit_update(_update, owner, ctx, x_in, delta, plan, layer, True)
                state.updates.append(update)
            else:  # the part's only task of layer 1 (see ``receiver``)
                _update(owner, ctx, x_in, delta, plan, layer)
                for update in state.updates:
                    update.result()
    if receiver >= 0:
        start = time.perf_counter()
        groups = plan.groups
        message = _stack([state.partial[k][groups[n] : groups[n + 1]] for n in route.to])
        owner.add_time("pack", time.perf_counter() - start)
        return message
    if k == 1:
        owner.drop_part_step(ctx.step, part)
    return state.loss


def _backward(
    owner: ModelState,
    ctx,
    state,
    part,
    k,
    plan,
    layer: PartLayer,
    next_plan,
    pieces,
    y,
    y_rows,
    lse,
):
    """Return ``delta_k`` of the part; keep its partial sums for layer ``k-1`` (old weights)."""
    _, z, a = state.forward[k]
    start = time.perf_counter()
    if k == ctx.n_layers:
        delta, state.loss = _output_delta(ctx, z, a, _input_block(y, y_rows), lse)
    else:
        own = state.partial.pop(k + 1)
        grad_a = np.zeros_like(z)
        grad_a[next_plan.own] = own[next_plan.groups[part] : next_plan.groups[part + 1]]
        for n, piece in zip(sorted(next_plan.send), pieces, strict=True):
            grad_a[next_plan.send[n]] += piece
        grad_a *= get_activation(ctx.activation).derivative(z, a)
        delta = grad_a
    if k >= 2:
        partial = np.empty((int(plan.groups[-1]), z.shape[1]), dtype=z.dtype)
        spmm_backward(delta, plan.indptr, layer.indices, layer.values, partial)
        state.partial[k] = partial
    state.backward_done.add(k)
    owner.add_time("backward_product", time.perf_counter() - start)
    return delta


def _update(
    owner: ModelState, ctx, x_in, delta, plan, layer: PartLayer, background: bool = False
) -> None:
    """The optimizer's step on a part's chunk of a layer, from its inputs and deltas."""
    start = time.perf_counter()
    grad_w = np.empty_like(layer.values)
    one = layer.values.dtype.type(1)
    masked_outer_grad(x_in, delta, plan.indptr, layer.indices, one, grad_w)
    layer.apply(ctx.optimizer, grad_w, delta.sum(axis=1))
    seconds = time.perf_counter() - start
    owner.add_time("update", seconds)
    if background:
        owner.add_time("update_background", seconds)
