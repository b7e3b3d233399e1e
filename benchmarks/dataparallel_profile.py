"""Where a data-parallel training step's time goes: tasks a step, wall time, task bodies, transfers.

Runs ``--steps`` steps of one architecture of :mod:`dasknn.data_parallel` (one shard per worker)
on a LocalCluster of ``--workers`` single-threaded workers (no network shaping: no root needed)
and reads Dask's task stream: tasks per step, the step's wall time, the time of the task bodies
per worker and per phase (the key's phase: ``compute``, ``push``, ``pull``, ...) with the mean
offset of the phase's first start and last stop from the step's first ``compute`` (a step's
prefetched rows are sent during the step before: negative), and the summed
transfer time; then the client's own share of the step (``cProfile`` of the ``fit``: planning,
building and submitting the graph, waiting). ``--model sampled`` is the sampled-softmax model of
``dataparallel.py --models corpus`` with Zipf-distributed ids instead of the corpus (V = 27,941,
d = 128, 4 ids concatenated, hidden 64, 256 candidates, global batch 256); ``--model zipf`` the
large-vocabulary model of ``dataparallel.py --models zipf`` (V = 2^18, d = 256, mean of 4 Zipf
ids, hidden 256, 1,024 classes, batch 1,024).

``--floor`` also times Dask alone on the shape of a ``hybrid`` step with prefetching at one
shard per worker: per worker a first task, ``compute``, a ``push`` message to every other
worker, an ``update`` after the pushes, a reply to every other worker and ``finish`` after the
replies (``6 N + 2 N (N - 1)`` no-op tasks, ``2 N (N - 1)`` messages, pinned as the model pins
its keys), once with empty messages and once with messages of the step's measured mean size::

    PYTHONPATH=. python3 benchmarks/dataparallel_profile.py --workers 4 --architecture hybrid
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe  # noqa: E402

WARMUP = 2
MODELS = {
    "sampled": dict(vocab=27941, dim=128, hidden=64, classes=27941, batch=256, combine="concat"),
    "zipf": dict(vocab=2**18, dim=256, hidden=256, classes=1024, batch=1024, combine="mean"),
}
CONTEXT, SAMPLED = 4, 256


def _no_op(*args) -> int:
    return 0


def _message(nbytes: int, *after) -> np.ndarray:
    return np.zeros(nbytes, dtype=np.uint8)


def time_floor(client, workers: list[str], steps: int, nbytes: int) -> float:
    """Mean seconds a step of the no-op graph shaped like a ``hybrid`` step (module docstring)
    takes, each message ``nbytes`` long."""
    import dask
    from dask.task_spec import Task, TaskRef

    n = len(workers)

    def step_graph(step: int) -> tuple[dict, list]:
        def key(phase, a, b):
            return ("dasknn-floor", step, phase, a, b)

        tasks = {}

        def add(k, func, *args):
            tasks[k] = Task(k, func, *args)
            return TaskRef(k)

        computed = [
            add(key("compute", i, i), _no_op, add(key("pull", i, i), _no_op)) for i in range(n)
        ]
        pushes = {
            (i, j): add(key("push", i, j), _message, nbytes, computed[i])
            for i in range(n)
            for j in range(n)
            if i != j
        }
        updates = [
            add(
                key("update", j, j),
                _no_op,
                computed[j],
                *[pushes[i, j] for i in range(n) if i != j],
            )
            for j in range(n)
        ]
        replies = {
            (j, i): add(key("reply", j, i), _message, nbytes, updates[j])
            for j in range(n)
            for i in range(n)
            if i != j
        }
        outputs = [
            add(
                key("finish", i, i),
                _no_op,
                computed[i],
                updates[i],
                *[replies[j, i] for j in range(n) if j != i],
            ).key
            for i in range(n)
        ]
        return tasks, outputs

    def placement(k) -> list[str]:
        return [workers[k[3]]]

    times = []
    for step in range(WARMUP + steps):
        tasks, outputs = step_graph(step)
        start = time.perf_counter()
        with dask.annotate(workers=placement, allow_other_workers=False):
            client.gather(client.get(tasks, outputs, sync=False))
        times.append(time.perf_counter() - start)
    return float(np.mean(times[WARMUP:]))


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
    parser.add_argument("--model", default="sampled", choices=sorted(MODELS))
    parser.add_argument("--floor", action="store_true")
    args = parser.parse_args()
    print(f"machine: {describe()}", flush=True)
    m = MODELS[args.model]
    vocab, batch = m["vocab"], m["batch"]
    rng = np.random.default_rng(0)
    p = 1.0 / np.arange(1, vocab + 1)
    p /= p.sum()
    total = batch * (WARMUP + args.steps)
    X = rng.choice(vocab, (total, CONTEXT), p=p)
    if args.model == "sampled":  # Zipf labels over the vocabulary
        y = rng.choice(vocab, total, p=p)
    else:  # uniform over the classes, as dataparallel.py
        y = rng.integers(0, m["classes"], total)
    sampled = {"output": "sampled", "n_sampled": SAMPLED} if args.model == "sampled" else {}
    model = EmbeddingMLP(
        vocab,
        CONTEXT,
        m["dim"],
        hidden=(m["hidden"],),
        n_classes=m["classes"],
        combine=m["combine"],
        dtype=np.float32,
        **sampled,
    )
    optimizer = SGD(lr=0.05)
    client_profile = cProfile.Profile()
    with local_cluster(args.workers) as cluster, Client(cluster) as client:
        arch = args.architecture
        # the task graph of a step, whose tasks the task stream shows by phase
        with data_parallel(
            model, client, architecture=arch, sparse_partitions=args.workers, messages="tasks"
        ) as dp:
            for k in range(WARMUP):
                dp.train_step(
                    X[k * batch : (k + 1) * batch],
                    y[k * batch : (k + 1) * batch],
                    optimizer=optimizer,
                )
            dp.reset_comm()
            with get_task_stream(client) as stream:
                start = time.perf_counter()
                # fit tells the model each next batch: the steady state (prefetching) steps
                client_profile.enable()
                dp.fit(
                    X[WARMUP * batch :],
                    y[WARMUP * batch :],
                    batch_size=batch,
                    shuffle=False,
                    optimizer=optimizer,
                )
                client_profile.disable()
                wall = (time.perf_counter() - start) / args.steps
            report = dp.comm_report()
            messages = sum(count for _, count in report.measured.values())
            nbytes = report.total()
        if args.floor:
            workers = list(dp.workers)
            empty = time_floor(client, workers, args.steps, 0)
            sized = time_floor(client, workers, args.steps, nbytes // max(messages, 1))
    n = args.steps
    bodies: dict = defaultdict(float)
    phases: dict = defaultdict(lambda: [0, 0.0])
    step_start: dict = {}
    spans: dict = defaultdict(lambda: [np.inf, -np.inf])  # (step, phase): first start, last stop
    transfers, transfer_count = 0.0, 0
    for task in stream.data:
        parsed = parse_dp_key(task["key"])
        for span in task["startstops"]:
            seconds = span["stop"] - span["start"]
            if span["action"] == "compute":
                bodies[task["worker"]] += seconds
                phase = phases[parsed.phase if parsed else "other"]
                phase[0] += 1
                phase[1] += seconds
                if parsed:
                    if parsed.phase == "compute":
                        first = step_start.get(parsed.step, np.inf)
                        step_start[parsed.step] = min(first, span["start"])
                    bounds = spans[parsed.step, parsed.phase]
                    bounds[0] = min(bounds[0], span["start"])
                    bounds[1] = max(bounds[1], span["stop"])
            elif span["action"] == "transfer":
                transfers += seconds
                transfer_count += 1
    print(
        f"{arch}, N = {args.workers}, model {args.model}: {len(stream.data) / n:.1f} tasks a "
        f"step, {wall * 1e3:.1f} ms a step (mean of {n} steps by fit), {messages / n:.1f} "
        f"messages and {nbytes / n / 1e6:.2f} MB a step between workers"
    )
    per_worker = ", ".join(f"{v / n * 1e3:.1f}" for v in bodies.values())
    print(f"  task bodies per worker: {per_worker} ms a step")
    print(
        f"  transfers, summed over the workers: {transfers / n * 1e3:.1f} ms a step "
        f"({transfer_count / n:.1f} a step)"
    )
    print(
        "  phase: tasks a step, body ms a step, first start .. last stop of the step's tasks "
        "from its first compute"
    )
    for phase, (count, seconds) in sorted(phases.items(), key=lambda kv: -kv[1][1]):
        offsets = np.array(
            [
                (b[0] - step_start[k], b[1] - step_start[k])
                for (k, ph), b in spans.items()
                if ph == phase and k in step_start
            ]
        ).reshape(-1, 2)
        window = ""
        if len(offsets):
            first, last = 1e3 * offsets.mean(axis=0)
            window = f"  {first:7.1f} .. {last:7.1f} ms"
        print(f"  {phase:12s} {count / n:6.1f} {seconds / n * 1e3:8.2f}{window}")
    print(f"  client (cProfile of the fit, cumulative ms a step; the step is {wall * 1e3:.1f}):")
    stats = pstats.Stats(client_profile)
    rows = []
    for (path, _, name), (_, _, _, cumulative, _) in stats.stats.items():
        if "dasknn" in path or name in ("get", "gather"):
            rows.append((cumulative, f"{Path(path).name}:{name}"))
    for cumulative, label in sorted(rows, reverse=True)[:14]:
        print(f"    {cumulative / n * 1e3:8.2f}  {label}")
    if args.floor:
        size = nbytes // max(messages, 1)
        print(
            f"  Dask alone on the hybrid step's shape (module docstring), mean of {n} steps: "
            f"{empty * 1e3:.1f} ms with empty messages, {sized * 1e3:.1f} ms with messages of "
            f"{size / 1e3:.0f} kB"
        )


if __name__ == "__main__":
    main()
