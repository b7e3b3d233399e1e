"""Soak test: 2,000 training batches at P = 2, with the memory of the workers, the scheduler and the
client sampled every 100 batches.

After a warm-up (the first ``--warmup`` batches: kernels compiled, buffers and Dask's bounded logs
filled), the resident memory of every process should grow by less than 1 MiB per 1,000 batches.
The script prints the samples and, per process, the least-squares growth after the warm-up in MiB
per 1,000 batches, of the samples and of their running maximum (a worker's resident size drops by
several MiB whenever the C library hands freed step buffers back to the system, and a sample
taken in such a dip tilts the fit of the samples; the maximum is the memory the process keeps),
the number of events Dask keeps under the transfer topic (a bounded log that fills during the
warm-up), the keys in ``dask.utils.key_split``'s cache (``dasknn.runtime.key_cache``) and the
one-second profiles each worker's profiler kept.

The cluster and client are those dasknn opens (``dasknn.runtime.cluster.open_client``: two
single-threaded worker processes on 127.0.0.1, Dask's debugging records kept at
``dasknn.runtime.cluster.LOW_LEVEL_LOG_LENGTH`` entries, no worker profiler); to measure with
Dask's own length or with the profiler, set ``DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH`` or
``DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=True`` (a value the user sets is kept).

``--step-faults`` measures instead what a training step allocates afresh in each mode: the
minor page faults of every worker over ``--steps`` steps after a warm-up call of ``fit``, per
worker and step, on a ``LocalCluster`` of Dask's defaults (two single-threaded workers whose
nannies set ``MALLOC_TRIM_THRESHOLD_``, so freed large buffers go back to the system and a new
one is faulted in page by page), with ``reuse_memory=False`` and then with the models' default
``reuse_memory=True`` (a fresh cluster each). Faults x the page size (4 KiB here) is the memory a
step touches for the first time.

Usage::

    python benchmarks/soak.py [--batches 2000] [--neurons 256]
    python benchmarks/soak.py --step-faults [--steps 20]
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import time
from contextlib import ExitStack

import numpy as np
import psutil
from dask.utils import key_split
from distributed import Client, LocalCluster
from distributed.batched import BatchedSend
from harness import add_json_option, describe, write_json

from dasknn import (
    DistributedCompressedMLP,
    DistributedEmbeddingMLP,
    DistributedSampledMLP,
    DistributedSparseMLP,
)
from dasknn.datasets import make_extreme_classification
from dasknn.model import DenseMLP, EmbeddingMLP, SparseMLP
from dasknn.pruning import magnitude_masks
from dasknn.runtime.cluster import open_client
from dasknn.runtime.key_cache import remove_key_cache_bound
from dasknn.runtime.measure import TOPIC
from dasknn.sampled import SampledMLP

MIB = 2**20


def _rss(dask_worker=None, dask_scheduler=None) -> int:
    return psutil.Process(os.getpid()).memory_info().rss


def _collect(dask_worker=None, dask_scheduler=None) -> int:
    return gc.collect()


def _cached_keys(dask_worker=None, dask_scheduler=None) -> int:
    return key_split.cache_info().currsize


def _profiles(dask_worker) -> int:
    return len(dask_worker.profile_history)


def _record_lengths(dask_worker=None, dask_scheduler=None) -> list[int]:
    """The entries Dask keeps of the last messages of this process's batched streams (the
    bounds set by ``distributed.admin.low-level-log-length`` when each stream started)."""
    streams = [obj for obj in gc.get_objects() if isinstance(obj, BatchedSend)]
    return sorted({stream.recent_message_log.maxlen for stream in streams})


def _events(dask_scheduler) -> int:
    return len(dask_scheduler.get_events(TOPIC))


def _slope(batches: list[int], values: list[float]) -> float:
    """Least-squares growth of ``values`` (bytes) in MiB per 1,000 batches."""
    return float(np.polyfit(np.array(batches) / 1000, np.array(values) / MIB, 1)[0])


def _verdict(growth: float) -> str:
    return "ok" if growth < 1.0 else "GROWS"


def soak_problem(neurons: int, layers: int, rows: int):
    """The soak's model, data and partition: a RadiX-Net ``SparseMLP`` (seed 0), ``rows`` uniform
    samples and targets, and every neuron dealt to one of 2 parts at random (seed 0)."""
    model = SparseMLP.radixnet(neurons=neurons, layers=layers, seed=0)
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(rows, model.n_inputs))
    y = rng.uniform(size=(rows, model.n_outputs))
    parts = [rng.integers(0, 2, size=n) for n in model.layer_sizes]
    return model, x, y, parts


def _minor_faults(dask_worker=None) -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


FAULT_MODES = ("model-parallel", "data-parallel", "pipeline", "sampled")


def _fault_modes(batch: int, steps: int) -> dict:
    """Per mode: ``(make(client, reuse_memory) -> distributed model, X, y, fit keywords)``. Every
    fit is ``steps`` steps."""
    rng = np.random.default_rng(0)
    rows = batch * steps
    sparse_model = SparseMLP.radixnet(neurons=1024, layers=6, n_outputs=10, activation="relu",
                                      loss="softmax_cross_entropy", scale="he", dtype=np.float32,
                                      seed=0)
    x = rng.random((rows, 1024), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, rows)]
    words = rng.integers(0, 8192, (rows, 3))
    dense = DenseMLP.init([1024, 300, 100, 10], seed=0)
    pruned = dense.prune(magnitude_masks(dense.weights, 0.9))
    xmc = make_extreme_classification(n_samples=rows, n_features=2000, n_labels=5000, seed=0)
    sampled = SampledMLP(hidden=64, active_fraction=0.05, shards=2).initialize(2000, 5000)
    fit = {"batch_size": batch, "epochs": 1, "shuffle": False}
    return {
        "model-parallel": (
            lambda c, reuse: DistributedSparseMLP(sparse_model, c, reuse_memory=reuse),
            x, y, {**fit, "lr": 0.01, "progress": False},
        ),
        "data-parallel": (
            lambda c, reuse: DistributedEmbeddingMLP(
                EmbeddingMLP(8192, 3, embed_dim=64, hidden=(128,)), c, sparse_partitions=2,
                reuse_memory=reuse),
            words, rng.integers(0, 8192, rows), {**fit, "lr": 0.1},
        ),
        "pipeline": (
            lambda c, reuse: DistributedCompressedMLP(pruned, c, stages=2, microbatches=2,
                                                      reuse_memory=reuse),
            x, rng.integers(0, 10, rows), {**fit, "lr": 0.05, "progress": False},
        ),
        "sampled": (lambda c, reuse: DistributedSampledMLP(sampled, c, reuse_memory=reuse),
                    xmc.X, xmc.Y, fit),
    }  # fmt: skip


def step_faults(args: argparse.Namespace) -> None:
    """Print and record the workers' minor faults a step per mode (``--step-faults``)."""
    results = []
    for mode, (make, x, y, fit) in _fault_modes(args.batch_size, args.steps).items():
        if mode not in args.modes:
            continue
        for reuse in (False, True):
            with ExitStack() as stack:
                cluster = stack.enter_context(
                    LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None)
                )
                client = stack.enter_context(Client(cluster))
                dist = stack.enter_context(make(client, reuse))
                dist.fit(x, y, **fit)  # warm-up: kernels, plans, first buffers
                before = client.run(_minor_faults)
                start = time.perf_counter()
                dist.fit(x, y, **fit)
                seconds = (time.perf_counter() - start) / args.steps
                after = client.run(_minor_faults)
            per_step = [(after[w] - before[w]) / args.steps for w in sorted(after)]
            mean = float(np.mean(per_step))
            print(f"{mode:15s} reuse_memory={reuse!s:5s}  minor faults a worker and step "
                  f"{mean:9.0f} ({mean * resource.getpagesize() / MIB:6.1f} MiB)  per worker "
                  f"{', '.join(f'{f:.0f}' for f in per_step)}  {seconds * 1e3:7.1f} ms a step",
                  flush=True)  # fmt: skip
            results.append({"mode": mode, "reuse_memory": reuse, "faults_per_step": mean,
                            "per_worker": per_step, "ms_per_step": seconds * 1e3})
    write_json(args.json, "soak.py --step-faults", results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--every", type=int, default=100, help="batches between samples")
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--neurons", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--collect",
        action="store_true",
        help="run a full garbage collection in every process before each sample, to tell "
        "garbage waiting for the collector from memory that is kept",
    )
    parser.add_argument(
        "--without-key-cache-bound",
        action="store_true",
        help="remove the model's bound on dask.utils.key_split's cache (dasknn.runtime.key_cache), "
        "to measure what it saves",
    )
    parser.add_argument(
        "--step-faults",
        action="store_true",
        help="measure the workers' minor page faults a training step in every mode instead",
    )
    parser.add_argument("--steps", type=int, default=20, help="measured steps (--step-faults)")
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=FAULT_MODES,
        default=FAULT_MODES,
        help="the modes --step-faults measures (default: all)",
    )
    add_json_option(parser)
    args = parser.parse_args()
    print(describe())
    if args.step_faults:
        step_faults(args)
        return
    model, x, y, parts = soak_problem(args.neurons, args.layers, args.every * args.batch_size)
    with ExitStack() as stack:
        client = open_client(stack, workers=2)
        lengths = {"client and scheduler": client.run_on_scheduler(_record_lengths)}
        lengths.update(client.run(_record_lengths))
        named = (f"{name.split('//')[-1]} {n}" for name, n in lengths.items())
        print("entries kept of the last messages of each batched stream: " + ", ".join(named))
        with DistributedSparseMLP(model, client, partition=parts) as dist:
            if args.without_key_cache_bound:
                remove_key_cache_bound(client, dist.token)
            samples: dict[str, list[float]] = {"client": [], "scheduler": []}
            done, marks, start = 0, [], time.perf_counter()
            while done < args.batches:
                dist.fit(x, y, batch_size=args.batch_size, lr=0.01, progress=False, shuffle=False)
                done += args.every
                marks.append(done)
                if args.collect:
                    client.run(_collect)
                    client.run_on_scheduler(_collect)
                    _collect()
                for address, rss in client.run(_rss).items():
                    samples.setdefault(f"worker {address}", []).append(rss)
                samples["scheduler"].append(client.run_on_scheduler(_rss))
                samples["client"].append(_rss())
                print(
                    f"{done:6d} batches {time.perf_counter() - start:7.1f} s  "
                    + "  ".join(f"{name.split('//')[-1]} {v[-1] / MIB:7.1f}" for name, v in
                                samples.items())  # fmt: skip
                    + f"  transfer events kept {client.run_on_scheduler(_events)}",
                    flush=True,
                )
            wall = time.perf_counter() - start
            cached = {"scheduler": client.run_on_scheduler(_cached_keys)}
            cached.update(client.run(_cached_keys))
            profiles = client.run(_profiles)
    after = [i for i, mark in enumerate(marks) if mark > args.warmup]
    print(f"\n{args.batches} batches of {args.batch_size} in {wall:.1f} s "
          f"({wall / args.batches * 1e3:.1f} ms/batch); growth after {args.warmup} batches "
          "(MiB per 1,000 batches, least squares of the samples and of their running "
          "maximum):")  # fmt: skip
    growths = []
    for name, values in samples.items():
        peaks = np.maximum.accumulate(values)
        growth = _slope([marks[i] for i in after], [values[i] for i in after])
        peak_growth = _slope([marks[i] for i in after], [peaks[i] for i in after])
        print(f"  {name:32s} {values[after[0]] / MIB:8.1f} -> {values[-1] / MIB:8.1f} MiB  "
              f"{growth:+7.2f} {_verdict(growth)}   maximum {peaks[after[0]] / MIB:8.1f} -> "
              f"{peaks[-1] / MIB:8.1f} MiB {peak_growth:+7.2f} "
              f"{_verdict(peak_growth)}")  # fmt: skip
        growths.append({"process": name, "mib_per_1000_batches": growth,
                        "maximum_mib_per_1000_batches": peak_growth,
                        "first_mib": values[after[0]] / MIB, "last_mib": values[-1] / MIB})
    write_json(args.json, "soak.py", {"ms_per_batch": wall / args.batches * 1e3,
                                      "growth": growths})
    print("keys in dask.utils.key_split's cache at the end: "
          + ", ".join(f"{name.split('//')[-1]} {n}" for name, n in cached.items()))  # fmt: skip
    print("one-second profiles kept by the workers' profilers at the end: "
          + ", ".join(f"{name.split('//')[-1]} {n}" for name, n in profiles.items()))  # fmt: skip


if __name__ == "__main__":
    main()
