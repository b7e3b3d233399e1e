"""Data-parallel training (Parallax): the sparse variable on parameter-server shards, the dense
ones allreduced, local aggregation per machine, and the shard-count search."""

from dasknn.data_parallel.model import DataParallelEmbeddingMLP, data_parallel

__all__ = ["DataParallelEmbeddingMLP", "data_parallel"]
