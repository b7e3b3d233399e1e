"""LSH-sampled training across Dask workers (D-SLIDE): the output layer sharded one shard a
worker, weights that never move, per-shard active budgets."""

from dasknn.sampled_parallel._model import DistributedSampledMLP

__all__ = ["DistributedSampledMLP"]
