"""Communication and load metrics of a network partition, from the exchange model: in layer ``k``
the owner of input ``i`` sends ``x_{k-1}(i)`` once to every other part owning a consumer of ``i``,
which returns one partial sum backward; a message is the words one part sends another in one
direction of one layer (docs/partitioning.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

__all__ = ["PartitionMetrics", "exchange_pairs", "layer_volume", "partition_metrics"]


def exchange_pairs(
    layer: sp.spmatrix, input_parts: np.ndarray, output_parts: np.ndarray, nparts: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The forward words of one layer: one per (input neuron, consuming part other than its owner).

    Parameters
    ----------
    layer : scipy.sparse matrix ``(n_in, n_out)``
        The layer's connections.
    input_parts, output_parts : numpy.ndarray of int
        The part of each input neuron and of each output neuron.
    nparts : int

    Returns
    -------
    neuron, owner, consumer : numpy.ndarray
        For every word: the input neuron, the part that owns it (sender forward, receiver backward)
        and the part that consumes it (receiver forward, sender backward).
    """
    coo = sp.coo_matrix(layer)
    keys = np.unique(coo.row.astype(np.int64) * nparts + np.asarray(output_parts)[coo.col])
    neuron, consumer = np.divmod(keys, nparts)
    owner = np.asarray(input_parts)[neuron]
    remote = consumer != owner
    return neuron[remote], owner[remote], consumer[remote]


def layer_volume(
    layer: sp.spmatrix, input_parts: np.ndarray, output_parts: np.ndarray, nparts: int
) -> int:
    """Words exchanged by one layer, forward plus backward.

    Parameters
    ----------
    layer, input_parts, output_parts, nparts
        As :func:`exchange_pairs`'s.

    Returns
    -------
    int
        Twice the distinct (input neuron, consuming part) pairs whose part is not the owner.
    """
    return 2 * len(exchange_pairs(layer, input_parts, output_parts, nparts)[0])


@dataclass(frozen=True)
class PartitionMetrics:
    """What a partitioned network sends and computes, per part, summed over all layers.

    Attributes
    ----------
    nparts : int
    send_volume : numpy.ndarray
        Words each part sends (forward and backward).
    messages_sent, messages_received : numpy.ndarray
        Messages each part sends / receives, counted per layer and direction and summed.
    load : numpy.ndarray
        Nonzeros (multiply-adds per sample) each part computes.
    layer_volume : numpy.ndarray
        Words exchanged by each layer (forward plus backward), all parts together.
    layer_imbalance : numpy.ndarray
        Per layer: largest part load over the average part load.
    """

    nparts: int
    send_volume: np.ndarray
    messages_sent: np.ndarray
    messages_received: np.ndarray
    load: np.ndarray
    layer_volume: np.ndarray
    layer_imbalance: np.ndarray

    @property
    def total_volume(self) -> int:
        """All words sent."""
        return int(self.send_volume.sum())

    @property
    def avg_volume(self) -> float:
        """Average words sent per part."""
        return float(self.send_volume.mean())

    @property
    def max_volume(self) -> int:
        """Most words sent by one part."""
        return int(self.send_volume.max())

    @property
    def avg_messages(self) -> float:
        """Average messages sent per part."""
        return float(self.messages_sent.mean())

    @property
    def max_messages(self) -> int:
        """Most messages sent by one part."""
        return int(self.messages_sent.max())

    @property
    def avg_load(self) -> float:
        """Average nonzeros per part."""
        return float(self.load.mean())

    @property
    def max_load(self) -> int:
        """Most nonzeros of one part."""
        return int(self.load.max())

    @property
    def imbalance(self) -> float:
        """Worst per-layer imbalance (largest part load over average part load)."""
        return float(self.layer_imbalance.max()) if len(self.layer_imbalance) else 1.0

    def summary(self) -> dict[str, float]:
        """The scalar figures as a flat dictionary."""
        return {
            "total_volume": self.total_volume,
            "avg_volume": self.avg_volume,
            "max_volume": self.max_volume,
            "avg_messages": self.avg_messages,
            "max_messages": self.max_messages,
            "avg_load": self.avg_load,
            "max_load": self.max_load,
            "imbalance": self.imbalance,
        }


def partition_metrics(
    layers: Sequence[sp.spmatrix], parts: Sequence[np.ndarray], nparts: int
) -> PartitionMetrics:
    """Measure a partition of ``layers`` (``parts[k]`` = part of each neuron of layer ``k``).

    Parameters
    ----------
    layers : sequence of scipy.sparse matrices
        The network's ``L`` layers, ``(n_in, n_out)`` each.
    parts : sequence of numpy.ndarray of int
        ``L + 1`` arrays: ``parts[0]`` places the input features, ``parts[k]`` the neurons of
        layer ``k``.
    nparts : int

    Returns
    -------
    PartitionMetrics
        Words, messages and load per part and the volume and imbalance per layer.

    Raises
    ------
    ValueError
        If ``parts`` does not hold ``L + 1`` arrays.
    """
    if len(parts) != len(layers) + 1:
        raise ValueError(f"a partition of {len(layers)} layers needs {len(layers) + 1} part arrays")
    send = np.zeros(nparts, dtype=np.int64)
    sent = np.zeros(nparts, dtype=np.int64)
    received = np.zeros(nparts, dtype=np.int64)
    load = np.zeros(nparts, dtype=np.int64)
    volumes = np.zeros(len(layers), dtype=np.int64)
    imbalance = np.ones(len(layers))
    for k, layer in enumerate(layers, start=1):
        _, owner, consumer = exchange_pairs(layer, parts[k - 1], parts[k], nparts)
        volumes[k - 1] = 2 * len(owner)
        send += np.bincount(owner, minlength=nparts) + np.bincount(consumer, minlength=nparts)
        links = np.unique(owner * nparts + consumer)
        link_owner, link_consumer = np.divmod(links, nparts)
        # Forward: owner -> consumer; backward: consumer -> owner (the same links reversed).
        per_owner = np.bincount(link_owner, minlength=nparts)
        per_consumer = np.bincount(link_consumer, minlength=nparts)
        sent += per_owner + per_consumer
        received += per_consumer + per_owner
        column_nnz = np.diff(sp.csc_matrix(layer).indptr)
        layer_load = np.bincount(parts[k], weights=column_nnz, minlength=nparts).astype(np.int64)
        load += layer_load
        if layer_load.sum():
            imbalance[k - 1] = layer_load.max() / layer_load.mean()
    return PartitionMetrics(nparts, send, sent, received, load, volumes, imbalance)
