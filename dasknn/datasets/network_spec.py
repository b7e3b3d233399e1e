"""Resolve a network description given on the command line or to the API."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from dasknn.datasets.challenge_io import iter_challenge_network
from dasknn.datasets.radixnet import iter_radixnet, radixnet_group_size

__all__ = ["iter_network", "load_network", "parse_radixnet_spec"]


def parse_radixnet_spec(text: str) -> tuple[int, int, int | None]:
    """``(neurons, layers, seed)`` of ``radixnet:N:L[:SEED]`` (seed ``None`` when not given).

    Raises
    ------
    ValueError
        When ``text`` is not of that form (naming the form expected).
    """
    fields = text.split(":")[1:] if text.startswith("radixnet:") else []
    if len(fields) not in (2, 3) or not all(f.isdigit() for f in fields):
        raise ValueError(f"network spec {text!r} must be radixnet:N:L or radixnet:N:L:SEED")
    return int(fields[0]), int(fields[1]), int(fields[2]) if len(fields) == 3 else None


def iter_network(
    spec: str | os.PathLike,
    neurons: int | None = None,
    layers: int | None = None,
    seed: int = 0,
    dtype: np.dtype | type = np.float64,
) -> Iterator[sp.csr_matrix]:
    """Yield the layers of a challenge directory or of ``radixnet:N:L`` one at a time.

    Errors in the spec or missing files are raised at the call, before any layer is made.

    Parameters
    ----------
    spec : str or path
        A directory of ``n{N}-l{k}.tsv[.gz]`` files, or ``radixnet:N:L`` (``N`` neurons, ``L``
        layers; ``radixnet:N:L:SEED`` sets the relabelling seed).
    neurons, layers : int, optional
        For a directory: the width to read and how many layers (default: all consecutive layers).
        For ``radixnet:N:L`` they must agree with the spec when given.
    seed : int
        Relabelling seed for generated networks (overridden by a ``:SEED`` suffix).
    dtype : numpy dtype
    """
    text = os.fspath(spec)
    if text.startswith("radixnet:"):
        n, depth, spec_seed = parse_radixnet_spec(text)
        seed = seed if spec_seed is None else spec_seed
        if neurons is not None and neurons != n:
            raise ValueError(f"--neurons {neurons} contradicts the network spec {text!r}")
        if layers is not None:
            if layers > depth:
                raise ValueError(f"--layers {layers} exceeds the {depth} layers of {text!r}")
            depth = layers
        _check_radixnet(n, depth)
        return iter_radixnet(n, depth, seed=seed, dtype=dtype)
    path = Path(text)
    if not path.exists():
        raise FileNotFoundError(
            f"network {text!r} is neither an existing directory nor radixnet:N:L"
        )
    return iter_challenge_network(path, neurons=neurons, layers=layers, dtype=dtype)


def _check_radixnet(neurons: int, layers: int) -> None:
    radixnet_group_size(neurons)
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")


def load_network(
    spec: str | os.PathLike,
    neurons: int | None = None,
    layers: int | None = None,
    seed: int = 0,
    dtype: np.dtype | type = np.float64,
) -> list[sp.csr_matrix]:
    """Load a network from a challenge directory or generate it from ``radixnet:N:L``.

    Parameters
    ----------
    spec, neurons, layers, seed, dtype
        As :func:`iter_network`'s.

    Returns
    -------
    list of scipy.sparse.csr_matrix
        The layers :func:`iter_network` yields.
    """
    return list(iter_network(spec, neurons, layers, seed, dtype))
