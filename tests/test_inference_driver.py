"""The data-parallel batch driver with a step of the test's own: every batch through every window,
at most ``weight_buffers`` windows placed, pinned slots keep their worker, and a faster worker
pulls more batches. Reference: the same affine windows applied with numpy."""

from __future__ import annotations

import time

import numpy as np
import pytest
import scipy.sparse as sp
from distributed import get_worker

from dasknn.inference._driver import per_worker_slots, run_batches, shared_slots
from dasknn.runtime.cluster import scheduler_workers


def apply_window(batch, weights: tuple[float, float], last: bool, delay: dict[str, float],
                 slot: str | None):  # fmt: skip
    """Task: ``rows * a + b`` for the window ``(a, b)``; the last window also returns whether it
    ran on its slot's worker (``None``: any) and on which worker."""
    worker = get_worker().address
    time.sleep(delay.get(worker, 0.0))  # a slow batch on purpose, not a wait
    rows = batch.toarray() if sp.issparse(batch) else batch
    out = rows * weights[0] + weights[1]
    return (out, slot in (None, worker), worker) if last else out


class AffineStep:
    """Windows are ``(a, b)`` pairs broadcast to every worker."""

    def __init__(self, buffers: int, delay: dict[str, float] | None = None) -> None:
        self.buffers = buffers
        self.delay = delay or {}
        self.windows: list[list] = []  # futures submitted through each window

    def place(self, client, weights, timeout):
        for futures in self.windows[: len(self.windows) + 1 - self.buffers]:
            assert all(f.done() for f in futures), "a window was placed before an old one passed"
        self.windows.append([])
        return client.scatter(weights, broadcast=True, hash=False)

    def submit(self, client, batch, placed, worker, last, timeout):
        workers = None if worker is None else [worker]
        future = client.submit(
            apply_window, batch, placed, last, self.delay, worker, workers=workers, pure=False
        )
        self.windows[-1].append(future)
        return future


@pytest.mark.parametrize("buffers", [1, 2])
def test_every_batch_through_every_window_with_bounded_buffers(dask_client, buffers):
    rng = np.random.default_rng(0)
    rows = sp.random(23, 5, density=0.5, random_state=1, format="csr")
    windows = [(float(a), float(b)) for a, b in rng.uniform(-1, 1, (4, 2))]
    step = AffineStep(buffers)
    results = run_batches(
        dask_client, rows, 4, step, [lambda w=w: w for w in windows], shared_slots(dask_client),
        weight_buffers=buffers, progress=False,
    )  # fmt: skip
    expected = rows.toarray()
    for a, b in windows:
        expected = expected * a + b
    assert sorted(s for s, _ in results) == list(range(0, 23, 4))
    for start, (out, on_slot, _) in results:
        np.testing.assert_allclose(out, expected[start : start + 4], rtol=1e-15)
        assert on_slot
    assert len(step.windows) == 4 and all(len(w) == 6 for w in step.windows)


def test_pinned_slots_keep_their_worker_and_faster_workers_pull_more(dask_client):
    fast, slow = sorted(scheduler_workers(dask_client))
    step = AffineStep(1, delay={slow: 1.0})
    rows = sp.csr_matrix(np.arange(24.0).reshape(12, 2))
    assert per_worker_slots([fast, slow]) == [fast, slow, fast, slow]  # one batch each first
    slots = per_worker_slots([fast, slow], per_worker=1)
    assert slots == [fast, slow]
    results = run_batches(dask_client, rows, 1, step, [lambda: (2.0, 1.0)], slots, progress=False)
    ran = [worker for _, (_, _, worker) in results]
    assert sorted(s for s, _ in results) == list(range(12))
    for start, (out, on_slot, _) in results:
        np.testing.assert_array_equal(out, rows[start].toarray() * 2.0 + 1.0)
        assert on_slot
    assert ran.count(slow) <= 3 and ran.count(fast) >= 9
