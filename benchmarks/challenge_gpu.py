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
case, e.g. ``--only 65536x120 --mode tiled`` and then ``--mode sectioned`` for an end-to-end A/B.

Two more commands share this script: ``challenge_gpu.py kernels [...]`` times the CUDA kernels
alone (no Dask) and ``challenge_gpu.py rowcheck [...]`` checks one large network's categories
against the CPU kernel's (``--help`` after either for its options; ``benchmarks/device/run.sh``
runs all three on a GPU machine).
"""

from __future__ import annotations

import argparse
import fcntl
import gc
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from harness import case_bias, describe

from dasknn.challenge import run_challenge
from dasknn.datasets import (
    load_mnist_test,
    mnist_to_challenge_inputs,
    radixnet,
    radixnet_group_size,
    read_challenge_network,
)
from dasknn.kernels.cuda_inference import (
    CUDA_MODES,
    SECTIONED_FROM,
    DeviceNetwork,
    compact_layers,
    cuda_runtime,
    infer_rows_cuda,
    pack_bit_rows,
)
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


KERNELS_DOC = """Kernel only (``challenge_gpu.py kernels``): the CUDA modes on RadiX-Net networks.

No Dask, one process, one GPU.

For each network (the generator, seed 0, float32) the layers are packed once and one
``DeviceNetwork`` uploaded per mode (``tiled`` once per ``--footprints`` entry, its footprint
tiles built on this host's cores, timed); the MNIST inputs at the challenge's size for the width
are bit-packed, each kernel compiled on two rows (on a GPU; the simulator compiles nothing), then
every mode runs ``--repeats`` times, alternating, with ``infer_rows_cuda`` on the whole batch. It
prints each run's seconds and GE/s (rows x edges / seconds, the challenge's measure), the best
run's ratio to ``sectioned`` and whether every mode gave the same categories (exit status 1 when
one did not). A mode written ``MODE/per-entry`` (e.g. ``sectioned/per-entry``) runs on the same
network with one weight per nonzero, expanded on the host, beside the default of one weight a
layer. ``--tag NAME`` labels the rows, e.g. for the kernels of another checkout put first on
``PYTHONPATH`` in the same call.

    python benchmarks/challenge_gpu.py kernels                                    # a GPU machine
    NUMBA_ENABLE_CUDASIM=1 python benchmarks/challenge_gpu.py kernels --networks 64x2 --rows 32

