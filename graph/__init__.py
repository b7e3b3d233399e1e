"""Hypergraph partitioning of sparse neural networks (the multi-phase model); no Dask here."""

from graph.backends import BACKENDS
from graph.floor import layer_volume_floor, volume_floor
from graph.metrics import PartitionMetrics, exchange_pairs, layer_volume, partition_metrics
from graph.network_partition import NetworkPartition, load_partitions, save_partitions
from graph.partition import DEFAULT_BACKEND, METHODS, check_network, partition_network
from graph.report import PartitionRow, format_table
from graph.stream import PhaseReport, partition_layers, partition_stream

__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "METHODS",
    "NetworkPartition",
    "PartitionMetrics",
    "PartitionRow",
    "PhaseReport",
    "check_network",
    "exchange_pairs",
    "format_table",
    "layer_volume",
    "layer_volume_floor",
    "load_partitions",
    "partition_metrics",
    "partition_layers",
    "partition_network",
    "partition_stream",
    "save_partitions",
    "volume_floor",
]
