"""CPU proxy of the tiled CUDA kernel's gain: L2 activation loads, sectioned vs footprint tiles.

The sectioned kernel (``mode="sectioned"``) issues one coalesced 128-byte activation load per
*kept* weight entry per group of 32 live rows (an entry is kept when its input's section, the 32
rows' values of that input, holds a nonzero). The tiled kernel (``mode="tiled"``) issues one per
footprint entry per live group (no flags). This script runs the inputs through the layers (scipy,
float32, the challenge's bias), packs the rows in groups of 32 as the GPU does (live rows
re-packed every ``--compact-every`` layers; a group is skipped when all its rows are dead) and
counts, per layer and in total:

- ``kept``: sectioned loads, the kept entries of the live groups;
- ``footprint``: tiled loads, live groups x the layer's footprint entries
  (:func:`dasknn.kernels.footprint_tiles.tile_layers`);
- ``entries``: live groups x the layer's weight entries (what the tiled kernel multiplies).

It prints the ratio kept / footprint (the fall in L2 activation loads) and the host seconds of
``tile_layers`` on this machine's cores. No GPU is needed.

    python benchmarks/footprint_loads.py --official ../shared/data/graphchallenge/neuron1024 \
        --networks 4096x24,16384x24,65536x12 --rows 1000
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from machine import describe

from dasknn.datasets import (
    challenge_bias,
    load_mnist_test,
    mnist_to_challenge_inputs,
    radixnet,
    read_challenge_network,
)
from dasknn.kernels.cuda_inference import LANES, compact_layers
from dasknn.kernels.footprint_tiles import FOOTPRINT, TILE_OUTPUTS, tile_layers
from dasknn.kernels.inference import pack_layers


def layer_loads(y: sp.csr_matrix, slots: np.ndarray, w: sp.csr_matrix,
                footprint_entries: int) -> tuple[int, int, int]:
    """(kept, footprint, entries) of one layer for activations ``y`` packed as ``slots`` (row ids
    in group order, 32 a group)."""
    groups = -(-slots.size // LANES)
    member = sp.csr_matrix((np.ones(slots.size), (np.arange(slots.size) // LANES, slots)),
                           shape=(groups, y.shape[0]))
    nonzero = sp.csr_matrix((np.ones(y.nnz), y.indices, y.indptr), shape=y.shape)
    sections = (member @ nonzero).tocsr()  # groups x inputs: nonzero where a section holds one
    sections.data[:] = 1.0
    live = np.diff(sections.indptr) > 0
    out_degree = np.diff(w.indptr).astype(np.float64)  # entries fed by each input
    kept = int(round(float((sections @ out_degree).sum())))
    n_live = int(live.sum())
    return kept, n_live * footprint_entries, n_live * int(w.nnz)


def next_layer(y: sp.csr_matrix, w: sp.csr_matrix, bias: float) -> sp.csr_matrix:
    """``min(max(Y W + b, 0), 32)`` on the nonzeros of ``Y W``, float32."""
    z = (y @ w).tocsr()
    z.data += np.float32(bias)
    np.clip(z.data, 0.0, 32.0, out=z.data)
    z.eliminate_zeros()
    return z


def measure(name: str, layers: list[sp.csr_matrix], images: np.ndarray, footprint: int,
            tile_outputs: int, compact_every: int) -> dict:
    neurons = layers[0].shape[0]
    compact = compact_layers(pack_layers(layers, np.float32))
    tile_layers(compact.indptr[:1], compact.indices, footprint, tile_outputs)  # compile
    start = time.perf_counter()
    tiles = tile_layers(compact.indptr, compact.indices, footprint, tile_outputs)
    tile_seconds = time.perf_counter() - start
    foot_per_layer = np.diff(tiles.foot_ptr[tiles.layer_tiles])
    y = mnist_to_challenge_inputs(images, int(round(neurons**0.5))).astype(np.float32)
    bias = challenge_bias(neurons)
    slots = np.flatnonzero(np.diff(y.indptr))
    totals = np.zeros(3, dtype=np.int64)
    for k, w in enumerate(layers):
        if k % compact_every == 0:
            slots = slots[np.diff(y.indptr)[slots] > 0]
        w32 = sp.csr_matrix(w, dtype=np.float32)
        totals += layer_loads(y, slots, w32, int(foot_per_layer[k]))
        y = next_layer(y, w32, bias)
    kept, foot, entries = (int(v) for v in totals)
    return {
        "network": name, "layers": len(layers), "rows": images.shape[0],
        "categories": int((np.diff(y.indptr) > 0).sum()), "kept": kept, "footprint": foot,
        "entries": entries, "ratio": kept / foot if foot else float("nan"),
        "tiles": tiles.n_tiles, "mean_footprint": float(foot_per_layer.sum() / tiles.n_tiles),
        "mean_columns": neurons * len(layers) / tiles.n_tiles, "tile_seconds": tile_seconds,
        "nnz": int(compact.indices.size),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--official", type=Path, help="directory of the official 1024 x 120")
    parser.add_argument("--networks", default="4096x24,16384x24,65536x12",
                        help="RadiX-Net cases NxL (generator, seed 0)")
    parser.add_argument("--rows", type=int, default=1000, help="MNIST test images")
    parser.add_argument("--footprint", type=int, default=FOOTPRINT)
    parser.add_argument("--tile-outputs", type=int, default=TILE_OUTPUTS)
    parser.add_argument("--compact-every", type=int, default=8)
    args = parser.parse_args()
    print(f"machine: {describe()}", flush=True)
    print(f"footprint {args.footprint}, tile outputs {args.tile_outputs}, {args.rows} MNIST rows",
          flush=True)
    images = load_mnist_test()[0][: args.rows]
    cases = []
    if args.official is not None:
        cases.append(("official 1024x120", lambda: read_challenge_network(args.official,
                                                                          neurons=1024)))
    for spec in filter(None, args.networks.split(",")):
        neurons, depth = (int(v) for v in spec.split("x"))
        cases.append((f"radixnet {spec}", lambda n=neurons, d=depth: radixnet(n, d, seed=0)))
    print("\n| network | rows | categories | sectioned loads (kept) | tiled loads (footprint) "
          "| kept / footprint | entries / footprint | mean footprint | mean columns a tile "
          "| tile_layers s (nnz) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, build in cases:
        r = measure(name, build(), images, args.footprint, args.tile_outputs,
                    args.compact_every)
        unflagged = r["entries"] / r["footprint"]
        print(f"| {r['network']} | {r['rows']} | {r['categories']} | {r['kept']:.3e} "
              f"| {r['footprint']:.3e} | **{r['ratio']:.1f}x** | {unflagged:.1f}x "
              f"| {r['mean_footprint']:.1f} | {r['mean_columns']:.1f} "
              f"| {r['tile_seconds']:.3f} ({r['nnz']:.2e}) |", flush=True)


if __name__ == "__main__":
    main()
