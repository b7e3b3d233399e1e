"""The Sparse DNN Graph Challenge inference engine: data-parallel batched inference on Dask."""

from dasknn.challenge.engine import ChallengeStats, run_challenge
from dasknn.challenge.inputs import load_inputs

__all__ = ["ChallengeStats", "load_inputs", "run_challenge"]
