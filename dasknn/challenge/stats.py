"""The statistics of a challenge run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = ["ChallengeStats", "merge_batches"]


def merge_batches(results: Sequence[tuple[int, object]]) -> tuple[np.ndarray, dict[str, int]]:
    """The sorted 1-based categories and the peak memory per worker of ``(first row,
    BatchResult)`` pairs."""
    categories = np.sort(
        np.concatenate([r.rows + s + 1 for s, r in results] or [np.empty(0, np.int64)])
    ).astype(np.int64)
    peaks: dict[str, int] = {}
    for _, r in results:
        for name, value in r.peak_memory.items():
            peaks[name] = max(peaks.get(name, 0), value)
    return categories, peaks


@dataclass
class ChallengeStats:
    """What a challenge run did and how fast.

    Attributes
    ----------
    inputs, neurons, layers, edges : int
        Input rows, neurons per layer, layers, and nonzeros of all layers together.
    categories : int
        Input rows that are not all zero after the last layer.
    seconds : float
        Wall time of the inference (docs/challenge.md says what the clock covers).
    rate : float
        ``inputs * edges / seconds``, the challenge's measure (edges per second).
    kernel_seconds : float
        Time spent inside the kernel, summed over batches and workers.
    macs_done, macs_needed : int
        Multiply-adds the kernel executed, and those a sparse product skipping every zero
        activation would need (nominal: ``inputs * edges``).
    batches, batch_size : int
        Number of batches and rows per batch.
    dtype : str
        ``float32`` or ``float64``.
    workers : int
        Dask workers used.
    mode : str
        ``broadcast`` (every worker holds all layers) or ``streamed`` (a bounded window).
    resident_layers, weight_buffers : int
        Layers per weight buffer and buffers resident per worker at once.
    weight_bytes : int
        Bytes of the packed network.
    peak_memory : dict of str to int
        Peak resident memory (bytes) of each worker process that ran batches.
    device : str
        ``cpu`` (numba kernel on the workers' cores) or ``cuda`` (the workers' GPUs).
    gpus : list of str
        Names of the GPUs used (``device="cuda"``).
    """

    inputs: int
    neurons: int
    layers: int
    edges: int
    categories: int
    seconds: float
    rate: float
    kernel_seconds: float
    macs_done: int
    macs_needed: int
    batches: int
    batch_size: int
    dtype: str
    workers: int
    mode: str
    resident_layers: int
    weight_buffers: int
    weight_bytes: int
    peak_memory: dict[str, int] = field(default_factory=dict)
    device: str = "cpu"
    gpus: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        """A JSON-ready dictionary."""
        return asdict(self)

    def summary(self) -> str:
        """A few human-readable lines."""
        nominal = self.inputs * self.edges
        peak = max(self.peak_memory.values(), default=0)
        where = (
            f"{self.workers} workers"
            if self.device == "cpu"
            else (f"{self.workers} GPU workers: {', '.join(self.gpus)}")
        )
        needed = f"{self.macs_needed:.4g} needed, " if self.macs_needed else ""
        lines = [
            f"network: {self.neurons} neurons x {self.layers} layers, {self.edges} edges; "
            f"{self.inputs} inputs, {self.categories} categories",
            f"time: {self.seconds:.3f} s, rate: {self.rate:.4g} edges/s "
            f"({where}, {self.batches} batches of {self.batch_size}, {self.dtype}, "
            f"{self.mode} weights)",
            f"work: {self.macs_done:.4g} multiply-adds done, {needed}"
            f"{nominal:.4g} nominal; kernel time {self.kernel_seconds:.3f} s",
            f"peak memory per worker: {peak / 2**20:.0f} MiB (max of "
            f"{len(self.peak_memory)} workers)",
        ]
        return "\n".join(lines)
