"""LSH-sampled training across Dask workers (D-SLIDE); see docs/sampled.md."""

from dasknn.sampled_parallel._model import DistributedSampledMLP

__all__ = ["DistributedSampledMLP"]
