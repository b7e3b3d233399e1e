"""Batched data-parallel inference of sparse networks on CPU or GPU workers: every layer
``Y = min(max(Y @ W + bias on the nonzeros, 0), ymax)`` on batches of rows the workers pull, with
the numba kernel (:func:`infer_on_cpus`) or the CUDA kernels (:func:`infer_on_gpus`). The Graph
Challenge (:mod:`dasknn.challenge`) runs on it; docs/challenge.md ("The engine").
"""

from dasknn.inference._batches import BatchResult, default_batch_size
from dasknn.inference._broadcast import submit_pinned
from dasknn.inference._gpu_inference import HeldNetwork, check_cuda_workers
from dasknn.inference._inference import InferenceRun, infer_on_cpus, infer_on_gpus

__all__ = [
    "BatchResult",
    "HeldNetwork",
    "InferenceRun",
    "check_cuda_workers",
    "default_batch_size",
    "infer_on_cpus",
    "infer_on_gpus",
    "submit_pinned",
]
