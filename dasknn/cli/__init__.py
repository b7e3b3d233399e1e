"""The ``dasknn`` command line: one sub-command a module of this package.

Each sub-command module exposes ``add_parser(subparsers)``, which registers its parser and sets
``func`` to the function that runs it (taking the parsed arguments, returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main", "build_parser"]

SUBCOMMANDS = ("partition", "challenge", "train")


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="dasknn", description="Distributed sparse deep neural networks on Dask."
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(f"dasknn.cli.{name}").add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code (errors in the input or the set-up exit with 2,
    with the message and no traceback)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, RuntimeError, MemoryError) as exc:
        print(f"dasknn {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