Under numba's CUDA simulator (any machine, functional only: its times say nothing about a GPU's)
the sectioned kernel takes about 40 s per layer and group of 32 rows at 1024 neurons on 2 cores.
"""

Variant = tuple[str, str, int | None, int | None]  # label, mode, footprint, warps a block

PER_ENTRY = "/per-entry"


def variants(modes: list[str], footprints: list[str]) -> list[Variant]:
    """The kernel variants to run: each mode, the tiled one once per ``FOOTPRINT[xWARPS]``."""
    out: list[Variant] = []
    for mode in modes:
        if mode != "tiled":
            out.append((mode, mode.removesuffix(PER_ENTRY), None, None))
            continue
        for spec in footprints:
            footprint, _, warps = spec.partition("x")
            out.append((f"tiled/{spec}", "tiled", int(footprint), int(warps) if warps else None))
    return out


def run_network(spec: str, images: np.ndarray, runs: list[Variant], repeats: int,
                compact_every: int, warm: bool) -> tuple[list[dict], bool]:
    """Every variant on one network; the rows of the results and whether the categories agree."""
    neurons, depth = (int(v) for v in spec.split("x"))
    t0 = time.perf_counter()
    layers = radixnet(neurons, depth, seed=0, dtype=np.float32)
    t1 = time.perf_counter()
    compact = compact_layers(pack_layers(layers, np.float32, groups=False))
    edges = int(compact.indices.size)
    del layers
    t2 = time.perf_counter()
    bits = pack_bit_rows(mnist_to_challenge_inputs(images, int(round(neurons**0.5))))
    bias = case_bias(neurons)
    print(f"{spec}: generated {t1 - t0:.1f} s, packed {t2 - t1:.1f} s, {edges} edges", flush=True)
    networks = {}
    for label, mode, footprint, warps in runs:
        start = time.perf_counter()
        if mode == "tiled":
            networks[label] = DeviceNetwork(compact, tiled=True, footprint=footprint,
                                            tile_warps=warps)
        elif label.endswith(PER_ENTRY):
            networks[label] = DeviceNetwork(compact.per_entry())
        else:
            networks[label] = DeviceNetwork(compact)
        if warm:  # compile the kernels before the timed runs
            infer_rows_cuda(bits[:2], networks[label], bias, compact_every=compact_every,
                            mode=mode)
        print(f"{spec} {label}: network on the device (tiles built when tiled)"
              f"{' and kernels compiled' if warm else ''} in {time.perf_counter() - start:.1f} s, "
              f"{networks[label].nbytes} device bytes", flush=True)
    seconds: dict[str, list[float]] = {label: [] for label, _, _, _ in runs}
    categories = {}
    for repeat in range(repeats):
        for label, mode, _, _ in runs:
            start = time.perf_counter()
            result = infer_rows_cuda(bits, networks[label], bias, compact_every=compact_every,
                                     mode=mode)
            elapsed = time.perf_counter() - start
            seconds[label].append(elapsed)
            categories.setdefault(label, result.rows)
            rate = bits.shape[0] * edges / elapsed / 1e9
            print(f"{spec} {label} run {repeat + 1}: {elapsed:.3f} s, {rate:.1f} GE/s, "
                  f"{result.rows.size} categories, {result.macs_done:.3e} MACs", flush=True)
    first = next(iter(categories.values()))
    equal = all(np.array_equal(first, rows) for rows in categories.values())
    base = min(seconds["sectioned"]) if "sectioned" in seconds else None
    rows = []
    for label, mode, footprint, _ in runs:
        best = min(seconds[label])
        network = networks[label]
        rows.append({
            "network": spec, "variant": label, "footprint": footprint,
            "tile_warps": network.tile_warps if mode == "tiled" else None, "rows": bits.shape[0],
            "edges": edges, "seconds": seconds[label], "best_seconds": best,
            "ge_s": bits.shape[0] * edges / best / 1e9,
            "vs_sectioned": None if base is None else base / best,
            "categories": int(categories[label].size), "categories_equal": equal,
            "device_bytes": network.nbytes,
        })
    return rows, equal


def kernels_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="challenge_gpu.py kernels", description=KERNELS_DOC.split("\n\n")[0])
    parser.add_argument("--networks", default="65536x120,16384x120",
                        help="RadiX-Net cases NxL, comma-separated")
    parser.add_argument("--rows", type=int, default=10_000, help="MNIST test images")
    parser.add_argument("--modes", default="sectioned,tiled",
                        help="kernel modes (auto, fused, sectioned, tiled), comma-separated")
    parser.add_argument("--footprints", default="64,32,32x6",
                        help="the tiled mode's variants, comma-separated: FOOTPRINT (blocks of as "
                        "many warps as 48 KB of shared memory hold) or FOOTPRINTxWARPS")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each mode, alternating")
    parser.add_argument("--compact-every", type=int, default=8)
    parser.add_argument("--out", type=Path, help="append the results to this JSON-lines file")
    parser.add_argument("--tag", default="",
                        help="a name for this run's code, written in each row (e.g. 'base' for "
                        "an earlier dasknn put first on PYTHONPATH, to A/B against it)")
    args = parser.parse_args(argv)
    runtime = cuda_runtime()
    if runtime == "none":
        sys.exit("no CUDA GPU here (set NUMBA_ENABLE_CUDASIM=1 to run on numba's simulator)")
    print(f"machine: {describe()}; CUDA: {runtime}; dasknn from "
          f"{Path(sys.modules['dasknn'].__file__).parent}", flush=True)
    runs = variants(args.modes.split(","), args.footprints.split(","))
    images = load_mnist_test()[0][: args.rows]
    table = []
    all_equal = True
    for spec in args.networks.split(","):
        rows, equal = run_network(spec, images, runs, args.repeats, args.compact_every,
                                  warm=runtime == "gpu")
        all_equal = all_equal and equal
        table.extend(rows)
        if args.out is not None:
            with args.out.open("a") as fh:
                for row in rows:
                    fh.write(json.dumps({**row, "tag": args.tag or None}) + "\n")
    print(f"\n| network | rows | variant{' (' + args.tag + ')' if args.tag else ''} | seconds "
          "(runs) | best GE/s | x sectioned | categories | equal |")
    print("|---|---:|---|---|---:|---:|---:|---|")
    for r in table:
        runs_s = " / ".join(f"{s:.3f}" for s in r["seconds"])
        ratio = "" if r["vs_sectioned"] is None else f"{r['vs_sectioned']:.2f}"
        print(f"| {r['network']} | {r['rows']} | {r['variant']} | {runs_s} | {r['ge_s']:.1f} "
              f"| {ratio} | {r['categories']} | {r['categories_equal']} |")
    if not all_equal:
        sys.exit("the modes' categories differ")


ROWCHECK_DOC = """Row check (``challenge_gpu.py rowcheck``): GPU against CPU categories.

