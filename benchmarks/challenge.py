"""Graph Challenge inference: dasknn against plain scipy.sparse and python-graphblas, one run.

For each network the baselines (scipy.sparse in float64 and in float32, python-graphblas) run on
the same MNIST inputs in this process and dasknn on a fresh 2-worker LocalCluster; the script
prints time, rate
(inputs x edges / seconds, the challenge's measure), the ratios dasknn / baseline, whether the
categories agree, the multiply-adds dasknn did against the nominal edges, and the kernel's rate
against this CPU's limit for the same access pattern. The 16384 x 120 case runs dasknn alone with
streamed weights and reports its peak memory per worker.

Run:  python benchmarks/challenge.py
Options: --only NAME[,NAME] (official, 1024x480, 1024x1920, 4096x120, 16384x120),
--inputs N (images for every case instead of the per-case defaults below), --quick (1000 images,
official, 1024x480 and 4096x120 only), --json FILE (the table's rows as JSON lines).

Per-case inputs by default: all 10,000 MNIST test images for the official network and 16384 x 120;
the first 2,500 for 1024 x 480 and 4096 x 120 and the first 1,000 for 1024 x 1920, so the two
single-machine baselines finish in a few minutes each on 2 cores. All three implementations always
see the same inputs, and the rate is normalised by the inputs (inputs x edges / seconds).

``--column-split`` runs the kernel alone instead (no Dask, one process, all numba threads): the
official 1024 x 120 network (``radixnet(1024, 120)`` where ``../shared`` is absent), float32 by
default, batches of the first ``--batches`` MNIST test images, ``advance`` over every layer with
the column split (a layer's output columns divided among the threads when it has fewer live tiles
of 64 rows than threads) and without it (``split_columns=False``, one tile a thread), the two
alternating ``--repeats`` times (ten times as many for batches of at most 256 rows); it prints the
best and median seconds of each, their ratio and whether rows, activations and multiply-add
counts agree bit for bit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numba
import numpy as np
import scipy.sparse as sp
from distributed import Client
from harness import add_json_option, describe, write_json

from dasknn.challenge import run_challenge
from dasknn.datasets import (
    challenge_bias,
    load_mnist_test,
    mnist_to_challenge_inputs,
    radixnet,
    read_challenge_network,
)
from dasknn.kernels import inference
from dasknn.kernels.lane_vectors import GROUP, LANES, accumulate_group, stack_group
from dasknn.runtime.cluster import local_cluster

OFFICIAL = Path(__file__).resolve().parents[1].parent / "shared/data/graphchallenge/neuron1024"


def scipy_inference(inputs: sp.csr_matrix, layers, bias: float) -> np.ndarray:
    """The plain scipy.sparse loop a user would write (float64)."""
    y = inputs
    for w in layers:
        z = y @ w
        z.data += bias  # the sparse product stores no zeros: bias on nonzeros only
        np.clip(z.data, 0.0, 32.0, out=z.data)
        z.eliminate_zeros()
        y = z
    return np.flatnonzero(np.diff(y.indptr)) + 1


def graphblas_inference(inputs, layers, bias: float) -> np.ndarray:
    """The same with python-graphblas (SuiteSparse:GraphBLAS, OpenMP on every core, float64)."""
    from graphblas import binary, monoid, select, semiring

    y = inputs
    for w in layers:
        z = y.mxm(w, semiring.plus_times).new()
        z << z.apply(binary.plus, right=bias)  # apply touches stored (nonzero) entries only
        z << select.valuegt(z, 0.0)  # ReLU: drop what is not positive
        z << z.apply(binary.min, right=32.0)
        y = z
    rows, _ = y.reduce_rowwise(monoid.any).new().to_coo()
    return np.asarray(rows, dtype=np.int64) + 1


@numba.njit(cache=True, parallel=True)
def _group_roofline(src, indptr, indices, data, flags, out, reps):
    """The kernel's inner pattern with nothing else: groups of 4 columns sharing 32 inputs
    accumulated over an L2-resident tile (every section flagged); the epilogue only adds up the
    sums."""
    n_tiles, n, _ = src.shape
    for t in numba.prange(n_tiles):
        for _ in range(reps):
            for c in range(0, n, GROUP):
                sums = stack_group(src.dtype)
                accumulate_group(sums, src, t * n * LANES, indices, data, flags, t * n,
                                 indptr[c], indptr[c + 1], 32, 64, 96)
                for i in range(GROUP * LANES):  # every sum is used: nothing is optimised away
                    out[t] += sums[i]


def cpu_limit_macs(dtype, neurons: int) -> float:
    """Measured multiply-adds per second of the bare inner pattern on all cores."""
    threads = numba.get_num_threads()
    src = np.full((threads, neurons, LANES), 1e-3, dtype=dtype)
    inputs = np.random.default_rng(0).integers(0, neurons, (neurons // 16, 32))
    indices = np.repeat(inputs, 16, axis=0).ravel().astype(np.int32)  # RadiX-Net-like: 16 share
    indptr = np.arange(0, indices.size + 1, 32, dtype=np.int64)
    data = np.full(indices.size, 1e-3, dtype=dtype)
    flags = np.ones((threads, neurons), dtype=np.bool_)
    out = np.zeros(threads, dtype=dtype)
    _group_roofline(src, indptr, indices, data, flags, out, 1)
    reps = max(1, int(4e8 / (threads * indices.size * LANES)))
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        _group_roofline(src, indptr, indices, data, flags, out, reps)
        best = max(best, threads * reps * indices.size * LANES / (time.perf_counter() - start))
    return best


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def run_case(name, layers, inputs, bias, baselines: bool, dasknn_kwargs: dict) -> dict:
    import graphblas as gb  # the bench extra; imported here so that --help needs none

    edges = sum(w.nnz for w in layers)
    n = inputs.shape[0]
    nominal = n * edges
    row: dict = {"name": name, "inputs": n, "edges": edges}
    print(f"\n== {name}: {layers[0].shape[0]} neurons x {len(layers)} layers, {edges} edges, "
          f"{n} inputs ==", flush=True)
    if baselines:
        cats_sp, t_sp = timed(scipy_inference, inputs, layers, bias)
        print(f"scipy.sparse     {t_sp:8.2f} s  {nominal / t_sp:.3g} edges/s", flush=True)
        cats_sp32, t_sp32 = timed(scipy_inference, inputs.astype(np.float32),
                                  [w.astype(np.float32) for w in layers], np.float32(bias))
        print(f"scipy.sparse f32 {t_sp32:8.2f} s  {nominal / t_sp32:.3g} edges/s  (same "
              f"categories as float64: {np.array_equal(cats_sp32, cats_sp)})", flush=True)
        g_inputs = gb.io.from_scipy_sparse(inputs)
        g_layers = [gb.io.from_scipy_sparse(w) for w in layers]
        cats_gb, t_gb = timed(graphblas_inference, g_inputs, g_layers, bias)
        print(f"python-graphblas {t_gb:8.2f} s  {nominal / t_gb:.3g} edges/s", flush=True)
        row.update(scipy_s=t_sp, scipy32_s=t_sp32, graphblas_s=t_gb, scipy_rate=nominal / t_sp,
                   scipy32_rate=nominal / t_sp32, graphblas_rate=nominal / t_gb)
    with local_cluster(2, 1) as cluster, Client(cluster) as client:
        for dtype in dasknn_kwargs.pop("dtypes", ("float32",)):
            cats, stats = run_challenge(layers, inputs, bias=bias, client=client, dtype=dtype,
                                        progress=False, **dasknn_kwargs)
            peak = max(stats.peak_memory.values()) / 2**20
            busy = stats.kernel_seconds / (stats.seconds * stats.workers)
            print(f"dasknn {dtype}   {stats.seconds:8.2f} s  {stats.rate:.3g} edges/s  "
                  f"({stats.batches} batches of {stats.batch_size}, {stats.mode} weights, "
                  f"workers busy in the kernel {busy:.0%}, peak {peak:.0f} MiB/worker)",
                  flush=True)
            kernel_rate = stats.macs_done / stats.kernel_seconds * stats.workers
            share = stats.macs_done / nominal
            print(f"  work: {stats.macs_done:.3g} multiply-adds done ({share:.1%} of nominal), "
                  f"{stats.macs_needed:.3g} needed; kernel "
                  f"{kernel_rate:.3g} MAC/s on {stats.workers} workers", flush=True)
            entry = {"seconds": stats.seconds, "rate": stats.rate, "macs_done": stats.macs_done,
                     "macs_needed": stats.macs_needed, "kernel_macs_per_s": kernel_rate,
                     "peak_mib": peak, "mode": stats.mode, "categories": stats.categories,
                     "busy": busy}
            if baselines:
                same = np.array_equal(cats, cats_sp) and np.array_equal(cats, cats_gb)
                entry.update(vs_scipy=stats.rate / row["scipy_rate"],
                             vs_scipy32=stats.rate / row["scipy32_rate"],
                             vs_graphblas=stats.rate / row["graphblas_rate"], same=same)
                print(f"  ratio: {entry['vs_scipy']:.1f}x scipy, {entry['vs_scipy32']:.1f}x scipy "
                      f"float32, {entry['vs_graphblas']:.1f}x graphblas; same categories as "
                      f"scipy and graphblas (float64): {same} ({cats.size}; scipy "
                      f"{cats_sp.size}, graphblas {cats_gb.size})", flush=True)
            row[dtype] = entry
    return row


Mode = Callable[[sp.csr_matrix], tuple[float, bytes, int]]


def kernel_mode(layers, bias: float, dtype: np.dtype, **options) -> Mode:
    """One timed ``advance`` over every layer: (seconds, what it computed, live rows).

    What it computed is the bytes of the live rows, their activations and the two counts.
    """
    packed = inference.pack_layers(layers, dtype)

    def run(inputs: sp.csr_matrix) -> tuple[float, bytes, int]:
        state = inference.start_batch(inputs, dtype)
        start = time.perf_counter()
        inference.advance(state, packed, bias, **options)
        seconds = time.perf_counter() - start
        counts = np.array([state.macs_done, state.macs_needed], dtype=np.int64)
        computed = (
            inference.live_rows(state).tobytes()
            + inference.live_activations(state).tobytes()
            + counts.tobytes()
        )
        return seconds, computed, state.live

    return run


def column_split(args) -> None:
    """The CPU kernel with and without the column split, alternating (``--column-split``)."""
    dtype = np.dtype(args.dtype)
    if (OFFICIAL / "n1024-l1.tsv.gz").exists():
        name, layers = "official 1024 x 120", read_challenge_network(OFFICIAL)
    else:
        name, layers = "radixnet(1024, 120)", radixnet(1024, 120)
    bias = challenge_bias(1024)
    images = load_mnist_test()[0]
    modes = {
        "split": kernel_mode(layers, bias, dtype, split_columns=True),
        "tile-only": kernel_mode(layers, bias, dtype, split_columns=False),
    }
    print(f"machine: {describe()}")
    print(f"numba {numba.__version__}, {numba.get_num_threads()} threads")
    print(f"network: {name}, {dtype}, bias {bias}; {LANES} rows a tile")
    print("seconds best / median of the timed runs; x: best of tile-only / best of split")
    results = []
    for rows in (int(b) for b in args.batches.split(",")):
        inputs = mnist_to_challenge_inputs(images[:rows], 32)
        repeats = args.repeats * (10 if rows <= 4 * LANES else 1)
        computed = {label: run(inputs)[1] for label, run in modes.items()}  # compile, warm
        times: dict[str, list[float]] = {label: [] for label in modes}
        for _ in range(repeats):
            for label, run in modes.items():
                seconds, result, live = run(inputs)
                assert result == computed[label], f"{label} changed between runs"
                times[label].append(seconds)
        same = computed["split"] == computed["tile-only"]
        ratio = min(times["tile-only"]) / min(times["split"])
        cells = "  ".join(f"{label} {min(t):.4f} / {statistics.median(t):.4f}"
                          for label, t in times.items())
        print(f"{rows:>6} rows ({live} live at the end), {repeats} runs:  {cells}  "
              f"tile-only / split {ratio:.2f}x  same bits: {same}", flush=True)
        results.append({"rows": rows, "live": live, "repeats": repeats, "same": same,
                        "ratio": ratio, "seconds": times})
    write_json(args.json, "challenge.py --column-split", results)
    print(f"threading layer {numba.threading_layer()}; machine at the end: {describe()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated case names")
    parser.add_argument("--inputs", type=int, help="MNIST images for every case")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--column-split", action="store_true",
                        help="time the CPU kernel with and without the column split instead")
    parser.add_argument("--batches", default="64,128,256,10000",
                        help="with --column-split: batch sizes, comma-separated")
    parser.add_argument("--repeats", type=int, default=5,
                        help="with --column-split: timed runs of each mode")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                        help="with --column-split: the kernel's dtype")
    add_json_option(parser)
    args = parser.parse_args()
    if args.column_split:
        column_split(args)
        return
    n_override = 1000 if args.quick else args.inputs
    wanted = set(args.only.split(",")) if args.only else None
    if args.quick and wanted is None:
        wanted = {"official", "1024x480", "4096x120"}
    print(f"machine: {describe()}")
    import graphblas as gb

    print(f"numpy {np.__version__}, numba {numba.__version__}, graphblas {gb.__version__}")
    images = load_mnist_test()[0]

    for dtype in (np.float32, np.float64):
        limit = cpu_limit_macs(dtype, 1024)
        print(f"CPU limit of the kernel's inner pattern ({np.dtype(dtype).name}, groups of "
              f"{GROUP} columns x {LANES} lanes, all cores): {limit:.3g} MAC/s")

    cases = []
    if OFFICIAL.exists():
        cases.append(("official", lambda: read_challenge_network(OFFICIAL), 32, 10000, True,
                      {"dtypes": ("float32", "float64")}))
    cases += [
        ("1024x480", lambda: radixnet(1024, 480), 32, 2500, True, {}),
        ("1024x1920", lambda: radixnet(1024, 1920), 32, 1000, True, {}),
        ("4096x120", lambda: radixnet(4096, 120), 64, 2500, True, {}),
        ("16384x120", lambda: radixnet(16384, 120, dtype=np.float32), 128, 10000, False,
         {"resident_layers": 8, "weight_buffers": 2}),
    ]
    rows = []
    for name, make, side, n_images, baselines, kwargs in cases:
        if wanted is not None and name not in wanted:
            continue
        layers = make()
        inputs = mnist_to_challenge_inputs(images[: n_override or n_images], side)
        rows.append(run_case(name, layers, inputs, challenge_bias(side * side), baselines,
                             dict(kwargs)))
        del layers
    print(f"\nload average at the end {os.getloadavg()}")
    print("\n| case | inputs | scipy edges/s | scipy f32 edges/s | graphblas edges/s | dasknn f32 "
          "edges/s | vs scipy | vs scipy f32 | vs graphblas | same categories | MACs done / "
          "nominal | peak MiB/worker |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        d = row["float32"]
        nominal = row["inputs"] * row["edges"]
        base = (f"{row['scipy_rate']:.3g} | {row['scipy32_rate']:.3g} | "
                f"{row['graphblas_rate']:.3g}" if "scipy_rate" in row else "- | - | -")
        ratios = (f"{d['vs_scipy']:.1f}x | {d['vs_scipy32']:.1f}x | {d['vs_graphblas']:.1f}x | "
                  f"{d['same']}" if "vs_scipy" in d else "- | - | - | -")
        print(f"| {row['name']} | {row['inputs']} | {base} | {d['rate']:.3g} | {ratios} | "
              f"{d['macs_done'] / nominal:.1%} | {d['peak_mib']:.0f} |")
    write_json(args.json, "challenge.py", rows)


if __name__ == "__main__":
    main()
