"""Row check on one large network: the GPU kernel's categories against the CPU engine's kernel's.

The network is generated once (RadiX-Net, seed 0, float32) and packed for the CPU kernel
(``pack_layers``, ~8 bytes an entry; the scipy layers, as many bytes again, are freed right after)
and for the GPU (``compact_layers``, ~2 bytes an entry). The first ``--rows`` MNIST test images at
the challenge's size for the width go through the CPU engine's kernel in this process
(``start_batch``, ``advance``, ``live_rows``, float32, on the numba threads that
``NUMBA_NUM_THREADS`` allows; the packed layers are freed after it), then, bit-packed, through
``infer_rows_cuda`` on a resident ``DeviceNetwork`` for every ``--modes`` entry (``tiled`` with
the default footprint; on a GPU each kernel is compiled on two rows before the timed run). It
prints and writes to ``--out`` (one JSON object) the seconds of each, the category counts and
whether each mode's categories equal the CPU kernel's; it exits with status 1 when one does not.

``--gpu-lock FILE`` holds an exclusive ``flock`` on FILE while the network is on the GPU, so a
session that runs this in the background can time other GPU work under the same lock; the CPU
kernel (minutes at 65536 x 1920) runs first, so it overlaps that work instead of waiting for it.

    python benchmarks/challenge_gpu_rowcheck.py --neurons 65536 --layers 1920 --rows 1000 \
        --modes sectioned,tiled --out rowcheck.json                      # the GPU machine
    NUMBA_ENABLE_CUDASIM=1 python benchmarks/challenge_gpu_rowcheck.py --neurons 1024 \
        --layers 2 --rows 32 --out /tmp/rowcheck.json                   # anywhere: the simulator

At 65536 x 1920 (4.0e9 entries) the scipy layers and the packed ones take about 32 GB each at
the peak, the compact network 8 GB; the CPU kernel runs one tile of 64 live rows per thread.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from harness import case_bias
from harness import describe

from dasknn.datasets import (
    load_mnist_test,
    mnist_to_challenge_inputs,
    radixnet,
    radixnet_group_size,
)
from dasknn.kernels.cuda_inference import (
    CUDA_MODES,
    DeviceNetwork,
    compact_layers,
    cuda_runtime,
    infer_rows_cuda,
    pack_bit_rows,
)
from dasknn.kernels.inference import advance, live_rows, pack_layers, start_batch

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    args = parser.parse_args()
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
    main()
