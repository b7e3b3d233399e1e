"""The Sparse DNN Graph Challenge: its files, checks, bias rule, categories and statistics, run
data-parallel on :mod:`dasknn.inference` or model-parallel (networks wider than one worker)
on :mod:`dasknn.model_parallel`."""

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
