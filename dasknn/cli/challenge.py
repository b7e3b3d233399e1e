"""``dasknn challenge``: Graph Challenge inference, checked against a golden file."""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from pathlib import Path

from dasknn.challenge import run_challenge
from dasknn.challenge.engine import prepare_run, prepare_worker_run
from dasknn.challenge.model_parallel import prepare_model_parallel
from dasknn.cli.cluster_options import (
    add_cluster_arguments,
    add_step_timeout_argument,
    check_step_timeout_option,
    cluster_target,
)
from dasknn.cli.tls import add_tls_options, security_from_args
from dasknn.datasets import read_categories, write_categories
from dasknn.runtime.cluster import open_client
from graph.atomic import check_output_path, write_text_atomically

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``dasknn challenge``."""
    parser = subparsers.add_parser(
        "challenge",
        help="run Graph Challenge inference on a Dask cluster and report the rate",
        description=(
            "Run every input row through the network (Y = min(max(Y @ W + b on nonzeros, 0), 32) "
            "per layer), write the categories (1-based ids of the rows still nonzero), compare "
            "them with a golden file, and report time, rate (inputs x edges / seconds) and the "
            "peak memory per worker."
        ),
    )
    parser.add_argument("--network", required=True, help="challenge directory or radixnet:N:L")
    parser.add_argument("--neurons", type=int, help="width to read from a challenge directory")
    parser.add_argument("--layers", type=int, help="use only the first LAYERS layers")
    parser.add_argument("--bias", type=float, help="bias (default: the challenge's for N)")
    parser.add_argument(
        "--inputs",
        required=True,
        type=Path,
        help="challenge sparse-input .tsv[.gz] or MNIST IDX image file (side = sqrt(N))",
    )
    parser.add_argument("--categories", type=Path, help="write the categories to this file")
    parser.add_argument("--golden", type=Path, help="expected categories; prints PASSED/FAILED")
    cluster = parser.add_mutually_exclusive_group()
    parser.add_argument(
        "--workers",
        type=int,
        help="start a LocalCluster of W workers (--device cuda: W GPUs, one worker each); with "
        "--cluster, the batch jobs' workers to wait for",
    )
    add_cluster_arguments(parser, cluster)
    parser.add_argument("--threads", type=int, default=1, help="threads per local worker")
    parser.add_argument("--batch-size", type=int, help="input rows per batch")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="run on the workers' cores (numba) or GPUs (CUDA; one worker per GPU, needs the "
        "cuda extra; without --scheduler a dask-cuda LocalCUDACluster is started)",
    )
    parser.add_argument(
        "--compact-every",
        type=int,
        default=8,
        help="--device cuda: layers run before dead rows are dropped",
    )
    parser.add_argument(
        "--cuda-mode",
        choices=("auto", "fused", "sectioned", "tiled"),
        default="auto",
        help="--device cuda: one launch per window of layers (fused) or per layer (sectioned; "
        "tiled: per layer, footprint tiles in shared memory)",
    )
    parser.add_argument(
        "--load-on-workers",
        action="store_true",
        help="--device cuda: each GPU worker loads --network itself (a directory it reads at "
        "the same path, or radixnet:N:L), so the network does not pass through this process",
    )
    parser.add_argument(
        "--resident-layers",
        type=int,
        help="stream the weights in windows of this many layers (default: broadcast if it fits)",
    )
    parser.add_argument(
        "--weight-buffers",
        type=int,
        default=2,
        help="windows of layers resident per worker when streaming",
    )
    parser.add_argument(
        "--model-parallel",
        action="store_true",
        help="split every layer by neurons across the workers (H-SpFF) instead of data-parallel",
    )
    parser.add_argument(
        "--parts", type=int, help="parts per layer in model-parallel mode (default: one per worker)"
    )
    parser.add_argument(
        "--partition",
        choices=("hypergraph", "random", "block"),
        default="hypergraph",
        help="partition method in model-parallel mode",
    )
    parser.add_argument(
        "--partition-file",
        type=Path,
        help="in model-parallel mode, use this partition file (dasknn partition --out) of the "
        "network instead of partitioning it (its partition into --parts parts)",
    )
    add_step_timeout_argument(
        parser,
        "the run may go without a batch finishing (with --model-parallel: a block of predictions)",
    )
    parser.add_argument("--json", type=Path, help="write the statistics to this JSON file")
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no summary")
    add_tls_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the challenge; exit 0 (passed or no golden file), 1 (failed) or 2 (bad input)."""
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    check_step_timeout_option(args.step_timeout)
    if args.partition_file is not None and not args.model_parallel:
        raise ValueError("--partition-file is for --model-parallel runs")
    security = security_from_args(args)
    for output in (args.categories, args.json):
        if output is not None:
            check_output_path(output)
    if args.workers is not None and args.scheduler is not None:
        raise ValueError("--workers starts a local cluster or sizes --cluster, not --scheduler")
    target = cluster_target(args, args.workers)
    golden = read_categories(args.golden) if args.golden is not None else None
    if args.load_on_workers:
        if args.model_parallel:
            raise ValueError("--load-on-workers runs data-parallel on GPUs; drop --model-parallel")
        network = prepare_worker_run(
            args.network,
            args.inputs,
            args.bias,
            batch_size=args.batch_size,
            dtype=args.dtype,
            device=args.device,
            compact_every=args.compact_every,
            cuda_mode=args.cuda_mode,
        )
        inputs, bias = args.inputs, args.bias
    elif args.model_parallel:
        if args.device != "cpu":
            raise ValueError("--model-parallel runs on the CPU only; drop --device cuda")
        prepared = prepare_model_parallel(
            args.network,
            args.inputs,
            args.bias,
            nparts=args.parts,
            method=args.partition,
            neurons=args.neurons,
            layers=args.layers,
            batch_size=args.batch_size or 1000,
            dtype=args.dtype,
            partition=args.partition_file,
        )
    else:
        network, inputs, bias = prepare_run(
            args.network,
            args.inputs,
            args.bias,
            neurons=args.neurons,
            layers=args.layers,
            batch_size=args.batch_size,
            dtype=args.dtype,
            resident_layers=args.resident_layers,
            weight_buffers=args.weight_buffers,
            device=args.device,
            compact_every=args.compact_every,
            cuda_mode=args.cuda_mode,
        )
    with ExitStack() as stack:
        client = open_client(
            stack, target, args.workers, args.threads, args.device, security=security
        )
        if args.model_parallel:
            categories, stats = prepared.run(
                client, progress=not args.quiet, step_timeout=args.step_timeout
            )
        else:
            categories, stats = run_challenge(
                network,
                inputs,
                bias=bias,
                client=client,
                batch_size=args.batch_size,
                dtype=args.dtype,
                resident_layers=args.resident_layers,
                weight_buffers=args.weight_buffers,
                progress=not args.quiet,
                device=args.device,
                compact_every=args.compact_every,
                cuda_mode=args.cuda_mode,
                step_timeout=args.step_timeout,
                **_worker_load_options(args),
            )
    report = stats.as_dict()
    passed = None
    if golden is not None:
        passed = bool(golden.size == categories.size and (golden == categories).all())
        report["passed"] = passed
    if args.categories is not None:
        write_categories(args.categories, categories)
    if args.json is not None:
        write_text_atomically(args.json, json.dumps(report, indent=2))
    if not args.quiet:
        print(stats.summary())
    if passed is not None:
        if passed:
            print("CHALLENGE PASSED")
        else:
            missing = len(set(golden.tolist()) - set(categories.tolist()))
            extra = len(set(categories.tolist()) - set(golden.tolist()))
            print(
                f"CHALLENGE FAILED: {categories.size} categories, golden {golden.size} "
                f"({missing} missing, {extra} extra)",
                file=sys.stdout,
            )
        return 0 if passed else 1
    return 0


def _worker_load_options(args: argparse.Namespace) -> dict:
    """The options of :func:`run_challenge` for ``--load-on-workers`` (none without it: the network
    given to it is already loaded)."""
    if not args.load_on_workers:
        return {}
    return {"load_on_workers": True, "neurons": args.neurons, "layers": args.layers}
