"""LSH-sampled training across Dask workers (D-SLIDE), one output shard a worker; see
docs/sampled.md."""

from dasknn.sampled_parallel.model import DistributedSampledMLP

__all__ = ["DistributedSampledMLP"]
