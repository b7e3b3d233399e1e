"""dasknn: distributed training and inference of sparse deep neural networks on Dask."""

from dasknn import datasets, optim
from dasknn.challenge import run_challenge, run_challenge_model_parallel
from dasknn.model import SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.sampled import SampledMLP
from dasknn.sampled_parallel import DistributedSampledMLP

__version__ = "0.1.0"

__all__ = [
    "DistributedSampledMLP",
    "DistributedSparseMLP",
    "SampledMLP",
    "SparseMLP",
    "datasets",
    "optim",
    "run_challenge",
    "run_challenge_model_parallel",
    "__version__",
]
