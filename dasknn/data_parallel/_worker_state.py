"""What a data-parallel model keeps on a worker, owned by one plugin per model.

Parameters live only in :class:`ReplicaState`; no task changes a value Dask holds.
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
    "read_states",
    "read_values",
]


@dataclass
class Held:
    """One array a worker owns (replica, shard or served variable) and its optimizer state."""

    values: np.ndarray
    slots: OptimizerSlots = field(default_factory=OptimizerSlots)

    def state_for(self, optimizer: Optimizer, flat: bool) -> ParamState:
        """The state of ``optimizer`` (fresh if it changed), flat (``flat``) or shaped."""
        param = self.values.reshape(-1) if flat else self.values
        return self.slots.state(optimizer, "values", param)


@dataclass
class ReplicaState(ModelPlugin):
    """The worker plugin of one data-parallel model: its ``replicas``, the ``shards`` and ``served``
    dense variables it serves, the step's ``scratch``, the pass's ``workspace`` and the ``mailbox``.
    """

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
        """Keep a posted value's transfer report for the reporting task (the postbox calls it)."""
        self.mailbox.hold_receipt(key, sender, nbytes)


def install_values(
    dask_worker, token: str, replicas: dict, shards: dict, served: dict, states=None
) -> int:
    """For ``Client.run``: give the model's plugin on ``dask_worker`` copies of its replicas, shards
    (``{(variable, shard): array}``) and served arrays, replacing what it held, with fresh
    optimizer state, or with ``states`` (``{"replicas"|"shards"|"served": {name: (optimizer,
    ParamState)}}``, copied) for the arrays it names."""
    state: ReplicaState = ReplicaState.on_worker(token, dask_worker)
    state.replicas = {name: Held(np.array(v)) for name, v in replicas.items()}
    state.shards = {(name, int(p)): Held(np.array(v)) for (name, p), v in shards.items()}
    state.served = {name: Held(np.array(v)) for name, v in served.items()}
    for where, held_states in (states or {}).items():
        held = getattr(state, where)
        for name, (optimizer, param_state) in held_states.items():
            copies = {n: np.array(a) for n, a in param_state.arrays.items()}
            held[name].slots = OptimizerSlots(
                optimizer, {"values": ParamState(param_state.step, copies)}
            )
    state.scratch = {}
    return len(state.replicas) + len(state.shards) + len(state.served)


def read_states(dask_worker, token: str) -> dict:
    """For ``Client.run``: copies of the optimizer state of every held array,
    ``{"replicas"|"shards"|"served": {name: (optimizer, ParamState)}}`` (arrays not stepped
    yet left out)."""
    state: ReplicaState = ReplicaState.on_worker(token, dask_worker)
    out: dict = {}
    for where in ("replicas", "shards", "served"):
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
    return count


def read_values(dask_worker, token: str) -> dict:
    """For ``Client.run``: copies ``{"replicas": {...}, "shards": {...}, "served": {...}}``."""
    state: ReplicaState = ReplicaState.on_worker(token, dask_worker)
    return {
        "replicas": {name: held.values.copy() for name, held in state.replicas.items()},
        "shards": {p: held.values.copy() for p, held in state.shards.items()},
        "served": {name: held.values.copy() for name, held in state.served.items()},
    }


def read_array(token: str, where: str, name) -> np.ndarray:
    """Task: a copy of one held array; ``where`` is ``"replicas"``, ``"shards"`` (``name`` a
    ``(variable, shard)`` pair) or ``"served"``."""
    key = tuple(name) if where == "shards" else name
    return getattr(ReplicaState.on_worker(token), where)[key].values.copy()
