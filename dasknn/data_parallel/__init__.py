"""Sparsity-aware data-parallel training (Parallax) on Dask: every worker runs the whole model on
its share of each batch's rows.

:func:`data_parallel` wraps a one-process model; the sparse variable lives on parameter-server
shards, the dense ones are allreduced, with local aggregation per machine and the shard-count
search (:mod:`~dasknn.data_parallel.model`, ``hybrid``, ``shards``, ``search``).

Batched data-parallel inference of sparse networks is :mod:`dasknn.inference`.
"""

from dasknn.data_parallel.model import DataParallelEmbeddingMLP, data_parallel

__all__ = ["DataParallelEmbeddingMLP", "data_parallel"]
