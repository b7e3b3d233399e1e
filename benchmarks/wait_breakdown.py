"""Where the wait of a ``messages="actors"`` training step goes (P=2, one thread per worker).

Trains the benchmark network (RadiX-Net, float32, sigmoid + MSE, batch 256) on two worker
processes and, per batch and worker, splits the task thread's time that is not arithmetic:

- waiting in ``ModelState.take`` for the peer's forward and backward messages (the weight updates
  the task thread runs inside those waits are not counted as waiting);
- the actor calls that post messages (``ModelState.post``, on the task thread) and the wait for
  their delivery at the end of the step (``check_posts``);
- the time outside the step tasks (the data scatter of ``fit`` and the hop between steps);

and the CPU time of every thread of the worker processes (task thread, event loop, update
thread) and of this process (client and scheduler). The timers are wrappers that this script
installs on the workers around those methods; the model code is unchanged.

Usage::

    flock /tmp/dasknn-tests.lock python benchmarks/wait_breakdown.py [--batches 3] [--reps 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import psutil
from distributed import Client, LocalCluster
from machine import describe

import graph
from dasknn.model import SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.model_parallel.timing import time_training


def _instrument(dask_worker) -> None:
    """Wrap ``take``, ``post``, ``check_posts`` and the step task with timers (once per worker)."""
    from collections import defaultdict

    from dasknn.model_parallel import exchange, worker_state

    dask_worker.wait_breakdown = defaultdict(float)
    dask_worker.step_times = []
    state = worker_state.ModelState
    if getattr(state, "wait_breakdown_timers", False):
        return
    state.wait_breakdown_timers = True
    take, post, check_posts, worker_step = (
        state.take, state.post, state.check_posts, exchange.worker_step
    )

    def timed_take(self, key, *args):
        before, start = self.timings.get("update", 0.0), time.perf_counter()
        value = take(self, key, *args)
        updates = self.timings.get("update", 0.0) - before
        phase = key[0].split("-")[1]
        dask_worker.wait_breakdown[f"wait for {phase} messages"] += (
            time.perf_counter() - start - updates
        )
        dask_worker.wait_breakdown[f"updates run while waiting for {phase}"] += updates
        return value

    def timed(name, func):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                dask_worker.wait_breakdown[name] += time.perf_counter() - start

        return call

    def timed_step(*args, **kwargs):
        start = time.perf_counter()
        try:
            return worker_step(*args, **kwargs)
        finally:
            dask_worker.step_times.append((start, time.perf_counter()))

    state.take = timed_take
    state.post = timed("post (actor call on the task thread)", post)
    state.check_posts = timed("check_posts at the end of the step", check_posts)
    exchange.worker_step = timed_step


def _thread_cpu(dask_worker=None) -> dict[str, float]:
    """CPU seconds of every thread of this process, by thread name."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    return {
        names.get(t.id, f"thread {t.id}"): t.user_time + t.system_time
        for t in psutil.Process().threads()
    }


def _read(dask_worker) -> tuple[dict, list, dict]:
    records = (dict(dask_worker.wait_breakdown), list(dask_worker.step_times), _thread_cpu())
    dask_worker.wait_breakdown.clear()
    dask_worker.step_times.clear()
    return records


def _thread_kind(name: str) -> str:
    if name == "MainThread":
        return "event loop"
    if name.startswith("dasknn-update"):
        return "update thread"
    if "Dask-Default-Threads" in name:
        return "task thread"
    return "other threads"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--neurons", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--reps", type=int, default=2, help="timed fit calls")
    args = parser.parse_args()
    print(f"machine: {describe()}")
    model = SparseMLP.radixnet(
        args.neurons, args.layers, seed=0, activation="sigmoid", loss="mse", dtype="float32"
    )
    rng = np.random.default_rng(1)
    rows = args.batch * args.batches
    x = rng.uniform(0, 1, size=(rows, args.neurons)).astype("float32")
    y = rng.uniform(0, 1, size=(rows, args.neurons)).astype("float32")
    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
        env={"NUMBA_NUM_THREADS": "1"},
    )  # fmt: skip
    client = Client(cluster)
    try:
        partition = graph.partition_network(model.weights, 2, "hypergraph", seed=0)
        with DistributedSparseMLP(
            model, client, partition, reuse_memory=True, messages="actors"
        ) as dist:
            dist.train_step(x[: args.batch], y[: args.batch], lr=0.01)  # compile the kernels
            client.run(_instrument)
            for rep in range(args.reps):
                cpu_before = client.run(_thread_cpu)
                local_before = sum(psutil.Process().cpu_times()[:2])
                times = time_training(dist, x, y, args.batch, lr=0.01, warmup=False)
                local = sum(psutil.Process().cpu_times()[:2]) - local_before
                records = client.run(_read)
                n = times.batches
                print(f"fit {rep + 1}: {times.format()}; wait share "
                      f"{times.wait / times.per_batch:.0%}")
                print(f"  client and scheduler process: {local / n * 1e3:.0f} ms CPU a batch")
                for w, (waits, steps, cpu) in records.items():
                    outside = times.per_batch * n - sum(end - start for start, end in steps)
                    print(f"  worker {w} (per batch, ms):")
                    print(f"    outside the step tasks: {outside / n * 1e3:.1f}")
                    for name, seconds in sorted(waits.items()):
                        print(f"    {name}: {seconds / n * 1e3:.1f}")
                    kinds: dict[str, float] = {}
                    for name, seconds in cpu.items():
                        kind = _thread_kind(name)
                        used = seconds - cpu_before[w].get(name, 0.0)
                        kinds[kind] = kinds.get(kind, 0.0) + used
                    print("    CPU: " + ", ".join(
                        f"{kind} {seconds / n * 1e3:.0f}" for kind, seconds in sorted(kinds.items())
                    ))
    finally:
        client.close()
        cluster.close()


if __name__ == "__main__":
    main()
