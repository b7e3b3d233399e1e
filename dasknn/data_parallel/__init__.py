"""Data-parallel execution on Dask: every worker holds the whole model (or a window of its
layers, or a shard of its sparse variable) and the rows of the data are split over the workers.

Inference: :mod:`~dasknn.data_parallel.driver` runs batches that the workers pull with a
per-device step (:mod:`~dasknn.data_parallel.cpu_inference`,
:mod:`~dasknn.data_parallel.gpu_inference`); :mod:`~dasknn.data_parallel.inference` puts them
together for sparse inference.

Training (Parallax): :func:`data_parallel` wraps a one-process model; the sparse variable lives on
parameter-server shards, the dense ones are allreduced, with local aggregation per machine and the
shard-count search (:mod:`~dasknn.data_parallel.model`, ``hybrid``, ``shards``, ``search``).
"""

from dasknn.data_parallel.model import DataParallelEmbeddingMLP, data_parallel

__all__ = ["DataParallelEmbeddingMLP", "data_parallel"]
