"""The data-parallel batch driver: rows cut into batches that the workers pull, through one or
more windows of weights, with a per-device step.

A *step* places a window of weights on the workers and submits one batch through it. The driver
keeps a bounded number of batches in flight, one per *slot*, and gives a slot its next batch as
soon as the slot's batch finishes, so faster workers take more batches. A slot is either shared
(``None``: the scheduler picks the worker) or pinned to a worker address (one GPU each).

With several windows (weights streamed a window of layers at a time), a batch runs through the
windows in order and its state stays on the workers between them; at most ``weight_buffers``
windows are placed at once, and the oldest is released when all of its batches have passed it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import scipy.sparse as sp
from distributed import Client, Future, as_completed, wait
from tqdm.auto import tqdm

from dasknn.data_parallel.batches import batch_starts
from dasknn.runtime.cluster import worker_info

__all__ = ["BatchStep", "per_worker_slots", "run_batches", "shared_slots"]

#: Batches in flight per worker thread (one running, one queued) or per pinned worker.
IN_FLIGHT = 2


class BatchStep(Protocol):
    """What runs a batch on one kind of device."""

    def place(self, client: Client, weights: Any) -> Any:
        """Put a window of weights on the workers; return what :meth:`submit` passes to tasks."""

    def submit(
        self, client: Client, batch: Any, placed: Any, worker: str | None, last: bool
    ) -> Future:
        """Submit one batch through the placed window.

        ``batch`` is the batch's input rows at the first window, else the future of its state
        after the previous window; ``worker`` is the slot's worker (``None``: any); ``last`` says
        whether this is the last window, whose task returns the batch's result.
        """


def shared_slots(client: Client, per_thread: int = IN_FLIGHT) -> list[None]:
    """Slots that the scheduler places: ``per_thread`` for every thread of the cluster."""
    workers = worker_info(client).values()
    return [None] * (per_thread * sum(int(w.get("nthreads", 1)) for w in workers))


def per_worker_slots(addresses: Sequence[str], per_worker: int = IN_FLIGHT) -> list[str]:
    """Slots pinned to workers: ``per_worker`` for each address."""
    return [address for address in addresses for _ in range(per_worker)]


def run_batches(
    client: Client,
    rows: sp.csr_matrix,
    batch_size: int,
    step: BatchStep,
    windows: Sequence[Callable[[], Any]],
    slots: Sequence[str | None],
    *,
    weight_buffers: int = 1,
    progress: bool = True,
    desc: str = "batches",
) -> list[tuple[int, Any]]:
    """Run every batch of ``rows`` through every window of weights.

    Parameters
    ----------
    client : distributed.Client
    rows : scipy.sparse.csr_matrix
        The input rows; batch ``i`` is ``rows[i * batch_size : (i + 1) * batch_size]``.
    batch_size : int
        Rows per batch.
    step : BatchStep
        Places the weights and submits a batch (see :class:`BatchStep`).
    windows : sequence of callables
        ``windows[k]()`` makes the weights of window ``k``; it is called when the window is
        placed, so streamed windows are made one at a time.
    slots : sequence of str or None
        One entry per batch in flight (see :func:`shared_slots`, :func:`per_worker_slots`).
    weight_buffers : int
        Windows placed at once.
    progress : bool
        Show a progress bar over batches and windows.
    desc : str
        Label of the progress bar.

    Returns
    -------
    list of (int, object)
        ``(first row, result of the last window's task)`` for every batch, in completion order.
    """
    if not slots:
        raise ValueError("the Dask cluster has no workers")
    if not windows:
        raise ValueError("there are no windows of weights")
    if weight_buffers < 1:
        raise ValueError(f"weight_buffers must be >= 1, got {weight_buffers}")
    starts = batch_starts(rows.shape[0], batch_size)
    last = len(windows) - 1
    items = ((w, b) for w in range(len(windows)) for b in range(len(starts)))
    states: list[Future | None] = [None] * len(starts)  # a batch's state between windows
    placed: deque[tuple[Any, list[Future]]] = deque()  # (weights, states after them)
    running: dict[str, tuple[int, int, str | None]] = {}
    results: list[tuple[int, Any]] = []
    queue = as_completed()

    def submit_next(worker: str | None) -> None:
        item = next(items, None)
        if item is None:
            return
        w, b = item
        if b == 0:
            if len(placed) >= weight_buffers:
                _, passed = placed.popleft()
                wait(passed)
            placed.append((step.place(client, windows[w]()), []))
        weights, passed = placed[-1]
        batch = rows[starts[b] : starts[b] + batch_size] if w == 0 else states[b]
        future = step.submit(client, batch, weights, worker, w == last)
        if w != last:
            states[b] = future
            passed.append(future)
        running[future.key] = (b, w, worker)
        queue.add(future)

    total = len(starts) * len(windows)
    with tqdm(total=total, disable=not progress, unit="batch", desc=desc) as bar:
        for worker in slots:
            submit_next(worker)
        for future in queue:
            b, w, worker = running.pop(future.key)
            if w == last:
                results.append((starts[b], future.result()))
                future.release()
            bar.update(1)
            submit_next(worker)
    placed.clear()
    return results
