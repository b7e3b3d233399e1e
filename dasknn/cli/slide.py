"""``dasknn slide``: LSH-sampled training of an extreme-classification network across a Dask
cluster (D-SLIDE), one shard of the output layer and one block of the hidden layer a worker:
loss per epoch, held-out precision@1 and @5, the bytes measured between workers beside the
prediction (also as JSON); checkpoints, resume and the recovery of a lost worker with
``--checkpoint-dir`` / ``--resume``."""

from __future__ import annotations

import argparse
import json
import time
from contextlib import ExitStack
from pathlib import Path

from dasknn.cli.cluster_options import (
    add_distributed_arguments,
    check_distributed_options,
    open_cluster,
)
from dasknn.cli.training_options import (
    add_checkpoint_arguments,
    add_training_arguments,
    check_checkpoint_options,
    check_training_options,
    checkpoint_options,
    optimizer_from_args,
)
from dasknn.datasets import make_extreme_classification, read_xmc
from dasknn.runtime.cluster import scheduler_workers
from dasknn.sampled import SampledMLP
from dasknn.sampled_parallel import DistributedSampledMLP
from graph.atomic import write_text_atomically

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``dasknn slide``."""
    parser = subparsers.add_parser(
        "slide",
        help="LSH-sampled training of a large output layer sharded across workers (D-SLIDE)",
        description=(
            "Train a one-hidden-layer extreme-classification network whose output neurons are "
            "chosen per row by LSH tables (SLIDE), one shard of the output layer and one block "
            "of the hidden layer a Dask worker (D-SLIDE): on a generated problem with a known "
            "Bayes-optimal ceiling (default) or on a file of the Extreme Classification "
            "Repository (--xmc). The last --held-out rows are held out. Prints the loss per "
            "epoch, the held-out precision@1 and @5, and the bytes measured between workers "
            "beside the prediction."
        ),
    )
    data = parser.add_argument_group("data")
    data.add_argument("--xmc", type=Path, help="a file in the Extreme Classification format")
    data.add_argument("--samples", type=int, default=4000, help="generated rows (default 4000)")
    data.add_argument("--features", type=int, default=2000, help="generated features")
    data.add_argument("--labels", type=int, default=5000, help="generated labels")
    data.add_argument("--held-out", type=int, default=500, help="held-out rows (the last)")
    model = parser.add_argument_group("network")
    model.add_argument("--hidden", type=int, default=128, help="hidden neurons")
    model.add_argument(
        "--active-fraction", type=float, default=0.05, help="output neurons active a row"
    )
    model.add_argument("--hash-family", choices=("simhash", "dwta"), default="simhash")
    model.add_argument("--k", type=int, default=6, help="hash bits a table")
    model.add_argument("--tables", type=int, default=20, help="hash tables")
    add_training_arguments(parser, batch_size=256, lr=1e-3, optimizer="adam")
    add_checkpoint_arguments(
        parser,
        "one fit call trains every epoch (its learning rate decaying over all of them) and "
        "scores the held-out rows after the last; a lost worker's shard and hidden block are",
    )
    add_distributed_arguments(parser, 2, "a step may go without finishing")
    parser.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    """``ValueError`` for any bad option, before any work."""
    for name in ("samples", "features", "labels", "hidden", "k", "tables"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.held_out < 1:
        raise ValueError("--held-out must be at least 1")
    if not 0 < args.active_fraction <= 1:
        raise ValueError(f"--active-fraction must lie in (0, 1], got {args.active_fraction}")
    check_training_options(args)
    check_checkpoint_options(args)
    check_distributed_options(args)
    if args.xmc is not None and not args.xmc.is_file():
        raise FileNotFoundError(f"--xmc {args.xmc}: no such file")
    if args.xmc is None and args.held_out >= args.samples:
        raise ValueError(f"--held-out {args.held_out} leaves no training row of {args.samples}")


def _data(args: argparse.Namespace):
    if args.xmc is not None:
        X, Y = read_xmc(args.xmc)
        if args.held_out >= X.shape[0]:
            raise ValueError(f"--held-out {args.held_out} leaves no training row of {X.shape[0]}")
        return X, Y, None
    problem = make_extreme_classification(
        n_samples=args.samples, n_features=args.features, n_labels=args.labels, seed=args.seed
    )
    return problem.X, problem.Y, problem


def _epoch_line(dist, epoch: int, epochs: int, loss: float, X_held, Y_held, score: bool) -> dict:
    """Print the line of an epoch (with the held-out precision@1 and @5 if ``score``); returns
    its statistics."""
    line = {"epoch": epoch + 1, "loss": loss}
    text = f"epoch {epoch + 1}/{epochs}: loss {loss:.6g}"
    if score:
        line["held_out_precision_at_1"] = dist.precision_at_k(X_held, Y_held, k=1)
        line["held_out_precision_at_5"] = dist.precision_at_k(X_held, Y_held, k=5)
        text += (
            f", held-out P@1 {line['held_out_precision_at_1']:.4f}, "
            f"P@5 {line['held_out_precision_at_5']:.4f}"
        )
    print(text, flush=True)
    return line


def run(args: argparse.Namespace) -> int:
    """Check, make or read the data, train on the cluster and print the figures; return the
    exit code."""
    _check(args)
    X, Y, problem = _data(args)
    split = X.shape[0] - args.held_out
    X_train, Y_train, X_held, Y_held = X[:split], Y[:split], X[split:], Y[split:]
    print(
        f"data: {X.shape[0]:,} rows, {X.shape[1]:,} features, {Y.shape[1]:,} labels; "
        f"{split:,} for training, {args.held_out:,} held out"
    )
    epochs: list[dict] = []
    with ExitStack() as stack:
        client = open_cluster(stack, args)
        shards = len(scheduler_workers(client))
        model = SampledMLP(
            hidden=args.hidden, active_fraction=args.active_fraction,
            hash_family=args.hash_family, k=args.k, n_tables=args.tables, shards=shards,
            seed=args.seed,
        ).initialize(X.shape[1], Y.shape[1])  # fmt: skip
        dist = stack.enter_context(
            DistributedSampledMLP(model, client, step_timeout=args.step_timeout)
        )
        optimizer = optimizer_from_args(args)
        start = time.perf_counter()
        checkpoints = checkpoint_options(args)
        if any(value is not None for value in checkpoints.values()):
            dist.fit(
                X_train, Y_train, batch_size=args.batch_size, epochs=args.epochs,
                optimizer=optimizer, seed=args.seed, progress=args.progress, **checkpoints,
            )  # fmt: skip
            for epoch, loss in enumerate(dist.loss_curve_):
                last = epoch == len(dist.loss_curve_) - 1
                epochs.append(_epoch_line(dist, epoch, args.epochs, loss, X_held, Y_held, last))
        else:  # a fit call an epoch
            for epoch in range(args.epochs):
                dist.fit(
                    X_train, Y_train, batch_size=args.batch_size, epochs=1, optimizer=optimizer,
                    seed=args.seed, progress=args.progress,
                )  # fmt: skip
                loss = dist.loss_curve_[-1]
                epochs.append(_epoch_line(dist, epoch, args.epochs, loss, X_held, Y_held, True))
        seconds = time.perf_counter() - start
        steps = dist.n_steps_
        report = dist.comm_report()
        print(report.format())
        print(f"trained {steps} steps of {args.batch_size} on {shards} shards: "
              f"{seconds / max(steps, 1) * 1e3:.1f} ms/step")  # fmt: skip
        statistics = {
            "rows": X.shape[0],
            "features": X.shape[1],
            "labels": Y.shape[1],
            "shards": shards,
            "batch_size": args.batch_size,
            "epochs": epochs,
            "steps": steps,
            "seconds_per_step": seconds / steps if steps else None,
            "held_out_oracle_precision_at_1": (
                None if problem is None else float(problem.oracle_hits[split:].mean())
            ),
            "comm": json.loads(report.to_json()),
        }
    if args.json is not None:
        write_text_atomically(args.json, json.dumps(statistics, indent=2))
    return 0
