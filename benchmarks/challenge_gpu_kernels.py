"""Kernel-only A/B of the CUDA modes on RadiX-Net networks: no Dask, one process, one GPU.

For each network (the generator, seed 0, float32) the script packs the layers once, uploads one
``DeviceNetwork`` per mode (``tiled`` once per ``--footprints`` entry, its footprint tiles built on
this host's cores, timed), bit-packs the MNIST inputs at the challenge's size for the width,
compiles each kernel on two rows (on a GPU; the simulator compiles nothing), then runs every mode
``--repeats`` times, alternating, with ``infer_rows_cuda`` on the whole batch. It prints each
run's seconds and GE/s (rows x edges / seconds, the challenge's measure), the best run's ratio to
``sectioned``, and whether every mode
gave the same categories (it exits with status 1 when one did not). A mode written
``MODE/per-entry`` (e.g. ``sectioned/per-entry``) runs on the same network with one weight per
nonzero, expanded on the host, as the device held it before it kept one weight per layer: the
A/B of that change.

    python benchmarks/challenge_gpu_kernels.py                          # on the GPU machine
    NUMBA_ENABLE_CUDASIM=1 python benchmarks/challenge_gpu_kernels.py --networks 1024x1,64x4 \
        --rows 32                                                       # anywhere: the simulator

Under the simulator (a Python thread a GPU thread, a block barrier for every warp vote) the
sectioned kernel takes about 40 s per layer and group of 32 rows at 1024 neurons on a 2-core
machine, hence the small check above (3.3 minutes there); 1024 x 4 at 64 rows took over 5
minutes a sectioned run. The simulator's times say nothing about a GPU's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from harness import case_bias
from harness import describe

from dasknn.datasets import load_mnist_test, mnist_to_challenge_inputs, radixnet
from dasknn.kernels.cuda_inference import (
    DeviceNetwork,
    compact_layers,
    cuda_runtime,
    infer_rows_cuda,
    pack_bit_rows,
)
from dasknn.kernels.inference import pack_layers

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
    compact = compact_layers(pack_layers(layers, np.float32))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
