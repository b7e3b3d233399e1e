"""What a distributed sampled model keeps on a worker: its hidden block and output shard (weights,
biases, optimizer state, hash tables), owned by one worker plugin per model."""

from __future__ import annotations

import numpy as np

from dasknn.lsh import HashTables
from dasknn.runtime.buffers import BufferPool
from dasknn.runtime.model_plugin import ModelPlugin
from dasknn.sampled.layers import HiddenLayer, OutputShard, SamplingConfig, shard_bucket_cap
from dasknn.sampled.model import restored_slots

__all__ = ["ShardState", "install_shard", "read_shard", "read_shard_state"]


class ShardState(ModelPlugin):
    """Worker plugin owning one sampled model's state on a worker.

    Attributes (after :meth:`install`)
    ----------------------------------
    position : int
        The worker's position, also its shard's number.
    hidden : HiddenLayer
        The worker's block of hidden neurons (columns ``columns[position]`` of the layer).
    shard : OutputShard
    columns : numpy.ndarray
        Bounds of every worker's block of hidden neurons.
    hidden_blocks, forwards : dict
        The hidden block and the shard's :class:`~dasknn.sampled_parallel._steps.Forward` of the
        training steps under way, by submission number.
    buffers : BufferPool
        The arrays of a step's :class:`~dasknn.sampled_parallel._steps.Forward` (the batch's
        hidden activation, its active set and logits), given back when the step's backward
        pass has read them.
    """

    kind = "sampled"

    def setup(self, worker) -> None:
        self.position = -1
        self.hidden: HiddenLayer | None = None
        self.shard: OutputShard | None = None
        self.columns = np.zeros(0, dtype=np.int64)
        self.hidden_blocks: dict = {}
        self.forwards: dict = {}
        self.buffers = BufferPool()

    def teardown(self, worker) -> None:
        self.hidden = None
        self.shard = None
        self.hidden_blocks.clear()
        self.forwards.clear()

    def install(self, position: int, payload: dict) -> None:
        """Own copies of the payload of :func:`install_shard`."""
        hogwild = payload["hogwild"]
        config = SamplingConfig(**payload["config"])
        self.position = position
        self.columns = np.asarray(payload["columns"], dtype=np.int64)
        self.hidden = HiddenLayer(
            np.array(payload["hidden_weights"]), np.array(payload["hidden_bias"]), hogwild,
            payload["update_all_rows"],
        )  # fmt: skip
        ids = np.array(payload["ids"])
        tables = None
        if payload.get("tables") is not None:
            cap = shard_bucket_cap(config.bucket_size, config.shards)
            tables = HashTables(*(np.array(a) for a in payload["tables"]), len(ids), cap)
        self.shard = OutputShard(
            position, ids, np.array(payload["output_weights"]), np.array(payload["output_bias"]),
            config, hogwild, payload.get("rebuilds", 0), tables,
        )  # fmt: skip
        optimizer = payload.get("optimizer")
        self.hidden.slots = restored_slots(optimizer, payload.get("hidden_states"))
        self.shard.slots = restored_slots(optimizer, payload.get("output_states"))


def install_shard(token: str, position: int, payload: dict) -> int:
    """Task: hand the worker's shard to the model's plugin; returns the position.

    ``payload``: ``hidden_weights`` (``(n_features, H_p)``), ``hidden_bias``, ``ids``,
    ``output_weights`` (``(n_p, H)``), ``output_bias``, ``columns``, ``config`` (the fields of
    :class:`~dasknn.sampled.layers.SamplingConfig`), ``hogwild``, ``update_all_rows``; for a model
    that trained also ``optimizer``, ``hidden_states`` / ``output_states`` (each layer's
    ``"weights"`` and ``"bias"`` optimizer state, or ``None``), ``rebuilds`` and ``tables``.
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
    """Task: :func:`read_shard`, the layers' ``hidden_slots`` / ``output_slots`` (copies of
    their :class:`~dasknn.optim.OptimizerSlots`) and the shard's ``rebuilds`` and ``tables``."""
    state = ShardState.on_worker(token)
    return {
        **read_shard(token),
        "hidden_slots": state.hidden.slots.copy(),
        "output_slots": state.shard.slots.copy(),
        "rebuilds": state.shard.rebuilds,
        "tables": tuple(a.copy() for a in state.shard.tables.arrays()),
    }
