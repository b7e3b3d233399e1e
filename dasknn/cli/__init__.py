"""The ``dasknn`` command line: one sub-command a module of this package.

Each sub-command module exposes ``add_parser(subparsers)``, which registers its parser and sets
``func`` to the function that runs it (taking the parsed arguments, returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

__all__ = ["main", "build_parser"]

SUBCOMMANDS = ("partition", "challenge", "train", "samo", "parallax", "slide", "precompile")
DASK_LOG_LEVELS = ("debug", "info", "warning", "error")


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="dasknn", description="Distributed sparse deep neural networks on Dask."
    )
    parser.add_argument(
        "--dask-log-level",
        choices=DASK_LOG_LEVELS,
        default="warning",
        help="the least severe of Dask's own log records (the 'distributed' logger of this "
        "process) to show; default warning, so Dask's informational lines (a connection closed "
        "as the command ends, ...) do not mix with the command's output",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(f"dasknn.cli.{name}").add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code.

    Errors a user can cause with bad files, options or an unreachable cluster (``ValueError``,
    ``OSError`` such as a missing file, a directory given for a file or a connection timeout,
    ``RuntimeError``, ``MemoryError``, a loss that is not finite) exit with 2 and one line on
    stderr, no traceback. Dask's
    own log records in this process below ``--dask-log-level`` (default warning) are not shown
    while the command runs.

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
    dask_logger = logging.getLogger("distributed")
    previous_level = dask_logger.level
    dask_logger.setLevel(args.dask_log_level.upper())
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError, RuntimeError, MemoryError, FloatingPointError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"dasknn {args.command}: error: {message}", file=sys.stderr)
        return 2
    finally:
        dask_logger.setLevel(previous_level)


if __name__ == "__main__":
    sys.exit(main())
