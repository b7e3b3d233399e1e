"""Placing a model-parallel network: the client's peak memory and time, streamed against whole.

    flock /tmp/bench.lock python benchmarks/placement.py [--neurons 4096] [--layers 120] [--parts 4]

Builds a RadiX-Net (float32) and places it with :class:`DistributedSparseMLP` on a LocalCluster of
two single-threaded workers, alternating two placements in the same run:

- ``streamed``: the default, each layer renumbered when the placement asks for it and handed
  over whenever ``PLACEMENT_BYTES`` of chunks wait;
- ``whole``: the baseline, every layer's chunks made and held before one hand-over
  (``PLACEMENT_BYTES`` set beyond the network's size).

Prints, per placement, the client's peak of Python-traced memory above what it held before
(``tracemalloc``: numpy's and scipy's arrays included), what the model keeps after placing, the
seconds the constructor took, and the ratios whole / streamed; both models' predictions on 64
inputs must be equal.

``--challenge`` measures ``run_challenge_model_parallel`` instead (``--inputs`` MNIST images,
hypergraph partition), on ``radixnet:N:L`` as a spec, made a layer at a time, against the same
network loaded first and given as a list of matrices (the list counted in its peak); the
categories must be equal. ``--spec-only`` runs the spec alone (a network too large to load
whole), with the workers' peak resident memory, and checks its categories against the plain
scipy loop of ``challenge.py`` (float64, a layer at a time in this process).
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np
from challenge import scipy_inference
from distributed import Client, LocalCluster
from harness import add_json_option, describe, write_json

import graph
from dasknn.challenge import run_challenge_model_parallel
from dasknn.challenge.engine import prepare_inputs
from dasknn.datasets import load_mnist_test, load_network, mnist_to_challenge_inputs
from dasknn.datasets.radixnet import iter_radixnet, radixnet
from dasknn.inference._workers import peak_rss
from dasknn.model import SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.model_parallel import _layout as layout

MIB = 2**20


def place(client: Client, model: SparseMLP, partition, whole: bool, x: np.ndarray) -> dict:
    """Construct the distributed model once; its client memory, seconds and ``predict(x)``."""
    default = layout.PLACEMENT_BYTES
    layout.PLACEMENT_BYTES = 2**62 if whole else default
    try:
        tracemalloc.start()
        start = time.perf_counter()
        dist = DistributedSparseMLP(model, client, partition=partition)
        seconds = time.perf_counter() - start
        kept, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    finally:
        layout.PLACEMENT_BYTES = default
    try:
        out = dist.predict(x)
    finally:
        dist.close()
    return {"seconds": seconds, "peak_mib": peak / MIB, "kept_mib": kept / MIB, "out": out}


def challenge(client: Client, spec: str, inputs, as_list: bool) -> dict:
    """One model-parallel challenge run of ``spec``, loaded whole first when ``as_list``; the
    client's peak memory, seconds and categories."""
    tracemalloc.start()
    start = time.perf_counter()
    network = load_network(spec) if as_list else spec
    categories, stats = run_challenge_model_parallel(network, inputs, client=client, progress=False)
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"seconds": seconds, "peak_mib": peak / MIB, "categories": categories,
            "partition_seconds": stats.partition_seconds,
            "placement_seconds": stats.placement_seconds}


