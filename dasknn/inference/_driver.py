"""The data-parallel batch driver: batches pulled by the workers' *slots* (shared or pinned to a
worker) through one or more windows of weights placed by a per-device step, at most
``weight_buffers`` at once; every wait bounded by ``step_timeout`` and every future released on
error (docs/challenge.md, "The engine"; docs/reliability.md).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import scipy.sparse as sp
from distributed import Client, Future, futures_of
from tqdm.auto import tqdm

from dasknn.exceptions import StepTimeoutError
from dasknn.inference._batches import batch_starts
from dasknn.runtime.cluster import scheduler_workers
from dasknn.runtime.step_timeout import (
    DEFAULT_STEP_TIMEOUT,
    check_step_timeout,
    step_timeout_error,
)
from dasknn.runtime.waiting import (
    gather_at_most,
    wait_at_most,
    watch_workers,
)

__all__ = ["BatchStep", "per_worker_slots", "run_batches", "shared_slots"]

#: Batches in flight per worker thread (one running, one queued) or per pinned worker.
IN_FLIGHT = 2
#: Seconds between two looks at the pinned slots' workers while no batch finishes.
POLL_SECONDS = 1.0


class BatchStep(Protocol):
    """What runs a batch on one kind of device."""

    def place(self, client: Client, weights: Any, timeout: float) -> Any:
        """Put a window of weights on the workers; return what :meth:`submit` passes to tasks.
        ``TimeoutError`` if they did not arrive within ``timeout`` seconds."""

    def submit(
        self,
        client: Client,
        batch: Any,
        placed: Any,
        worker: str | None,
        last: bool,
        timeout: float,
    ) -> Future:
        """Submit one batch (input rows, or the future of its previous state) through the placed
        window on ``worker`` (``None``: any); ``last``: its task returns the batch's result.
        ``TimeoutError`` if sending took over ``timeout`` seconds."""


def shared_slots(client: Client, per_thread: int = IN_FLIGHT) -> list[None]:
    """Slots that the scheduler places: ``per_thread`` for every thread of the cluster."""
    workers = scheduler_workers(client).values()
    return [None] * (per_thread * sum(int(w.get("nthreads", 1)) for w in workers))


def per_worker_slots(addresses: Sequence[str], per_worker: int = IN_FLIGHT) -> list[str]:
    """Slots pinned to workers: ``per_worker`` for each address, in turns (``a, b, a, b``)."""
    return [address for _ in range(per_worker) for address in addresses]


class _InFlight:
    """The batches submitted and not yet taken back, and what the driver holds for them."""

    def __init__(self, client: Client, step_timeout: float, batches: int, windows: int) -> None:
        self.client = client
        self.step_timeout = step_timeout
        self.batches = batches
        self.windows = windows
        self.running: dict[str, tuple[Future, int, int, str | None]] = {}

    def add(self, future: Future, batch: int, window: int, worker: str | None) -> None:
        """Hold ``future``, batch ``batch`` at window ``window`` on slot ``worker``."""
        self.running[future.key] = (future, batch, window, worker)

    def wait_first(self, futures: Sequence[Future]) -> None:
        """Wait until one of ``futures`` has finished, looking at the pinned slots' workers.

        Raises
        ------
        WorkerLostError
            As soon as a worker a running batch is pinned to has left the cluster.
        StepTimeoutError
            If none finished within ``step_timeout``, naming the running batches' workers.
        """
        deadline = time.monotonic() + self.step_timeout
        while True:
            left = deadline - time.monotonic()
            if wait_at_most(futures, max(min(POLL_SECONDS, left), 0.01), "FIRST_COMPLETED"):
                return
            pinned = {worker for _, _, _, worker in self.running.values() if worker is not None}
            if pinned:
                lost = watch_workers(client=self.client, workers=pinned, what=self._pinned_to)()
                if lost is not None:
                    raise lost
            if left <= POLL_SECONDS:
                raise self._timeout_error("no batch finished")

    def fetch(self, future: Future, batch: int) -> Any:
        """The result of a finished batch, fetched within ``step_timeout``."""
        try:
            return gather_at_most(self.client, [future], self.step_timeout)[0]
        except TimeoutError:
            holders = self.client.who_has([future]).get(future.key, ())
            raise step_timeout_error(
                self.client, f"the result of batch {batch + 1} did not arrive",
                self.step_timeout, list(holders),
            ) from None  # fmt: skip

    def _label(self, batch: int, window: int) -> str:
        return f"{batch + 1}" + (f" (window {window + 1})" if self.windows > 1 else "")

    def _pinned_to(self, lost: list[str]) -> str:
        labels = [
            self._label(b, w) for _, b, w, worker in self.running.values() if worker in lost
        ]
        many = len(labels) > 1
        return (
            f"batch{'es' if many else ''} {', '.join(labels)} of {self.batches} "
            f"{'were' if many else 'was'} pinned there"
        )

    def _timeout_error(self, what: str) -> StepTimeoutError:
        """The error naming the running batches by worker and their workers' state."""
        processing = {
            key: address
            for address, keys in self.client.processing().items()
            for key in keys
        }
        by_worker: dict[str, list[str]] = {}
        unplaced = []
        for key, (future, b, w, worker) in self.running.items():
            if future.done():
                continue
            address = worker or processing.get(key)
            if address is None:
                unplaced.append(self._label(b, w))
            else:
                by_worker.setdefault(address, []).append(self._label(b, w))
        roles = {
            address: f"batch{'es' if len(labels) > 1 else ''} {', '.join(labels)} of "
            f"{self.batches}"
            for address, labels in by_worker.items()
        }
        if unplaced:
            what += f" (batches {', '.join(unplaced)} wait for a worker)"
        return step_timeout_error(self.client, what, self.step_timeout, list(roles), roles)

    def release(self) -> None:
        """Release every batch's future."""
        for future, *_ in self.running.values():
            future.release()
        self.running.clear()


