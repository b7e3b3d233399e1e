"""The functions that run on the workers: one part's share of a layer step. The values kept
between tasks belong to :class:`~dasknn.model_parallel._worker_state.ModelState`; no task changes
a value Dask holds (docs/training.md, Task graphs, Messages between workers)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from dasknn.kernels.training import add_rows, masked_outer_grad, spmm_backward, spmm_forward
from dasknn.model.activations import get_activation
from dasknn.model.losses import get_loss
from dasknn.model_parallel._plan import LayerPartPlan
from dasknn.model_parallel._worker_state import GradientSum, ModelState, PartLayer, PartStep
from dasknn.optim import Optimizer
from dasknn.runtime.alignment import local_copy
from dasknn.runtime.keys import phase_names, step_key

__all__ = [
    "NO_RECEIVER", "OUTPUT_BLOCK", "SOFTMAX_STATS", "Route", "StepContext", "backward_task",
    "combine_logsumexp", "forward_task",
]

#: A task's ``receiver`` other than a worker: none, the output block ``a_L``, softmax statistics.
NO_RECEIVER, OUTPUT_BLOCK, SOFTMAX_STATS = -1, -2, -3


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
    #: ``False`` for a forward pass: a part keeps only its latest layer's activations.
    training: bool = True
    #: Row blocks the step's batch is split into; a layer's gradients are summed over them.
    microbatches: int = 1
    #: Rows of the whole step's batch (the ``B`` of the mean loss); 0 for a forward pass.
    batch: int = 0
    #: ``messages="posted"``: every part's worker address; empty: messages are task results.
    part_workers: tuple = ()


@dataclass(frozen=True)
class Route:
    """Where a task's incoming messages come from and where its part's messages go (static):
    ``sources``, per sender (plan order), ``None`` (in the mailbox) or ``(i, lo, hi)``, rows of
    piece ``i``; ``local``, the receiving parts whose messages are left in the mailbox (posted
    to their worker when ``StepContext.part_workers`` is set); ``to``, the receiving parts on the
    destination worker, in the order their messages are stacked."""

    sources: tuple = ()
    local: tuple = ()
    to: tuple = ()


def _input_block(x, rows):
    return x if rows is None else np.ascontiguousarray(x[:, rows])


def _batch_columns(owner: ModelState, part_step: PartStep, ctx, x, rows) -> np.ndarray:
    """``x[:, rows]`` (all of ``x`` for ``None``, a view for a slice), gathered into a
    :func:`_temporary` array for an index array."""
    if rows is None or isinstance(rows, slice):
        return x if rows is None else x[:, rows]
    out = _temporary(owner, part_step, ctx, (x.shape[0], len(rows)), x.dtype)
    return np.take(x, rows, axis=1, out=out, mode="clip")  # in range: no buffered copy


def _message_key(ctx, i: int, phase: str, k: int, sender: int, receiver: int) -> tuple:
    return step_key(phase_names(ctx.token)[phase], ctx.step, k, sender, receiver, i)


def _rows(owner: ModelState, ctx, a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``a[rows]``: with ``messages="posted"`` in a pooled array held until the step task's posts
    are delivered (:meth:`ModelState.posted_array`), else new."""
    if not ctx.part_workers:
        return a[rows]
    out = owner.posted_array((len(rows), *a.shape[1:]), a.dtype)
    return a.take(rows, axis=0, out=out, mode="clip")  # rows are in range: no buffered copy


def _post(owner: ModelState, ctx, i: int, phase: str, k: int, sender: int, messages: dict) -> None:
    """Leave ``{receiver: rows}`` of ``sender`` in the receiver's mailbox (posted if remote)."""
    for receiver, rows in messages.items():
        address = ctx.part_workers[receiver] if ctx.part_workers else owner.address
        owner.send(address, _message_key(ctx, i, phase, k, sender, receiver), rows)


def _received(owner: ModelState, ctx, i, phase, k, part, senders, pieces, route: Route) -> list:
    """The messages of ``(phase, k, s)`` for ``part`` from every ``s`` of ``senders``, in order."""
    messages = []
    for s, source in zip(senders, route.sources, strict=True):
        if source is None:
            messages.append(owner.take(_message_key(ctx, i, phase, k, s, part)))
        else:
            index, lo, hi = source
            messages.append(pieces[index][lo:hi])
    return messages


