"""What a distributed model keeps on a worker, owned by one worker plugin per model.

:class:`ModelState` is a :class:`~dasknn.runtime.model_plugin.ModelPlugin` (``kind`` ``"model"``)
registered by :class:`~dasknn.model_parallel.DistributedSparseMLP` under
:meth:`ModelState.plugin_name` of the model's token and removed by its ``close()``. On every
worker it owns, for the parts placed there:

- per layer and part, the weight chunk's stored values, its bias and the optimizer state of both
  (:class:`PartLayer`): the training steps update these and nothing else, so no value Dask holds is
  ever changed after its task returned (spilling, replicating or rebalancing Dask's data cannot
  lose an update);
- the intermediate values of the steps in flight (:class:`PartStep`), the mailbox of messages
  between parts on this worker, the time spent per kind of work, the background thread that
  applies the weight updates of steps run as a task per layer step, and the queue of updates
  that a step run as one task per worker (``messages="posted"``) applies on its own thread while
  it would otherwise wait for a message (:meth:`ModelState.queue_idle`).

The step tasks (:mod:`dasknn.model_parallel._steps`) find it with :meth:`ModelState.on_worker`.
The dask arrays a user reads (``dist.weights``, ``dist.biases``) are snapshots: tasks that copy
the owned values into fresh pydata-sparse chunks (:func:`snapshot_weight`, :func:`snapshot_bias`).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import sparse

from dasknn.optim import Optimizer, OptimizerSlots
from dasknn.runtime.model_plugin import ModelPlugin
from dasknn.runtime.postbox import MESSAGE_TIMEOUT, Mailbox, pack_envelope

__all__ = [
    "TIMING_KINDS",
    "GradientSum",
    "MicrobatchStep",
    "ModelState",
    "PartLayer",
    "PartStep",
    "install_parts",
    "read_parts",
    "snapshot_bias",
    "snapshot_weight",
]

#: Timing categories recorded by the workers (seconds, summed over tasks); ``update_background``
#: is the part of ``update`` run by the background thread, beside the task thread.
TIMING_KINDS = ("forward_product", "backward_product", "update", "update_background", "pack")


@dataclass
class PartLayer:
    """One part's chunk of one layer: the parameters and their optimizer state.

    Attributes
    ----------
    shape : (int, int)
        Shape ``(n_{k-1}, c_m)`` of the chunk.
    indptr, indices : numpy.ndarray
        The chunk's CSR structure (fixed: training never changes the pattern).
    values : numpy.ndarray
        The stored weights, updated in place by training.
    bias : numpy.ndarray
        The part's bias, updated in place by training.
    slots : OptimizerSlots
        The optimizer of the last update and its state of ``"weights"`` (the values) and
        ``"bias"``.
    lock : threading.Lock
        Held while the parameters are updated or copied.
    """

    shape: tuple[int, int]
    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    bias: np.ndarray
    slots: OptimizerSlots = field(default_factory=OptimizerSlots)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def apply(self, optimizer: Optimizer, grad_w: np.ndarray, grad_b: np.ndarray) -> None:
        """One step of ``optimizer`` from the gradients (its state is started afresh when it
        differs from the previous step's optimizer)."""
        with self.lock:
            self.slots.update(optimizer, "weights", self.values, grad_w)
            self.slots.update(optimizer, "bias", self.bias, grad_b)


@dataclass
class MicrobatchStep:
    """One part's intermediate values for one microbatch (a row block of the step's batch)."""

    forward: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    partial: dict[int, np.ndarray] = field(default_factory=dict)
    backward_done: set[int] = field(default_factory=set)
    loss: float = 0.0


@dataclass
class GradientSum:
    """A layer's weight and bias gradients summed over the microbatches accumulated so far."""

    count: int
    weights: np.ndarray
    bias: np.ndarray


@dataclass
class PartStep:
    """One part's intermediate values during one step.

    Attributes
    ----------
    microbatches : dict
        Microbatch number -> :class:`MicrobatchStep`.
    gradients : dict
        Layer -> :class:`GradientSum` until every microbatch's gradient of the layer is in it
        (used by the update thread only, or by the task thread once the updates are waited for;
        with ``messages="posted"`` by the task thread only).
    updates : list of Future
        The update-thread jobs of the step.
    finished : int
        Microbatches whose layer 1 is done.
    """

    microbatches: dict[int, MicrobatchStep] = field(default_factory=dict)
    gradients: dict[int, GradientSum] = field(default_factory=dict)
    updates: list[Future] = field(default_factory=list)
    finished: int = 0
    lock: threading.RLock = field(default_factory=threading.RLock)

    def microbatch(self, i: int) -> MicrobatchStep:
        """The values of microbatch ``i`` (created on first use; call with ``lock`` held)."""
        return self.microbatches.setdefault(i, MicrobatchStep())


class ModelState(ModelPlugin):
    """Worker plugin owning one distributed model's state on a worker (see the module docstring).

    Parameters
    ----------
    token : str
        The model's token; the plugin is registered as :meth:`plugin_name` of it.
    first_step : int
        The first step number this placement of the model runs: a task of an earlier step (one
        still running when the model was placed again after a lost worker) is refused, so it
        cannot change the values placed afresh. :meth:`clear_steps` moves it past every step
        begun here, so a task of a dropped step fails with a ``RuntimeError`` instead of
        starting its part's values afresh (and failing on a missing layer, as ``KeyError``).
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
        #: Messages for the parts on this worker, by step key ``(name, step, layer, sender,
        #: receiver part, microbatch)`` (:func:`dasknn.runtime.keys.step_key`): left by parts on
        #: this worker, or posted by other workers (``messages="posted"``); also the jobs the
        #: task thread runs while a message it takes has not arrived (:meth:`queue_idle`).
        self.mailbox = Mailbox()
        self._posts: list = []
        #: ``messages="posted"``: the postbox actor of every worker (address -> handle), set by
        #: the step task.
        self.postboxes: dict = {}
        self.timings: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()
        self._timings_lock = threading.Lock()
        self._updater = ThreadPoolExecutor(1, thread_name_prefix=f"dasknn-update-{self.token}")

    def teardown(self, worker) -> None:
        self._updater.shutdown(wait=True, cancel_futures=True)
        self.clear_steps()
        self.layers.clear()

    # ---------------------------------------------------------------- parameters
    def install(self, chunks: dict, states: dict | None = None) -> None:
        """Own copies of ``{(k, m): (GCXS chunk, bias)}``, with the optimizer and its state
        ``{(k, m): (optimizer, weight state, bias state)}`` where given."""
        for (k, m), (chunk, bias) in chunks.items():
            optimizer, weight_state, bias_state = (states or {}).get((k, m), (None, None, None))
            held = {"weights": weight_state, "bias": bias_state} if optimizer is not None else {}
            self.layers[(k, m)] = PartLayer(
                shape=tuple(chunk.shape),
                indptr=np.array(chunk.indptr),
                indices=np.array(chunk.indices),
                values=np.array(chunk.data),
                bias=np.array(bias),
                slots=OptimizerSlots(optimizer, held),
            )

    def read(self) -> dict:
        """Copies of every owned part: ``{(k, m): (values, bias, optimizer, weight state, bias
        state)}``."""
        parts = {}
        for key, layer in list(self.layers.items()):
            with layer.lock:
                slots = layer.slots.copy()
                parts[key] = (
                    layer.values.copy(),
                    layer.bias.copy(),
                    slots.optimizer,
                    slots.states.get("weights"),
                    slots.states.get("bias"),
                )
        return parts

    # ---------------------------------------------------------------- steps
    def part_step(self, step: int, part: int) -> PartStep:
        """The intermediate values of ``part`` in ``step`` (created on first use);
        ``RuntimeError`` for a step before :attr:`first_step`."""
        with self._lock:
            if step < self.first_step:
                raise RuntimeError(
                    f"step {step} was dropped on this worker or belongs to an earlier placement "
                    f"of the model (steps from {self.first_step} on run here)"
                )
            self._latest_step = max(self._latest_step, step)
            return self.steps.setdefault((step, part), PartStep())

    def drop_part_step(self, step: int, part: int) -> None:
        """Forget ``part``'s intermediate values of ``step``."""
        with self._lock:
            self.steps.pop((step, part), None)

    def clear_steps(self) -> int:
        """Forget every step in flight and the mailbox, and refuse the steps begun so far from
        now on (a task still running or queued for one fails instead of computing from missing
        values); returns the number of part states."""
        with self._lock:
            dropped = len(self.steps)
            self.steps.clear()
            self.first_step = max(self.first_step, self._latest_step + 1)
        self.mailbox.clear()
        self._posts = []
        return dropped

    # ---------------------------------------------------------------- messages
    def deliver(self, key: tuple, rows: np.ndarray) -> None:
        """Leave the message ``key`` in the mailbox (from any thread or the event loop)."""
        self.mailbox.deliver(key, rows)

    def hold_receipt(self, key: tuple, sender: str, nbytes: int) -> None:
        """Keep the transfer report of a posted message for the step task that reports them all
        (the postbox calls it)."""
        self.mailbox.hold_receipt(key, sender, nbytes)

    def post(self, address: str, key: tuple, rows: np.ndarray) -> None:
        """Post the message ``key`` to the mailbox of the worker at ``address`` through its
        postbox actor (key and sender in one envelope); :meth:`check_posts` raises if a post
        failed."""
        envelope = pack_envelope(key, self.address)
        self._posts.append(self.postboxes[address].post_packed(envelope, rows))

    def check_posts(self) -> None:
        """Wait until every message posted so far is delivered; re-raise a failed post's error,
        and raise ``RuntimeError`` if :meth:`clear_steps` drops the steps in flight meanwhile (a
        post to a worker that has left waits for it to come back, which it never does)."""
        posts, self._posts = self._posts, []
        self.mailbox.wait_posted(posts)

    def take(self, key: tuple, timeout: float = MESSAGE_TIMEOUT) -> np.ndarray:
        """Remove and return the message ``key``, waiting for it up to ``timeout`` seconds
        (``TimeoutError`` naming the key after that); ``RuntimeError`` if :meth:`clear_steps`
        drops the steps in flight meanwhile (a step failed elsewhere).

        While the message has not arrived, the jobs of :meth:`queue_idle` run first, one at a
        time, in the order they were queued; the wait starts when none is left.
        """
        return self.mailbox.take(key, timeout=timeout)

    def queue_idle(self, func, *args) -> None:
        """Queue ``func(*args)`` for the calling task thread: it runs while a message that thread
        takes has not arrived (:meth:`take`), or at the latest in :meth:`run_idle`."""
        self.mailbox.queue_idle(func, *args)

    def run_idle(self) -> None:
        """Run every job :meth:`queue_idle` left, in the order they were queued."""
        self.mailbox.run_idle()

    def submit_update(self, func, *args) -> Future:
        """Run ``func(*args)`` on this model's background update thread."""
        return self._updater.submit(func, *args)

    # ---------------------------------------------------------------- timings
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


def install_parts(dask_worker, token: str, chunks: dict, states: dict | None = None) -> int:
    """For ``Client.run``: hand ``{(k, m): (GCXS chunk, bias)}`` (and optimizer states, see
    :meth:`ModelState.install`) to the model's plugin on ``dask_worker``, which keeps copies;
    returns the number of chunks."""
    ModelState.on_worker(token, dask_worker).install(chunks, states)
    return len(chunks)


def read_parts(dask_worker, token: str) -> dict:
    """For ``Client.run``: copies of the parts the model's plugin owns on ``dask_worker`` (see
    :meth:`ModelState.read`); call it between steps."""
    return ModelState.on_worker(token, dask_worker).read()


def snapshot_weight(token: str, k: int, m: int) -> sparse.GCXS:
    """Task: a new GCXS chunk holding the current weights of part ``m`` in layer ``k``."""
    layer = ModelState.on_worker(token).layers[(k, m)]
    with layer.lock:
        data = layer.values.copy()
    return sparse.GCXS(
        (data, layer.indices.copy(), layer.indptr.copy()),
        shape=layer.shape,
        compressed_axes=(0,),
    )


def snapshot_bias(token: str, k: int, m: int) -> np.ndarray:
    """Task: a copy of the current bias of part ``m`` in layer ``k``."""
    layer = ModelState.on_worker(token).layers[(k, m)]
    with layer.lock:
        return layer.bias.copy()
