"""LSH-sampled training of networks with a large output layer in one process (SLIDE).

:class:`SampledMLP` is the model; :mod:`dasknn.sampled.layers` the state it is made of (the hidden
layer and the output shards with their hash tables), which the distributed model
(:mod:`dasknn.sampled_parallel`) places one shard a worker.
"""

from dasknn.sampled.layers import ActiveSet
from dasknn.sampled.model import SampledMLP, precision_at_k

__all__ = ["ActiveSet", "SampledMLP", "precision_at_k"]
