"""Batched data-parallel inference of sparse networks on CPU or GPU workers.

Every layer ``Y = min(max(Y @ W + bias on the nonzeros, 0), ymax)`` runs on batches of rows that
the workers pull: :func:`infer_on_cpus` with the numba kernel (the network broadcast once, or
streamed in windows of layers over the weight budget), :func:`infer_on_gpus` with the CUDA kernels
on one GPU per worker (uploaded once, or loaded by the workers, a :class:`HeldNetwork`). Both
return an :class:`InferenceRun`, one :class:`BatchResult` a batch. The Graph Challenge
(:mod:`dasknn.challenge`) runs on this package; docs/challenge.md ("The engine").
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
