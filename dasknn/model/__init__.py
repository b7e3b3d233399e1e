"""Sparse multilayer perceptrons: activations, losses, input checks, the single-process model and
networks made a layer at a time."""

from dasknn.model.activations import Activation, get_activation
from dasknn.model.compressed_mlp import CompressedMLP
from dasknn.model.dense_mlp import DenseMLP
from dasknn.model.embedding_mlp import EmbeddingMLP
from dasknn.model.layer_source import LayerSource
from dasknn.model.losses import Loss, get_loss
from dasknn.model.sparse_mlp import SparseMLP

__all__ = [
    "Activation",
    "CompressedMLP",
    "DenseMLP",
    "EmbeddingMLP",
    "LayerSource",
    "Loss",
    "SparseMLP",
    "get_activation",
    "get_loss",
]
