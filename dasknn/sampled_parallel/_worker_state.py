"""What a distributed sampled model keeps on a worker: one worker plugin per model owning the
worker's block of hidden neurons and its shard of the output layer (weights, biases, optimizer
state, hash family and tables). The step tasks find it with :func:`shard_state`; they change
only this state, never a value Dask holds."""

from __future__ import annotations

import numpy as np

from dasknn.runtime.model_plugin import ModelPlugin
from dasknn.sampled.layers import HiddenLayer, OutputShard, SamplingConfig

__all__ = ["ShardState", "install_shard", "read_shard"]


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
        The worker's hidden block (from the forward pass to the hidden update) and its shard's
        forward values (:class:`~dasknn.sampled_parallel._steps.Forward`, from selection to
        backward) of the training steps under way, by submission number.
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
        """Own copies of the worker's parameters (see :func:`install_shard`)."""
        hogwild = payload["hogwild"]
        self.position = position
        self.columns = np.asarray(payload["columns"], dtype=np.int64)
        self.hidden = HiddenLayer(
            np.array(payload["hidden_weights"]),
            np.array(payload["hidden_bias"]),
            hogwild,
            payload["update_all_rows"],
        )
        self.shard = OutputShard(
            position,
            np.array(payload["ids"]),
            np.array(payload["output_weights"]),
            np.array(payload["output_bias"]),
            SamplingConfig(**payload["config"]),
            hogwild,
        )


def install_shard(token: str, position: int, payload: dict) -> int:
    """Task: hand the worker's parameters to the model's plugin; returns the position.

    ``payload`` holds ``hidden_weights`` (``(n_features, H_p)``), ``hidden_bias``, ``ids``,
    ``output_weights`` (``(n_p, H)``), ``output_bias``, ``columns``, ``config`` (the fields of
    :class:`~dasknn.sampled.layers.SamplingConfig`), ``hogwild`` and ``update_all_rows``.
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
