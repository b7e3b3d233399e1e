"""Graph Challenge on a GPU: dasknn ``device="cuda"`` against SNIG's published one-GPU rates.

Every case runs the challenge networks (the official 1024 x 120 where its directory is given, and
RadiX-Net networks from the generator, seed 0) through ``run_challenge(device="cuda")`` on a
dask-cuda ``LocalCUDACluster`` (one worker per GPU), and prints the time, the rate
(inputs x edges / seconds, the challenge's measure; the seconds cover weights to the GPU workers,
batches and categories back, as for the CPU engine), the GPU kernel seconds, SNIG's rate on one
RTX 2080 Ti (Lin & Huang, TPDS 2021, Table 3, 60,000 images) and the ratio.

Inputs: the 10,000 MNIST test images at the challenge's size for the width (the project's input
rule), stacked ``--copies`` times (6 copies = 60,000 rows, SNIG's count; the challenge's own 60,000
training images are not available here). Categories are checked against categories of the CPU
engine computed beforehand on the 10,000 images (``--refs DIR``, files ``NAME.npy`` as written by
``--write-refs``), shifted for every copy; in the same run, the CPU engine also runs the official
network on this machine's cores (``--cpu-baseline``) for a same-machine ratio. Cases without
references (networks too large for the machine that wrote them) can be checked in the same run on
the first ``--check-rows`` images by the CPU engine's kernel in this process.

Other ``NxL`` cases run too (no SNIG figure). Cases stop being started when ``--budget`` seconds
have passed; results are appended to ``--out/results.jsonl`` as they come.

    python benchmarks/challenge_gpu.py --write-refs refs/                     # any machine, CPU
    python benchmarks/challenge_gpu.py --refs refs/ --official DIR --out out/  # the GPU machine

``--load-on-workers`` also runs every case with ``run_challenge(load_on_workers=True)``: the GPU
workers load the network themselves (the spec ``radixnet:N:L:0`` or the official directory) and no
network bytes pass through the client; the run follows the client-loaded one on the same case and
batches, and both rows carry ``"network_from"`` (``"client"`` or ``"workers"``), the timed
seconds and the whole call's seconds; ``--workers-only`` skips the client-loaded run, e.g.
``--only 65536x1920 --wide-copies 6 --batches-per-gpu 1 --load-on-workers`` for both paths on the
largest network in one call.

``--mode`` picks the CUDA kernel mode (``auto``, ``fused``, ``sectioned``, ``tiled``) for every
case, e.g. ``--only 65536x120 --mode tiled`` and then ``--mode sectioned`` for an end-to-end A/B
(``benchmarks/challenge_gpu_kernels.py`` is the kernel-only one).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from harness import case_bias
from harness import describe

from dasknn.challenge import run_challenge
from dasknn.datasets import (
    load_mnist_test,
    mnist_to_challenge_inputs,
    radixnet,
    read_challenge_network,
)
from dasknn.kernels.cuda_inference import CUDA_MODES, SECTIONED_FROM
from dasknn.kernels.inference import advance, live_rows, pack_layers, start_batch
from dasknn.runtime.cluster import scheduler_workers

# SNIG, one GPU (RTX 2080 Ti), Table 3 of Lin & Huang, TPDS 2021: Gigaedges per second.
SNIG_ONE_GPU = {
    (1024, 120): 295.28, (1024, 480): 586.52, (1024, 1920): 718.74,
    (4096, 120): 586.52, (4096, 480): 803.84, (4096, 1920): 867.28,
    (16384, 120): 851.53, (16384, 480): 1076.99, (16384, 1920): 1113.94,
    (65536, 120): 1021.61, (65536, 480): 1404.60, (65536, 1920): 1489.46,
}
CASES = ["official", "16384x120", "65536x120", "16384x480", "4096x120", "1024x1920", "4096x480",
         "1024x480", "4096x1920", "16384x1920", "1024x120"]


def _shape(name: str) -> tuple[int, int]:
    if name == "official":
        return 1024, 120
    neurons, layers = name.split("x")
    return int(neurons), int(layers)


def _network(name: str, official: Path | None):
    neurons, layers = _shape(name)
    if name == "official":
        if official is None:
            raise FileNotFoundError("--official DIR is needed for the official network")
        return read_challenge_network(official, neurons=1024)
    return radixnet(neurons, layers, seed=0, dtype=np.float32)


def _spec(name: str, official: Path | None) -> str:
    """What the GPU workers load for ``--load-on-workers``: the official directory or the
    generator spec of :func:`_network` (seed 0)."""
    if name == "official":
        if official is None:
            raise FileNotFoundError("--official DIR is needed for the official network")
        return str(official)
    neurons, layers = _shape(name)
    return f"radixnet:{neurons}:{layers}:0"


def _inputs(images: np.ndarray, neurons: int, copies: int) -> sp.csr_matrix:
    base = mnist_to_challenge_inputs(images, int(round(neurons**0.5)))
    return sp.vstack([base] * copies, format="csr") if copies > 1 else base


def cpu_kernel_categories(layers, inputs: sp.csr_matrix, bias: float) -> np.ndarray:
    """Categories (1-based) of ``inputs`` from the CPU engine's kernel in this process, float32,
    on all of its numba threads: the check for networks without stored references."""
    state = advance(start_batch(inputs, np.float32), pack_layers(layers, np.float32), bias)
    return live_rows(state) + 1


def write_refs(out: Path, names: list[str], official: Path | None) -> None:
    """CPU-engine categories of the 10,000 MNIST test images for each case."""
    out.mkdir(parents=True, exist_ok=True)
    images = load_mnist_test()[0]
    for name in names:
        if (out / f"{name}.npy").exists():
            continue
        neurons, _ = _shape(name)
        start = time.perf_counter()
        categories, stats = run_challenge(_network(name, official), _inputs(images, neurons, 1),
                                          progress=False)
        np.save(out / f"{name}.npy", categories)
        print(f"{name}: {categories.size} categories, {time.perf_counter() - start:.1f} s, "
              f"{stats.rate:.3g} edges/s", flush=True)


def _row(compact_every: int, cuda_mode: str, name: str, path: str, tried: list, batches: int,
         categories: np.ndarray, stats, call: float, prepare: float,
         expected: np.ndarray | None, cpu: tuple | None) -> dict:
    """The results row of one case run one way (``path``: who loaded the network), printed."""
    neurons, n_layers = _shape(name)
    checked = None
    if cpu is not None:
        rows_checked, cpu_categories, cpu_seconds = cpu
        checked = {"rows": rows_checked, "categories": int(cpu_categories.size),
                   "equal": bool(np.array_equal(categories[categories <= rows_checked],
                                                cpu_categories)),
                   "seconds": cpu_seconds}
    mode = cuda_mode
    if mode == "auto":
        mode = "sectioned" if neurons >= SECTIONED_FROM else "fused"
    choice = f"{batches} batches/GPU, {mode}"
    snig = SNIG_ONE_GPU.get((neurons, n_layers), float("nan"))
    rate = stats.rate / 1e9
    row = {
        "case": name, "neurons": neurons, "layers": n_layers, "inputs": stats.inputs,
        "categories": stats.categories, "seconds": stats.seconds,
        "kernel_seconds": stats.kernel_seconds, "rate_ge_s": rate,
        "snig_ge_s": snig, "ratio_vs_snig": rate / snig,
        "compact_every": compact_every, "cuda_mode": mode,
        "batches_per_gpu": batches, "tried": {t[1]: t[0] for t in tried},
        "mode": stats.mode, "gpus": stats.gpus, "prepare_seconds": prepare,
        "network_from": path, "call_seconds": call,
        "matches_cpu_engine": None if expected is None else bool(
            np.array_equal(categories, expected)),
        "macs_done": stats.macs_done, "nominal": stats.inputs * stats.edges,
        "cpu_kernel_check": checked,
    }
    print(f"{name} (network loaded by the {path}): {stats.inputs} inputs, {stats.categories} "
          f"categories, {stats.seconds:.3f} s ({stats.kernel_seconds:.3f} s on the GPU), "
          f"{rate:.1f} GE/s, SNIG {snig:.1f}, x{rate / snig:.2f}, "
          f"{choice} (tried {row['tried']}), "
          f"matches CPU engine: {row['matches_cpu_engine']}, CPU kernel check: {checked}, "
          f"prepare {prepare:.1f} s, whole call with the network's load {call:.1f} s", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--refs", type=Path, help="CPU-engine categories (NAME.npy, 10k images)")
    parser.add_argument("--write-refs", type=Path, help="compute the CPU categories and stop")
    parser.add_argument("--official", type=Path, help="directory of the official 1024 x 120")
    parser.add_argument("--only", help="comma-separated cases (default: all, in order)")
    parser.add_argument("--images", type=int, default=10_000, help="MNIST test images used")
    parser.add_argument("--copies", type=int, default=6, help="copies of the images")
    parser.add_argument("--wide-copies", type=int, default=1,
                        help="copies for 65536-neuron networks (their inputs are 8x larger)")
    parser.add_argument("--compact-every", type=int, default=8,
                        help="layers between compactions of the live rows")
    parser.add_argument("--mode", choices=CUDA_MODES, default="auto",
                        help="CUDA kernel mode, passed to run_challenge(cuda_mode=...)")
    parser.add_argument("--batches-per-gpu", default="1,4",
                        help="batch counts per GPU tried on the first case of each width (more "
                        "batches overlap the transfer of one with the kernels of another); the "
                        "fastest is used for the other cases of that width")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds for all cases")
    parser.add_argument("--check-rows", type=int, default=0,
                        help="for cases without references, run the CPU kernel in this process "
                        "on the first CHECK_ROWS images and compare their categories")
    parser.add_argument("--cpu-baseline", action="store_true",
                        help="also run the CPU engine on the official network on this machine")
    parser.add_argument("--load-on-workers", action="store_true",
                        help="also run every case with the GPU workers loading the network "
                        "themselves (run_challenge(load_on_workers=True))")
    parser.add_argument("--workers-only", action="store_true",
                        help="with --load-on-workers: skip the client-loaded runs")
    parser.add_argument("--scheduler", help="use this cluster instead of a LocalCUDACluster")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    names = args.only.split(",") if args.only else CASES
    if args.official is None:
        names = [n for n in names if n != "official"]
    if args.write_refs is not None:
        write_refs(args.write_refs, names, args.official)
        return

    from contextlib import ExitStack

    from distributed import Client

    from dasknn.runtime.cluster import open_client

    args.out.mkdir(parents=True, exist_ok=True)
    results_file = args.out / "results.jsonl"
    images = load_mnist_test()[0][: args.images]
    began = time.perf_counter()
    print(f"machine: {describe()}", flush=True)
    rows = []
    with ExitStack() as stack:
        try:
            client = open_client(stack, args.scheduler, device="cuda")
        except Exception as error:  # noqa: BLE001 - report and fall back to a plain cluster
            print(f"LocalCUDACluster failed ({error!r}); one plain worker process instead")
            client = open_client(stack, None, workers=1)
        sweep = [int(v) for v in args.batches_per_gpu.split(",")]
        best_batches: dict[int, int] = {}
        gpus = len(scheduler_workers(client))
        for name in names:
            if time.perf_counter() - began > args.budget:
                print(f"{name}: skipped (budget of {args.budget:.0f} s spent)", flush=True)
                continue
            neurons, n_layers = _shape(name)
            copies = args.wide_copies if neurons >= 65536 else args.copies
            t0 = time.perf_counter()
            client_load = not (args.load_on_workers and args.workers_only)
            layers = _network(name, args.official) if client_load else None
            network_seconds = time.perf_counter() - t0
            x = _inputs(images, neurons, copies)
            prepare = time.perf_counter() - t0
            expected = None
            if args.refs is not None and (args.refs / f"{name}.npy").exists():
                base = np.load(args.refs / f"{name}.npy")
                base = base[base <= images.shape[0]]
                expected = np.concatenate([base + c * images.shape[0] for c in range(copies)])
            bias = case_bias(neurons)
            paths = (["client"] if client_load else []) + (
                ["workers"] if args.load_on_workers else [])
            runs = []
            for path in paths:
                if path == "workers":
                    layers = None  # the client's copy: the workers' loads need the memory
                    gc.collect()
                tried = []
                sweep_here = [best_batches[neurons]] if neurons in best_batches else sweep
                for batches in sweep_here:
                    t1 = time.perf_counter()
                    categories, stats = run_challenge(
                        layers if path == "client" else _spec(name, args.official), x, bias,
                        client=client, device="cuda",
                        batch_size=-(-x.shape[0] // (batches * gpus)),
                        compact_every=args.compact_every, cuda_mode=args.mode, progress=False,
                        load_on_workers=path == "workers",
                    )
                    call = time.perf_counter() - t1 + (network_seconds if path == "client" else 0)
                    tried.append((stats.seconds, batches, categories, stats, call))
                seconds, batches, categories, stats, call = min(tried, key=lambda t: t[0])
                best_batches[neurons] = batches
                print(f"{name} (network loaded by the {path}): timed call {stats.seconds:.3f} s "
                      f"({stats.kernel_seconds:.3f} s on the GPU), {stats.rate / 1e9:.1f} GE/s, "
                      f"{stats.categories} categories, whole call with the network's load "
                      f"{call:.1f} s", flush=True)
                runs.append((path, tried, batches, categories, stats, call))
            if len(runs) == 2:
                (_, _, _, by_client, client_stats, client_call), (_, _, _, by_workers, stats,
                                                                  call) = runs
                print(f"{name}: workers / client loading: timed {stats.seconds:.3f} / "
                      f"{client_stats.seconds:.3f} s (x{client_stats.seconds / stats.seconds:.2f}"
                      f" the rate), whole call {call:.1f} / {client_call:.1f} s, same categories:"
                      f" {bool(np.array_equal(by_workers, by_client))}", flush=True)
            cpu = None
            if expected is None and args.check_rows > 0:
                layers = layers if layers is not None else _network(name, args.official)
                rows_checked = min(args.check_rows, images.shape[0])
                t1 = time.perf_counter()
                cpu = (rows_checked, cpu_kernel_categories(layers, x[:rows_checked], bias),
                       time.perf_counter() - t1)
            for path, tried, batches, categories, stats, call in runs:
                row = _row(args.compact_every, args.mode, name, path, tried, batches, categories,
                           stats, call, prepare, expected, cpu)
                rows.append(row)
                with results_file.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
        if args.cpu_baseline and "official" in names:
            from dasknn.runtime.cluster import local_cluster

            layers = _network("official", args.official)
            x = _inputs(images, 1024, args.copies)
            with local_cluster(os.cpu_count()) as cpu_cluster, Client(cpu_cluster) as cpu:
                categories, stats = run_challenge(layers, x, client=cpu, progress=False)
            gpu = next((r for r in rows if r["case"] == "official"), None)
            row = {"case": "official-cpu-engine", "workers": stats.workers,
                   "seconds": stats.seconds, "rate_ge_s": stats.rate / 1e9,
                   "gpu_over_cpu": None if gpu is None else gpu["rate_ge_s"] / (stats.rate / 1e9),
                   "same_categories": None if gpu is None else bool(
                       gpu["categories"] == stats.categories)}
            with results_file.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(f"CPU engine, official, {stats.workers} workers: {stats.seconds:.3f} s, "
                  f"{stats.rate / 1e9:.1f} GE/s; GPU / CPU x{row['gpu_over_cpu']}", flush=True)
    print("\n| network | loaded by | inputs | s | GPU s | GE/s | SNIG GE/s | x SNIG | "
          "whole call s | = CPU engine |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['case']} | {r['network_from']} | {r['inputs']} | {r['seconds']:.3f} "
              f"| {r['kernel_seconds']:.3f} "
              f"| {r['rate_ge_s']:.1f} | {r['snig_ge_s']:.1f} | {r['ratio_vs_snig']:.2f} "
              f"| {r['call_seconds']:.1f} | {r['matches_cpu_engine']} |")


if __name__ == "__main__":
    main()
