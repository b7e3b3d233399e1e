"""dasknn: distributed training and inference of sparse deep neural networks on Dask."""

from dasknn import datasets, optim, pruning
from dasknn.challenge import run_challenge, run_challenge_model_parallel
from dasknn.model import CompressedMLP, DenseMLP, SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.pipeline_parallel import PipelineMLP
from dasknn.runtime.step_timeout import StepTimeoutError
from dasknn.runtime.waiting import WorkerLostError
from dasknn.sampled import SampledMLP
from dasknn.sampled_parallel import DistributedSampledMLP

__version__ = "0.1.0"

__all__ = [
    "CompressedMLP",
    "DenseMLP",
    "DistributedSampledMLP",
    "DistributedSparseMLP",
    "PipelineMLP",
    "SampledMLP",
    "SparseMLP",
    "StepTimeoutError",
    "WorkerLostError",
    "datasets",
    "optim",
    "pruning",
    "run_challenge",
    "run_challenge_model_parallel",
    "__version__",
]
