"""Batched data-parallel inference of sparse networks on CPU or GPU workers.

Every layer ``Y = min(max(Y @ W + bias on the nonzeros, 0), ymax)`` runs on batches of rows that
the workers pull: :func:`infer_on_cpus` runs them with the numba kernel on the workers' cores (the
network broadcast once to every worker, or streamed through windows of layers when it exceeds the
weight budget), :func:`infer_on_gpus` with the CUDA kernels on one GPU per worker (the network
uploaded once to each GPU, or loaded by the GPU workers themselves, a :class:`HeldNetwork`). Both
return an :class:`InferenceRun` holding a :class:`BatchResult` per batch.

One batch driver runs both, the per-device step a parameter: it keeps a bounded number of batches
in flight, places and releases the windows of weights, and bounds every wait by ``step_timeout``.
The Graph Challenge (:mod:`dasknn.challenge`) runs on this package.
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
