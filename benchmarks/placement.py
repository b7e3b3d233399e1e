"""Placing a model-parallel network: the client's peak memory and time, streamed against whole.

    flock /tmp/bench.lock python benchmarks/placement.py [--neurons 4096] [--layers 120] [--parts 4]

Builds a RadiX-Net (float32) and places it with :class:`DistributedSparseMLP` on a LocalCluster of
two single-threaded workers, alternating two placements in the same run:

- ``streamed``: the default, each layer renumbered when the placement asks for it and handed
  over whenever ``PLACEMENT_BYTES`` of chunks wait;
- ``whole``: the baseline, every layer's chunks made and held before one hand-over
  (``PLACEMENT_BYTES`` set beyond the network's size).

Prints, per placement, the client's peak of Python-traced memory above what it held before
(``tracemalloc``: numpy's and scipy's arrays included) and what the model keeps after placing,
from one construction, the seconds of another, untraced (tracing slows the allocations: about
twice the time at 4096 x 120), and the ratios whole / streamed; both models' predictions on 64
inputs must be equal.

``--challenge`` measures ``run_challenge_model_parallel`` instead (``--inputs`` MNIST images,
hypergraph partition), on ``radixnet:N:L`` as a spec, made a layer at a time, against the same
network loaded first and given as a list of matrices (the list counted in its peak); the
categories must be equal. ``--spec-only`` runs the spec alone (a network too large to load
whole) untraced (the client's peak is its process's peak RSS, the LocalCluster's scheduler
included: tracemalloc would slow the placement by a third), with the workers' peak resident
memory, and checks its categories against the plain
scipy loop of ``challenge.py`` (float64, a layer at a time; ``--check-processes K`` splits the
inputs into K row blocks checked in K processes at once, after the run). ``--workers`` sets the
cluster's single-threaded workers (one part each), ``--partition FILE`` takes a partition of
``dasknn partition --stream --out FILE`` instead of partitioning in the run::

    python -m dasknn partition radixnet:65536:1920 --parts 16 --stream --out p16.npz
    python benchmarks/placement.py --challenge --spec-only --neurons 65536 --layers 1920 \
        --inputs 100 --workers 16 --partition p16.npz --check-processes 15
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
import tracemalloc
from concurrent.futures import ProcessPoolExecutor

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
    """Construct the distributed model twice: traced (``tracemalloc``) for the client's memory,
    untraced for the seconds (tracing slows every allocation); the second one's ``predict(x)``."""
    default = layout.PLACEMENT_BYTES
    layout.PLACEMENT_BYTES = 2**62 if whole else default
    try:
        tracemalloc.start()
        try:
            traced = DistributedSparseMLP(model, client, partition=partition)
            kept, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        traced.close()
        start = time.perf_counter()
        dist = DistributedSparseMLP(model, client, partition=partition)
        seconds = time.perf_counter() - start
    finally:
        layout.PLACEMENT_BYTES = default
    try:
        out = dist.predict(x)
    finally:
        dist.close()
    return {"seconds": seconds, "peak_mib": peak / MIB, "kept_mib": kept / MIB, "out": out}


def challenge(
    client: Client, spec: str, inputs, as_list: bool, partition: str | None, traced: bool
) -> dict:
    """One model-parallel challenge run of ``spec``, loaded whole first when ``as_list``; the
    client's peak memory (``traced``: ``tracemalloc``'s above what it held before, which slows
    the run's allocations; else the process's peak RSS), seconds, categories and the run's
    statistics."""
    if traced:
        tracemalloc.start()
    start = time.perf_counter()
    network = load_network(spec) if as_list else spec
    categories, stats = run_challenge_model_parallel(
        network, inputs, client=client, progress=False, partition=partition
    )
    seconds = time.perf_counter() - start
    if traced:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    else:
        peak = peak_rss()
    return {
        "seconds": seconds,
        "peak_mib": peak / MIB,
        "categories": categories,
        "stats": stats.as_dict(),
    }


def _scipy_block(neurons: int, layers: int, rows) -> np.ndarray:
    """Categories (1-based within ``rows``) of the plain scipy loop on ``radixnet:N:L``."""
    matrix, bias = rows
    return scipy_inference(matrix.astype(np.float64), iter_radixnet(neurons, layers, seed=0), bias)


