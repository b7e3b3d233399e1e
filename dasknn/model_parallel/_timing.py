"""Time a model-parallel training run and split it into local products, update and waiting."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dasknn.model_parallel._model import DistributedSparseMLP
from dasknn.runtime.comm_report import CommReport

__all__ = ["TrainingTimes", "time_training"]


@dataclass(frozen=True)
class TrainingTimes:
    """Per-batch seconds of a timed run: wall time (``per_batch``); sparse products, gradient and
    optimizer update (``update_background`` of it on the background thread) and packing on the
    busiest worker; ``wait = per_batch - (products + pack + update - update_background)``, that
    worker's task thread waiting for communication, scheduling and other workers. ``comm``:
    measured against predicted communication of the timed batches."""

    batches: int
    batch_size: int
    per_batch: float
    products: float
    update: float
    update_background: float
    pack: float
    wait: float
    comm: CommReport

    @property
    def samples_per_second(self) -> float:
        """Training throughput."""
        return self.batch_size / self.per_batch

    def format(self) -> str:
        """One line: time per batch and its breakdown."""
        return (
            f"{self.per_batch * 1e3:9.1f} ms/batch ({self.samples_per_second:,.0f} samples/s): "
            f"local products {self.products * 1e3:.1f} ms, update {self.update * 1e3:.1f} ms "
            f"({self.update_background * 1e3:.1f} in the background), pack "
            f"{self.pack * 1e3:.1f} ms, communication+scheduling wait {self.wait * 1e3:.1f} ms"
        )


def time_training(
    dist: DistributedSparseMLP, X: np.ndarray, Y: np.ndarray, batch_size: int, epochs: int = 1,
    lr: float | None = 0.01, warmup: bool = True, progress: bool = False,
    on_epoch: Callable[[int, float], None] | None = None, **fit_options,
) -> TrainingTimes:  # fmt: skip
    """Train ``dist`` on ``(X, Y)`` with ``fit`` (``on_epoch``'s time not counted) and time it,
    after a warm-up step unless ``warmup`` is false; plain SGD at ``lr``, or the ``optimizer``
    of ``fit_options``, which go to ``fit``."""
    optimizer = fit_options.get("optimizer")
    lr = None if optimizer is not None else lr
    if warmup:
        dist.train_step(X[:batch_size], Y[:batch_size], lr=lr, optimizer=optimizer)
    dist.reset_comm()
    outside = 0.0

    def timed_on_epoch(epoch: int, loss: float) -> None:
        nonlocal outside
        begin = time.perf_counter()
        on_epoch(epoch, loss)
        outside += time.perf_counter() - begin

    start = time.perf_counter()
    dist.fit(
        X, Y, batch_size=batch_size, epochs=epochs, lr=lr, progress=progress,
        on_epoch=timed_on_epoch if on_epoch is not None else None, **fit_options,
    )  # fmt: skip
    wall = time.perf_counter() - start - outside
    comm = dist.comm_report()
    batches = max(comm.steps, 1)
    busiest = max(dist.timings().values(), key=lambda t: sum(t.values()))
    each = {kind: seconds / batches for kind, seconds in busiest.items()}
    products = (busiest["forward_product"] + busiest["backward_product"]) / batches
    update, background, pack = each["update"], each["update_background"], each["pack"]
    per_batch = wall / batches
    wait = per_batch - products - pack - (update - background)
    return TrainingTimes(
        batches, batch_size, per_batch, products, update, background, pack, wait, comm
    )
