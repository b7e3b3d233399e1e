"""Task graphs of a training step and of a forward pass, built once per network and partition.

Keys are ``(f"dasknn-{phase}-{token}", step, layer, part, receiver, microbatch)``, ``phase`` one of
``fwd``, ``bwd``, ``lse``; ``receiver`` is the destination worker's index, ``-1`` for none, ``-2``
an output block, ``-3`` softmax statistics. See docs/training.md (Task graphs).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter

from dask.task_spec import List, Task, TaskRef

from dasknn.model_parallel._layout import Layout
from dasknn.model_parallel._plan import CommPlan
from dasknn.model_parallel._steps import (
    NO_RECEIVER,
    OUTPUT_BLOCK,
    SOFTMAX_STATS,
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

#: Microbatch numbers stay below this in a priority (:class:`StepPriority`).
PRIORITY_STRIDE = 2**31


@dataclass(frozen=True)
class _Spec:
    """A template task; refs: ``("step", phase, k, m, n)``, ``("prev", m)``, ``("fixed", key)``,
    ``("input", name, m)``."""

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
        ``True``: a product task per part and layer, then one pack task per message (two scheduler
        round trips a layer instead of one), to measure what fusing them saves. Default ``False``.
    """

    def __init__(
        self, token: str, plan: CommPlan, layout: Layout, kind: str, softmax: bool = False,
        separate_packing: bool = False,
    ) -> None:  # fmt: skip
        self.separate_packing = separate_packing
        self.names = phase_names(token)
        self.plan, self.n_layers, self.nparts = plan, plan.n_layers, plan.nparts
        self.specs: list[_Spec] = []
        self._plan_keys = layout.plan_keys
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

    def _fixed(self, k: int, m: int) -> tuple:
        """``(plan, next_plan)`` refs of ``(k, m)`` (``None`` where absent)."""
        keys = self._plan_keys
        plan = ("fixed", keys[k - 1][m]) if k else None
        return plan, ("fixed", keys[k][m]) if k < self.n_layers else None

    def _destinations(self, phase: str, k: int, m: int, receivers: list[int]) -> list[int]:
        """Task receivers of ``(phase, k, m)``: one per other worker hosting ``receivers``."""
        home = self._worker[m]
        local = tuple(n for n in receivers if self._worker[n] == home)
        self._local[(phase, k, m)] = local
        dests = sorted({self._worker[n] for n in receivers} - {home})
        for h in dests:
            self._to[(phase, k, m, h)] = tuple(n for n in receivers if self._worker[n] == h)
        return dests or [NO_RECEIVER]

    def _rows(self, phase: str, k: int, sender: int, n: int) -> int:
        """Rows of the message of ``sender`` for part ``n`` in layer ``k``."""
        if phase == "fwd":
            return len(self.plan.layers[k][sender].send[n])
        groups = self.plan.layers[k - 1][sender].groups
        return int(groups[n + 1] - groups[n])

    def _sources(self, phase: str, k: int, m: int, senders: list[int]) -> tuple:
        """``(pieces, route sources, extra after)`` of part ``m`` receiving from ``senders``."""
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
                    receivers = self._destinations("fwd", k, m, sorted(self.plan.layers[k][m].send))
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
                    kwargs.update(x0=("input", "x", m), x0_rows=("input", "x_rows", m))
                if k == L and train:
                    kwargs.update(y=("input", "y", m), y_rows=("input", "y_rows", m))
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
                    forward_pieces, sources, after = self._sources("fwd", k - 1, m, senders)
                    kwargs["after"] += after
                    kwargs.update(forward_pieces=forward_pieces, forward_route=Route(sources))
                    kwargs.update(y=("input", "y", m), y_rows=("input", "y_rows", m))
                    if softmax:
                        kwargs["lse"] = ("step", "lse", L, 0, NO_RECEIVER)
                        kwargs["after"] += (("step", "fwd", L, m, SOFTMAX_STATS),)
                    pieces, sources = (), ()
                else:
                    returning = sorted(self.plan.layers[k][m].send)
                    pieces, sources, after = self._sources("bwd", k + 1, m, returning)
                    previous = self._receivers[("bwd", k + 1, m)]
                    kwargs["after"] = tuple(("step", "bwd", k + 1, m, n) for n in previous) + after
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

    def key(self, step: int, phase: str, k: int, m: int, n: int, i: int = 0) -> tuple:
        """Key of a task of microbatch ``i`` of ``step``."""
        return step_key(self.names[phase], step, k, m, n, i)

    def output_keys(self, step: int, microbatches: int = 1) -> list[tuple]:
        """Keys whose values the client collects: one per part and microbatch."""
        return [self.key(step, *spec, i) for spec in self.outputs for i in range(microbatches)]

    def graph(self, ctx: StepContext, inputs: dict, rows: list, previous: dict | None = None):
        """The task graph of step ``ctx.step``: every task of the template once per microbatch.

        Parameters
        ----------
        ctx : StepContext
        inputs : dict
            ``{("x", m): key, ("y", m): key}``: the keys of every part's data blocks.
        rows : list
            Per microbatch, the batch columns to take: an index array, a slice or ``None`` (all).
        previous : dict, optional
            Per part, the keys of the previous step's last tasks, which the first layer waits for.
        """
        step, previous = ctx.step, previous or {}

        def resolve(ref, i: int):
            if not (isinstance(ref, tuple) and ref):
                return ref  # None or a Route
            if ref[0] == "step":
                return TaskRef(self.key(step, *ref[1:], i))
            if ref[0] == "fixed":
                return TaskRef(ref[1])
            if ref[0] == "input":
                return TaskRef(inputs[ref[1:]]) if ref[1] in ("x", "y") else rows[i]
            return ref

        def resolve_all(refs, i: int) -> List | tuple:
            resolved = []
            for ref in refs:
                if ref[0] == "prev":
                    resolved += [TaskRef(k) for k in previous.get(ref[1], ())]
                else:
                    resolved.append(resolve(ref, i))
            return List(*resolved) if resolved else ()

        dsk = {}
        for i in range(ctx.microbatches):
            for spec in self.specs:
                key = self.key(step, spec.phase, spec.k, spec.m, spec.n, i)
                args = [resolve(a, i) for a in spec.args]
                if spec.func is combine_logsumexp:
                    dsk[key] = Task(key, spec.func, *args)
                    continue
                kwargs = {"microbatch": i}
                for name, value in spec.kwargs.items():
                    many = name in ("after", "forward_pieces")
                    kwargs[name] = resolve_all(value, i) if many else resolve(value, i)
                dsk[key] = Task(key, spec.func, ctx, *args, **kwargs)
        return dsk


class StepPriority:
    """Scheduling priority of a step's tasks (the ``priority=`` annotation): the earliest layer step
    first (forward ``0..L``, backward ``L..1``), then the lowest microbatch."""

    def __init__(self, token: str, n_layers: int) -> None:
        self.names = phase_names(token)
        self.n_layers = n_layers

    def __call__(self, key) -> int:
        _, _, k, _, _, i = key
        position = 2 * self.n_layers + 1 - k if key[0] == self.names["bwd"] else k
        return -(position * PRIORITY_STRIDE + i)
