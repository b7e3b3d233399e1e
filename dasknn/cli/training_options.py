"""The training options a training command shares: ``--epochs``, ``--batch-size``, ``--lr``,
``--optimizer``, ``--seed`` and ``--progress`` / ``--no-progress``."""

from __future__ import annotations

import argparse
import math

from dasknn.optim import SGD, Adam, AdamW, Optimizer

__all__ = [
    "OPTIMIZERS",
    "add_training_arguments",
    "check_training_options",
    "optimizer_from_args",
]

OPTIMIZERS = {"adam": Adam, "adamw": AdamW, "sgd": SGD}


def add_training_arguments(
    parser: argparse.ArgumentParser, batch_size: int, lr: float, optimizer: str
) -> None:
    """Add the training options with the command's defaults."""
    group = parser.add_argument_group("training")
    group.add_argument("--epochs", type=int, default=1, help="passes over the training rows")
    group.add_argument(
        "--batch-size", type=int, default=batch_size, help=f"rows a step (default {batch_size})"
    )
    group.add_argument("--lr", type=float, default=lr, help=f"learning rate (default {lr:g})")
    group.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default=optimizer)
    group.add_argument("--seed", type=int, default=0, help="seed of the model and the batches")
    group.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="show a progress bar while an epoch trains (on stderr)",
    )


def check_training_options(args: argparse.Namespace) -> None:
    """``ValueError`` naming a bad training option, before any work."""
    for name in ("epochs", "batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise ValueError(f"--lr must be a finite number > 0, got {args.lr}")


def optimizer_from_args(args: argparse.Namespace) -> Optimizer:
    """The optimizer of ``--optimizer`` at ``--lr``."""
    return OPTIMIZERS[args.optimizer](lr=args.lr)
