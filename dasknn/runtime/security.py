"""TLS between the client, the scheduler and the workers: a ``distributed.Security`` from
certificate files (one CA, certificate and key for every role, encryption required), or with
temporary certificates for a local cluster. See docs/reliability.md, "Security"."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from distributed import Security

__all__ = ["client_uses_tls", "temporary_security", "tls_security"]


def tls_security(
    ca_file: str | os.PathLike | None = None,
    cert: str | os.PathLike | None = None,
    key: str | os.PathLike | None = None,
) -> Security | None:
    """A ``Security`` for every role from certificate files, or ``None`` when none is given.

    Parameters
    ----------
    ca_file : path
        PEM file of the certificate authority that signed the cluster's certificates.
    cert : path
        PEM certificate of this client (and of the scheduler and workers of a local cluster).
    key : path, optional
        PEM private key of ``cert``; may be left out when ``cert`` holds the key too.

    Raises
    ------
    ValueError
        For a key without a certificate, only one of CA and certificate, or invalid files.
    FileNotFoundError
        If a file does not exist.
    """
    if ca_file is None and cert is None and key is None:
        return None
    if ca_file is None or cert is None:
        raise ValueError(
            "TLS needs both a CA file and a certificate (--tls-ca-file and --tls-cert; the key "
            "--tls-key unless the certificate file holds it)"
        )
    paths = {"CA file": ca_file, "certificate": cert, "key": key}
    for what, path in paths.items():
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(f"TLS {what} {path} does not exist or is not a file")
    options = {"tls_ca_file": str(ca_file)}
    for role in ("client", "scheduler", "worker"):
        options[f"tls_{role}_cert"] = str(cert)
        if key is not None:
            options[f"tls_{role}_key"] = str(key)
    security = Security(require_encryption=True, **options)
    try:
        security.get_connection_args("client")
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(
            f"cannot use the TLS files (CA {ca_file}, certificate {cert}, key {key}): {exc}"
        ) from None
    return security


def temporary_security() -> Security:
    """A ``Security`` with new self-signed certificates in memory, for a cluster started here.

    Raises
    ------
    RuntimeError
        If ``cryptography`` is not installed.
    """
    try:
        return Security.temporary()
    except ImportError as exc:
        raise RuntimeError(
            f"temporary TLS certificates need the cryptography package ({exc}); "
            "python3 -m pip install cryptography, or give certificate files"
        ) from None


def client_uses_tls(security: Security) -> bool:
    """Whether ``security`` gives a client a TLS context (a CA and a certificate)."""
    return security.get_connection_args("client")["ssl_context"] is not None
