"""Task graphs of a training step and of a forward pass, built once per network and partition.

The structure of a step (which tasks exist, what each one depends on, which part runs it) is
computed once into a :class:`StepTemplate`; every batch only stamps it with fresh keys carrying the
step number and submits the whole step at once. Keys (named in :mod:`dasknn.runtime.keys`) are
tuples

    ``(f"dasknn-{phase}-{token}", step, layer, part, receiver, microbatch)``

with ``phase`` ``fwd`` (the task of ``(layer, part)`` that returns the activations the parts of
layer ``layer + 1`` on worker number ``receiver`` need, stacked), ``bwd`` (the partial sums of
layer ``layer`` returned to the owners of those rows on worker number ``receiver``; the part's
weight update of the layer starts in the background when they are computed) or ``lse`` (softmax
statistics). Workers are numbered by sorted address. ``receiver`` is ``-1`` for a task that sends
nothing to another worker, ``-2`` for an output block, ``-3`` for softmax statistics. Every task
runs on the worker of ``part`` (:data:`part_of`), so the only values Dask moves between
workers are the packed messages. A part sends one message per layer and phase to each *other
worker* hosting receivers; messages between parts on the same worker never become tasks: the
sender leaves them in the worker's mailbox (:mod:`dasknn.model_parallel._steps`) and the receiver's
tasks wait for one of the sender's tasks (``after``). With ``P`` parts on ``W`` workers a layer thus
costs at most ``P (W - 1)`` tasks instead of ``P (P - 1)``. With microbatches every task exists
once per row block of the batch (``microbatch``), each block's tasks depending on the same
block's; :class:`StepPriority` orders a worker's ready tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter

from dask.task_spec import List, Task, TaskRef

from dasknn.model_parallel._layout import Layout
from dasknn.model_parallel._plan import CommPlan
from dasknn.model_parallel._steps import (
    Route,
    StepContext,
    backward_task,
    combine_logsumexp,
    forward_task,
)
from dasknn.runtime.keys import phase_names, step_key

__all__ = ["StepPriority", "StepTemplate", "part_of"]

#: The position function of a step key's placement: the part in ``key[3]``.
part_of = itemgetter(3)

NO_RECEIVER = -1
OUTPUT_BLOCK = -2
SOFTMAX_STATS = -3
#: Microbatch numbers stay below this in a priority (:class:`StepPriority`).
PRIORITY_STRIDE = 2**31


@dataclass(frozen=True)
class _Spec:
    """One task of the template: refs are ``("step", phase, k, m, n)`` (a key of the same step),
    ``("prev", m)`` (the part's last task of the previous step) or a fixed key."""

    phase: str
    k: int
    m: int
    n: int
    func: object
    args: tuple
    kwargs: dict


class StepTemplate:
    """The structure of one step (``kind="train"``) or forward pass (``kind="predict"``).

    Parameters
    ----------
    token : str
    plan : CommPlan
    layout : Layout
    kind : {"train", "predict"}
    softmax : bool
        Whether the loss is softmax cross-entropy (needs the ``lse`` reduction).
    separate_packing : bool
        ``False`` (the default): each message is returned by a task that also makes sure its
        part's layer is computed, so a layer costs one scheduler round trip. ``True``: a product
        task per part and layer, then one pack task per message after it (two round trips per
        layer); kept to measure what the fusion saves.
    """

    def __init__(
        self,
        token: str,
        plan: CommPlan,
        layout: Layout,
        kind: str,
        softmax: bool = False,
        separate_packing: bool = False,
    ) -> None:
        self.token = token
        self.separate_packing = separate_packing
        self.names = phase_names(token)
        self.plan = plan
        self.kind = kind
        self.n_layers = plan.n_layers
        self.nparts = plan.nparts
        self.specs: list[_Spec] = []
        self._layout = layout
        workers = sorted(set(layout.part_workers))
        self._worker = [workers.index(address) for address in layout.part_workers]
        self._receivers: dict[tuple, list[int]] = {}  # (phase, k, m) -> task receivers
        self._local: dict[tuple, tuple] = {}  # (phase, k, m) -> receiving parts on m's worker
        self._to: dict[tuple, tuple] = {}  # (phase, k, m, worker) -> receiving parts there
        self._build_forward(train=kind == "train", softmax=softmax)
        if kind == "train":
            self._build_backward(softmax)
            self.outputs = [("bwd", 1, m, NO_RECEIVER) for m in range(self.nparts)]
        else:
            self.outputs = [("fwd", self.n_layers, m, OUTPUT_BLOCK) for m in range(self.nparts)]

    # ------------------------------------------------------------------ structure
    def _fixed(self, k: int, m: int) -> tuple:
        """``(plan, next_plan)`` refs of ``(k, m)`` (``None`` where absent); the weights are not
        task arguments: the model's worker plugin owns them."""
        layout = self._layout
        next_plan = ("fixed", layout.plan_keys[k][m]) if k < self.n_layers else None
        if k == 0:
            return None, next_plan
        return ("fixed", layout.plan_keys[k - 1][m]), next_plan

    def _destinations(self, phase: str, k: int, m: int, receivers: list[int]) -> list[int]:
        """Task receivers of ``(phase, k, m)`` sending to the parts ``receivers``: one per other
        worker hosting some of them (``[NO_RECEIVER]`` if none); records the routes."""
        home = self._worker[m]
        local = tuple(n for n in receivers if self._worker[n] == home)
        self._local[(phase, k, m)] = local
        dests = sorted({self._worker[n] for n in receivers} - {home})
        for h in dests:
            self._to[(phase, k, m, h)] = tuple(n for n in receivers if self._worker[n] == h)
        return dests or [NO_RECEIVER]

    def _rows(self, phase: str, k: int, sender: int, n: int) -> int:
        """Rows of the message of ``sender`` for part ``n`` (activations of layer ``k`` forward,
        partial sums of layer ``k`` backward)."""
        if phase == "fwd":
            return len(self.plan.layers[k][sender].send[n])
        groups = self.plan.layers[k - 1][sender].groups
        return int(groups[n + 1] - groups[n])

    def _sources(self, phase: str, k: int, m: int, senders: list[int]) -> tuple:
        """``(pieces, route sources, extra after)`` of part ``m`` receiving the messages of
        ``(phase, k, s)`` for every ``s`` of ``senders``: a remote sender's message is the piece
        of its task for ``m``'s worker, rows ``lo:hi``; a local one's waits in the mailbox."""
        pieces, sources, after = [], [], []
        home = self._worker[m]
        for s in senders:
            if self._worker[s] == home:
                sources.append(None)
                after.append(("step", phase, k, s, self._receivers[(phase, k, s)][0]))
                continue
            to = self._to[(phase, k, s, home)]
            lo = sum(self._rows(phase, k, s, n) for n in to[: to.index(m)])
            sources.append((len(pieces), lo, lo + self._rows(phase, k, s, m)))
            pieces.append(("step", phase, k, s, home))
        return tuple(pieces), tuple(sources), tuple(after)

    def _build_forward(self, train: bool, softmax: bool) -> None:
        L, P = self.n_layers, self.nparts
        for k in range(0, L + 1):
            for m in range(P):
                local: tuple = ()
                if k < L:
                    targets = sorted(self.plan.layers[k][m].send)
                    receivers = self._destinations("fwd", k, m, targets)
                    local = self._local[("fwd", k, m)]
                elif not train:
                    receivers = [OUTPUT_BLOCK]
                elif softmax:
                    receivers = [SOFTMAX_STATS]
                else:
                    continue
                self._receivers[("fwd", k, m)] = receivers
                kwargs = self._after_previous_layer(k, m)
                pieces, sources = (), ()
                if k >= 1:
                    senders = self.plan.layers[k - 1][m].senders()
                    pieces, sources, after = self._sources("fwd", k - 1, m, senders)
                    kwargs["after"] += after
                kwargs["route"] = Route(sources=sources, local=local)
                if k == 0:
                    kwargs["x0"] = ("input", "x", m)
                    kwargs["x0_rows"] = ("input", "x_rows", m)
                if k == L and train:
                    kwargs["y"] = ("input", "y", m)
                    kwargs["y_rows"] = ("input", "y_rows", m)
                self._add_part_tasks("fwd", k, m, receivers, forward_task, pieces, kwargs)
        if train and softmax:
            stats = tuple(("step", "fwd", L, m, SOFTMAX_STATS) for m in range(P))
            self.specs.append(_Spec("lse", L, 0, NO_RECEIVER, combine_logsumexp, stats, {}))

    def _after_previous_layer(self, k: int, m: int) -> dict:
        """``after=`` of the forward tasks of ``(k, m)``: all tasks of ``(k-1, m)``."""
        if k == 0:
            return {"after": (("prev", m),)}
        receivers = self._receivers[("fwd", k - 1, m)]
        return {"after": tuple(("step", "fwd", k - 1, m, n) for n in receivers)}

    def _build_backward(self, softmax: bool) -> None:
        L, P = self.n_layers, self.nparts
        for k in range(L, 0, -1):
            for m in range(P):
                layer_plan = self.plan.layers[k - 1][m]
                owners = layer_plan.senders() if k >= 2 else []
                receivers = self._destinations("bwd", k, m, owners)
                self._receivers[("bwd", k, m)] = receivers
                kwargs: dict = {}
                if k == L:
                    kwargs = self._after_previous_layer(k, m)
                    senders = layer_plan.senders()
                    forward_pieces, forward_sources, after = self._sources(
                        "fwd", k - 1, m, senders
                    )
                    kwargs["after"] += after
                    kwargs["forward_pieces"] = forward_pieces
                    kwargs["forward_route"] = Route(sources=forward_sources, local=())
                    kwargs["y"] = ("input", "y", m)
                    kwargs["y_rows"] = ("input", "y_rows", m)
                    if softmax:
                        kwargs["lse"] = ("step", "lse", L, 0, NO_RECEIVER)
                        kwargs["after"] += (("step", "fwd", L, m, SOFTMAX_STATS),)
                    pieces, sources = (), ()
                else:
                    kwargs["after"] = tuple(
                        ("step", "bwd", k + 1, m, n) for n in self._receivers[("bwd", k + 1, m)]
                    )
                    returning = sorted(self.plan.layers[k][m].send)
                    pieces, sources, after = self._sources("bwd", k + 1, m, returning)
                    kwargs["after"] += after
                kwargs["route"] = Route(sources=sources, local=self._local[("bwd", k, m)])
                self._add_part_tasks("bwd", k, m, receivers, backward_task, pieces, kwargs)

    def _add_part_tasks(self, phase, k, m, receivers, func, pieces, kwargs) -> None:
        """The tasks of ``(k, m)``: one per receiver (see ``separate_packing``)."""
        if self.separate_packing and receivers[0] >= 0:
            product = (m, k, NO_RECEIVER, *self._fixed(k, m))
            self.specs.append(_Spec(phase, k, m, NO_RECEIVER, func, product + pieces, kwargs))
            after = kwargs.get("after", ()) + (("step", phase, k, m, NO_RECEIVER),)
            kwargs = {**kwargs, "after": after}
        for h in receivers:
            args = (m, k, h, *self._fixed(k, m))
            route = kwargs["route"]
            if h >= 0:
                route = Route(route.sources, route.local, self._to[(phase, k, m, h)])
            task_kwargs = {**kwargs, "route": route}
            self.specs.append(_Spec(phase, k, m, h, func, args + pieces, task_kwargs))

    # ------------------------------------------------------------------ stamping
    def key(self, step: int, phase: str, k: int, m: int, n: int, i: int = 0) -> tuple:
        """Key of a task of microbatch ``i`` of ``step``."""
        return step_key(self.names[phase], step, k, m, n, i)

    def output_keys(self, step: int, microbatches: int = 1) -> list[tuple]:
        """Keys whose values the client collects: one per part and microbatch."""
        return [self.key(step, *spec, i) for spec in self.outputs for i in range(microbatches)]

    def graph(
        self, ctx: StepContext, inputs: dict, rows: list, previous: dict | None = None
    ) -> dict:
        """The task graph of step ``ctx.step``: every task of the template once per microbatch.

        Parameters
        ----------
        ctx : StepContext
        inputs : dict
            ``{("x", m): key, ("y", m): key}``: the keys of every part's data blocks.
        rows : list
            Per microbatch (``ctx.microbatches`` of them), the batch columns to take from the
            data blocks: an index array, a slice or ``None`` (all of them).
        previous : dict, optional
            Per part, the keys of the previous step's last tasks, which the first layer waits for.
        """
        step = ctx.step
        dsk = {}
        for i in range(ctx.microbatches):

            def resolve(ref, i=i):
                if ref is None:
                    return None
                if isinstance(ref, tuple) and ref and ref[0] == "step":
                    return TaskRef(self.key(step, *ref[1:], i))
                if isinstance(ref, tuple) and ref and ref[0] == "fixed":
                    return TaskRef(ref[1])
                if isinstance(ref, tuple) and ref and ref[0] == "input":
                    if ref[1] in ("x", "y"):
                        return TaskRef(inputs[(ref[1], ref[2])])
                    return rows[i]
                return ref

            for spec in self.specs:
                key = self.key(step, spec.phase, spec.k, spec.m, spec.n, i)
                args = [resolve(a) for a in spec.args]
                if spec.func is combine_logsumexp:
                    dsk[key] = Task(key, spec.func, *args)
                    continue
                kwargs = {"microbatch": i}
                for name, value in spec.kwargs.items():
                    if name in ("route", "forward_route"):
                        kwargs[name] = value
                    elif name in ("after", "forward_pieces"):
                        refs = []
                        for ref in value:
                            if isinstance(ref, tuple) and ref and ref[0] == "prev":
                                refs += [TaskRef(k) for k in (previous or {}).get(ref[1], ())]
                            elif (resolved := resolve(ref)) is not None:
                                refs.append(resolved)
                        kwargs[name] = List(*refs) if refs else ()
                    else:
                        kwargs[name] = resolve(value)
                dsk[key] = Task(key, spec.func, ctx, *args, **kwargs)
        return dsk


class StepPriority:
    """Scheduling priority of a step's tasks (the ``priority=`` annotation, evaluated per key).

    A worker with several ready tasks runs the earliest layer step first (the forward layers
    ``0..L``, then the backward layers ``L..1``), and within one layer step the lowest microbatch:
    the messages of microbatch ``i`` are sent, and travel, while microbatch ``i + 1`` computes.
    """

    def __init__(self, token: str, n_layers: int) -> None:
        self.names = phase_names(token)
        self.n_layers = n_layers

    def __call__(self, key) -> int:
        _, _, k, _, _, i = key
        if key[0] == self.names["bwd"]:
            position = 2 * self.n_layers + 1 - k
        else:
            position = k
        return -(position * PRIORITY_STRIDE + i)
