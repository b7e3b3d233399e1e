"""TLS options shared by the sub-commands that connect to a cluster (``--scheduler``)."""

from __future__ import annotations

import argparse

from distributed import Security

from dasknn.runtime.security import tls_security

__all__ = ["add_tls_options", "security_from_args"]


def add_tls_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--tls-ca-file``, ``--tls-cert``, ``--tls-key`` and ``--tls`` to ``parser``."""
    group = parser.add_argument_group(
        "TLS",
        "certificates for the connections to the scheduler and, without --scheduler, of the "
        "local cluster; without them dask's configuration (distributed.comm.tls.*) applies",
    )
    group.add_argument("--tls-ca-file", help="PEM file of the CA that signed the certificates")
    group.add_argument("--tls-cert", help="PEM certificate (of every role of a local cluster)")
    group.add_argument("--tls-key", help="PEM private key of --tls-cert (unless it holds it)")
    group.add_argument(
        "--tls",
        action="store_true",
        help="start the local cluster with TLS on temporary certificates (no --scheduler)",
    )


def security_from_args(args: argparse.Namespace) -> Security | bool | None:
    """The ``security`` for :func:`dasknn.runtime.cluster.open_client` from the options.

    Raises
    ------
    ValueError
        If ``--tls`` is given with ``--scheduler`` or with certificate files, or the files are
        incomplete or invalid (see :func:`dasknn.runtime.security.tls_security`).
    FileNotFoundError
        If a certificate file does not exist.
    """
    security = tls_security(args.tls_ca_file, args.tls_cert, args.tls_key)
    if not args.tls:
        return security
    if args.scheduler is not None:
        raise ValueError(
            "--tls starts a local cluster on temporary certificates; to reach --scheduler give "
            "--tls-ca-file, --tls-cert and --tls-key"
        )
    if security is not None:
        raise ValueError("--tls takes no certificate files (they already turn TLS on)")
    return True