def _stack(rows: list[np.ndarray]) -> np.ndarray:
    return rows[0] if len(rows) == 1 else np.concatenate(rows, axis=0)


def _timed(seconds: dict, kind: str, func, *args) -> None:
    clock = time.perf_counter()
    func(*args)
    seconds[kind] += time.perf_counter() - clock


def _spmm_rows(x_in, sender, plan: LayerPartPlan, layer: PartLayer, z, accumulate: bool,
               columns: slice = slice(None)) -> None:  # fmt: skip
    """``z[columns] (+)= W[:, columns].T @ x_in`` over the input rows of ``sender``'s group (all
    rows for ``None``)."""
    bounds, rows, order = layer.column_view(plan.indptr, plan.groups)
    lo, hi = (0, -1) if sender is None else (sender, sender + 1)
    spmm_forward(x_in, bounds[lo][columns], bounds[hi][columns], rows, order, layer.values,
                 z[columns], accumulate)


def _activate(name: str, bias: np.ndarray, z: np.ndarray, a: np.ndarray, rows: slice) -> None:
    """``z[rows] += bias[rows]``, ``a[rows] = f(z[rows])`` (an element-wise ``f``)."""
    z[rows] += bias[rows, None]
    get_activation(name).forward(z[rows], out=a[rows])


def _temporary(owner: ModelState, part_step: PartStep, ctx: StepContext, shape, dtype):
    """An uninitialized array for one step: in a training step from the worker's pool (given
    back at the step's end), in a forward pass new (the passes of several blocks run at once)."""
    if ctx.training:
        return owner.step_array(part_step, shape, dtype)
    return np.empty(shape, dtype=dtype)


def _ensure_forward(owner, ctx, part, i, k, plan, next_plan, x0, x0_rows, pieces, route):
    """Compute ``x_in``, ``z``, ``a`` of ``part`` in layer ``k`` once (the microbatch's
    :class:`MicrobatchStep` is returned); post its messages to ``route.local``."""
    part_step = owner.part_step(ctx.step, part)
    with part_step.lock:
        state = part_step.microbatch(i)
        if k in state.forward:
            return state
        if k == 0:
            a = _batch_columns(owner, part_step, ctx, x0, x0_rows)
            state.forward[0] = (None, None, a)
            messages = {n: _rows(owner, ctx, a, next_plan.send[n]) for n in route.local}
            _post(owner, ctx, i, "fwd", 0, part, messages)
            return state
        layer = owner.layers[(k, part)]
        clock = time.perf_counter()
        a_prev = state.forward[k - 1][2]
        groups, batch, dtype = plan.groups, a_prev.shape[1], np.dtype(ctx.dtype)
        x_in = _temporary(owner, part_step, ctx, (int(groups[-1]), batch), dtype)
        own_rows = x_in[groups[part] : groups[part + 1]]
        np.take(a_prev, plan.own, axis=0, out=own_rows, mode="clip")  # in range: no copy
        z = _temporary(owner, part_step, ctx, (layer.shape[1], batch), dtype)
        senders = plan.senders()
        seconds = {"pack": time.perf_counter() - clock, "forward_product": 0.0}
        name = ctx.output_activation if k == ctx.n_layers else ctx.activation
        head = z.shape[0]  # the rows finished and posted first: those other parts need
        if ctx.part_workers:
            # own input rows first, then each sender's (waiting counts as neither), over the
            # rows to post; the rest once they are posted
            if route.local and k < ctx.n_layers:
                head = next_plan.sent_prefix()
            first = slice(0, head)
            _timed(seconds, "forward_product", _spmm_rows, x_in, part, plan, layer, z, False,
                   first)
            received = _received(owner, ctx, i, "fwd", k - 1, part, senders, pieces, route)
            for n, piece in zip(senders, received, strict=True):
                _timed(seconds, "pack", x_in.__setitem__, slice(groups[n], groups[n + 1]), piece)
                _timed(seconds, "forward_product", _spmm_rows, x_in, n, plan, layer, z, True,
                       first)
        else:
            clock = time.perf_counter()
            received = _received(owner, ctx, i, "fwd", k - 1, part, senders, pieces, route)
            for n, piece in zip(senders, received, strict=True):
                x_in[groups[n] : groups[n + 1]] = piece
            seconds["pack"] += time.perf_counter() - clock
            _timed(seconds, "forward_product", _spmm_rows, x_in, None, plan, layer, z, False)
        a = _temporary(owner, part_step, ctx, z.shape, dtype)
        _timed(seconds, "forward_product", _activate, name, layer.bias, z, a, slice(0, head))
        if ctx.training:
            state.forward[k] = (x_in, z, a)
        else:  # every task of layer k-1 has run (``after``): its values are no longer needed
            state.forward[k] = (None, None, a)
            del state.forward[k - 1]
        if route.local:
            clock = time.perf_counter()
            messages = {n: _rows(owner, ctx, a, next_plan.send[n]) for n in route.local}
            _post(owner, ctx, i, "fwd", k, part, messages)
            seconds["pack"] += time.perf_counter() - clock
        if head < z.shape[0]:  # the rows no other part needs, while the posts travel
            rest = slice(head, None)
            _timed(seconds, "forward_product", _spmm_rows, x_in, None, plan, layer, z, False,
                   rest)
            _timed(seconds, "forward_product", _activate, name, layer.bias, z, a, rest)
        for kind, value in seconds.items():
            owner.add_time(kind, value)
    return state


