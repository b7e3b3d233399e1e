"""Sparsity-aware data-parallel training (Parallax) on Dask (see docs/data_parallel.md).

:class:`DistributedEmbeddingMLP` runs the whole model on every worker on its share of each batch;
batched data-parallel inference of sparse networks is :mod:`dasknn.inference`.
"""

from dasknn.data_parallel._hybrid import ARCHITECTURES
from dasknn.data_parallel._model import DistributedEmbeddingMLP
from dasknn.data_parallel._report import machine_bytes, machine_total

__all__ = ["ARCHITECTURES", "DistributedEmbeddingMLP", "machine_bytes", "machine_total"]
