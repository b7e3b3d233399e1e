"""What ``run_challenge(load_on_workers=True)`` removes: the compact network's trip from the client
to a GPU worker process.

For each ``radixnet:N:L`` spec, on a LocalCluster of one worker process (no GPU needed):

- client-loaded (the default path): the client loads, checks and compacts the network
  (:func:`dasknn.challenge.worker_network.load_compact_network`, run in this process), then sends
  the compact copy to the worker and runs a task on it there
  (:func:`dasknn.data_parallel.broadcast.load_on_each`, as ``CUDAInference.place`` does before
  the upload to the GPU): the *trip*, inside the challenge's clock;
- worker-loaded: the worker does the same load itself and only its summary comes back
  (:func:`dasknn.challenge.worker_network.load_on_gpu_workers`), before the clock.

It prints the seconds of each part, the trip's GB/s (compact bytes / trip seconds), and the
ratio of the client path's load + trip to the worker path's load (the best of ``--repeats``).

    python benchmarks/network_trip.py --specs radixnet:16384:120,radixnet:65536:24
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np
from distributed import Client, LocalCluster
from machine import describe

from dasknn.challenge.worker_network import load_compact_network, load_on_gpu_workers
from dasknn.data_parallel.broadcast import load_on_each
from dasknn.runtime.waiting import gather_at_most


def held_bytes(network) -> int:
    """On the worker: the bytes of the copy it received (the task that takes it there)."""
    return network.nbytes


def client_path(client: Client, address: str, spec: str, timeout: float) -> dict:
    start = time.perf_counter()
    compact = load_compact_network(spec, None, None, 0, "float32", False)
    loaded = time.perf_counter()
    placed = load_on_each(client, compact, [address], timeout, held_bytes)
    received = gather_at_most(client, [placed[address]], timeout)[0]
    done = time.perf_counter()
    assert received == compact.nbytes
    del placed
    return {
        "load": loaded - start,
        "trip": done - loaded,
        "bytes": compact.nbytes,
        "edges": int(compact.indptr[-1, -1]),
    }


def worker_path(client: Client, address: str, spec: str, timeout: float) -> dict:
    start = time.perf_counter()
    held = load_on_gpu_workers(
        client,
        [address],
        spec,
        neurons=None,
        layers=None,
        seed=0,
        dtype=np.dtype("float32"),
        tiled=False,
        step_timeout=timeout,
    )
    seconds = time.perf_counter() - start
    held.release()
    return {"load": seconds, "edges": held.edges}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", default="radixnet:16384:120,radixnet:65536:24")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--memory-limit", default="20GiB", help="the worker's memory limit")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    print(f"machine: {describe()}", flush=True)
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            memory_limit=args.memory_limit,
        ) as cluster,
        Client(cluster) as client,
    ):
        address = next(iter(client.scheduler_info()["workers"]))
        client.run(load_compact_network, "radixnet:64:2", None, None, 0, "float32", False)
        load_compact_network("radixnet:64:2", None, None, 0, "float32", False)  # numba's JIT
        print(
            "| spec | edges | compact GB | client load s | trip s | trip GB/s | client load + "
            "trip s | worker load s | client / worker |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for spec in args.specs.split(","):
            by_client, by_worker = [], []
            for _ in range(args.repeats):
                by_client.append(client_path(client, address, spec, args.timeout))
                gc.collect()
                by_worker.append(worker_path(client, address, spec, args.timeout))
            c = min(by_client, key=lambda r: r["load"] + r["trip"])
            w = min(by_worker, key=lambda r: r["load"])
            assert c["edges"] == w["edges"]
            total = c["load"] + c["trip"]
            print(
                f"| {spec} | {c['edges']:,} | {c['bytes'] / 1e9:.3f} | {c['load']:.2f} | "
                f"{c['trip']:.2f} | {c['bytes'] / 1e9 / c['trip']:.2f} | {total:.2f} | "
                f"{w['load']:.2f} | {total / w['load']:.2f} |",
                flush=True,
            )
    print(f"machine after: {describe()}")


if __name__ == "__main__":
    main()
