"""Sparse multilayer perceptrons: activations, losses, input checks and the single-process model."""

from dasknn.model.activations import Activation, get_activation
from dasknn.model.compressed_mlp import CompressedMLP
from dasknn.model.dense_mlp import DenseMLP
from dasknn.model.embedding_mlp import EmbeddingMLP
from dasknn.model.losses import Loss, get_loss
from dasknn.model.sparse_mlp import SparseMLP

__all__ = [
    "Activation",
    "CompressedMLP",
    "DenseMLP",
    "EmbeddingMLP",
    "Loss",
    "SparseMLP",
    "get_activation",
    "get_loss",
]
