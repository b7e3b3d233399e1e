"""``dasknn train``: model-parallel SGD on a Dask cluster, timed, with the measured volume."""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from pathlib import Path

import numpy as np

import graph
from dasknn.cli.cluster_options import add_cluster_arguments, cluster_target
from dasknn.datasets import (
    load_mnist_test,
    load_network,
    mnist_to_challenge_inputs,
    parse_radixnet_spec,
)
from dasknn.model import SparseMLP
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
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="local worker processes (with --cluster: the batch jobs' workers to wait for)",
    )
    add_cluster_arguments(parser, parser.add_mutually_exclusive_group())
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
    parser.add_argument("--save", type=Path, help="write the trained model to this .npz file")
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
    if args.save is not None:
        check_output_path(args.save)


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
                neurons,
                depth,
                seed=args.seed,
                activation=args.activation,
                loss=loss,
                dtype=args.dtype,
                n_inputs=1024,
                n_outputs=10,
                scale="he",
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
    target = cluster_target(args, args.workers)
    model, x, y = _model_and_data(args)
    print(f"network {args.network}: {model}")
    partition = graph.partition_network(model.weights, args.parts, args.partition, seed=args.seed)
    print(f"partition: {args.partition}, P={args.parts} ({partition.seconds:.2f} s)")
    with ExitStack() as stack:
        client = open_client(stack, target, args.workers)
        dist = DistributedSparseMLP(model, client, partition, reuse_memory=args.reuse_memory)
        print(f"placed {dist.nparts} parts on {len(set(dist.part_workers))} workers")
        times = time_training(dist, x, y, args.batch_size, args.epochs, args.lr)
        print(f"trained {times.batches} batches of {args.batch_size}: {times.format()}")
        print(times.comm.format())
        if args.save is not None:
            dist.gather().save(args.save)
            print(f"saved the trained model to {args.save}")
        dist.close()
    return 0
