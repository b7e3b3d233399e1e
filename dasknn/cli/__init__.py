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

SUBCOMMANDS = ("partition", "challenge", "train", "samo")


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
    """Run the command line; return the exit code.

    Errors a user can cause with bad files, options or an unreachable cluster (``ValueError``,
    ``OSError`` such as a missing file, a directory given for a file or a connection timeout,
    ``RuntimeError``, ``MemoryError``) exit with 2 and one line on stderr, no traceback.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit code: 0 on success, 2 on such an error.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError, RuntimeError, MemoryError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"dasknn {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