def run_challenges(args) -> None:
    """The ``--challenge`` comparison (``--spec-only``: the spec alone)."""
    spec = f"radixnet:{args.neurons}:{args.layers}"
    images, _ = load_mnist_test()
    inputs = mnist_to_challenge_inputs(images[: args.inputs], side=int(np.sqrt(args.neurons)))
    edges = args.neurons * 32 * args.layers
    print(f"run_challenge_model_parallel({spec!r}), {args.inputs} inputs, float32, "
          f"{edges * 8 / MIB:.0f} MiB of float32 CSR; 2 workers, one part each")
    runs: dict[str, dict] = {}
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster, Client(cluster) as client:
        for kind in ("spec",) if args.spec_only else ("list", "spec"):
            runs[kind] = challenge(client, spec, inputs, kind == "list")
        workers_peak = client.run(peak_rss)
    for kind, row in runs.items():
        print(f"{kind:>5}: client peak {row['peak_mib']:7.0f} MiB, {row['seconds']:.1f} s "
              f"(partition {row['partition_seconds']:.1f} s, placement "
              f"{row['placement_seconds']:.1f} s), {len(row['categories'])} categories")
    print("workers' peak RSS: " + ", ".join(f"{v / MIB:.0f} MiB" for v in workers_peak.values()))
    if args.spec_only:
        matrix, bias = prepare_inputs(inputs, None, args.neurons)
        layers = iter_radixnet(args.neurons, args.layers, seed=0)
        expected = scipy_inference(matrix.astype(np.float64), layers, bias)
        np.testing.assert_array_equal(runs["spec"]["categories"], expected)
        print("categories equal scipy's (float64, a layer at a time)")
    else:
        np.testing.assert_array_equal(runs["list"]["categories"], runs["spec"]["categories"])
        print(f"list / spec: peak {runs['list']['peak_mib'] / runs['spec']['peak_mib']:.2f}x "
              "(same categories)")
    write_json(args.json, "placement-challenge", {
        "spec": spec, "inputs": args.inputs,
        **{f"{kind}_{name}": row[name] for kind, row in runs.items()
           for name in ("seconds", "peak_mib")},
    })  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--neurons", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=120)
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2, help="placements of each kind")
    parser.add_argument("--challenge", action="store_true",
                        help="measure run_challenge_model_parallel on a spec against a list")
    parser.add_argument("--inputs", type=int, default=1000, help="images (--challenge)")
    parser.add_argument("--spec-only", action="store_true",
                        help="--challenge without the network loaded whole")
    args = add_json_option(parser).parse_args()
    print(describe())
    if args.challenge:
        run_challenges(args)
        return
    weights = radixnet(args.neurons, args.layers, seed=0)
    model = SparseMLP(weights, [np.zeros(w.shape[1]) for w in weights], dtype="float32")
    del weights
    network = sum(w.data.nbytes + w.indices.nbytes + w.indptr.nbytes for w in model.weights)
    partition = graph.partition_network(model.weights, args.parts, method="random", seed=0)
    x = np.random.default_rng(0).random((64, args.neurons), dtype=np.float32)
    print(f"RadiX-Net {args.neurons} x {args.layers}, float32, {network / MIB:.0f} MiB as CSR; "
          f"{args.parts} parts on 2 workers; "
          f"PLACEMENT_BYTES {layout.PLACEMENT_BYTES / MIB:.0f} MiB")
    runs: dict[str, list[dict]] = {"whole": [], "streamed": []}
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster, Client(cluster) as client:
        for _ in range(args.repeats):
            for kind in runs:
                runs[kind].append(place(client, model, partition, kind == "whole", x))
    np.testing.assert_array_equal(runs["whole"][0]["out"], runs["streamed"][0]["out"])
    results = {"neurons": args.neurons, "layers": args.layers, "parts": args.parts,
               "network_mib": network / MIB}
    for kind, rows in runs.items():
        names = ("seconds", "peak_mib", "kept_mib")
        best = {name: min(row[name] for row in rows) for name in names}
        results[kind] = best
        print(f"{kind:>9}: peak {best['peak_mib']:7.0f} MiB ({best['peak_mib'] * MIB / network:.2f}"
              f" x the network), kept {best['kept_mib']:5.0f} MiB, {best['seconds']:.2f} s")
    whole, streamed = results["whole"], results["streamed"]
    results["peak_ratio"] = whole["peak_mib"] / streamed["peak_mib"]
    results["time_ratio"] = whole["seconds"] / streamed["seconds"]
    print(f"whole / streamed: peak {results['peak_ratio']:.2f}x, time {results['time_ratio']:.2f}x "
          "(same predictions)")
    write_json(args.json, "placement", results)


if __name__ == "__main__":
    main()
