"""Task graphs of a training step and of a forward pass, built once per network and partition.

The structure of a step (which tasks exist, what each one depends on, which part runs it) is
computed once into a :class:`StepTemplate`; every batch only stamps it with fresh keys carrying the
step number and submits the whole step at once. Keys are tuples

    ``(f"dasknn-{phase}-{token}", step, layer, part, receiver)``

with ``phase`` ``fwd`` (the task of ``(layer, part)`` that returns the activations ``receiver``
needs for layer ``layer + 1``), ``bwd`` (the partial sums of layer ``layer`` returned to
``receiver``, the owner of those rows; the part's weight update of the layer starts in the
background when they are computed) or ``lse`` (softmax statistics). ``receiver`` is ``-1``
for a task that sends nothing, ``-2`` for an output block, ``-3`` for softmax statistics. Every
task runs on the worker of ``part`` (:class:`PartPlacement`), so the only values Dask moves
between workers are the packed messages.
"""

from __future__ import annotations

from dataclasses import dataclass

from dask._task_spec import Task, TaskRef, Tuple

from dasknn.parallel.layout import Layout
from dasknn.parallel.plan import CommPlan
from dasknn.parallel.steps import (
    StepContext,
    backward_task,
    combine_logsumexp,
    forward_task,
)

__all__ = ["PartPlacement", "StepTemplate", "message_phase", "phase_names"]

NO_RECEIVER = -1
OUTPUT_BLOCK = -2
SOFTMAX_STATS = -3


def phase_names(token: str) -> dict[str, str]:
    """Key names of the tasks of a model: ``{"fwd": ..., "bwd": ..., "lse": ...}``."""
    return {phase: f"dasknn-{phase}-{token}" for phase in ("fwd", "bwd", "lse")}


def message_phase(key) -> tuple[str, str, int] | None:
    """``(token, phase, layer)`` of a message key of a dasknn step, ``None`` for other keys.

    ``phase`` is ``"forward"`` (activations; ``layer`` is the layer that consumes them),
    ``"backward"`` (partial sums of ``layer``) or ``"other"`` (softmax statistics and anything
    else that is not a layer message).
    """
    if not (isinstance(key, tuple) and len(key) == 5 and isinstance(key[0], str)):
        return None
    name = key[0]
    if not name.startswith("dasknn-"):
        return None
    kind, _, token = name[len("dasknn-") :].partition("-")
    if kind in ("fwd", "bwd") and key[4] < 0:  # not a layer message (softmax statistics)
        return token, "other", int(key[2])
    if kind == "fwd":
        return token, "forward", int(key[2]) + 1
    if kind == "bwd":
        return token, "backward", int(key[2])
    if kind == "lse":
        return token, "other", int(key[2])
    return None


