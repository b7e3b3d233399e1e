"""dasknn: distributed training and inference of sparse deep neural networks on Dask."""

from dasknn import datasets, exceptions, optim, pruning
from dasknn.challenge import run_challenge, run_challenge_model_parallel
from dasknn.data_parallel import DistributedEmbeddingMLP
from dasknn.exceptions import (
    ModelClosedError,
    ModelFailedError,
    NonFiniteLossError,
    StepTimeoutError,
    WorkerLostError,
)
from dasknn.model import CompressedMLP, DenseMLP, LayerSource, SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.pipeline_parallel import DistributedCompressedMLP
from dasknn.sampled import SampledMLP
from dasknn.sampled_parallel import DistributedSampledMLP

__version__ = "0.1.0"

__all__ = [
    "CompressedMLP",
    "DenseMLP",
    "DistributedEmbeddingMLP",
    "DistributedCompressedMLP",
    "DistributedSampledMLP",
    "DistributedSparseMLP",
    "LayerSource",
    "ModelClosedError",
    "ModelFailedError",
    "NonFiniteLossError",
    "SampledMLP",
    "SparseMLP",
    "StepTimeoutError",
    "WorkerLostError",
    "datasets",
    "exceptions",
    "optim",
    "pruning",
    "run_challenge",
    "run_challenge_model_parallel",
    "__version__",
]
