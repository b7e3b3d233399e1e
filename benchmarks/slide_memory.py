"""D-SLIDE's workers with and without ``ReuseFreedMemory``: page faults, CPU and step time.

The data and model of ``benchmarks/slide.py`` (its defaults: 200,000 labels, 100,000 features,
hidden 128, batch 256, SimHash K = 9, L = 50, rehash every 10 steps). Each entry of
``--clusters`` is a fresh LocalCluster of ``--parts`` single-threaded worker processes
(``NUMBA_NUM_THREADS=1``) started by Dask's nanny, which sets ``MALLOC_TRIM_THRESHOLD_=65536``:
``untuned`` leaves the workers' malloc so, ``tuned`` registers
:class:`~dasknn.runtime.worker_memory.ReuseFreedMemory` by hand before the model is placed. On
each, the same fresh ``DistributedSampledMLP`` (P = ``--parts``, in order) runs ``--warmup``
steps by one ``fit``, then ``--steps`` timed steps by one ``fit`` on the next batches;
``resource.getrusage`` is read on every worker around the timed steps (minor page faults, user
and system CPU seconds). PyTorch CPU (full softmax, the slide benchmark's anchor at lr 1e-2) and
the one-process ``SampledMLP`` (HOGWILD, numba threads) run the same first batches before, for
their ms a step. ``--phases``: the minor faults a step of each of the layers' methods (those
``benchmarks/slide_steps.py`` times), in this process, for ``SampledMLP(shards=P)`` in order (the
arithmetic of P = ``--parts``, all shards in one process), first with malloc as the nanny leaves
a worker's (trim threshold 65536, which fixes the mmap threshold at glibc's initial 128 KiB), then
tuned as ``ReuseFreedMemory`` tunes a worker.

Usage::

    flock /tmp/dasknn-tests.lock timeout 360 python benchmarks/slide_memory.py
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import resource
import time
from collections import defaultdict

import numpy as np
from machine import describe
from slide import make_parser, sampled_model, torch_trainer
from slide_steps import PHASES

from dasknn.datasets import make_extreme_classification
from dasknn.runtime.cluster import local_cluster
from dasknn.runtime.worker_memory import PLUGIN_NAME, ReuseFreedMemory, tune_malloc
from dasknn.sampled.model import epoch_batches

MODES = ("untuned", "tuned")
#: glibc's mallopt parameters (malloc.h) and their values in a worker Dask's nanny started:
#: ``MALLOC_TRIM_THRESHOLD_=65536``, and with it the mmap threshold fixed at its initial 128 KiB.
NANNY_MALLOC = ((-1, 65536), (-3, 128 * 2**10))


def usage() -> np.ndarray:
    """This process's minor page faults, user and system CPU seconds so far."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return np.array([u.ru_minflt, u.ru_utime, u.ru_stime], dtype=np.float64)


def fit_rows(model, data, batches: list[np.ndarray], batch: int) -> None:
    """One ``fit`` call over ``batches`` in order (as ``benchmarks/slide.py`` groups them)."""
    rows = np.concatenate(batches)
    model.fit(data.X[rows], data.Y[rows], epochs=1, batch_size=batch, shuffle=False)


def count_faults(model, faults: dict) -> None:
    """Wrap the layers' methods of ``model`` (``slide_steps.PHASES``) so that each call adds
    this process's minor page faults during it to ``faults[phase]``."""

    def counted(name, method):
        def call(*a, **kw):
            start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            out = method(*a, **kw)
            faults[name] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start
            return out

        return call

    layers = [("hidden", model.hidden_layer_, PHASES["hidden_layer_"])]
    layers += [("output", shard, PHASES["shard"]) for shard in model.shards_]
    for prefix, layer, names in layers:
        for name in names:
            setattr(layer, name, counted(f"{prefix} {name}", getattr(layer, name)))


