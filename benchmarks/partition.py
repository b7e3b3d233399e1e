"""Benchmark of the multi-phase hypergraph partitioner: hypergraph against random and the floor.

Prints, per P, the Table-1 figures of ``dasknn partition`` (hypergraph H vs balanced random R) with
the volume floor beside each ratio and the paper's (PaToH) ratio and seconds, then, on request:

* the straightforward loop (one Mt-KaHyPar call per layer, default preset, hypergraph built from
  Python lists with one fixed vertex per net, no merging), run in the same process as the baseline
  of the speed-up (``--loop``);
* KaHyPar against Mt-KaHyPar, with and without the exact assignment phases (``--compare``);
* the volume removed by two-sided refinement over the single sweep (``--refine``);
* the same table for the generated RadiX-Net 4096 x 120 (``--radixnet4096``);
* the seconds of generating RadiX-Net networks and reading the official network (``--generation``);
* only the streamed partition of a generated RadiX-Net N x L at one P, layer by layer, with its
  time, peak memory (RSS high-water mark) and H/R (``--stream N L P``, nothing else is run).

Run from the repository root, under the shared lock::

    python benchmarks/partition.py --loop --compare --refine \
        --radixnet4096
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import add_json_option, describe, write_json  # noqa: E402

import graph  # noqa: E402
from dasknn.datasets import radixnet, read_challenge_network  # noqa: E402

OFFICIAL = Path(__file__).resolve().parents[2] / "shared/data/graphchallenge/neuron1024"
PARTS = (32, 64, 128, 256, 512)
PAPER_RATIO_1024 = dict(zip(PARTS, (0.34, 0.31, 0.29, 0.39, 0.62), strict=True))
PAPER_SECONDS_1024 = dict(zip(PARTS, (2.48, 3.41, 3.89, 4.97, 5.63), strict=True))
PAPER_RATIO_4096 = dict(zip(PARTS, (0.22, 0.23, 0.23, 0.20, 0.25), strict=True))


def straightforward_loop(layers, nparts: int, epsilon: float = 0.01, seed: int = 0):
    """The naive baseline: one Mt-KaHyPar call per layer on a Python-list hypergraph.

    One vertex per neuron, one fixed vertex per part (weight 1: Mt-KaHyPar rejects 0) in every
    input net, default preset, a fresh context per layer, no merging. Inputs of layer 1 follow the
    first phase as in the library.
    """
    import mtkahypar

    from graph.backends import _mtkahypar_initializer
    from graph.multiphase import assign_input_owners

    initializer = _mtkahypar_initializer()
    mtkahypar.set_seed(seed)
    parts = []
    previous = None
    for layer in layers:
        context = initializer.context_from_preset(mtkahypar.PresetType.DEFAULT)
        context.set_partitioning_parameters(nparts, epsilon, mtkahypar.Objective.KM1)
        context.logging = False
        n_in, n_out = layer.shape
        csr = layer.tocsr()
        nets, weights = [], []
        node_weights = np.diff(layer.tocsc().indptr).tolist()
        fixed = [-1] * n_out
        if previous is not None:
            node_weights += [1] * nparts
            fixed += list(range(nparts))
        for i in range(n_in):
            pins = csr.indices[csr.indptr[i] : csr.indptr[i + 1]].tolist()
            if not pins:
                continue
            if previous is not None:
                pins.append(n_out + int(previous[i]))
            nets.append(pins)
            weights.append(2)
        hypergraph = initializer.create_hypergraph(
            context, len(node_weights), len(nets), nets, node_weights, weights
        )
        if previous is not None:
            hypergraph.add_fixed_vertices(fixed, nparts)
        result = np.array(hypergraph.partition(context).get_partition()[:n_out])
        if previous is None:
            parts.append(assign_input_owners(layer, result, nparts))
        parts.append(result)
        previous = result
    return parts


def timed(function, *args, **kwargs):
    start = time.perf_counter()
    value = function(*args, **kwargs)
    return value, time.perf_counter() - start


def main_table(layers, parts, args, paper_ratio=None, paper_seconds=None):
    print(f"\n### Table 1 form, {args.name}: H = hypergraph (default settings), R = random\n")
    rows = []
    extra = []
    for nparts in parts:
        hyper = graph.partition_network(layers, nparts, seed=args.seed)
        rand = graph.partition_network(layers, nparts, method="random", seed=args.seed)
        row = graph.PartitionRow(
            nparts, hyper.metrics(), rand.metrics(), graph.volume_floor(layers, nparts),
            hyper.seconds,
        )
        rows.append(row)
        extra.append((row, hyper))
    print(graph.format_table(rows))
    write_json(args.json, "partition.py", [
        {"network": args.name, "parts": row.nparts, "h_over_r_avg_volume": row.ratio("avg_volume"),
         "floor_over_r": row.floor_ratio, "seconds": row.seconds}
        for row in rows
    ])
    print("\n| P | H/R avg vol | floor/R | H/floor | paper H/R | time H (s) | paper time (s) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for row, _ in extra:
        paper = paper_ratio.get(row.nparts, float("nan")) if paper_ratio else float("nan")
        paper_t = paper_seconds.get(row.nparts, float("nan")) if paper_seconds else float("nan")
        over_floor = (
            row.method.avg_volume / row.floor_avg_volume if row.floor_volume else float("inf")
        )
        print(
            f"| {row.nparts} | {row.ratio('avg_volume'):.3f} | {row.floor_ratio:.3f} "
            f"| {over_floor:.3f} | {paper:.2f} | {row.seconds:.2f} | {paper_t:.2f} |"
        )
    return rows


def _random_avg_volume(layers, nparts, seed):
    return graph.partition_network(layers, nparts, method="random", seed=seed).metrics().avg_volume


def loop_table(layers, parts, args):
    sub = layers[: args.loop_layers]
    print(
        f"\n### Straightforward Mt-KaHyPar loop vs dasknn default, {args.name}, "
        f"first {len(sub)} layers\n"
    )
    print("| P | loop H/R | loop time (s) | dasknn H/R | dasknn time (s) | speed-up |")
    print("|---:|---:|---:|---:|---:|---:|")
    for nparts in parts:
        base = _random_avg_volume(sub, nparts, args.seed)
        loop, seconds = timed(straightforward_loop, sub, nparts, seed=args.seed)
        ours = graph.partition_network(sub, nparts, seed=args.seed)
        loop_volume = graph.partition_metrics(sub, loop, nparts).avg_volume
        print(
            f"| {nparts} | {loop_volume / base:.3f} | {seconds:.2f} "
            f"| {ours.metrics().avg_volume / base:.3f} | {ours.seconds:.2f} "
            f"| {seconds / ours.seconds:.1f} |",
            flush=True,
        )


def compare_table(layers, parts, args):
    sub = layers[: args.compare_layers]
    print(
        f"\n### KaHyPar vs Mt-KaHyPar vs swaps, {args.name}, first {len(sub)} layers "
        "(H/R average volume | seconds)\n"
    )
    configs = [
        ("kahypar", True), ("mtkahypar", True), ("kahypar", False), ("mtkahypar", False),
        ("swap", False),
    ]
    head = " | ".join(f"{b}{'' if exact else ' no-assign'} H/R | s" for b, exact in configs)
    print(f"| P | {head} |")
    print("|---:|" + "---:|---:|" * len(configs))
    for nparts in parts:
        base = _random_avg_volume(sub, nparts, args.seed)
        cells = []
        for backend, exact in configs:
            result = graph.partition_network(
                sub, nparts, backend=backend, seed=args.seed, exact_assignment=exact
            )
            cells.append(f"{result.metrics().avg_volume / base:.3f} | {result.seconds:.2f}")
        print(f"| {nparts} | " + " | ".join(cells) + " |", flush=True)


def refine_table(layers, rows, args):
    print(f"\n### Two-sided refinement over the single sweep, {args.name}\n")
    print("| P | sweep volume | refined volume | removed | removed % | sweeps | time (s) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        result = graph.partition_network(layers, row.nparts, seed=args.seed, refine=True)
        gains = result.info["refinement_gains"]
        refined = result.metrics().total_volume
        before = refined + sum(gains)
        print(
            f"| {row.nparts} | {before} | {refined} | {sum(gains)} "
            f"| {100 * sum(gains) / max(before, 1):.2f} | {len(gains)} | {result.seconds:.2f} |",
            flush=True,
        )


def generation_times() -> None:
    """Seconds of generating RadiX-Net networks and of reading the official one."""
    print("\n### Generating and reading networks\n")
    cases = [(f"radixnet({n}, {d})", lambda n=n, d=d: radixnet(n, d))
             for n, d in ((1024, 120), (4096, 120), (16384, 120), (1024, 1920))]
    if OFFICIAL.exists():
        cases.append(("read official 1024 x 120 (.tsv.gz)",
                      lambda: read_challenge_network(OFFICIAL)))
    for label, make in cases:
        start = time.perf_counter()
        layers = make()
        seconds = time.perf_counter() - start
        edges = sum(w.nnz for w in layers)
        print(f"{label:<36} {seconds:8.2f} s  {edges / 1e6:8.1f} M edges", flush=True)


def stream_run(neurons: int, depth: int, nparts: int, args) -> None:
    """Streamed partition of RadiX-Net ``neurons x depth`` at ``nparts``: time, peak RSS, H/R."""
    import resource
    import tempfile

    from dasknn.datasets import iter_radixnet

    totals = {"volume": 0, "random_volume": 0, "floor": 0, "messages": 0, "random_messages": 0}
    start = time.perf_counter()
    imbalance = [1.0]

    def report(row) -> None:
        for key in totals:
            totals[key] += getattr(row, key)
        imbalance[0] = max(imbalance[0], row.imbalance)
        if row.layer % args.stream_every == 0 or row.layer == depth:
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            print(
                f"layer {row.layer:5d}  {time.perf_counter() - start:9.1f} s  "
                f"phase {row.seconds:6.2f} s  H/R so far "
                f"{totals['volume'] / totals['random_volume']:.4f}  peak RSS {rss:.2f} GiB",
                flush=True,
            )

    with tempfile.TemporaryDirectory() as folder:
        graph.partition_stream(
            iter_radixnet(neurons, depth, seed=args.seed), nparts,
            parts_out=Path(folder) / "parts.npz", seed=args.seed, report=report,
            backend=args.stream_backend,
        )
        stored = (Path(folder) / "parts.npz").stat().st_size
    seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    ratio = totals["volume"] / totals["random_volume"]
    floor = totals["floor"] / totals["random_volume"]
    messages = totals["messages"] / totals["random_messages"]
    print(
        f"\n| network | P | seconds | s/layer | peak RSS (GiB) | H/R volume | floor/R "
        f"| H/R messages | max imbalance | parts file (MB) |\n"
        f"|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        f"| RadiX-Net {neurons} x {depth} ({args.stream_backend}) | {nparts} | {seconds:.0f} "
        f"| {seconds / depth:.2f} "
        f"| {rss:.2f} | {ratio:.4f} | {floor:.4f} | {messages:.4f} | {imbalance[0]:.4f} "
        f"| {stored / 1e6:.1f} |"
    )
    write_json(args.json, "partition.py", [
        {"network": f"radixnet:{neurons}:{depth}", "parts": nparts, "seconds": seconds,
         "peak_rss_gib": rss, "h_over_r_volume": ratio, "floor_over_r": floor,
         "h_over_r_messages": messages}
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", type=Path, default=OFFICIAL)
    parser.add_argument("--parts", type=int, nargs="+", default=list(PARTS))
    parser.add_argument("--layers", type=int, help="only the first LAYERS layers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--loop", action="store_true", help="run the straightforward loop")
    parser.add_argument("--loop-layers", type=int, default=24, help="layers for --loop")
    parser.add_argument("--compare", action="store_true", help="kahypar vs mtkahypar vs swap")
    parser.add_argument("--compare-layers", type=int, default=24, help="layers for --compare")
    parser.add_argument("--refine", action="store_true", help="two-sided refinement gain")
    parser.add_argument("--radixnet4096", action="store_true", help="also RadiX-Net 4096 x 120")
    parser.add_argument("--generation", action="store_true",
                        help="also time generating RadiX-Net networks and reading the official one")
    parser.add_argument("--stream", type=int, nargs=3, metavar=("N", "L", "P"),
                        help="only the streamed partition of RadiX-Net N x L at P parts")
    parser.add_argument("--stream-backend", default=graph.DEFAULT_BACKEND, choices=graph.BACKENDS,
                        help="phase solver of --stream (default: %(default)s)")
    parser.add_argument("--stream-every", type=int, default=10,
                        help="print progress every this many layers (--stream)")
    add_json_option(parser)
    args = parser.parse_args()
    print(f"machine: {describe()}")
    if args.stream:
        stream_run(*args.stream, args)
        print(f"\nmachine at the end: {describe()}")
        return
    layers = read_challenge_network(args.network, layers=args.layers)
    args.name = f"official {layers[0].shape[0]} x {len(layers)}"
    rows = main_table(layers, args.parts, args, PAPER_RATIO_1024, PAPER_SECONDS_1024)
    if args.loop:
        loop_table(layers, args.parts, args)
    if args.compare:
        compare_table(layers, args.parts, args)
    if args.refine:
        refine_table(layers, rows, args)
    if args.radixnet4096:
        layers = radixnet(4096, args.layers or 120, seed=0)
        args.name = f"RadiX-Net 4096 x {len(layers)}"
        rows = main_table(layers, args.parts, args, PAPER_RATIO_4096)
        if args.refine:
            refine_table(layers, rows, args)
    if args.generation:
        generation_times()
    print(f"\nmachine at the end: {describe()}")


if __name__ == "__main__":
    main()
