"""What a data-parallel model keeps on a worker, in one plugin per model (:class:`ReplicaState`);
no task changes a value Dask holds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dasknn.model.embedding_network import Workspace, apply_dense, apply_rows
from dasknn.optim import Optimizer, OptimizerSlots, ParamState
from dasknn.runtime.buffers import StepBuffers
from dasknn.runtime.model_plugin import ModelPlugin
from dasknn.runtime.postbox import Mailbox

__all__ = [
    "ReplicaState",
    "clear_mailbox",
    "install_values",
    "read_array",
    "read_states",
    "read_values",
]

#: The attributes of :class:`ReplicaState` that hold arrays.
HELD = ("replicas", "shards", "served")


@dataclass
class Held:
    """One array a worker owns (replica, shard or served variable) and its optimizer state."""

    values: np.ndarray
    slots: OptimizerSlots = field(default_factory=OptimizerSlots)

    def step(
        self,
        optimizer: Optimizer,
        grad: np.ndarray,
        rows: np.ndarray | None = None,
        take: Callable[..., np.ndarray] = np.empty,
    ) -> None:
        """One step of ``optimizer`` (its state fresh if it changed) on the whole array, or on its
        distinct rows ``rows`` only (``grad`` then holds theirs; their values and state are
        gathered into arrays of ``take(shape, dtype)``)."""
        if rows is None:
            state = self.slots.state(optimizer, "values", self.values.reshape(-1))
            apply_dense(optimizer, self.values, grad, state)
        else:
            state = self.slots.state(optimizer, "values", self.values)
            apply_rows(optimizer, self.values, state, rows, grad, take)


class ReplicaState(ModelPlugin):
    """The worker plugin of one data-parallel model: its ``replicas``, the ``shards`` and the
    ``served`` dense variables it serves, the steps' ``scratch``, the ``workspace`` of a pass, the
    arrays of posted steps (``buffers``), the ``mailbox`` and the ``posts`` of its last posted
    task."""

    kind = "dp"

    def setup(self, worker) -> None:
        self.replicas: dict[str, Held] = {}
        self.shards: dict[tuple[str, int], Held] = {}
        self.served: dict[str, Held] = {}
        self.scratch: dict = {}
        self.workspace = Workspace()
        self.buffers = StepBuffers()
        self.mailbox = Mailbox()
        self.posts: list = []

    def teardown(self, worker) -> None:
        self.mailbox.close()  # ends the waits of a step in flight, and of one begun later
        self.setup(worker)

    def ended(self, step: int, posts: list) -> None:
        """The posted program of ``step`` ran here and made ``posts``: the arrays of the steps
        now over go back to :attr:`buffers` (:meth:`StepBuffers.ended
        <dasknn.runtime.buffers.StepBuffers.ended>`)."""
        self.buffers.ended(step, posts)

    def deliver(self, key: tuple, value) -> None:
        """Leave a posted value in the mailbox (the postbox calls it)."""
        self.mailbox.deliver(key, value)

    def hold_receipt(self, key: tuple, sender: str, nbytes: int) -> None:
        """Keep a posted value's transfer report for the task (the postbox calls it)."""
        self.mailbox.hold_receipt(key, sender, nbytes)


def install_values(
    dask_worker, token: str, replicas: dict, shards: dict, served: dict, states=None
) -> int:
    """For ``Client.run``: give the model's plugin on ``dask_worker`` copies of its replicas, shards
    (``{(variable, shard): array}``) and served arrays, replacing what it held, with fresh
    optimizer state, or with copies of ``states`` (``{"replicas"|"shards"|"served": {name:
    (optimizer, ParamState)}}``) for the arrays it names. Returns how many arrays it holds."""
    state: ReplicaState = ReplicaState.on_worker(token, dask_worker)
    for where, arrays in zip(HELD, (replicas, shards, served), strict=True):
        setattr(state, where, {_name(where, n): Held(np.array(v)) for n, v in arrays.items()})
    for where, held_states in (states or {}).items():
        for name, (optimizer, param_state) in held_states.items():
            copies = {n: np.array(a) for n, a in param_state.arrays.items()}
            getattr(state, where)[_name(where, name)].slots = OptimizerSlots(
                optimizer, {"values": ParamState(param_state.step, copies)}
            )
    state.scratch = {}
    state.buffers.forget()
    return sum(len(getattr(state, where)) for where in HELD)


def _name(where: str, name):
    """A held array's key: ``(variable, shard)`` for a shard."""
    return (name[0], int(name[1])) if where == "shards" else name


def read_states(dask_worker, token: str) -> dict:
    """For ``Client.run``: copies of the optimizer state of every held array that was stepped,
    ``{"replicas"|"shards"|"served": {name: (optimizer, ParamState)}}``."""
    state: ReplicaState = ReplicaState.on_worker(token, dask_worker)
    out: dict = {}
    for where in HELD:
        out[where] = {}
        for name, held in getattr(state, where).items():
            values = held.slots.states.get("values")
            if values is not None:
                copies = {n: a.copy() for n, a in values.arrays.items()}
                out[where][name] = (held.slots.optimizer, ParamState(values.step, copies))
    return out


def clear_mailbox(dask_worker, token: str) -> int:
    """For ``Client.run``: forget the messages posted on ``dask_worker`` and end the step's waits
    there (``RuntimeError``); returns how many were forgotten."""
    state = ReplicaState.on_worker(token, dask_worker)
    count = len(state.mailbox)
    state.mailbox.clear()
    state.posts = []  # those of the failed step: no later step waits for them
    state.buffers.forget()  # a post of the failed steps may still read their arrays
    return count


def read_values(dask_worker, token: str) -> dict:
    """For ``Client.run``: copies ``{"replicas"|"shards"|"served": {name: array}}``."""
    state: ReplicaState = ReplicaState.on_worker(token, dask_worker)
    return {w: {n: h.values.copy() for n, h in getattr(state, w).items()} for w in HELD}


def read_array(token: str, where: str, name) -> np.ndarray:
    """Task: a copy of one held array; ``where`` is ``"replicas"``, ``"shards"`` (``name`` a
    ``(variable, shard)`` pair) or ``"served"``."""
    return getattr(ReplicaState.on_worker(token), where)[_name(where, name)].values.copy()
