"""``dasknn partition``: partition a network for P = ... parts and print the paper's Table 1."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import graph
from dasknn.datasets import iter_network, load_network, parse_radixnet_spec
from graph.atomic import check_output_path, write_text_atomically
from graph.report import PartitionRow, format_table

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``dasknn partition``."""
    parser = subparsers.add_parser(
        "partition",
        help="partition a network with the multi-phase hypergraph model and report the volume",
        description=(
            "Partition every layer of NETWORK (a directory of Graph Challenge files or "
            "radixnet:N:L) for each part count and print, per P, the communication volume and "
            "messages of METHOD against BASELINE (the form of Table 1 of Demirci & "
            "Ferhatosmanoglu, ICS'21), with the volume floor beside it."
        ),
    )
    parser.add_argument("network", help="challenge directory or radixnet:N:L[:SEED]")
    parser.add_argument("--parts", type=int, nargs="+", default=[32, 64, 128, 256, 512])
    parser.add_argument("--method", default="hypergraph", choices=graph.METHODS)
    parser.add_argument("--baseline", default="random", choices=graph.METHODS)
    parser.add_argument("--backend", default=graph.DEFAULT_BACKEND, choices=graph.BACKENDS)
    parser.add_argument("--epsilon", type=float, default=0.01, help="allowed imbalance")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--refine", action="store_true", help="add two-sided refinement sweeps (slower)"
    )
    parser.add_argument("--neurons", type=int, help="width to read from a challenge directory")
    parser.add_argument("--layers", type=int, help="use only the first LAYERS layers")
    parser.add_argument("--out", type=Path, help="save the METHOD partitions to this .npz file")
    parser.add_argument("--report", type=Path, help="save the table to this markdown file")
    parser.add_argument("--json", type=Path, help="save the figures of every P to this JSON file")
    parser.add_argument(
        "--stream",
        action="store_true",
        help=(
            "partition one layer at a time, keeping only the previous parts (taken without asking "
            "for generated networks of more than STREAM_NONZEROS nonzeros); one P, the hypergraph "
            "method, --out required; the per-layer report is printed and written to --json as "
            "each layer is done"
        ),
    )
    parser.set_defaults(func=run)


STREAM_NONZEROS = 2**31


def _streams(args: argparse.Namespace) -> bool:
    if args.stream:
        return True
    if str(args.network).startswith("radixnet:"):
        neurons, depth, _ = parse_radixnet_spec(str(args.network))
        depth = depth if args.layers is None else min(depth, args.layers)
        return 32 * neurons * depth > STREAM_NONZEROS
    return False


