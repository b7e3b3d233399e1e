"""The Sparse DNN Graph Challenge inference engine: data-parallel batched inference on Dask,
and model-parallel inference for networks wider than one worker."""

from dasknn.challenge.engine import ChallengeStats, run_challenge
from dasknn.challenge.inputs import load_inputs
from dasknn.challenge.model_parallel import ModelParallelStats, run_challenge_model_parallel

__all__ = [
    "ChallengeStats",
    "ModelParallelStats",
    "load_inputs",
    "run_challenge",
    "run_challenge_model_parallel",
]