One large network, its first rows.

The network is generated once (RadiX-Net, seed 0, float32) and packed for the CPU kernel
(``pack_layers``, ~8 bytes an entry; the scipy layers, as many bytes again, are freed right after)
and for the GPU (``compact_layers``, ~2 bytes an entry). The first ``--rows`` MNIST test images at
the challenge's size for the width go through the CPU engine's kernel in this process
(``start_batch``, ``advance``, ``live_rows``, float32, on the numba threads that
``NUMBA_NUM_THREADS`` allows; the packed layers are freed after it), then, bit-packed, through
``infer_rows_cuda`` on a resident ``DeviceNetwork`` for every ``--modes`` entry (``tiled`` with
the default footprint; on a GPU each kernel is compiled on two rows before the timed run). It
prints and writes to ``--out`` (one JSON object) the seconds of each, the category counts and
whether each mode's categories equal the CPU kernel's; exit status 1 when one does not.

``--gpu-lock FILE`` holds an exclusive ``flock`` on FILE while the network is on the GPU, so a
script that runs this in the background can time other GPU work under the same lock; the CPU
kernel (about a minute at 65536 x 1920 on 12 cores) runs first and overlaps that work.

    python benchmarks/challenge_gpu.py rowcheck --neurons 65536 --layers 1920 --rows 1000 \
        --out rowcheck.json
    NUMBA_ENABLE_CUDASIM=1 python benchmarks/challenge_gpu.py rowcheck --neurons 64 --layers 2 \
        --rows 32 --out /tmp/rowcheck.json

At 65536 x 1920 (4.0e9 entries) the scipy layers and the packed ones take about 32 GB each at
the peak, the compact network 8 GB.
"""

MNIST_TEST_IMAGES = 10_000


@contextmanager
def gpu_lock(path: Path | None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (nothing when ``path`` is None)."""
    if path is None:
        yield
        return
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def gpu_categories(compact, inputs, bias: float, mode: str, warm: bool) -> dict:
    """One mode on the GPU: the network uploaded (tiles built when tiled), the rows run once."""
    start = time.perf_counter()
    network = DeviceNetwork(compact, tiled=mode == "tiled")
    if warm:  # compile the kernels before the timed run
        infer_rows_cuda(inputs[:2], network, bias, mode=mode)
    upload = time.perf_counter() - start
    start = time.perf_counter()
    result = infer_rows_cuda(inputs, network, bias, mode=mode)
    seconds = time.perf_counter() - start
    return {
        "rows": np.sort(result.rows),
        "upload_seconds": upload,
        "seconds": seconds,
        "kernel_seconds": result.kernel_seconds,
        "device_bytes": network.nbytes,
    }


def parse_modes(text: str) -> list[str]:
    """The comma-separated CUDA modes, each named once; a clear error for any other."""
    modes = text.split(",")
    unknown = [m for m in modes if m not in CUDA_MODES]
    if unknown or len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(
            f"--modes takes distinct entries of {CUDA_MODES}, comma-separated; got {text!r}"
        )
    return modes