def fault_phases(args, model_args, data, warm, timed) -> None:
    """Print the minor faults a step by phase of ``SampledMLP(shards=args.parts)`` in order, in
    this process, with the nanny's malloc setting, then tuned (see the module docstring)."""
    mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    if not all(mallopt(param, value) == 1 for param, value in NANNY_MALLOC):
        raise RuntimeError("mallopt failed")
    table = {}
    for mode in MODES:
        if mode == "tuned" and not tune_malloc():
            raise RuntimeError("mallopt failed")
        model = sampled_model(model_args, args.parts, False).initialize(args.features, args.labels)
        fit_rows(model, data, warm, args.batch)
        faults: dict = defaultdict(float)
        count_faults(model, faults)
        start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        fit_rows(model, data, timed, args.batch)
        faults["whole step"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start
        table[mode] = {k: v / len(timed) for k, v in faults.items()}
    print(f"\nminor faults a step by phase, SampledMLP(shards={args.parts}) in one process:")
    print("| phase | nanny's malloc | tuned |")
    print("| --- | --- | --- |")
    for phase in sorted(table["untuned"], key=lambda k: -table["untuned"][k]):
        print(f"| {phase} | {table['untuned'][phase]:.0f} | {table['tuned'].get(phase, 0):.0f} |")


def run_cluster(mode: str, args, model_args, data, warm, timed) -> dict:
    """One fresh cluster: ms a step, and per worker and step the minor faults, user and system
    CPU ms of the timed steps, and their mean loss."""
    from distributed import Client

    from dasknn.sampled_parallel import DistributedSampledMLP

    with local_cluster(args.parts) as cluster, Client(cluster) as client:
        if mode == "tuned":
            client.register_plugin(ReuseFreedMemory(), name=PLUGIN_NAME)
            tuned = client.run(lambda dask_worker: dask_worker.dasknn_malloc_tuned)
            if not all(tuned.values()):
                raise RuntimeError(f"mallopt failed on a worker: {tuned}")
        model = sampled_model(model_args, args.parts, False).initialize(args.features, args.labels)
        with DistributedSampledMLP(model, client) as dist:
            fit_rows(dist, data, warm, args.batch)
            before = client.run(usage)
            start = time.perf_counter()
            fit_rows(dist, data, timed, args.batch)
            seconds = time.perf_counter() - start
            after = client.run(usage)
            loss = dist.loss_curve_[-1]
    per_step = np.array([(after[w] - before[w]) / len(timed) for w in sorted(after)])
    return {"ms": 1e3 * seconds / len(timed), "usage": per_step, "loss": loss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps on each cluster")
    parser.add_argument("--steps", type=int, default=50, help="timed steps on each cluster")
    parser.add_argument(
        "--clusters",
        nargs="+",
        choices=MODES,
        default=["untuned", "tuned", "untuned", "tuned"],
        help="one fresh cluster each, in this order",
    )
    parser.add_argument("--torch-steps", type=int, default=20, help="timed PyTorch steps")
    parser.add_argument("--local-steps", type=int, default=40, help="timed one-process steps")
    parser.add_argument(
        "--phases", action="store_true", help="also the faults by phase (last, in this process)"
    )
    args = parser.parse_args()
    model_args = make_parser().parse_args([])  # slide.py's model and sizes
    model_args.torch_lr_decay = model_args.lr_decay  # slide.py's default: one schedule for all
    args.features, args.labels, args.batch = (
        model_args.features,
        model_args.labels,
        model_args.batch,
    )
    print(f"machine: {describe()}")
    start = time.perf_counter()
    data = make_extreme_classification(
        n_samples=model_args.samples + model_args.test,
        n_features=args.features,
        n_labels=args.labels,
        zipf=model_args.zipf,
        seed=0,
    )
    print(f"data: slide.py's defaults, made in {time.perf_counter() - start:.1f} s", flush=True)
    train = np.arange(model_args.samples)
    test = np.arange(model_args.samples, model_args.samples + model_args.test)
    batches = [train[b] for b in epoch_batches(len(train), args.batch, 0, 0, True)]
    warm, timed = batches[: args.warmup], batches[args.warmup : args.warmup + args.steps]

    steps, _ = torch_trainer(data, test, model_args, 1e-2)
    steps(batches[:2])
    start = time.perf_counter()
    steps(batches[2 : 2 + args.torch_steps])
    torch_ms = 1e3 * (time.perf_counter() - start) / args.torch_steps
    print(f"PyTorch full softmax, {model_args.threads} threads: {torch_ms:.1f} ms a step")

    local = sampled_model(model_args, 1, True).initialize(args.features, args.labels)
    fit_rows(local, data, warm, args.batch)
    before = usage()
    start = time.perf_counter()
    fit_rows(local, data, timed[: args.local_steps], args.batch)
    local_ms = 1e3 * (time.perf_counter() - start) / args.local_steps
    local_use = (usage() - before) / args.local_steps
    print(
        f"SampledMLP, 1 process: {local_ms:.1f} ms a step, {local_use[0]:.0f} minor faults a "
        f"step (glibc's default thresholds)",
        flush=True,
    )

    os.environ["NUMBA_NUM_THREADS"] = "1"  # one core a worker
    results = []
    for index, mode in enumerate(args.clusters):
        row = run_cluster(mode, args, model_args, data, warm, timed)
        results.append((mode, row))
        faults, user, system = row["usage"].T
        print(
            f"cluster {index + 1} {mode}: {row['ms']:.1f} ms a step; per worker and step: "
            f"minor faults {' / '.join(f'{f:.0f}' for f in faults)}, user CPU "
            f"{' / '.join(f'{1e3 * u:.1f}' for u in user)} ms, system CPU "
            f"{' / '.join(f'{1e3 * s:.1f}' for s in system)} ms; mean loss {row['loss']:.6f}",
            flush=True,
        )

    print()
    print(
        f"| cluster | workers' malloc | ms a step | minor faults / worker / step | user CPU ms "
        f"| system CPU ms | vs PyTorch ({torch_ms:.0f} ms) | vs 1 process ({local_ms:.0f} ms) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for index, (mode, row) in enumerate(results):
        faults, user, system = row["usage"].T
        print(
            f"| {index + 1} | {mode} | {row['ms']:.1f} | {faults.mean():.0f} | "
            f"{1e3 * user.mean():.1f} | {1e3 * system.mean():.1f} | "
            f"{torch_ms / row['ms']:.2f}x | {local_ms / row['ms']:.2f}x |"
        )
    means = {
        m: np.mean([r["ms"] for mode, r in results if mode == m])
        for m in MODES
        if m in args.clusters
    }
    if len(means) == 2:
        print(
            f"\nmean ms a step: untuned {means['untuned']:.1f}, tuned {means['tuned']:.1f}: "
            f"tuned faster by {means['untuned'] / means['tuned']:.3f}x "
            f"({100 * (1 - means['tuned'] / means['untuned']):.1f} % of the untuned step)"
        )
    if args.phases:
        fault_phases(args, model_args, data, warm, timed)


if __name__ == "__main__":
    main()
