"""Sparsity-aware data-parallel training (Parallax) on Dask: every worker runs the whole model on
its share of each batch's rows.

:class:`DistributedEmbeddingMLP` wraps a one-process model; the sparse variable lives on
parameter-server shards, the dense ones are allreduced, with local aggregation per machine and the
shard-count search (:mod:`~dasknn.data_parallel._model`, ``hybrid``, ``shards``, ``search``).

Batched data-parallel inference of sparse networks is :mod:`dasknn.inference`.
"""

from dasknn.data_parallel._hybrid import ARCHITECTURES
from dasknn.data_parallel._model import DistributedEmbeddingMLP
from dasknn.data_parallel._report import machine_bytes, machine_total

__all__ = ["ARCHITECTURES", "DistributedEmbeddingMLP", "machine_bytes", "machine_total"]