def run_stream(args: argparse.Namespace) -> int:
    """Partition layer by layer; print and save each layer's figures as soon as it is done."""
    if len(args.parts) != 1:
        raise ValueError("a streamed partition takes one --parts value")
    if args.method != "hypergraph" or args.refine:
        raise ValueError("a streamed partition uses the hypergraph method without --refine")
    if args.out is None:
        raise ValueError("a streamed partition needs --out for its parts")
    for target in (args.out, args.report, args.json):
        if target is not None:
            check_output_path(target)
    nparts = args.parts[0]
    rows: list[dict] = []
    totals = {"volume": 0, "random_volume": 0, "floor": 0}
    print("| layer | volume | messages | R volume | R messages | floor | H/R | imbalance | s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)

    def report(row: graph.PhaseReport) -> None:
        for key in totals:
            totals[key] += getattr(row, key)
        rows.append(asdict(row) | {"ratio": row.ratio})
        print(
            f"| {row.layer} | {row.volume} | {row.messages} | {row.random_volume} "
            f"| {row.random_messages} | {row.floor} | {row.ratio:.3f} | {row.imbalance:.4f} "
            f"| {row.seconds:.2f} |",
            flush=True,
        )
        if args.json is not None:
            write_text_atomically(args.json, json.dumps(_stream_report(args, rows, totals)))

    layers = iter_network(args.network, neurons=args.neurons, layers=args.layers, seed=args.seed)
    graph.partition_stream(
        layers,
        nparts,
        parts_out=args.out,
        epsilon=args.epsilon,
        backend=args.backend,
        seed=args.seed,
        report=report,
    )
    summary = (
        f"{args.network}: {len(rows)} layers, P = {nparts}: H/R "
        f"{totals['volume'] / max(totals['random_volume'], 1):.3f}, floor/R "
        f"{totals['floor'] / max(totals['random_volume'], 1):.3f}"
    )
    print(summary)
    if args.report is not None:
        write_text_atomically(args.report, summary + "\n")
    return 0


def _stream_report(args: argparse.Namespace, rows: list[dict], totals: dict) -> dict:
    return {
        "network": args.network,
        "nparts": args.parts[0],
        "backend": args.backend,
        "epsilon": args.epsilon,
        "layers_done": len(rows),
        "totals": totals,
        "layers": rows,
    }


def run(args: argparse.Namespace) -> int:
    """Partition, print the table, write the requested files; return the exit code."""
    if args.layers is not None and args.layers < 1:
        raise ValueError(f"--layers must be at least 1, not {args.layers}")
    if _streams(args):
        return run_stream(args)
    for target in (args.out, args.report, args.json):
        if target is not None:
            check_output_path(target)
    layers = load_network(args.network, neurons=args.neurons, layers=args.layers)
    graph.check_network(layers)
    smallest = min([layers[0].shape[0]] + [layer.shape[1] for layer in layers])
    for nparts in args.parts:
        if not 1 <= nparts <= smallest:
            raise ValueError(
                f"--parts {nparts} is impossible: need 1 <= P <= {smallest} (neurons per layer)"
            )
    rows = []
    partitions = {}
    for nparts in args.parts:
        method = graph.partition_network(
            layers, nparts, args.method, args.epsilon, args.backend, args.seed, refine=args.refine
        )
        baseline = graph.partition_network(
            layers, nparts, args.baseline, args.epsilon, args.backend, args.seed
        )
        rows.append(
            PartitionRow(
                nparts,
                method.metrics(),
                baseline.metrics(),
                graph.volume_floor(layers, nparts),
                method.seconds,
            )
        )
        partitions[nparts] = method
    title = (
        f"{args.network}: {len(layers)} layers, {args.method} (H) vs {args.baseline} (R), "
        f"backend {args.backend}, epsilon {args.epsilon}{', refined' if args.refine else ''}"
    )
    table = format_table(rows, title)
    print(table)
    if args.out is not None:
        graph.save_partitions(args.out, partitions)
    if args.report is not None:
        write_text_atomically(args.report, table + "\n")
    if args.json is not None:
        write_text_atomically(args.json, json.dumps(_report(args, len(layers), rows), indent=2))
    return 0


def _metrics(metrics: graph.PartitionMetrics) -> dict:
    return metrics.summary() | {
        "layer_volume": metrics.layer_volume.tolist(),
        "send_volume": metrics.send_volume.tolist(),
    }


def _report(args: argparse.Namespace, n_layers: int, rows: list[PartitionRow]) -> dict:
    """The table's figures (and the volume per layer and per part) as a JSON-ready dict."""
    return {
        "network": args.network,
        "layers": n_layers,
        "method": args.method,
        "baseline": args.baseline,
        "backend": args.backend,
        "epsilon": args.epsilon,
        "refine": args.refine,
        "parts": [
            {
                "nparts": row.nparts,
                "seconds": row.seconds,
                "floor_volume": row.floor_volume,
                "floor_avg_volume": row.floor_avg_volume,
                "avg_volume_ratio": row.ratio("avg_volume"),
                "floor_ratio": row.floor_ratio,
                "method_metrics": _metrics(row.method),
                "baseline_metrics": _metrics(row.baseline),
            }
            for row in rows
        ],
    }
