"""LSH-sampled training across Dask workers (D-SLIDE); see docs/sampled.md."""

from dasknn.sampled_parallel.model import DistributedSampledMLP

__all__ = ["DistributedSampledMLP"]