def forward_task(
    ctx: StepContext, part: int, k: int, receiver: int, plan: LayerPartPlan,
    next_plan: LayerPartPlan | None, *pieces: np.ndarray, x0=None, x0_rows=None, y=None,
    y_rows=None, after=None, route: Route = Route(), microbatch: int = 0,
):  # fmt: skip
    """Part ``part``'s forward step of layer ``k`` on microbatch ``microbatch``; returns what
    ``receiver`` needs.

    Parameters
    ----------
    receiver : int
        A worker index: rows ``next_plan.send[n]`` for ``n`` in ``route.to``, stacked; ``-1``: none;
        ``-2``: the output block ``a_L``; ``-3``: the softmax statistics.
    pieces : arrays
        The messages of layer ``k-1`` from other workers (``route.sources``).
    x0, x0_rows, y, y_rows : array, optional
        Input (layer 0) or target (softmax statistics) columns, and the batch rows to take.
    after : tuple
        Ignored: tasks that must run first.
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
    if receiver == OUTPUT_BLOCK:
        owner.drop_part_step(ctx.step, part)
        return a
    if receiver == SOFTMAX_STATS:
        return _softmax_statistics(state.forward[k][1], _input_block(y, y_rows))
    return None


def _softmax_statistics(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """One part's per-sample logit maxima, sums of ``exp(z - max)`` and target sums, ``(3, B)``."""
    stats = np.empty((3, z.shape[1]), dtype=np.float64)
    stats[2] = y.sum(axis=0)
    if z.shape[0] == 0:
        stats[0], stats[1] = -np.inf, 0.0
        return stats
    stats[0] = z.max(axis=0)
    stats[1] = np.exp(z - stats[0]).sum(axis=0)
    return stats


def combine_logsumexp(*stats: np.ndarray) -> np.ndarray:
    """The row-wise log-sum-exp of all parts' logits and the target row sums, ``(2, B)``."""
    peaks = np.stack([s[0] for s in stats])
    top = peaks.max(axis=0)
    total = sum(s[1] * np.exp(s[0] - top) for s in stats)
    return np.stack([top + np.log(total), sum(s[2] for s in stats)])


