"""A model's state on a worker, owned by one plugin per model (docs/training.md, Worker state)."""

from __future__ import annotations

import threading
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import sparse

from dasknn.kernels.training import column_runs
from dasknn.optim import Optimizer, OptimizerSlots, ParamState
from dasknn.runtime.buffers import BufferPool
from dasknn.runtime.model_plugin import ModelPlugin
from dasknn.runtime.postbox import MESSAGE_TIMEOUT, Mailbox
from dasknn.runtime.posted import PostedTask

__all__ = [
    "TIMING_KINDS", "GradientSum", "MicrobatchStep", "ModelState", "PartLayer", "PartRead",
    "PartStep", "gcxs", "read_parts", "snapshot_bias", "snapshot_weight",
]

#: Seconds summed over tasks; ``update_background`` is the background thread's share of ``update``.
TIMING_KINDS = ("forward_product", "backward_product", "update", "update_background", "pack")


def gcxs(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, shape) -> sparse.GCXS:
    """A row-compressed GCXS matrix of the CSR arrays given (not copied)."""
    return sparse.GCXS((data, indices, indptr), shape=shape, compressed_axes=(0,))


class PartRead(NamedTuple):
    """One chunk as :meth:`ModelState.read` gives it: copies of its ``values`` and ``bias``, the
    last update's ``optimizer`` and its states (``None`` before any), and the chunk's fixed
    pattern (renumbered rows, the part's columns)."""

    values: np.ndarray
    bias: np.ndarray
    optimizer: Optimizer | None
    weight_state: ParamState | None
    bias_state: ParamState | None
    indptr: np.ndarray
    indices: np.ndarray


@dataclass
class PartLayer:
    """One part's chunk ``(n_{k-1}, c_m)`` of one layer: the fixed CSR structure ``indptr``,
    ``indices``; ``values`` and ``bias``, updated in place under ``lock``; ``slots``, the last
    update's optimizer and its state of ``"weights"`` and ``"bias"``; the forward kernel's view of
    the pattern once made (:meth:`column_view`)."""

    shape: tuple[int, int]
    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    bias: np.ndarray
    slots: OptimizerSlots = field(default_factory=OptimizerSlots)
    lock: threading.Lock = field(default_factory=threading.Lock)
    columns: tuple | None = field(default=None, repr=False)

    def column_view(self, indptr: np.ndarray, groups: np.ndarray) -> tuple:
        """:func:`~dasknn.kernels.training.column_runs` ``(bounds, rows, order)`` of the chunk
        without its empty rows (``indptr``: the plan's) cut at the plan's ``groups``; made once
        (the pattern and plan are fixed while the layer is installed)."""
        if self.columns is None:
            self.columns = column_runs(indptr, self.indices, self.shape[1], groups)
        return self.columns

    def apply(self, optimizer: Optimizer, grad_w: np.ndarray, grad_b: np.ndarray) -> None:
        """One step of ``optimizer`` (its state starts afresh when the optimizer changed)."""
        with self.lock:
            self.slots.update(optimizer, "weights", self.values, grad_w)
            self.slots.update(optimizer, "bias", self.bias, grad_b)


@dataclass
class MicrobatchStep:
    """One part's values of one microbatch: ``forward[k] = (x_in, z, a)``, ``partial[k]`` (the
    partial sums for layer ``k-1``), the layers whose backward is done, the loss share."""

    forward: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    partial: dict[int, np.ndarray] = field(default_factory=dict)
    backward_done: set[int] = field(default_factory=set)
    loss: float = 0.0


@dataclass
class GradientSum:
    """A layer's weight and bias gradients summed over ``count`` microbatches."""

    count: int
    weights: np.ndarray
    bias: np.ndarray


