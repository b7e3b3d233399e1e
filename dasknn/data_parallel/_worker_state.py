"""What a data-parallel model keeps on a worker, owned by one worker plugin per model.

:class:`ReplicaState` is a :class:`~dasknn.runtime.model_plugin.ModelPlugin` registered under
``ReplicaState.plugin_name(token)`` and removed by the model's ``close()``. On every worker
it holds:

- the replicas of the variables this worker computes with (the dense variables under ``hybrid``,
  ``ar`` and ``ar-dense``; the whole sparse variables under ``ar`` and ``ar-dense``) and their
  optimizer state, identical on every worker (every replica takes the same step);
- as a parameter server, the shards of the sparse variables it serves (``hybrid``, ``ps``)
  and, under ``ps``, the dense variables it serves, with their optimizer state;
- the intermediate values of the step in flight (:attr:`scratch`), dropped when the step ends,
  and the :attr:`workspace` of the forward and backward pass's temporaries, kept from one step to
  the next;
- with ``messages="posted"``, the :attr:`mailbox` of the values other workers posted to it,
  and the :attr:`posts` it made in the last step (:mod:`dasknn.data_parallel._posted`).

The step tasks (:mod:`dasknn.data_parallel._steps`) find it with ``ReplicaState.on_worker(token)``.
No task changes a value Dask holds: parameters live here only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dasknn.model.embedding_network import Workspace
from dasknn.optim import Optimizer, OptimizerSlots, ParamState
from dasknn.runtime.model_plugin import ModelPlugin
from dasknn.runtime.postbox import Mailbox

__all__ = [
    "Held",
    "ReplicaState",
    "clear_mailbox",
    "install_values",
    "read_array",
    "read_values",
]


@dataclass
class Held:
    """One array a worker owns (a replica, a shard or a served variable) and its optimizer
    state (started afresh whenever the optimizer changes)."""

    values: np.ndarray
    slots: OptimizerSlots = field(default_factory=OptimizerSlots)

    def state_for(self, optimizer: Optimizer, flat: bool) -> ParamState:
        """The state of ``optimizer`` (fresh when it differs from the last one used), for the
        values as one flat array (``flat``) or in their shape."""
        param = self.values.reshape(-1) if flat else self.values
        return self.slots.state(optimizer, "values", param)


@dataclass
class ReplicaState(ModelPlugin):
    """The worker plugin of one data-parallel model (see the module docstring)."""

    kind = "dp"
    token: str
    replicas: dict[str, Held] = field(default_factory=dict)
    shards: dict[tuple[str, int], Held] = field(default_factory=dict)
    served: dict[str, Held] = field(default_factory=dict)
    scratch: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.name = self.plugin_name(self.token)

    def setup(self, worker) -> None:
        self.replicas, self.shards, self.served, self.scratch = {}, {}, {}, {}
        self.workspace = Workspace()
        self.mailbox = Mailbox()
        self.posts: list = []  # the posts of the last step, acknowledged or not

    def teardown(self, worker) -> None:
        self.mailbox.clear()  # ends the waits of a step in flight
        self.setup(worker)

    def deliver(self, key: tuple, value) -> None:
        """Leave a value another worker posted in the mailbox (the postbox calls it)."""
        self.mailbox.deliver(key, value)

    def hold_receipt(self, key: tuple, sender: str, nbytes: int) -> None:
        """Keep the transfer report of a posted value for the task that reports them all (the
        postbox calls it)."""
        self.mailbox.hold_receipt(key, sender, nbytes)


def install_values(dask_worker, token: str, replicas: dict, shards: dict, served: dict) -> int:
    """For ``Client.run``: give the model's plugin on ``dask_worker`` copies of its arrays
    (``{name: array}``, ``{(variable, shard): array}``, ``{name: array}``), replacing what it
    held."""
    state: ReplicaState = ReplicaState.on_worker(token, dask_worker)
    state.replicas = {name: Held(np.array(v)) for name, v in replicas.items()}
    state.shards = {(name, int(p)): Held(np.array(v)) for (name, p), v in shards.items()}
    state.served = {name: Held(np.array(v)) for name, v in served.items()}
    state.scratch = {}
    return len(state.replicas) + len(state.shards) + len(state.served)


def clear_mailbox(dask_worker, token: str) -> int:
    """For ``Client.run``: forget the messages posted to the model's plugin on ``dask_worker``
    and end the waits of the step in flight there (with ``RuntimeError``); returns how many
    messages were forgotten."""
    state = ReplicaState.on_worker(token, dask_worker)
    count = len(state.mailbox)
    state.mailbox.clear()
    state.posts = []  # those of the failed step: no later step waits for them
    return count


def read_values(dask_worker, token: str) -> dict:
    """For ``Client.run``: copies of the arrays the model's plugin holds on ``dask_worker``:
    ``{"replicas": {...}, "shards": {...}, "served": {...}}``."""
    state: ReplicaState = ReplicaState.on_worker(token, dask_worker)
    return {
        "replicas": {name: held.values.copy() for name, held in state.replicas.items()},
        "shards": {p: held.values.copy() for p, held in state.shards.items()},
        "served": {name: held.values.copy() for name, held in state.served.items()},
    }


def read_array(token: str, where: str, name) -> np.ndarray:
    """Task: a copy of one array the model's plugin holds on this worker: ``where`` is
    ``"replicas"``, ``"shards"`` (``name`` a ``(variable, shard)`` pair) or ``"served"``."""
    key = tuple(name) if where == "shards" else name
    return getattr(ReplicaState.on_worker(token), where)[key].values.copy()