class PartPlacement:
    """Worker restriction of a step's tasks: the worker of the part in ``key[3]``.

    Used as the ``workers=`` annotation (evaluated per key by the scheduler) together with
    ``allow_other_workers=False``.
    """

    def __init__(self, part_workers: list[str]):
        self.part_workers = list(part_workers)

    def __call__(self, key) -> list[str]:
        return [self.part_workers[key[3]]]


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
        self._forward_receivers: dict[tuple[int, int], list[int]] = {}
        self._build_forward(train=kind == "train", softmax=softmax)
        if kind == "train":
            self._build_backward(softmax)
            self.outputs = [("bwd", 1, m, NO_RECEIVER) for m in range(self.nparts)]
        else:
            self.outputs = [("fwd", self.n_layers, m, OUTPUT_BLOCK) for m in range(self.nparts)]

    # ------------------------------------------------------------------ structure
    def _fixed(self, k: int, m: int) -> tuple:
        """``(plan, weight, bias, next_plan)`` refs of ``(k, m)`` (``None`` where absent)."""
        layout = self._layout
        next_plan = ("fixed", layout.plan_keys[k][m]) if k < self.n_layers else None
        if k == 0:
            return None, None, None, next_plan
        return (
            ("fixed", layout.plan_keys[k - 1][m]),
            ("fixed", layout.weight_key(k, m)),
            ("fixed", layout.bias_key(k, m)),
            next_plan,
        )

    def _build_forward(self, train: bool, softmax: bool) -> None:
        L, P = self.n_layers, self.nparts
        for k in range(0, L + 1):
            for m in range(P):
                if k < L:
                    receivers = sorted(self.plan.layers[k][m].send) or [NO_RECEIVER]
                elif not train:
                    receivers = [OUTPUT_BLOCK]
                elif softmax:
                    receivers = [SOFTMAX_STATS]
                else:
                    continue
                self._forward_receivers[(k, m)] = receivers
                pieces = ()
                if k >= 1:
                    pieces = tuple(
                        ("step", "fwd", k - 1, s, m) for s in self.plan.layers[k - 1][m].senders()
                    )
                kwargs = self._after_previous_layer(k, m)
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
        receivers = self._forward_receivers[(k - 1, m)]
        return {"after": tuple(("step", "fwd", k - 1, m, n) for n in receivers)}

    def _build_backward(self, softmax: bool) -> None:
        L, P = self.n_layers, self.nparts
        backward_receivers: dict[tuple[int, int], list[int]] = {}
        for k in range(L, 0, -1):
            for m in range(P):
                layer_plan = self.plan.layers[k - 1][m]
                receivers = (layer_plan.senders() if k >= 2 else []) or [NO_RECEIVER]
                backward_receivers[(k, m)] = receivers
                kwargs: dict = {}
                if k == L:
                    kwargs = self._after_previous_layer(k, m)
                    kwargs["forward_pieces"] = tuple(
                        ("step", "fwd", k - 1, s, m) for s in layer_plan.senders()
                    )
                    kwargs["y"] = ("input", "y", m)
                    kwargs["y_rows"] = ("input", "y_rows", m)
                    if softmax:
                        kwargs["lse"] = ("step", "lse", L, 0, NO_RECEIVER)
                        kwargs["after"] += (("step", "fwd", L, m, SOFTMAX_STATS),)
                    pieces: tuple = ()
                else:
                    kwargs["after"] = tuple(
                        ("step", "bwd", k + 1, m, n) for n in backward_receivers[(k + 1, m)]
                    )
                    pieces = tuple(
                        ("step", "bwd", k + 1, s, m)
                        for s in sorted(self.plan.layers[k][m].send)
                    )
                self._add_part_tasks("bwd", k, m, receivers, backward_task, pieces, kwargs)

    def _add_part_tasks(self, phase, k, m, receivers, func, pieces, kwargs) -> None:
        """The tasks of ``(k, m)``: one per receiver (see ``separate_packing``)."""
        if self.separate_packing and receivers[0] >= 0:
            product = (m, k, NO_RECEIVER, *self._fixed(k, m))
            self.specs.append(_Spec(phase, k, m, NO_RECEIVER, func, product + pieces, kwargs))
            after = kwargs.get("after", ()) + (("step", phase, k, m, NO_RECEIVER),)
            kwargs = {**kwargs, "after": after}
        for n in receivers:
            args = (m, k, n, *self._fixed(k, m))
            self.specs.append(_Spec(phase, k, m, n, func, args + pieces, kwargs))

    # ------------------------------------------------------------------ stamping
    def key(self, step: int, phase: str, k: int, m: int, n: int) -> tuple:
        """Key of a task of ``step``."""
        return (self.names[phase], step, k, m, n)

    def output_keys(self, step: int) -> list[tuple]:
        """Keys whose values the client collects: one per part."""
        return [self.key(step, *spec) for spec in self.outputs]

    def graph(
        self, ctx: StepContext, inputs: dict, previous: list | None = None
    ) -> dict:
        """The task graph of step ``ctx.step``.

        Parameters
        ----------
        ctx : StepContext
        inputs : dict
            ``{("x", m): key, ("x_rows", m): rows or None, ("y", m): ..., ("y_rows", m): ...}``:
            the keys of the data blocks of every part and the batch rows to take from them.
        previous : list of keys, optional
            The per-part last keys of the previous step, which the first layer waits for.
        """
        step = ctx.step

        def resolve(ref):
            if ref is None:
                return None
            if isinstance(ref, tuple) and ref and ref[0] == "step":
                return TaskRef(self.key(step, *ref[1:]))
            if isinstance(ref, tuple) and ref and ref[0] == "fixed":
                return TaskRef(ref[1])
            if isinstance(ref, tuple) and ref and ref[0] == "input":
                value = inputs[(ref[1], ref[2])]
                return TaskRef(value) if ref[1] in ("x", "y") else value
            if isinstance(ref, tuple) and ref and ref[0] == "prev":
                return TaskRef(previous[ref[1]]) if previous else None
            return ref

        dsk = {}
        for spec in self.specs:
            key = self.key(step, spec.phase, spec.k, spec.m, spec.n)
            args = [resolve(a) for a in spec.args]
            kwargs = {}
            for name, value in spec.kwargs.items():
                if name in ("after", "forward_pieces"):
                    refs = [r for r in (resolve(v) for v in value) if r is not None]
                    kwargs[name] = Tuple(*refs) if refs else ()
                else:
                    kwargs[name] = resolve(value)
            if spec.func is combine_logsumexp:
                dsk[key] = Task(key, spec.func, *args)
            else:
                dsk[key] = Task(key, spec.func, ctx, *args, **kwargs)
        return dsk