def _output_delta(ctx: StepContext, z, a, y, lse) -> tuple[np.ndarray, float]:
    """``dJ/dz_L`` of the part's outputs and its loss share, both scaled by ``1 / ctx.batch``.

    ``y`` as received may start off its dtype's alignment (a small array unpickled inside a
    message); it is copied to aligned memory first, as BLAS (``np.vdot``) needs on some CPUs."""
    loss = get_loss(ctx.loss)
    if not y.flags.aligned:
        y = local_copy(y)
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
    ctx: StepContext, part: int, k: int, receiver: int, plan: LayerPartPlan,
    next_plan: LayerPartPlan | None, *pieces: np.ndarray, forward_pieces: tuple = (), y=None,
    y_rows=None, lse=None, after=None, route: Route = Route(), forward_route: Route = Route(),
    microbatch: int = 0,
):  # fmt: skip
    """Part ``part``'s backward step of layer ``k`` on microbatch ``microbatch``; returns what
    ``receiver`` needs.

    Computes ``delta_k`` and the partial sums for layer ``k-1`` (old weights); the optimizer's step
    runs once every microbatch's gradient of the layer is summed.

    Parameters
    ----------
    receiver : int
        A worker index: the partial sums of the owners in ``route.to``, stacked; ``-1``: none (in
        layer 1: the microbatch's loss share).
    forward_pieces : tuple of arrays
        At ``k = L``: the forward messages of layer ``L`` from other workers (``forward_route``).
    """
    owner = ModelState.on_worker(ctx.token)
    i = microbatch
    part_step = owner.part_step(ctx.step, part)
    with part_step.lock:
        state = part_step.microbatch(i)
        if k not in state.backward_done:
            if k == ctx.n_layers:
                _ensure_forward(owner, ctx, part, i, k, plan, None, None, None, forward_pieces,
                                forward_route)  # fmt: skip
            layer = owner.layers[(k, part)]
            delta = _backward(owner, ctx, part_step, i, part, k, plan, layer, next_plan, pieces,
                              y, y_rows, lse, route)  # fmt: skip
            x_in = state.forward.pop(k)[0]
            if k >= 2 and not ctx.part_workers:
                groups, partial = plan.groups, state.partial[k]
                local = {n: partial[groups[n] : groups[n + 1]] for n in route.local}
                _post(owner, ctx, i, "bwd", k, part, local)
            if k >= 2 or part_step.finished + 1 < ctx.microbatches:
                job = (_accumulate, owner, ctx, part_step, x_in, delta, k, plan, layer)
                if ctx.part_workers:
                    owner.mailbox.queue_idle(*job)
                else:
                    part_step.updates.append(owner.updater.submit(*job, True))
            else:  # the part's last task of the step: every other update is queued before it
                for update in part_step.updates:
                    update.result()
                owner.mailbox.run_idle()
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


def _backward(owner, ctx, part_step: PartStep, i, part, k, plan, layer: PartLayer, next_plan,
              pieces, y, y_rows, lse, route: Route):  # fmt: skip
    """Return ``delta_k`` of microbatch ``i``, keep the partial sums for layer ``k-1`` (the
    messages of layer ``k + 1`` are taken last)."""
    state = part_step.microbatch(i)
    _, z, a = state.forward[k]
    start = time.perf_counter()
    if k == ctx.n_layers:
        delta, state.loss = _output_delta(ctx, z, a, _input_block(y, y_rows), lse)
    else:
        own = state.partial.pop(k + 1)
        grad_a = owner.step_array(part_step, z.shape, z.dtype)
        grad_a.fill(0)
        grad_a[next_plan.own] = own[next_plan.groups[part] : next_plan.groups[part + 1]]
        derivative = get_activation(ctx.activation).derivative(
            z, a, out=owner.step_array(part_step, z.shape, z.dtype)
        )
        returning = sorted(next_plan.send)
        clock = time.perf_counter()
        received = _received(owner, ctx, i, "bwd", k + 1, part, returning, pieces, route)
        start += time.perf_counter() - clock  # waiting for the messages is no product
        for n, piece in zip(returning, received, strict=True):
            add_rows(grad_a, next_plan.send[n], piece)
        grad_a *= derivative
        delta = grad_a
    if k >= 2:
        shape = (int(plan.groups[-1]), z.shape[1])
        if ctx.part_workers:  # the other owners' rows first, each posted as soon as computed
            # (pooled until the posts are delivered)
            partial = state.partial[k] = owner.posted_array(shape, z.dtype)
            groups = plan.groups
            for n in [n for n in route.local if n != part] + [part]:
                lo, hi = int(groups[n]), int(groups[n + 1])
                indptr = plan.indptr[lo : hi + 1]
                spmm_backward(delta, indptr, layer.indices, layer.values, partial[lo:hi])
                if n != part:
                    _post(owner, ctx, i, "bwd", k, part, {n: partial[lo:hi]})
        else:  # its rows are task results: new
            partial = state.partial[k] = np.empty(shape, dtype=z.dtype)
            spmm_backward(delta, plan.indptr, layer.indices, layer.values, partial)
    state.backward_done.add(k)
    owner.add_time("backward_product", time.perf_counter() - start)
    return delta


def _accumulate(owner: ModelState, ctx, part_step: PartStep, x_in, delta, k: int, plan,
                layer: PartLayer, background: bool = False) -> None:  # fmt: skip
    """Add one microbatch's gradient to the layer's sum; apply the optimizer with the last one."""
    start = time.perf_counter()
    grad_w = owner.step_array(part_step, layer.values.shape, layer.values.dtype)
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
