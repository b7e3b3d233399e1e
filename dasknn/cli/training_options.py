"""The training options a training command shares: ``--epochs``, ``--batch-size``, ``--lr``,
``--optimizer``, ``--seed`` and ``--progress`` / ``--no-progress``; and the checkpoint options
``--checkpoint-dir``, ``--checkpoint-every`` and ``--resume`` (the ``checkpoint``,
``checkpoint_every`` and ``resume`` arguments of a model's ``fit``)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from dasknn.optim import SGD, Adam, AdamW, Optimizer

__all__ = [
    "OPTIMIZERS",
    "add_checkpoint_arguments",
    "check_checkpoint_options",
    "checkpoint_options",
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


def add_checkpoint_arguments(parser: argparse.ArgumentParser, recovers: str) -> None:
    """Add ``--checkpoint-dir``, ``--checkpoint-every`` and ``--resume``; ``recovers`` says what
    the model restores from the last checkpoint when a worker is lost."""
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        help=f"write a checkpoint here every --checkpoint-every batches; {recovers} restored "
        "from the last one and training goes on",
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


def check_checkpoint_options(args: argparse.Namespace) -> None:
    """The errors of bad checkpoint options, before any work: ``ValueError`` for a
    ``--checkpoint-every`` below 1, ``NotADirectoryError`` for a ``--checkpoint-dir`` that is a
    file, ``FileNotFoundError`` for one whose parent is missing or a ``--resume`` that does not
    exist."""
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        raise ValueError("--checkpoint-every must be at least 1")
    if args.checkpoint_dir is not None:
        if args.checkpoint_dir.exists() and not args.checkpoint_dir.is_dir():
            raise NotADirectoryError(f"--checkpoint-dir {str(args.checkpoint_dir)!r} is a file")
        if not args.checkpoint_dir.absolute().parent.is_dir():
            raise FileNotFoundError(
                f"the parent of --checkpoint-dir {args.checkpoint_dir} is missing"
            )
    if args.resume is not None and not args.resume.exists():
        raise FileNotFoundError(f"--resume {str(args.resume)!r} does not exist")


def checkpoint_options(args: argparse.Namespace) -> dict:
    """The ``fit`` arguments of the checkpoint options."""
    return {
        "checkpoint": args.checkpoint_dir,
        "checkpoint_every": args.checkpoint_every,
        "resume": args.resume,
    }