def rowcheck_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="challenge_gpu.py rowcheck", description=ROWCHECK_DOC.split("\n\n")[0])
    parser.add_argument("--neurons", type=int, default=65536, help="RadiX-Net width")
    parser.add_argument("--layers", type=int, default=1920, help="RadiX-Net depth")
    parser.add_argument("--rows", type=int, default=1000, help="first MNIST test images checked")
    parser.add_argument(
        "--modes",
        type=parse_modes,
        default=["sectioned", "tiled"],
        help="CUDA kernel modes, comma-separated",
    )
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the results")
    parser.add_argument(
        "--gpu-lock", type=Path, help="hold an exclusive flock on this file while using the GPU"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.rows <= MNIST_TEST_IMAGES:
        parser.error(f"--rows must be between 1 and {MNIST_TEST_IMAGES}, got {args.rows}")
    if args.layers < 1:
        parser.error(f"--layers must be >= 1, got {args.layers}")
    try:
        radixnet_group_size(args.neurons)
    except ValueError as error:
        parser.error(f"--neurons: {error}")
    side = int(round(args.neurons**0.5))
    if side * side != args.neurons:
        parser.error(f"--neurons must be a square (the inputs are images), got {args.neurons}")
    runtime = cuda_runtime()
    if runtime == "none":
        sys.exit("no CUDA GPU here (set NUMBA_ENABLE_CUDASIM=1 to run on numba's simulator)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(f"machine: {describe()}; CUDA: {runtime}", flush=True)
    spec = f"{args.neurons}x{args.layers}"
    bias = case_bias(args.neurons)
    x = mnist_to_challenge_inputs(load_mnist_test()[0][: args.rows], side)
    bits = pack_bit_rows(x)
    inputs = x if bits is None else bits

    t0 = time.perf_counter()
    layers = radixnet(args.neurons, args.layers, seed=0, dtype=np.float32)
    t1 = time.perf_counter()
    packed = pack_layers(layers, np.float32)
    del layers
    t2 = time.perf_counter()
    compact = compact_layers(packed)
    t3 = time.perf_counter()
    edges = int(packed.indices.size)
    print(
        f"{spec}: generated {t1 - t0:.1f} s, packed {t2 - t1:.1f} s, compacted {t3 - t2:.1f} s, "
        f"{edges} edges, {args.rows} rows",
        flush=True,
    )

    start = time.perf_counter()
    cpu_rows = np.sort(live_rows(advance(start_batch(x, np.float32), packed, bias)))
    cpu_seconds = time.perf_counter() - start
    print(
        f"{spec} CPU kernel: {args.rows} rows in {cpu_seconds:.1f} s, {cpu_rows.size} categories",
        flush=True,
    )
    del packed

    gpu = {}
    waited = time.perf_counter()
    with gpu_lock(args.gpu_lock):
        if args.gpu_lock is not None:
            print(f"{spec}: GPU lock taken after {time.perf_counter() - waited:.1f} s", flush=True)
        for mode in args.modes:
            gpu[mode] = gpu_categories(compact, inputs, bias, mode, warm=runtime == "gpu")
            print(
                f"{spec} GPU {mode}: on the device in {gpu[mode]['upload_seconds']:.1f} s, "
                f"{args.rows} rows in {gpu[mode]['seconds']:.3f} s, "
                f"{gpu[mode]['rows'].size} categories",
                flush=True,
            )
    del compact

    result = {
        "network": spec,
        "rows": args.rows,
        "edges": edges,
        "bias": bias,
        "cuda": runtime,
        "machine": describe(),
        "generate_seconds": t1 - t0,
        "pack_seconds": t2 - t1,
        "compact_seconds": t3 - t2,
        "cpu_seconds": cpu_seconds,
        "cpu_categories": int(cpu_rows.size),
        "gpu": {},
        "all_equal": True,
    }
    for mode, run in gpu.items():
        equal = bool(np.array_equal(run["rows"], cpu_rows))
        result["all_equal"] = result["all_equal"] and equal
        result["gpu"][mode] = {
            "upload_seconds": run["upload_seconds"],
            "seconds": run["seconds"],
            "kernel_seconds": run["kernel_seconds"],
            "device_bytes": run["device_bytes"],
            "categories": int(run["rows"].size),
            "equal_to_cpu": equal,
        }
        print(
            f"{spec} {mode}: GPU {run['seconds']:.3f} s, CPU {cpu_seconds:.1f} s, "
            f"categories GPU {run['rows'].size} / CPU {cpu_rows.size}, "
            f"equal: {equal}",
            flush=True,
        )
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    if not result["all_equal"]:
        sys.exit(f"{spec}: the GPU categories differ from the CPU kernel's on {args.rows} rows")


if __name__ == "__main__":
    COMMAND = sys.argv[1] if len(sys.argv) > 1 else ""
    if COMMAND == "kernels":
        kernels_main(sys.argv[2:])
    elif COMMAND == "rowcheck":
        rowcheck_main(sys.argv[2:])
    else:
        main()
