"""How often each worker fetches each of the CPU challenge engine's weight windows during a run,
with Dask's active memory manager ticking at a chosen interval: a window is broadcast once (one
worker gets it from the client, the others a copy), and the manager's ``ReduceReplicas`` policy
may drop a copy no task waits for at that moment, which its worker then fetches again. Counted
from each worker's ``transfer_incoming_log`` (the windows are the ``PackedLayers-...`` keys).

Usage::

    flock /tmp/dasknn-tests.lock python benchmarks/window_fetches.py \
        [--interval 2s] [--resident-layers 30] [--runs 3] [--copies 4]

The official 1024 x 120 network is used where ``../shared`` has it, else ``radixnet:1024:120``;
the inputs are the bundled MNIST test set at the challenge's size, repeated ``--copies`` times,
in batches of 500 on two single-threaded workers.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

import dask
import scipy.sparse as sp
from distributed import Client, LocalCluster
from distributed.worker import Worker
from machine import describe

from dasknn.challenge import run_challenge
from dasknn.challenge.inputs import load_inputs

ROOT = Path(__file__).resolve().parents[1]
OFFICIAL = ROOT.parent / "shared" / "data" / "graphchallenge" / "neuron1024"
IMAGES = ROOT / "dasknn" / "datasets" / "data" / "t10k-images-idx3-ubyte.gz"


def _window_fetches(dask_worker: Worker) -> dict[str, tuple[int, int]]:
    """The windows this worker fetched: their key, how many times and the bytes in all."""
    times: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for transfer in dask_worker.transfer_incoming_log:
        for key in transfer["keys"]:
            if str(key).startswith("PackedLayers-"):
                times[str(key)] += 1
                total[str(key)] += transfer["keys"][key]
    return {key: (times[key], total[key]) for key in times}


def _run(interval: str, resident_layers: int | None, copies: int) -> None:
    network = str(OFFICIAL) if (OFFICIAL / "n1024-l1.tsv.gz").exists() else "radixnet:1024:120"
    inputs = sp.vstack([load_inputs(IMAGES, 1024)] * copies).tocsr()
    config = {"distributed.scheduler.active-memory-manager.interval": interval}
    with (
        dask.config.set(config),
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        start = time.perf_counter()
        _, stats = run_challenge(
            network, inputs, client=client, batch_size=500, progress=False,
            resident_layers=resident_layers,
        )
        seconds = time.perf_counter() - start
        fetched = client.run(_window_fetches)
    windows = {key for per_worker in fetched.values() for key in per_worker}
    again = sum(n - 1 for per_worker in fetched.values() for n, _ in per_worker.values())
    extra = sum(
        b - b // n for per_worker in fetched.values() for n, b in per_worker.values()
    )
    print(
        f"interval {interval}, mode {stats.mode}, {inputs.shape[0]} inputs, {seconds:.1f} s: "
        f"{len(windows)} windows fetched, {again} fetched again ({extra / 1e6:.1f} MB more)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", default="2s", help="the memory manager's interval")
    parser.add_argument("--resident-layers", type=int, default=None,
                        help="layers a window (default: the whole network, broadcast mode)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--copies", type=int, default=4, help="times the 10,000 images repeat")
    args = parser.parse_args()
    print(describe())
    for _ in range(args.runs):
        _run(args.interval, args.resident_layers, args.copies)


if __name__ == "__main__":
    main()
