"""``dasknn samo``: prune a dense network trained on MNIST and train the pruned network on
compressed model states (SAMO) with pipeline stages and data-parallel replicas on a Dask cluster:
memory by category, loss and held-out accuracy per epoch, time per step, measured bytes against
the formulas over the whole run and the stages' idle fractions (also as JSON); the trained model
with ``--save``."""

from __future__ import annotations

import argparse
import json
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from dasknn.cli.cluster_options import (
    add_cluster_arguments,
    add_step_timeout_argument,
    check_step_timeout_option,
    cluster_target,
)
from dasknn.cli.tls import add_tls_options, security_from_args
from dasknn.cli.training_options import (
    add_checkpoint_arguments,
    add_training_arguments,
    check_checkpoint_options,
    checkpoint_options,
    optimizer_from_args,
)
from dasknn.compressed import PRECISIONS, get_precision
from dasknn.compressed.stack import COMPUTES
from dasknn.datasets import load_mnist_test
from dasknn.model import CompressedMLP, DenseMLP
from dasknn.optim import Optimizer
from dasknn.pipeline_parallel import (
    SCHEDULES,
    DistributedCompressedMLP,
    ParallelPlan,
    balanced_bounds,
    compressed_layer_bytes,
    plan_parallelism,
)
from dasknn.pruning import EarlyBird, magnitude_masks
from dasknn.runtime.affinity import pin_by_default, pinned_core
from dasknn.runtime.cluster import open_client
from dasknn.runtime.comm_report import CommReport
from graph.atomic import check_output_path, write_text_atomically

__all__ = ["add_parser", "run"]

