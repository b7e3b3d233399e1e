"""``dasknn train``: model-parallel SGD on a Dask cluster, timed, with the measured volume."""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from pathlib import Path

import numpy as np

import graph
from dasknn.datasets import (
    load_mnist_test,
    load_network,
    mnist_to_challenge_inputs,
    parse_radixnet_spec,
)
from dasknn.model import SparseMLP
from dasknn.model.checkpoint import latest_checkpoint
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.model_parallel.timing import time_training
from dasknn.runtime.cluster import open_client
from graph.atomic import check_output_path

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``dasknn train``."""
    parser = subparsers.add_parser(
        "train",
        help="train a sparse network model-parallel on Dask workers and report time and volume",
        description=(
            "Split every layer of NETWORK by neurons into PARTS parts (hypergraph, random or "
            "block partition), place part m on worker m %% W, and train by minibatch SGD. Prints "
            "the time per batch with its breakdown (local products, update, packing, "
            "communication and scheduling wait) and the communication volume measured by the "
            "scheduler plugin against the partition's prediction."
        ),
    )
    parser.add_argument("network", help="challenge directory or radixnet:N:L[:SEED]")
    parser.add_argument(
        "--data",
        choices=("random", "mnist"),
        default="random",
        help="random: uniform inputs and targets; mnist: the bundled MNIST test set "
        "(32x32 binarised inputs, a 10-class softmax head is added)",
    )
    parser.add_argument("--samples", type=int, default=1024, help="training samples to use")
    parser.add_argument("--partition", choices=graph.METHODS, default="hypergraph")
    parser.add_argument("--parts", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="local worker processes")
    parser.add_argument("--scheduler", help="address of an existing Dask scheduler")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, help="train STEPS batches (overrides --samples)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument(
        "--activation", default="sigmoid", choices=("sigmoid", "relu", "clipped_relu", "identity")
    )
    parser.add_argument("--loss", choices=("mse", "softmax_cross_entropy"))
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--save",
        type=Path,
        help="write the trained model (with its optimizer state and partition) to this .npz file",
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        help="write a checkpoint here every --checkpoint-every batches; a lost worker's parts are "
        "restored from the last one and training goes on",
    )
    parser.add_argument(
        "--checkpoint-every", type=int, help="batches between checkpoints (default: one epoch)"
    )
    parser.add_argument(
        "--resume",
        type=Path,
        help="continue from this checkpoint (or the newest in this directory), written by a run "
        "with the same network, data and options (--epochs may be larger)",
    )
    parser.add_argument(
        "--step-timeout",
        type=float,
        default=300.0,
        help="seconds a step may go without finishing before the run stops, naming the workers "
        "it waits for (default 300)",
    )
    parser.add_argument(
        "--reuse-memory",
        action="store_true",
        help="tune the workers' malloc to reuse freed step buffers (faster; a process-wide "
        "setting, for a cluster of your own)",
    )
    parser.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    for name in ("parts", "workers", "batch_size", "samples", "epochs"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.steps is not None and args.steps < 1:
        raise ValueError("--steps must be at least 1")
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        raise ValueError("--checkpoint-every must be at least 1")
    if not args.step_timeout > 0:
        raise ValueError("--step-timeout must be a number of seconds > 0")
    if args.save is not None:
        check_output_path(args.save)
    if args.checkpoint_dir is not None:
        if args.checkpoint_dir.exists() and not args.checkpoint_dir.is_dir():
            raise NotADirectoryError(f"--checkpoint-dir {str(args.checkpoint_dir)!r} is a file")
        if not args.checkpoint_dir.absolute().parent.is_dir():
            raise FileNotFoundError(
                f"the parent of --checkpoint-dir {args.checkpoint_dir} is missing"
            )
    if args.resume is not None and not args.resume.exists():
        raise FileNotFoundError(f"--resume {str(args.resume)!r} does not exist")


def _model_and_data(args: argparse.Namespace) -> tuple[SparseMLP, np.ndarray, np.ndarray]:
    samples = args.steps * args.batch_size if args.steps else args.samples
    rng = np.random.default_rng(args.seed)
    if args.data == "mnist":
        loss = args.loss or "softmax_cross_entropy"
        images, labels = load_mnist_test()
        if samples > len(images):
            raise ValueError(f"MNIST has {len(images)} samples, asked for {samples}")
        x = mnist_to_challenge_inputs(images[:samples], side=32).toarray()
        if loss == "softmax_cross_entropy":
            y = labels[:samples].astype(np.int64)
        else:
            y = np.eye(10)[labels[:samples]]
        if args.network.startswith("radixnet:"):
            neurons, depth, _ = parse_radixnet_spec(args.network)
            model = SparseMLP.radixnet(
                neurons, depth, seed=args.seed, activation=args.activation, loss=loss,
                dtype=args.dtype, n_inputs=1024, n_outputs=10, scale="he",
            )
            return model, x, y
        raise ValueError("--data mnist needs a radixnet:N:L network (a 1024-input, 10-class model)")
    loss = args.loss or "mse"
    if args.network.startswith("radixnet:"):
        neurons, depth, _ = parse_radixnet_spec(args.network)
        model = SparseMLP.radixnet(
            neurons, depth, seed=args.seed, activation=args.activation, loss=loss, dtype=args.dtype
        )
    else:
        weights = load_network(args.network, dtype=args.dtype)
        model = SparseMLP(weights, activation=args.activation, loss=loss, dtype=args.dtype)
    x = rng.uniform(0, 1, size=(samples, model.n_inputs))
    if loss == "mse":
        y = rng.uniform(0, 1, size=(samples, model.n_outputs))
    else:
        y = rng.integers(0, model.n_outputs, size=samples)
    return model, x, y


def run(args: argparse.Namespace) -> int:
    """Build, partition, place and train; print the figures; return the exit code."""
    _check(args)
    model, x, y = _model_and_data(args)
    print(f"network {args.network}: {model}")
    partition = _checkpoint_partition(args)
    if partition is None:
        partition = graph.partition_network(
            model.weights, args.parts, args.partition, seed=args.seed
        )
        print(f"partition: {args.partition}, P={args.parts} ({partition.seconds:.2f} s)")
    else:
        print(f"partition: that of the checkpoint {args.resume}, P={args.parts}")
    fit_options = {
        "seed": args.seed,
        "checkpoint": args.checkpoint_dir,
        "checkpoint_every": args.checkpoint_every,
        "resume": args.resume,
    }
    # A warm-up step (compiling the kernels before timing) would be a step of its own: not in a
    # run that must match the checkpointed one.
    warmup = args.checkpoint_dir is None and args.resume is None
    with ExitStack() as stack:
        client = open_client(stack, args.scheduler, args.workers)
        dist = DistributedSparseMLP(
            model, client, partition, reuse_memory=args.reuse_memory, step_timeout=args.step_timeout
        )
        stack.callback(dist.close)
        print(f"placed {dist.nparts} parts on {len(set(dist.part_workers))} workers")
        times = time_training(
            dist, x, y, args.batch_size, args.epochs, args.lr, warmup=warmup, **fit_options
        )
        print(f"trained {times.batches} batches of {args.batch_size}: {times.format()}")
        print(times.comm.format())
        if args.save is not None:
            dist.save(args.save)
            print(f"saved the trained model to {args.save}")
    return 0


def _checkpoint_partition(args: argparse.Namespace) -> list[np.ndarray] | None:
    """The partition stored in the ``--resume`` checkpoint, if it has one of ``--parts`` parts
    (so a resumed run places the neurons as the interrupted one did)."""
    if args.resume is None:
        return None
    _, record, _ = latest_checkpoint(args.resume)
    if record.partition is None or record.nparts != args.parts:
        return None
    return record.partition
