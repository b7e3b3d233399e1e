"""Sparse multilayer perceptrons: activations, losses, input checks and the single-process model."""

from dasknn.model.activations import Activation, get_activation
from dasknn.model.embedding_mlp import EmbeddingMLP
from dasknn.model.losses import Loss, get_loss
from dasknn.model.sparse_mlp import SparseMLP

__all__ = ["Activation", "EmbeddingMLP", "Loss", "SparseMLP", "get_activation", "get_loss"]