@dataclass
class PartStep:
    """One part's values in one step: :class:`MicrobatchStep` per microbatch, :class:`GradientSum`
    per layer until every microbatch's is in, the update-thread jobs, the microbatches whose
    layer 1 is done (``finished``), and the arrays taken from the worker's
    :class:`~dasknn.runtime.buffers.BufferPool` (``buffers``, given back when the step is
    dropped at its end)."""

    microbatches: dict[int, MicrobatchStep] = field(default_factory=dict)
    gradients: dict[int, GradientSum] = field(default_factory=dict)
    updates: list[Future] = field(default_factory=list)
    finished: int = 0
    lock: threading.RLock = field(default_factory=threading.RLock)
    buffers: list[np.ndarray] = field(default_factory=list)

    def microbatch(self, i: int) -> MicrobatchStep:
        """The values of microbatch ``i`` (created on first use; call with ``lock`` held)."""
        return self.microbatches.setdefault(i, MicrobatchStep())


class ModelState(ModelPlugin):
    """Worker plugin owning one distributed model's parts, steps in flight, mailbox and timings.

    Parameters
    ----------
    token : str
        The model's token; the plugin is registered as :meth:`plugin_name` of it.
    first_step : int
        The first step of this placement; earlier or dropped steps raise ``RuntimeError``.
    """

    kind = "model"

    def __init__(self, token: str, first_step: int = 1) -> None:
        super().__init__(token)
        self.first_step = first_step

    def setup(self, worker) -> None:
        self.address = worker.address
        self.layers: dict[tuple[int, int], PartLayer] = {}
        self.steps: dict[tuple[int, int], PartStep] = {}
        self._latest_step = 0  # the highest step number begun here
        self.mailbox = Mailbox()
        #: The training steps' temporaries, reused from step to step.
        self.buffers = BufferPool()
        #: ``messages="posted"``: the step task under way and the key a failing worker posts to.
        self.posting: PostedTask | None = None
        #: The pooled arrays whose rows the step task under way posts (:meth:`posted_array`).
        self._posted: list[np.ndarray] = []
        self.failed = None
        self.timings: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()
        self._timings_lock = threading.Lock()
        #: The model's background update thread.
        self.updater = ThreadPoolExecutor(1, thread_name_prefix=f"dasknn-update-{self.token}")

    def teardown(self, worker) -> None:
        self.updater.shutdown(wait=True, cancel_futures=True)
        self.clear_steps()
        self.mailbox.close()  # a step task begun before the removal does not wait
        self.layers.clear()

    def install(self, chunks: dict, states: dict | None = None) -> int:
        """Own copies of ``{(k, m): (CSR chunk, bias)}`` and of the optimizer states
        ``{(k, m): (optimizer, weight state, bias state)}`` given; returns the count."""
        for (k, m), (chunk, bias) in chunks.items():
            optimizer, weight_state, bias_state = (states or {}).get((k, m), (None, None, None))
            held = {"weights": weight_state, "bias": bias_state} if optimizer is not None else {}
            self.layers[(k, m)] = PartLayer(
                tuple(chunk.shape), np.array(chunk.indptr), np.array(chunk.indices),
                np.array(chunk.data), np.array(bias), OptimizerSlots(optimizer, held),
            )  # fmt: skip
        return len(chunks)

    def read(self) -> dict[tuple[int, int], PartRead]:
        """Every chunk held here, ``{(k, m): PartRead}`` (values and states copied)."""
        parts = {}
        for key, layer in list(self.layers.items()):
            with layer.lock:
                slots = layer.slots.copy()
                parts[key] = PartRead(
                    layer.values.copy(), layer.bias.copy(), slots.optimizer,
                    slots.states.get("weights"), slots.states.get("bias"),
                    layer.indptr, layer.indices,
                )  # fmt: skip
        return parts

    def part_step(self, step: int, part: int) -> PartStep:
        """The values of ``part`` in ``step``; ``RuntimeError`` for a step before ``first_step``."""
        with self._lock:
            if step < self.first_step:
                raise RuntimeError(
                    f"step {step} was dropped on this worker or belongs to an earlier placement "
                    f"of the model (steps from {self.first_step} on run here)"
                )
            self._latest_step = max(self._latest_step, step)
            return self.steps.setdefault((step, part), PartStep())

    def drop_part_step(self, step: int, part: int) -> None:
        """Forget ``part``'s intermediate values of ``step`` (its last task is done) and give
        its arrays back to :attr:`buffers`."""
        with self._lock:
            dropped = self.steps.pop((step, part), None)
        if dropped is not None:
            self.buffers.give(dropped.buffers)

    def step_array(self, part_step: PartStep, shape: tuple[int, ...], dtype) -> np.ndarray:
        """An uninitialized array of ``shape`` and ``dtype`` from :attr:`buffers`, held by
        ``part_step`` until its end (from either thread)."""
        array = self.buffers.take(shape, dtype)
        part_step.buffers.append(array)
        return array

    def posted_array(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """An uninitialized array from :attr:`buffers` for values the step task under way posts
        (``messages="posted"``), held until :meth:`end_posting`."""
        array = self.buffers.take(shape, dtype)
        with self._lock:
            self._posted.append(array)
        return array

    def end_posting(self, delivered: bool) -> None:
        """Release the arrays of :meth:`posted_array`: back to :attr:`buffers` once every post
        of the step task is ``delivered`` (acknowledged by its receiver); otherwise (the task
        failed, a post may still be read) left to Python."""
        with self._lock:
            posted, self._posted = self._posted, []
        if delivered:
            self.buffers.give(posted)

    def clear_steps(self) -> int:
        """Drop the steps in flight and the mailbox, refuse those begun; returns the count."""
        with self._lock:
            dropped = len(self.steps)
            self.steps.clear()
            self.first_step = max(self.first_step, self._latest_step + 1)
        self.mailbox.clear()
        return dropped

    def deliver(self, key: tuple, rows: np.ndarray) -> None:
        """Leave the message ``key`` in the mailbox (from any thread or the event loop)."""
        self.mailbox.deliver(key, rows)

    def hold_receipt(self, key: tuple, sender: str, nbytes: int) -> None:
        """Keep a posted message's transfer report for the step task (the postbox calls it)."""
        self.mailbox.hold_receipt(key, sender, nbytes)

    def send(self, address: str, key: tuple, rows) -> None:
        """Leave the message ``key`` in the mailbox if ``address`` is this worker's, else post it
        there from the step task under way (:attr:`posting`)."""
        if address == self.address:
            self.mailbox.deliver(key, rows)
        else:
            self.posting.post((address,), key, rows)

    def take(self, key: tuple, timeout: float = MESSAGE_TIMEOUT) -> np.ndarray:
        """:meth:`Mailbox.take <dasknn.runtime.postbox.Mailbox.take>` of ``key``, raising the
        error another worker posted under :attr:`failed` if it failed in the step."""
        return self.mailbox.take(key, self.failed, timeout=timeout)

    def add_time(self, kind: str, seconds: float) -> None:
        """Add to the time spent on ``kind`` of work (from either thread)."""
        with self._timings_lock:
            self.timings[kind] += seconds

    def read_timings(self) -> dict[str, float]:
        """Seconds spent per kind of work (:data:`TIMING_KINDS`)."""
        with self._timings_lock:
            return {kind: float(self.timings.get(kind, 0.0)) for kind in TIMING_KINDS}

    def reset_timings(self) -> None:
        """Zero the timings."""
        with self._timings_lock:
            self.timings.clear()


def read_parts(dask_worker, token: str) -> dict:
    """For ``Client.run``: :meth:`ModelState.read` on ``dask_worker`` (call it between steps)."""
    return ModelState.on_worker(token, dask_worker).read()


def snapshot_weight(token: str, k: int, m: int) -> sparse.GCXS:
    """Task: a new GCXS chunk holding the current weights of part ``m`` in layer ``k``."""
    layer = ModelState.on_worker(token).layers[(k, m)]
    with layer.lock:
        data = layer.values.copy()
    return gcxs(data, layer.indices.copy(), layer.indptr.copy(), layer.shape)


def snapshot_bias(token: str, k: int, m: int) -> np.ndarray:
    """Task: a copy of the current bias of part ``m`` in layer ``k``."""
    layer = ModelState.on_worker(token).layers[(k, m)]
    with layer.lock:
        return layer.bias.copy()