def scipy_categories(neurons: int, layers: int, inputs, processes: int) -> np.ndarray:
    """The scipy loop's categories of ``inputs``, their rows split into ``processes`` blocks
    checked at once in as many processes (one: in this process)."""
    matrix, bias = prepare_inputs(inputs, None, neurons)
    if processes <= 1:
        return _scipy_block(neurons, layers, (matrix, bias))
    bounds = np.linspace(0, matrix.shape[0], processes + 1).astype(int)
    blocks = [(matrix[lo:hi], bias) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        found = pool.map(_scipy_block, [neurons] * processes, [layers] * processes, blocks)
        return np.concatenate([c + lo for c, lo in zip(found, bounds[:-1], strict=True)])


def run_challenges(args) -> None:
    """The ``--challenge`` comparison (``--spec-only``: the spec alone)."""
    spec = f"radixnet:{args.neurons}:{args.layers}"
    images, _ = load_mnist_test()
    inputs = mnist_to_challenge_inputs(images[: args.inputs], side=int(np.sqrt(args.neurons)))
    edges = args.neurons * 32 * args.layers
    print(
        f"run_challenge_model_parallel({spec!r}), {args.inputs} inputs, float32, "
        f"{edges * 8 / MIB:.0f} MiB of float32 CSR; {args.workers} single-threaded workers"
        + (f", partition {args.partition}" if args.partition else "")
    )
    runs: dict[str, dict] = {}
    with (
        LocalCluster(
            n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        for kind in ("spec",) if args.spec_only else ("list", "spec"):
            traced = not args.spec_only  # the list against the spec: Python's allocations
            runs[kind] = challenge(client, spec, inputs, kind == "list", args.partition, traced)
        workers_peak = client.run(peak_rss)
    for kind, row in runs.items():
        stats = row["stats"]
        print(
            f"{kind:>5}: client peak {row['peak_mib']:7.0f} MiB, {row['seconds']:.1f} s "
            f"(partition {stats['partition_seconds']:.1f} s, placement "
            f"{stats['placement_seconds']:.1f} s, inference {stats['seconds']:.1f} s, "
            f"{stats['rate']:.3g} edges/s), {len(row['categories'])} categories; "
            f"{stats['measured_bytes']:,} B moved, {stats['predicted_bytes']:,} B predicted"
        )
    print("workers' peak RSS: " + ", ".join(f"{v / MIB:.0f} MiB" for v in workers_peak.values()))
    results = {
        "spec": spec, "inputs": args.inputs, "workers": args.workers,
        "partition_file": args.partition,
        "workers_peak_mib": [v / MIB for v in workers_peak.values()],
        **{f"{kind}_{name}": row[name] for kind, row in runs.items()
           for name in ("seconds", "peak_mib", "stats")},
    }  # fmt: skip
    if args.spec_only:
        start = time.perf_counter()
        expected = scipy_categories(args.neurons, args.layers, inputs, args.check_processes)
        equal = np.array_equal(runs["spec"]["categories"], expected)
        results.update(check_seconds=time.perf_counter() - start, categories_equal=equal)
        write_json(args.json, "placement-challenge", results)
        np.testing.assert_array_equal(runs["spec"]["categories"], expected)
        print(
            f"categories equal scipy's (float64, a layer at a time, "
            f"{results['check_seconds']:.0f} s in {args.check_processes} processes)"
        )
    else:
        np.testing.assert_array_equal(runs["list"]["categories"], runs["spec"]["categories"])
        print(
            f"list / spec: peak {runs['list']['peak_mib'] / runs['spec']['peak_mib']:.2f}x "
            "(same categories)"
        )
        write_json(args.json, "placement-challenge", results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--neurons", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=120)
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2, help="placements of each kind")
    parser.add_argument(
        "--challenge",
        action="store_true",
        help="measure run_challenge_model_parallel on a spec against a list",
    )
    parser.add_argument("--inputs", type=int, default=1000, help="images (--challenge)")
    parser.add_argument(
        "--spec-only", action="store_true", help="--challenge without the network loaded whole"
    )
    parser.add_argument(
        "--workers", type=int, default=2, help="single-threaded workers of the --challenge cluster"
    )
    parser.add_argument(
        "--partition",
        metavar="FILE",
        help="--challenge: a partition file of `dasknn partition --stream`",
    )
    parser.add_argument(
        "--check-processes", type=int, default=1, help="--spec-only: processes of the scipy check"
    )
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
    print(
        f"RadiX-Net {args.neurons} x {args.layers}, float32, {network / MIB:.0f} MiB as CSR; "
        f"{args.parts} parts on 2 workers; "
        f"PLACEMENT_BYTES {layout.PLACEMENT_BYTES / MIB:.0f} MiB"
    )
    runs: dict[str, list[dict]] = {"whole": [], "streamed": []}
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        for _ in range(args.repeats):
            for kind in runs:
                runs[kind].append(place(client, model, partition, kind == "whole", x))
    np.testing.assert_array_equal(runs["whole"][0]["out"], runs["streamed"][0]["out"])
    results = {
        "neurons": args.neurons,
        "layers": args.layers,
        "parts": args.parts,
        "network_mib": network / MIB,
    }
    for kind, rows in runs.items():
        names = ("seconds", "peak_mib", "kept_mib")
        best = {name: min(row[name] for row in rows) for name in names}
        results[kind] = best
        print(
            f"{kind:>9}: peak {best['peak_mib']:7.0f} MiB ({best['peak_mib'] * MIB / network:.2f}"
            f" x the network), kept {best['kept_mib']:5.0f} MiB, {best['seconds']:.2f} s"
        )
    whole, streamed = results["whole"], results["streamed"]
    results["peak_ratio"] = whole["peak_mib"] / streamed["peak_mib"]
    results["time_ratio"] = whole["seconds"] / streamed["seconds"]
    print(
        f"whole / streamed: peak {results['peak_ratio']:.2f}x, time {results['time_ratio']:.2f}x "
        "(same predictions)"
    )
    write_json(args.json, "placement", results)


if __name__ == "__main__":
    main()
