"""``dasknn parallax``: train a next-word model on the standard library's text, its embedding on
sharded parameter servers and its dense layers all-reduced (Parallax's sparsity-aware data
parallelism), on a Dask cluster: loss per epoch, held-out perplexity and accuracy, the bytes
measured between workers beside the prediction (also as JSON)."""

from __future__ import annotations

import argparse
import json
import time
from contextlib import ExitStack

import numpy as np

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
from dasknn.data_parallel import ARCHITECTURES, DistributedEmbeddingMLP
from dasknn.datasets import load_stdlib_corpus
from dasknn.model import EmbeddingMLP
from graph.atomic import write_text_atomically

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``dasknn parallax``."""
    parser = subparsers.add_parser(
        "parallax",
        help="train a next-word embedding model data-parallel: embedding on parameter-server "
        "shards, dense layers all-reduced (Parallax)",
        description=(
            "Tokenize the standard library's docstrings (or code), hold out every tenth file, "
            "and train an embedding MLP that predicts the next word from CONTEXT words, "
            "data-parallel on Dask workers: the embedding's rows on sharded parameter servers "
            "(only the rows a batch touches move), the dense variables all-reduced "
            "(--architecture hybrid), or everything on parameter servers (ps) or all-reduced "
            "(ar). Prints the loss per epoch, the held-out perplexity and accuracy, and the "
            "bytes measured between workers beside the prediction."
        ),
    )
    parser.add_argument("--corpus", choices=("prose", "code"), default="prose")
    parser.add_argument("--context", type=int, default=3, help="words before the predicted one")
    parser.add_argument("--max-vocab", type=int, default=4096, help="most frequent words kept")
    parser.add_argument(
        "--packages",
        help="only these top-level standard-library modules or packages, comma-separated "
        "(default: all)",
    )
    parser.add_argument("--embed-dim", type=int, default=64)
    parser.add_argument("--hidden", default="128", help="hidden layer sizes, comma-separated")
    parser.add_argument("--architecture", choices=ARCHITECTURES, default="hybrid")
    parser.add_argument(
        "--sparse-partitions",
        default="auto",
        help="parameter-server shards of the embedding, or 'auto' to search for the count",
    )
    parser.add_argument("--messages", choices=("posted", "tasks"), default="posted")
    add_training_arguments(parser, batch_size=256, lr=0.5, optimizer="sgd")
    add_checkpoint_arguments(
        parser,
        "one fit call trains every epoch (batches drawn from --seed) and scores the held-out "
        "windows after the last; a lost worker's replica and shards are",
    )
    add_distributed_arguments(parser, 2, "a step may go without finishing")
    parser.set_defaults(func=run)


def _sizes(text: str, what: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",")) if text.strip() else ()
    except ValueError:
        sizes = (0,)
    if any(s < 1 for s in sizes):
        raise ValueError(f"--{what} must be comma-separated positive sizes, got {text!r}")
    return sizes


def _check(args: argparse.Namespace) -> tuple[tuple[int, ...], int | str]:
    """The hidden sizes and the shard count; ``ValueError`` for any bad option, before any
    work."""
    hidden = _sizes(args.hidden, "hidden")
    for name in ("context", "embed_dim"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_vocab < 2:
        raise ValueError("--max-vocab must be at least 2")
    check_training_options(args)
    check_checkpoint_options(args)
    check_distributed_options(args)
    shards: int | str = args.sparse_partitions
    if shards != "auto":
        try:
            shards = int(shards)
        except ValueError:
            raise ValueError(
                f"--sparse-partitions must be a count or 'auto', got {shards!r}"
            ) from None
        if shards < 1:
            raise ValueError("--sparse-partitions must be at least 1")
    return hidden, shards


def run(args: argparse.Namespace) -> int:
    """Check, load the corpus, train on the cluster and print the figures; return the exit
    code."""
    hidden, shards = _check(args)
    optimizer = optimizer_from_args(args)
    packages = tuple(p.strip() for p in args.packages.split(",")) if args.packages else None
    corpus = load_stdlib_corpus(args.corpus, args.context, args.max_vocab, packages)
    (X, y), (X_held, y_held) = corpus.split()
    if len(X) == 0 or len(X_held) == 0:
        raise ValueError("the corpus has no training or no held-out window: give more packages")
    model = EmbeddingMLP(
        len(corpus.vocabulary), args.context, embed_dim=args.embed_dim, hidden=hidden,
        seed=args.seed,
    )  # fmt: skip
    print(
        f"corpus: {corpus.n_tokens:,} tokens, {len(corpus.vocabulary):,} words; "
        f"{len(X):,} training and {len(X_held):,} held-out windows"
    )
    epochs: list[dict] = []
    with ExitStack() as stack:
        client = open_cluster(stack, args)
        dist = stack.enter_context(
            DistributedEmbeddingMLP(
                model,
                client,
                architecture=args.architecture,
                sparse_partitions=shards,
                messages=args.messages,
                step_timeout=args.step_timeout,
            )
        )
        start = time.perf_counter()
        checkpoints = checkpoint_options(args)
        if any(value is not None for value in checkpoints.values()):
            dist.fit(
                X, y, batch_size=args.batch_size, epochs=args.epochs, optimizer=optimizer,
                seed=args.seed, progress=args.progress, **checkpoints,
            )  # fmt: skip
            for epoch, loss in enumerate(dist.loss_curve_):
                last = epoch == len(dist.loss_curve_) - 1
                epochs.append(_epoch_line(dist, epoch, args.epochs, loss, X_held, y_held, last))
        else:  # a fit call an epoch, its batches drawn from --seed + epoch
            for epoch in range(args.epochs):
                dist.fit(
                    X, y, batch_size=args.batch_size, epochs=1, optimizer=optimizer,
                    seed=args.seed + epoch, progress=args.progress,
                )  # fmt: skip
                loss = dist.loss_curve_[-1]
                epochs.append(_epoch_line(dist, epoch, args.epochs, loss, X_held, y_held, True))
        seconds = time.perf_counter() - start
        steps = dist.n_steps_
        report = dist.comm_report()
        print(report.format())
        per_step = seconds / max(steps, 1) * 1e3
        print(f"trained {steps} steps of {args.batch_size}: {per_step:.1f} ms/step")
        statistics = {
            "vocabulary": len(corpus.vocabulary),
            "windows": {"training": len(X), "held_out": len(X_held)},
            "architecture": args.architecture,
            "sparse_partitions": shards,
            "workers": len(dist.workers),
            "batch_size": args.batch_size,
            "epochs": epochs,
            "steps": steps,
            "seconds_per_step": seconds / steps if steps else None,
            "comm": json.loads(report.to_json()),
        }
    if args.json is not None:
        write_text_atomically(args.json, json.dumps(statistics, indent=2, default=_plain))
    return 0


def _epoch_line(dist, epoch: int, total: int, loss: float, X_held, y_held, scored: bool) -> dict:
    """Print and return an epoch's line: its loss and, when ``scored``, the held-out perplexity
    and accuracy."""
    line = {"epoch": epoch + 1, "loss": loss}
    text = f"epoch {epoch + 1}/{total}: loss {loss:.6g}"
    if scored:
        line["held_out_perplexity"] = dist.perplexity(X_held, y_held)
        line["held_out_accuracy"] = dist.score(X_held, y_held)
        text += (
            f", held-out perplexity {line['held_out_perplexity']:.2f}, accuracy "
            f"{line['held_out_accuracy']:.4f}"
        )
    print(text, flush=True)
    return line


def _plain(value):
    """JSON for numpy scalars."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")