MNIST_SAMPLES = 10_000


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``dasknn samo``."""
    parser = subparsers.add_parser(
        "samo",
        help="prune a network and train it on compressed states with pipeline stages and "
        "data-parallel replicas (SAMO)",
        description=(
            "Train a dense 784-...-10 network on the first SAMPLES images of the bundled MNIST "
            "test set in this process, prune it by weight magnitude (at the Early-Bird ticket "
            "with --early-bird), and train the pruned network on compressed model states with "
            "STAGES pipeline stages x REPLICAS replicas on Dask workers (or the fewest "
            "stages whose states fit --memory-limit). Prints the memory of the model states by "
            "category beside the paper's formulas, the loss and the held-out accuracy (the last "
            "HELD_OUT images) per epoch, the time per step, the bytes measured between workers "
            "over the run against the formulas, and the stages' idle fractions in the last step."
        ),
    )
    parser.add_argument(
        "--hidden", default="300,100", help="hidden layer sizes, comma-separated (LeNet-300-100)"
    )
    parser.add_argument("--samples", type=int, default=8000, help="training images (the first)")
    parser.add_argument("--held-out", type=int, default=2000, help="held-out images (the last)")
    parser.add_argument("--sparsity", type=float, default=0.9, help="pruned fraction, in [0, 1)")
    parser.add_argument("--scope", choices=("global", "layer"), default="global")
    parser.add_argument(
        "--dense-epochs", type=int, default=2, help="epochs of the dense network before pruning"
    )
    parser.add_argument(
        "--early-bird",
        action="store_true",
        help="prune at the Early-Bird ticket (masks of 5 epochs within Hamming distance 0.1) "
        "when one is found within --dense-epochs",
    )
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument("--compute", choices=COMPUTES, default="sparse")
    parser.add_argument("--stages", type=int, help="pipeline stages (default 1)")
    parser.add_argument("--replicas", type=int, help="replicas of every stage (default 1)")
    parser.add_argument(
        "--memory-limit",
        type=int,
        help="bytes of model states a worker may hold: the fewest stages that fit, the other "
        "workers as replicas (not with --stages / --replicas)",
    )
    parser.add_argument(
        "--microbatches", type=int, default=1, help="microbatches per replica and batch"
    )
    parser.add_argument("--schedule", choices=SCHEDULES, default="gpipe")
    parser.add_argument(
        "--pin-cores",
        action=argparse.BooleanOptionalAction,
        help="bind each stage worker's process to a core of its own while training (default: "
        "on a local cluster of --workers when the machine has more cores than stage workers)",
    )
    parser.add_argument(
        "--reuse-memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the passes' freed buffers in the worker processes for reuse while training "
        "(glibc; undone at the end; default: on)",
    )
    add_step_timeout_argument(parser, "a step may go without finishing")
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="local worker processes (with --cluster: the batch jobs' workers to wait for); "
        "--memory-limit shares out this many",
    )
    add_cluster_arguments(parser, parser.add_mutually_exclusive_group())
    add_tls_options(parser)
    add_training_arguments(parser, batch_size=64, lr=1e-3, optimizer="adam")
    parser.add_argument("--json", type=Path, help="write every statistic to this JSON file")
    parser.add_argument(
        "--save",
        type=Path,
        help="write the trained pruned model (compressed weights, index, biases, configuration; "
        "CompressedMLP.load reads it) to this .npz file",
    )
    add_checkpoint_arguments(parser, "a lost stage worker's layers are")
    parser.set_defaults(func=run)


def _pinned_cores(client, pipe: DistributedCompressedMLP) -> dict[str, int | None]:
    """The core each stage worker is bound to, read on the workers."""
    stage_workers = sorted(set(pipe.workers.values()))
    return {
        address: core
        for address, (core, _threads) in client.run(pinned_core, workers=stage_workers).items()
    }


def _comm_figures(report: CommReport) -> dict:
    """The run's traffic by phase, measured beside the formulas: ``{"exact", "steps",
    "phases": {phase: {measured_bytes, predicted_bytes, measured_messages,
    predicted_messages}}}`` (phases ``forward``, ``backward``: the pipeline's messages between
    stages; ``predict``: those of the held-out scores; ``allreduce``: the gradients between
    replicas)."""
    phases = {}
    for phase in ("forward", "backward", "predict", "allreduce"):
        phases[phase] = {
            "measured_bytes": report.total(phase=phase),
            "predicted_bytes": report.total("predicted", phase=phase),
            "measured_messages": report.messages(phase=phase),
            "predicted_messages": report.messages("predicted", phase=phase),
        }
    return {"exact": report.exact, "steps": report.steps, "phases": phases}


def _layer_sizes(hidden: str) -> list[int]:
    try:
        sizes = [int(part) for part in hidden.split(",")] if hidden.strip() else []
    except ValueError:
        sizes = [0]
    if any(s < 1 for s in sizes):
        raise ValueError(f"--hidden must be comma-separated positive sizes, got {hidden!r}")
    return [28 * 28, *sizes, 10]


def _check(args: argparse.Namespace) -> tuple[list[int], Optimizer]:
    """The layer sizes and the optimizer; ``ValueError`` for any bad option, before any work."""
    sizes = _layer_sizes(args.hidden)
    for name in ("samples", "batch_size", "workers", "microbatches"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("held_out", "dense_epochs", "epochs"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 0")
    if args.samples + args.held_out > MNIST_SAMPLES:
        raise ValueError(
            f"--samples {args.samples} and --held-out {args.held_out} overlap: the MNIST test set "
            f"has {MNIST_SAMPLES} images"
        )
    check_step_timeout_option(args.step_timeout)
    check_checkpoint_options(args)
    if not 0.0 <= args.sparsity < 1.0:
        raise ValueError(f"--sparsity must lie in [0, 1), got {args.sparsity}")
    try:
        get_precision(args.precision)
    except ImportError as exc:
        raise RuntimeError(str(exc)) from None
    optimizer = optimizer_from_args(args)
    if args.memory_limit is not None:
        if args.stages is not None or args.replicas is not None:
            raise ValueError(
                "--memory-limit chooses the stages and replicas: not with --stages or --replicas"
            )
        if args.memory_limit < 1:
            raise ValueError("--memory-limit must be a number of bytes >= 1")
    for name in ("stages", "replicas"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    stages = args.stages or 1
    if stages > len(sizes) - 1:
        raise ValueError(f"--stages {stages} for a network of {len(sizes) - 1} layers")
    if args.memory_limit is None:
        _check_plan(args, stages, args.replicas or 1)
    for path in (args.json, args.save):
        if path is not None:
            check_output_path(path)
    return sizes, optimizer


def _check_plan(args: argparse.Namespace, stages: int, replicas: int) -> None:
    """``ValueError`` if a local cluster has too few workers, or a batch (the last of an epoch
    included) does not split into ``replicas * microbatches`` equal microbatches."""
    if args.scheduler is None and args.cluster is None and stages * replicas > args.workers:
        raise ValueError(
            f"stages x replicas = {stages * replicas} workers needed, --workers is {args.workers}"
        )
    parts = replicas * args.microbatches
    last = args.samples % args.batch_size
    for rows in {min(args.batch_size, args.samples), last} - {0}:
        if rows % parts:
            raise ValueError(
                f"a batch of {rows} rows does not split into replicas x microbatches = {parts} "
                f"equal microbatches (choose --batch-size and --samples so that every batch does)"
            )


def _mnist(args: argparse.Namespace) -> tuple[np.ndarray, ...]:
    images, labels = load_mnist_test()
    x = images.reshape(len(images), -1).astype(np.float32) / 255.0
    held = slice(MNIST_SAMPLES - args.held_out, MNIST_SAMPLES)
    return x[: args.samples], labels[: args.samples], x[held], labels[held]


def _prune(args, sizes, optimizer, x, y, x_held, y_held) -> tuple[CompressedMLP, dict]:
    """Train the dense parent, draw the masks and give the pruned model; the dense figures."""
    dense = DenseMLP.init(sizes, seed=args.seed)
    bird = EarlyBird(args.sparsity, scope=args.scope) if args.early_bird else None
    ticket = None
    for epoch in range(args.dense_epochs):
        dense.fit(x, y, batch_size=args.batch_size, optimizer=optimizer, seed=epoch, progress=False)
        if bird is not None and bird.update(dense.weights):
            ticket = epoch + 1
            break
    figures = {"epochs": len(dense.loss_curve_), "loss_curve": list(dense.loss_curve_)}
    if args.held_out:
        figures["held_out_accuracy"] = dense.score(x_held, y_held)
    if bird is not None:
        figures["early_bird_epoch"] = ticket
        figures["early_bird_distances"] = [d for d in bird.distances_ if d == d]
    masks = magnitude_masks(dense.weights, args.sparsity, args.scope)
    if ticket is not None:
        masks = bird.mask_
    return dense.prune(masks, precision=args.precision, compute=args.compute), figures


def _plan(args: argparse.Namespace, model: CompressedMLP, optimizer: Optimizer) -> ParallelPlan:
    layer_bytes = compressed_layer_bytes(model.stack, optimizer)
    if args.memory_limit is not None:
        plan = plan_parallelism(layer_bytes, args.workers, args.memory_limit)
        _check_plan(args, plan.stages, plan.replicas)
        return plan
    stages, replicas = args.stages or 1, args.replicas or 1
    bounds = balanced_bounds(model, stages)
    sizes = [sum(layer_bytes[a:b]) for a, b in bounds]
    return ParallelPlan(stages, replicas, bounds, sizes, memory_limit=max(sizes))


def run(args: argparse.Namespace) -> int:
    """Check, train the dense parent, prune, plan and train on the cluster; print the figures;
    return the exit code."""
    sizes, optimizer = _check(args)
    security = security_from_args(args)
    target = cluster_target(args, args.workers)
    x, y, x_held, y_held = _mnist(args)
    model, dense = _prune(args, sizes, optimizer, x, y, x_held, y_held)
    text = f"dense {'-'.join(map(str, sizes))}: {dense['epochs']} epoch(s)"
    if args.held_out:
        text += f", held-out accuracy {dense['held_out_accuracy']:.4f}"
    print(text)
    memory = model.memory_report(optimizer=optimizer)
    print(f"pruned to {model.nnz:,} of {model.phi:,} weights")
    print(memory.format())
    plan = _plan(args, model, optimizer)
    print(
        f"plan: {plan.stages} stage(s) x {plan.replicas} replica(s), layers {plan.bounds}, "
        f"{max(plan.stage_bytes):,} B of states on the largest stage"
    )
    epochs: list[dict] = []
    with ExitStack() as stack:
        client = open_client(stack, target, args.workers, security=security)
        pin_cores = args.pin_cores
        if pin_cores is None:
            pin_cores = pin_by_default(target is None, plan.stages * plan.replicas)
        pipe = stack.enter_context(
            DistributedCompressedMLP(
                model,
                client,
                stages=plan.stages,
                replicas=plan.replicas,
                microbatches=args.microbatches,
                schedule=args.schedule,
                bounds=plan.bounds,
                pin_cores=pin_cores,
                reuse_memory=args.reuse_memory,
                step_timeout=args.step_timeout,
            )
        )

        def report_epoch(epoch: int, loss: float) -> None:
            line = {"epoch": epoch + 1, "loss": loss}
            text = f"epoch {epoch + 1}/{args.epochs}: loss {loss:.6g}"
            if args.held_out:
                line["held_out_accuracy"] = pipe.score(x_held, y_held)
                text += f", held-out accuracy {line['held_out_accuracy']:.4f}"
            epochs.append(line)
            print(text, flush=True)

        start = time.perf_counter()
        pipe.fit(
            x,
            y,
            batch_size=args.batch_size,
            epochs=args.epochs,
            optimizer=optimizer,
            seed=args.seed,
            progress=args.progress,
            on_epoch=report_epoch,
            **checkpoint_options(args),
        )
        seconds = time.perf_counter() - start
        steps = args.epochs * -(-args.samples // args.batch_size)
        statistics = {
            "layer_sizes": sizes,
            "sparsity": memory.sparsity,
            "phi": model.phi,
            "nnz": model.nnz,
            "precision": args.precision,
            "compute": args.compute,
            "dense": dense,
            "memory": {
                "categories": memory.categories,
                "states": memory.states,
                "formulas": memory.formulas,
            },
            "plan": {
                "stages": plan.stages,
                "replicas": plan.replicas,
                "bounds": plan.bounds,
                "stage_bytes": plan.stage_bytes,
                "memory_limit": args.memory_limit,
            },
            "microbatches": args.microbatches,
            "schedule": args.schedule,
            "reuse_memory": args.reuse_memory,
            "pinned_cores": _pinned_cores(client, pipe) if pipe.pin_cores else None,
            "batch_size": args.batch_size,
            "epochs": epochs,
            "steps": steps,
            "seconds_per_step": seconds / steps if steps else None,
        }
        if steps:
            comm = pipe.comm_report()
            statistics["comm"] = _comm_figures(comm)
            idle = pipe.idle_fractions()
            statistics["idle_fractions_last_step"] = [
                {"stage": s, "replica": d, "idle": value} for (s, d), value in sorted(idle.items())
            ]
            if pipe.scaler is not None:
                statistics["skipped_steps"] = pipe.scaler.skipped_steps
                statistics["loss_scale"] = pipe.scaler.scale
            print(
                f"trained {steps} steps of {args.batch_size}: "
                f"{statistics['seconds_per_step'] * 1e3:.1f} ms/step"
            )
            print(
                ", ".join(
                    f"{phase} {f['measured_bytes']:,} B in {f['measured_messages']} messages "
                    f"(formula {f['predicted_bytes']:,} B in {f['predicted_messages']})"
                    for phase, f in statistics["comm"]["phases"].items()
                )
                + f" over the run{' (equal)' if comm.exact else ''}"
            )
            print(
                "idle fraction of the last step: "
                + ", ".join(f"stage {s} replica {d} {value:.3f}" for (s, d), value in idle.items())
            )
        if args.save is not None:
            pipe.gather().save(args.save)
            print(f"saved the trained model to {args.save}")
    if args.json is not None:
        write_text_atomically(args.json, json.dumps(statistics, indent=2))
    return 0
