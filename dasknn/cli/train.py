"""``dasknn train``: model-parallel SGD on a Dask cluster: the loss per epoch and held-out
accuracy, the time per batch and the measured volume (also as JSON)."""

from __future__ import annotations

import argparse
import json
from contextlib import ExitStack
from pathlib import Path

import numpy as np

import graph
from dasknn.cli.cluster_options import (
    add_cluster_arguments,
    add_step_timeout_argument,
    check_step_timeout_option,
    cluster_target,
)
from dasknn.cli.held_out import read_validation_file, split_validation
from dasknn.cli.tls import add_tls_options, security_from_args
from dasknn.cli.training_options import (
    add_checkpoint_arguments,
    add_training_arguments,
    check_checkpoint_options,
    check_training_options,
    checkpoint_options,
    optimizer_from_args,
)
from dasknn.datasets import (
    load_mnist_test,
    load_network,
    mnist_to_challenge_inputs,
    parse_radixnet_spec,
)
from dasknn.model import SparseMLP
from dasknn.model.checkpoint import latest_checkpoint
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.model_parallel._timing import TrainingTimes, time_training
from dasknn.runtime.cluster import open_client
from dasknn.runtime.dashboard_feed import DashboardFeed
from graph.atomic import check_output_path, write_text_atomically

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``dasknn train``."""
    parser = subparsers.add_parser(
        "train",
        help="train a sparse network model-parallel on Dask workers and report time and volume",
        description=(
            "Split every layer of NETWORK by neurons into PARTS parts (hypergraph, random or "
            "block partition), place part m on worker m %% W, and train by minibatch SGD. Prints "
            "the loss of every epoch (and the held-out accuracy or loss), the time per batch with "
            "its breakdown (local products, update, packing, communication and scheduling wait) "
            "and the communication volume measured by the scheduler plugin against the "
            "partition's prediction; the run can be watched on the dashboard page it prints."
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
    parser.add_argument("--steps", type=int, help="train STEPS batches (overrides --samples)")
    parser.add_argument(
        "--activation", default="sigmoid", choices=("sigmoid", "relu", "clipped_relu", "identity")
    )
    parser.add_argument("--loss", choices=("mse", "softmax_cross_entropy"))
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    held_out = parser.add_mutually_exclusive_group()
    held_out.add_argument(
        "--validation-fraction", type=float,
        help="hold out this fraction of the samples (the last ones) and score it every epoch",
    )
    held_out.add_argument(
        "--validation-data", type=Path,
        help="score this .npz file (arrays X and y) every epoch",
    )
    add_training_arguments(parser, batch_size=64, lr=0.01, optimizer="sgd")
    parser.add_argument("--json", type=Path, help="write every statistic to this JSON file")
    parser.add_argument(
        "--save",
        type=Path,
        help="write the trained model (with its optimizer state and partition) to this .npz file",
    )
    add_checkpoint_arguments(parser, "a lost worker's parts are")
    add_step_timeout_argument(parser, "a step may go without finishing")
    parser.add_argument(
        "--reuse-memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the workers' freed step buffers for reuse while training (glibc; undone at "
        "the end; default: on)",
    )
    add_tls_options(parser)
    parser.add_argument(
        "--microbatches",
        type=int,
        help="split every batch into this many row blocks that run through the layers "
        "interleaved (default: chosen per batch, see docs/training.md)",
    )
    parser.add_argument(
        "--messages",
        choices=("tasks", "posted"),
        default="posted",
        help="tasks: a task per layer step and message; posted: a task per worker and step, "
        "messages posted straight between workers (see docs/training.md)",
    )
    parser.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    check_training_options(args)
    for name in ("parts", "workers", "samples"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.steps is not None and args.steps < 1:
        raise ValueError("--steps must be at least 1")
    if args.microbatches is not None and args.microbatches < 1:
        raise ValueError("--microbatches must be at least 1")
    check_step_timeout_option(args.step_timeout)
    for output in (args.save, args.json):
        if output is not None:
            check_output_path(output)
    check_checkpoint_options(args)


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


def _held_out(args, x, y) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    if args.validation_fraction is not None:
        return split_validation(x, y, args.validation_fraction)
    if args.validation_data is not None:
        return (x, y, *read_validation_file(args.validation_data))
    return x, y, None, None


def _statistics(args, model, partition, dist, times: TrainingTimes, epochs: list) -> dict:
    comm = times.comm
    return {
        "network": args.network,
        "layer_sizes": list(model.layer_sizes),
        "activation": model.activation.name,
        "loss": model.loss.name,
        "partition": {
            "method": args.partition if args.resume is None else f"checkpoint {args.resume}",
            "parts": args.parts,
            "seconds": getattr(partition, "seconds", 0.0),
        },
        "workers": len(set(dist.part_workers)),
        "batch_size": args.batch_size,
        "epochs": epochs,
        "timing": {
            "batches": times.batches,
            "seconds_per_batch": times.per_batch,
            "samples_per_second": times.samples_per_second,
            "products": times.products,
            "update": times.update,
            "update_background": times.update_background,
            "pack": times.pack,
            "wait": times.wait,
        },
        "comm": json.loads(comm.to_json()),
    }


def run(args: argparse.Namespace) -> int:
    """Build, partition, place and train; print the figures; return the exit code."""
    _check(args)
    security = security_from_args(args)
    target = cluster_target(args, args.workers)
    model, x, y = _model_and_data(args)
    x, y, x_held, y_held = _held_out(args, x, y)
    if x_held is not None:
        model.score(x_held[:1], y_held[:1])  # the held-out data fit the model (else ValueError)
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
        **checkpoint_options(args),
    }
    # A warm-up step (compiling the kernels before timing) would be a step of its own: not in a
    # run that must match the checkpointed one.
    warmup = args.checkpoint_dir is None and args.resume is None
    epochs: list[dict] = []
    with ExitStack() as stack:
        client = open_client(stack, target, args.workers, security=security)
        dist = stack.enter_context(
            DistributedSparseMLP(
                model,
                client,
                partition=partition,
                reuse_memory=args.reuse_memory,
                microbatches=args.microbatches,
                messages=args.messages,
                step_timeout=args.step_timeout,
            )
        )
        print(
            f"placed {dist.nparts} parts on {len(set(dist.part_workers))} workers; "
            f"{dist.step_microbatches(args.batch_size)} microbatches a batch"
        )

        def report_epoch(epoch: int, loss: float) -> None:
            line = {"epoch": epoch + 1, "loss": loss}
            text = f"epoch {epoch + 1}/{args.epochs}: loss {loss:.6g}"
            if x_held is not None:
                held = dist.gather()  # scored in this process: no step on the workers' clocks
                if held.loss.classification:
                    line["validation_accuracy"] = held.score(x_held, y_held)
                    text += f", held-out accuracy {line['validation_accuracy']:.4f}"
                else:
                    line["validation_loss"] = held.evaluate(x_held, y_held)
                    text += f", held-out loss {line['validation_loss']:.6g}"
                text += f" ({x_held.shape[0]} samples)"
            epochs.append(line)
            print(text, flush=True)

        with DashboardFeed(dist) as feed:
            print(f"dashboard: {feed.url}", flush=True)
            times = time_training(
                dist, x, y, args.batch_size, args.epochs, optimizer=optimizer_from_args(args),
                warmup=warmup, progress=args.progress, on_epoch=report_epoch, **fit_options,
            )  # fmt: skip
        print(f"trained {times.batches} batches of {args.batch_size}: {times.format()}")
        print(times.comm.format())
        statistics = _statistics(args, model, partition, dist, times, epochs)
        if args.save is not None:
            dist.save(args.save)
            print(f"saved the trained model to {args.save}")
    if args.json is not None:
        write_text_atomically(args.json, json.dumps(statistics, indent=2))
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
