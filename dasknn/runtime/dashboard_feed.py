"""A distributed model's communication and timings on the dashboard page, updated while it trains:
``with DashboardFeed(dist) as feed: dist.fit(...)``. See docs/dashboard.md."""

from __future__ import annotations

import threading
import time
from typing import Any

from dasknn.exceptions import ModelClosedError, ModelFailedError
from dasknn.runtime.comm_report import CommReport
from dasknn.runtime.dashboard import install_dashboard_page, publish_report
from dasknn.runtime.distributed_model import DistributedModel

__all__ = ["DashboardFeed", "report_message"]


def report_message(
    token: str, report: CommReport, timings: dict[str, dict[str, float]], elapsed: float
) -> dict[str, Any]:
    """The page's report: ``report`` as plain lists, and per worker of ``timings`` the seconds of
    products, update, packing and the rest of ``elapsed`` (waiting)."""
    pairs: dict = {}
    for (_, _, sender, receiver), (nbytes, messages) in report.measured.items():
        row = pairs.setdefault((sender, receiver), [0, 0])
        row[0] += nbytes
        row[1] += messages
    layers: dict = {}
    for (layer, phase, _, _), ((mb, mm), (pb, _)) in report.compared().items():
        row = layers.setdefault((layer, phase), [0, 0, 0])
        row[0] += mb
        row[1] += pb
        row[2] += mm
    times = {}
    for worker, seconds in timings.items():
        products = seconds["forward_product"] + seconds["backward_product"]
        update = seconds["update"] - seconds["update_background"]
        busy = products + update + seconds["pack"]
        times[worker] = {
            "products": products,
            "update": update,
            "pack": seconds["pack"],
            "wait": max(elapsed - busy, 0.0),
        }
    return {
        "token": token,
        "batches": report.steps,
        "workers": sorted(timings or {w for pair in pairs for w in pair}),
        "pairs": [[sender, receiver, *row] for (sender, receiver), row in sorted(pairs.items())],
        "layers": [
            [layer, phase, *row]
            for (layer, phase), row in sorted(
                layers.items(), key=lambda item: (item[0][0] or 0, item[0][1])
            )
        ],
        "payload": report.total() - report.total(phase="other"),
        "predicted": report.total("predicted") - report.total("predicted", "other"),
        "other": report.total(phase="other"),
        "times": times,
    }


class DashboardFeed:
    """Publish ``dist``'s report to the dashboard page every ``interval`` seconds while open.

    Parameters
    ----------
    dist : DistributedModel
        Any distributed model; its ``timings()``, where it has one, give the per-worker times.
    interval : float
        Seconds between publications (each reads the scheduler's counts and workers' timings).

    Attributes
    ----------
    url : str
        The page's address, showing this model's run.
    last : dict
        The report published last.
    """

    def __init__(self, dist: DistributedModel, interval: float = 1.0) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        self.dist = dist
        self.interval = interval
        self.url = install_dashboard_page(dist.client, dist.token)
        self.last: dict[str, Any] = {}
        self._start = time.perf_counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def publish(self) -> dict[str, Any]:
        """Publish the model's report now; return it."""
        message = report_message(
            self.dist.token,
            self.dist.comm_report(),
            self.dist.timings() if hasattr(self.dist, "timings") else {},
            time.perf_counter() - self._start,
        )
        publish_report(self.dist.client, message)
        self.last = message
        return message

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.publish()
            except OSError:
                # a worker left: skip; the training reports it
                continue
            except (ModelClosedError, ModelFailedError):
                return  # the training reports why

    def __enter__(self) -> DashboardFeed:
        self._start = time.perf_counter()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="dasknn-dashboard", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if exc_info[0] is None:
            self.publish()
