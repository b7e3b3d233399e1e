"""What a distributed sampled model keeps on a worker: its hidden block and output shard (weights,
biases, optimizer state, hash tables), owned by one worker plugin per model (:func:`shard_state`).
"""

from __future__ import annotations

import numpy as np

from dasknn.lsh import HashTables
from dasknn.optim import OptimizerSlots
from dasknn.runtime.model_plugin import ModelPlugin
from dasknn.sampled.layers import HiddenLayer, OutputShard, SamplingConfig, shard_bucket_cap

__all__ = ["ShardState", "install_shard", "read_shard", "read_shard_state"]


class ShardState(ModelPlugin):
    """Worker plugin owning one sampled model's state on a worker.

    Attributes (after :meth:`install`)
    ----------------------------------
    position : int
        The worker's position, which is also its shard's number.
    hidden : HiddenLayer
        The worker's block of hidden neurons (columns ``columns[position]`` of the layer).
    shard : OutputShard
    columns : numpy.ndarray
        Bounds of every worker's block of hidden neurons.
    hidden_blocks, forwards : dict
        The hidden block and the shard's :class:`~dasknn.sampled_parallel._steps.Forward` of the
        training steps under way, by submission number.
    """

    kind = "sampled"

    def setup(self, worker) -> None:
        self.position = -1
        self.hidden: HiddenLayer | None = None
        self.shard: OutputShard | None = None
        self.columns = np.zeros(0, dtype=np.int64)
        self.hidden_blocks: dict = {}
        self.forwards: dict = {}

    def teardown(self, worker) -> None:
        self.hidden = None
        self.shard = None
        self.hidden_blocks.clear()
        self.forwards.clear()

    def install(self, position: int, payload: dict) -> None:
        """Own copies of the worker's parameters, and of its optimizer state and hash tables
        when the payload holds them (see :func:`install_shard`)."""
        hogwild = payload["hogwild"]
        config = SamplingConfig(**payload["config"])
        self.position = position
        self.columns = np.asarray(payload["columns"], dtype=np.int64)
        self.hidden = HiddenLayer(
            np.array(payload["hidden_weights"]),
            np.array(payload["hidden_bias"]),
            hogwild,
            payload["update_all_rows"],
        )
        ids = np.array(payload["ids"])
        tables = None
        if payload.get("tables") is not None:
            cap = shard_bucket_cap(config.bucket_size, config.shards)
            tables = HashTables(*(np.array(a) for a in payload["tables"]), len(ids), cap)
        self.shard = OutputShard(
            position,
            ids,
            np.array(payload["output_weights"]),
            np.array(payload["output_bias"]),
            config,
            hogwild,
            payload.get("rebuilds", 0),
            tables,
        )
        optimizer = payload.get("optimizer")
        for layer, states in ((self.hidden, payload.get("hidden_states")),
                              (self.shard, payload.get("output_states"))):  # fmt: skip
            if states is not None:
                copies = {k: type(v)(v.step, {n: np.array(a) for n, a in v.arrays.items()})
                          for k, v in states.items()}  # fmt: skip
                layer.slots = OptimizerSlots(optimizer, copies)


def install_shard(token: str, position: int, payload: dict) -> int:
    """Task: hand the worker's parameters to the model's plugin; returns the position.

    ``payload``: ``hidden_weights`` (``(n_features, H_p)``), ``hidden_bias``, ``ids``,
    ``output_weights`` (``(n_p, H)``), ``output_bias``, ``columns``, ``config`` (the fields of
    :class:`~dasknn.sampled.layers.SamplingConfig`), ``hogwild`` and ``update_all_rows``; for a
    model that trained, also ``optimizer``, ``hidden_states`` and ``output_states`` (the
    optimizer state of each layer's ``"weights"`` and ``"bias"``, ``None`` if none),
    ``rebuilds`` and ``tables`` (``(keys, key_ptr, bucket_ptr, items)`` of the shard).
    """
    ShardState.on_worker(token).install(position, payload)
    return position


def read_shard(token: str) -> dict:
    """Task: copies of the worker's parameters (its hidden block and output shard)."""
    state = ShardState.on_worker(token)
    return {
        "hidden_weights": state.hidden.weights.copy(),
        "hidden_bias": state.hidden.bias.copy(),
        "output_weights": state.shard.weights.copy(),
        "output_bias": state.shard.bias.copy(),
    }


def read_shard_state(token: str) -> dict:
    """Task: copies of everything the worker holds of the model: :func:`read_shard`, and
    ``hidden_slots`` / ``output_slots`` (``(optimizer, states)`` of each layer), ``rebuilds``
    and ``tables`` of its shard."""
    state = ShardState.on_worker(token)
    out = read_shard(token)
    for name, layer in (("hidden_slots", state.hidden), ("output_slots", state.shard)):
        slots = layer.slots.copy()
        out[name] = (slots.optimizer, slots.states)
    out["rebuilds"] = state.shard.rebuilds
    out["tables"] = tuple(a.copy() for a in state.shard.tables.arrays())
    return out
