"""What placing a value on every worker costs with ``dasknn.data_parallel.broadcast.broadcast``
(scattered to one worker, then copied to each by a task pinned there) against Dask's own
broadcast (``Client.scatter(value, broadcast=True)``, the scheduler's ``replicate``), which the
challenge's CPU path used before: the median wall time of a placement, until every worker holds
the value, for arrays of a few sizes, the two interleaved on the same cluster.

Usage::

    flock /tmp/dasknn-tests.lock python benchmarks/broadcast_placement.py [--workers 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import dask
import numpy as np
from distributed import Client, LocalCluster
from machine import describe

from dasknn.data_parallel.broadcast import broadcast


def _dask_broadcast(client: Client, value: np.ndarray):
    return client.scatter(value, hash=False, broadcast=True)


def _dasknn_broadcast(client: Client, value: np.ndarray):
    return broadcast(client, value, 60.0)


def _placed_seconds(client: Client, place, value: np.ndarray, workers: int) -> float:
    """Wall time of one placement; checks every worker holds the value, then lets it go."""
    start = time.perf_counter()
    future = place(client, value)
    took = time.perf_counter() - start
    holders = client.who_has(future)[future.key]
    assert len(holders) == workers, holders
    key = future.key
    future.release()
    del future
    while client.run_on_scheduler(lambda dask_scheduler: key in dask_scheduler.tasks):
        time.sleep(0.01)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--mib", type=float, nargs="+", default=[0.01, 1.0, 16.0, 64.0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    print(describe())
    # Dask's active memory manager drops replicas no task waits for (every 2 s): off, so the
    # check that every worker holds the value cannot race it
    no_amm = {"distributed.scheduler.active-memory-manager.start": False}
    with dask.config.set(no_amm), LocalCluster(
        n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        ways = {
            "dask scatter(broadcast=True)": _dask_broadcast,
            "dasknn broadcast": _dasknn_broadcast,
        }
        print(f"{args.workers} worker processes, median of {args.repeats}, interleaved:")
        for mib in args.mib:
            value = np.random.default_rng(0).random(max(int(mib * 2**20 / 8), 1))
            for place in ways.values():  # warm-up: connections, imports
                _placed_seconds(client, place, value, args.workers)
            times: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(args.repeats):
                for name, place in ways.items():
                    times[name].append(_placed_seconds(client, place, value, args.workers))
            old, new = (statistics.median(times[name]) for name in ways)
            print(f"  {mib:8.2f} MiB: dask {old * 1e3:8.2f} ms  dasknn {new * 1e3:8.2f} ms  "
                  f"ratio dasknn/dask {new / old:5.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
