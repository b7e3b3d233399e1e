"""The CPU challenge kernel with and without the column split, on all numba threads, one run.

``advance`` splits each tile's output columns among the numba threads when a layer has fewer live
tiles (64 rows each) than threads; ``split_columns=False`` runs one tile a thread whatever the
count. For batches of the first 64, 128, 256 and 10,000 MNIST test images through the official
1024 x 120 network (``radixnet(1024, 120)`` when ``../shared`` is absent), float32, the script
times both in the same process, alternating them, and prints the best and median seconds of each,
the ratio of the best times (tile-only / split) and whether rows, activations and multiply-add
counts agree bit for bit. With ``--before REV`` the kernel module of git revision ``REV``
(``dasknn/kernels/inference.py``, imported from a temporary copy) runs as a third mode in the same
alternation, the baseline for what the change costs where the split does not apply.

Run under the shared lock:  flock /tmp/dasknn-tests.lock python benchmarks/kernel_threads.py
Options: --batches 64,128,256,10000, --repeats N (timed runs of each mode; the small batches run
ten times as many), --dtype float32|float64, --before REV.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numba
import numpy as np
import scipy.sparse as sp
from harness import describe

from dasknn.datasets import (
    challenge_bias,
    load_mnist_test,
    mnist_to_challenge_inputs,
    radixnet,
    read_challenge_network,
)
from dasknn.kernels import inference
from dasknn.kernels.inference import LANES

ROOT = Path(__file__).resolve().parents[1]
OFFICIAL = ROOT.parent / "shared/data/graphchallenge/neuron1024"

Mode = Callable[[sp.csr_matrix], tuple[float, bytes, int]]


def network() -> tuple[str, list[sp.csr_matrix]]:
    """The official 1024 x 120 network, else the generated one of the same shape."""
    if (OFFICIAL / "n1024-l1.tsv.gz").exists():
        return "official 1024 x 120", read_challenge_network(OFFICIAL)
    return "radixnet(1024, 120)", radixnet(1024, 120)


def kernel_at(revision: str, folder: Path) -> ModuleType:
    """The kernel module as it was at git ``revision``, imported from a copy in ``folder``."""
    source = subprocess.run(
        ["git", "show", f"{revision}:dasknn/kernels/inference.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = folder / "inference_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("inference_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def mode(kernel: ModuleType, layers, bias: float, dtype: np.dtype, **options) -> Mode:
    """One timed ``advance`` of ``kernel`` over every layer: (seconds, what it computed, live rows).

    What it computed is the bytes of the live rows, their activations and the two counts.
    """
    packed = kernel.pack_layers(layers, dtype)

    def run(inputs: sp.csr_matrix) -> tuple[float, bytes, int]:
        state = kernel.start_batch(inputs, dtype)
        start = time.perf_counter()
        kernel.advance(state, packed, bias, **options)
        seconds = time.perf_counter() - start
        counts = np.array([state.macs_done, state.macs_needed], dtype=np.int64)
        computed = (
            kernel.live_rows(state).tobytes()
            + kernel.live_activations(state).tobytes()
            + counts.tobytes()
        )
        return seconds, computed, state.live

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="64,128,256,10000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--before", metavar="REV", help="also time the kernel of this revision")
    args = parser.parse_args()
    dtype = np.dtype(args.dtype)
    name, layers = network()
    bias = challenge_bias(1024)
    images = load_mnist_test()[0]
    with tempfile.TemporaryDirectory(prefix="kernel-before-") as folder:
        modes = {
            "split": mode(inference, layers, bias, dtype, split_columns=True),
            "tile-only": mode(inference, layers, bias, dtype, split_columns=False),
        }
        if args.before:
            modes[f"before {args.before}"] = mode(
                kernel_at(args.before, Path(folder)), layers, bias, dtype
            )
        print(f"machine: {describe()}")
        print(f"numba {numba.__version__}, {numba.get_num_threads()} threads")
        print(f"network: {name}, {dtype}, bias {bias}; {LANES} rows a tile")
        print("seconds best / median of the timed runs; x: best of the mode / best of split")
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
            same = all(result == computed["split"] for result in computed.values())
            best = min(times["split"])
            cells = "  ".join(
                f"{label} {min(t):.4f} / {statistics.median(t):.4f}"
                + ("" if label == "split" else f" ({min(t) / best:.2f}x)")
                for label, t in times.items()
            )
            print(
                f"{rows:>6} rows ({live} live at the end), {repeats} runs:  {cells}  "
                f"same bits: {same}",
                flush=True,
            )
        print(f"threading layer {numba.threading_layer()}; machine at the end: {describe()}")


if __name__ == "__main__":
    main()
