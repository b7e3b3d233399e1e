"""Where a data-parallel training step's time goes: tasks a step, wall time, task bodies, transfers.

Runs ``--steps`` steps of one architecture of :mod:`dasknn.data_parallel` (one shard per worker)
on a LocalCluster of ``--workers`` single-threaded workers (no network shaping: no root needed)
and reads Dask's task stream: tasks per step, the step's wall time, the time of the task bodies
per worker and per phase (the key's phase: ``compute``, ``push``, ``pull``, ...) and the summed
transfer time. The model is the sampled-softmax model of ``dataparallel.py --models corpus``
with Zipf-distributed ids instead of the corpus (V = 27,941, d = 128, 4 ids concatenated,
hidden 64, 256 candidates, global batch 256)::

    PYTHONPATH=. python3 benchmarks/dataparallel_profile.py --workers 4 --architecture hybrid
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe  # noqa: E402

VOCAB, DIM, CONTEXT, HIDDEN, SAMPLED, BATCH, WARMUP = 27941, 128, 4, 64, 256, 256, 2


def main() -> None:
    from distributed import Client, get_task_stream

    from dasknn.data_parallel import data_parallel
    from dasknn.data_parallel.hybrid import ARCHITECTURES
    from dasknn.model import EmbeddingMLP
    from dasknn.optim import SGD
    from dasknn.runtime.cluster import local_cluster
    from dasknn.runtime.keys import parse_dp_key

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--architecture", default="hybrid", choices=ARCHITECTURES)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    print(f"machine: {describe()}", flush=True)
    rng = np.random.default_rng(0)
    p = 1.0 / np.arange(1, VOCAB + 1)
    p /= p.sum()
    total = BATCH * (WARMUP + args.steps)
    X, y = rng.choice(VOCAB, (total, CONTEXT), p=p), rng.choice(VOCAB, total, p=p)
    model = EmbeddingMLP(
        VOCAB,
        CONTEXT,
        DIM,
        hidden=(HIDDEN,),
        combine="concat",
        dtype=np.float32,
        output="sampled",
        n_sampled=SAMPLED,
    )
    optimizer = SGD(lr=0.05)
    with local_cluster(args.workers) as cluster, Client(cluster) as client:
        arch = args.architecture
        with data_parallel(model, client, architecture=arch, sparse_partitions=args.workers) as dp:
            for k in range(WARMUP):
                dp.train_step(
                    X[k * BATCH : (k + 1) * BATCH],
                    y[k * BATCH : (k + 1) * BATCH],
                    optimizer=optimizer,
                )
            with get_task_stream(client) as stream:
                start = time.perf_counter()
                # fit tells the model each next batch: the steady state (prefetching) steps
                dp.fit(
                    X[WARMUP * BATCH :],
                    y[WARMUP * BATCH :],
                    batch_size=BATCH,
                    shuffle=False,
                    optimizer=optimizer,
                )
                wall = (time.perf_counter() - start) / args.steps
    n = args.steps
    bodies: dict = defaultdict(float)
    phases: dict = defaultdict(lambda: [0, 0.0])
    transfers = 0.0
    for task in stream.data:
        parsed = parse_dp_key(task["key"])
        for span in task["startstops"]:
            seconds = span["stop"] - span["start"]
            if span["action"] == "compute":
                bodies[task["worker"]] += seconds
                phase = phases[parsed.phase if parsed else "other"]
                phase[0] += 1
                phase[1] += seconds
            elif span["action"] == "transfer":
                transfers += seconds
    print(
        f"{arch}, N = {args.workers}: {len(stream.data) / n:.1f} tasks a step, "
        f"{wall * 1e3:.1f} ms a step (mean of {n} steps by fit)"
    )
    per_worker = ", ".join(f"{v / n * 1e3:.1f}" for v in bodies.values())
    print(f"  task bodies per worker: {per_worker} ms a step")
    print(f"  transfers, summed over the workers: {transfers / n * 1e3:.1f} ms a step")
    for phase, (count, seconds) in sorted(phases.items(), key=lambda kv: -kv[1][1]):
        print(f"  {phase:20s} {count / n:6.1f} tasks a step {seconds / n * 1e3:8.2f} ms a step")


if __name__ == "__main__":
    main()
