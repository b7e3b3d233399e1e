"""Time the data layer: generating RadiX-Net networks and reading the official network.

Run: ``python benchmarks/datasets.py``. The issue's target: 4096 x 120 generated in under 10 s.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

from harness import describe

from dasknn.datasets import radixnet, read_challenge_network

OFFICIAL = Path(__file__).resolve().parents[2] / "shared/data/graphchallenge/neuron1024"


def _timed(label: str, func) -> None:
    start = time.perf_counter()
    layers = func()
    seconds = time.perf_counter() - start
    edges = sum(w.nnz for w in layers)
    print(f"{label:<36} {seconds:8.2f} s  {edges / 1e6:8.1f} M edges")


def main() -> None:
    print(f"machine: {describe()}, python {platform.python_version()}")
    for neurons, depth in ((1024, 120), (4096, 120), (16384, 120), (1024, 1920)):
        _timed(f"radixnet({neurons}, {depth})", lambda n=neurons, d=depth: radixnet(n, d))
    if OFFICIAL.exists():
        _timed("read official 1024 x 120 (.tsv.gz)", lambda: read_challenge_network(OFFICIAL))


if __name__ == "__main__":
    main()
