"""``dasknn partition``: partition a network for P = ... parts and print the paper's Table 1."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import graph
from dasknn.datasets import load_network
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
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Partition, print the table, write the requested files; return the exit code."""
    if args.layers is not None and args.layers < 1:
        raise ValueError(f"--layers must be at least 1, not {args.layers}")
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
