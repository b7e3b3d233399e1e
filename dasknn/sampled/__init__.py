"""LSH-sampled training of networks with a large output layer in one process (SLIDE):
:class:`SampledMLP`, built of :mod:`dasknn.sampled.layers` (which :mod:`dasknn.sampled_parallel`
places one shard a worker)."""

from dasknn.sampled.layers import ActiveSet
from dasknn.sampled.model import SampledMLP, precision_at_k

__all__ = ["ActiveSet", "SampledMLP", "precision_at_k"]