def run_batches(
    client: Client,
    rows: sp.csr_matrix,
    batch_size: int,
    step: BatchStep,
    windows: Sequence[Callable[[], Any]],
    slots: Sequence[str | None],
    *,
    weight_buffers: int = 1,
    step_timeout: float = DEFAULT_STEP_TIMEOUT,
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
    step : BatchStep
        Places the weights and submits a batch (see :class:`BatchStep`).
    windows : sequence of callables
        ``windows[k]()`` makes window ``k``'s weights, called when it is placed.
    slots : sequence of str or None
        One entry per batch in flight (see :func:`shared_slots`, :func:`per_worker_slots`).
    weight_buffers : int
        Windows placed at once.
    step_timeout : float
        Seconds the run may go without a batch finishing, a window placed or a result arriving.
    progress : bool
        A progress bar over batches and windows.
    desc : str
        Its label.

    Returns
    -------
    list of (int, object)
        ``(first row, result of the last window's task)`` for every batch, in completion order.

    Raises
    ------
    ValueError
        On no slots, no windows, ``weight_buffers < 1`` or a bad ``step_timeout``, before
        anything is scheduled.
    StepTimeoutError
        If no batch finished within ``step_timeout`` seconds (naming the running batches, their
        workers and their state), or a window, rows or result did not arrive in that time.
    WorkerLostError
        As soon as a worker that a running batch is pinned to has left the cluster.
    Exception
        A batch task's own error.

    Every future the driver holds is released when it raises.
    """
    if not slots:
        raise ValueError("the Dask cluster has no workers")
    if not windows:
        raise ValueError("there are no windows of weights")
    if weight_buffers < 1:
        raise ValueError(f"weight_buffers must be >= 1, got {weight_buffers}")
    step_timeout = check_step_timeout(step_timeout)
    starts = batch_starts(rows.shape[0], batch_size)
    last = len(windows) - 1
    items = ((w, b) for w in range(len(windows)) for b in range(len(starts)))
    states: list[Future | None] = [None] * len(starts)  # a batch's state between windows
    placed: deque[tuple[Any, list[Future]]] = deque()  # (weights, states after them)
    flight = _InFlight(client, step_timeout, len(starts), len(windows))
    results: list[tuple[int, Any]] = []
    pinned = sorted({worker for worker in slots if worker is not None})

    def place(w: int) -> None:
        if len(placed) >= weight_buffers:
            _, passed = placed.popleft()
            while unfinished := [f for f in passed if not f.done()]:
                flight.wait_first(unfinished)
        try:
            placed.append((step.place(client, windows[w](), step_timeout), []))
        except TimeoutError:
            workers = pinned or list(scheduler_workers(client))
            raise step_timeout_error(
                client, f"window {w + 1} of the weights did not reach the workers",
                step_timeout, workers,
            ) from None  # fmt: skip

    def submit_next(worker: str | None) -> None:
        item = next(items, None)
        if item is None:
            return
        w, b = item
        if b == 0:
            place(w)
        weights, passed = placed[-1]
        batch = rows[starts[b] : starts[b] + batch_size] if w == 0 else states[b]
        try:
            future = step.submit(client, batch, weights, worker, w == last, step_timeout)
        except TimeoutError:
            raise step_timeout_error(
                client, f"batch {b + 1} did not reach its worker", step_timeout, [worker]
            ) from None
        if w != last:
            states[b] = future
            passed.append(future)
        flight.add(future, b, w, worker)

    total = len(starts) * len(windows)
    try:
        with tqdm(total=total, disable=not progress, unit="batch", desc=desc) as bar:
            for worker in slots:
                submit_next(worker)
            while flight.running:
                flight.wait_first([future for future, *_ in flight.running.values()])
                done = [key for key, (f, *_) in flight.running.items() if f.done()]
                for key in done:
                    future, b, w, worker = flight.running[key]
                    if w == last:
                        results.append((starts[b], flight.fetch(future, b)))
                        future.release()
                    del flight.running[key]
                    bar.update(1)
                    submit_next(worker)
    except BaseException:
        # the error's traceback holds this frame: release the run's futures now
        flight.release()
        for future in futures_of([states, [weights for weights, _ in placed]]):
            future.release()
        raise
    placed.clear()
    return results
