"""Deterministic generator of Graph Challenge style RadiX-Net networks.

Radix-2 butterfly layers on ``M = N / 16`` neurons, Kronecker-expanded by a dense 16 x 16 block:
32 nonzeros of 1/16 per row and column. Layer ``k`` of the first group connects input ``i`` to the
outputs

    ``(i - b * s + M * q) mod N`` for ``b in {0, 1}``, ``q in 0..15``, ``s = 2 ** ((k - 1) mod m)``

with ``m = log2(M)`` layers a group (the official network's first group exactly). Each later group
permutes the rows of these circulant layers by one seeded random permutation.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import scipy.sparse as sp

__all__ = ["iter_radixnet", "radixnet", "radixnet_group_size"]

_DENSE_BLOCK = 16


def radixnet_group_size(neurons: int) -> int:
    """Number of layers in one relabelling group: ``m = log2(neurons / 16)``.

    Parameters
    ----------
    neurons : int
        Neurons per layer, ``16 * 2**m`` with ``m >= 1``.

    Returns
    -------
    int

    Raises
    ------
    ValueError
        If ``neurons`` is not ``16 * 2**m`` with ``m >= 1``.
    """
    if neurons < 2 * _DENSE_BLOCK or neurons % _DENSE_BLOCK:
        raise ValueError(f"neurons must be 16 * 2**m with m >= 1, got {neurons}")
    base = neurons // _DENSE_BLOCK
    if base & (base - 1):
        raise ValueError(f"neurons must be 16 * 2**m with m >= 1, got {neurons}")
    return base.bit_length() - 1


def _index_dtype(neurons: int) -> np.dtype:
    """The CSR index dtype of a layer of ``neurons`` (scipy's choice: int32 while every row
    pointer fits), so the matrix is built without the copy of a cast."""
    return np.dtype(np.int32 if neurons * 2 * _DENSE_BLOCK < 2**31 else np.int64)


def _circulant_columns(neurons: int, stride: int) -> np.ndarray:
    """Column indices of every row of the circulant layer, shape ``(neurons, 32)``, sorted, of
    :func:`_index_dtype`."""
    base = neurons // _DENSE_BLOCK
    rows = np.arange(neurons)[:, None]
    offsets = (np.arange(_DENSE_BLOCK)[:, None] * base - np.array([0, stride])[None, :]).ravel()
    columns = np.sort((rows + offsets[None, :]) % neurons, axis=1)
    return columns.astype(_index_dtype(neurons), copy=False)


def iter_radixnet(
    neurons: int,
    layers: int,
    seed: int = 0,
    dtype: np.dtype | type = np.float64,
    value: float = 1.0 / 16.0,
) -> Iterator[sp.csr_matrix]:
    """Yield the layers of a RadiX-Net network one at a time (the matrices of :func:`radixnet`).

    Holds only the ``log2(neurons / 16)`` circulant patterns and one relabelling.

    Parameters
    ----------
    neurons, layers, seed, dtype, value
        As :func:`radixnet`'s.

    Yields
    ------
    scipy.sparse.csr_matrix
        Layer ``k`` of shape ``(neurons, neurons)`` with 32 nonzeros per row and column.

    Raises
    ------
    ValueError
        On the first ``next()``, if ``neurons`` is not ``16 * 2**m`` or ``layers < 1``.
    """
    group = radixnet_group_size(neurons)
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    rng = np.random.default_rng(seed)
    nnz_row = 2 * _DENSE_BLOCK
    circulants = [_circulant_columns(neurons, 1 << t) for t in range(group)]
    indptr = np.arange(neurons + 1, dtype=_index_dtype(neurons)) * nnz_row
    perm = np.arange(neurons)
    for k in range(layers):
        if k % group == 0 and k > 0:
            perm = rng.permutation(neurons)
        cols = circulants[k % group][perm]
        yield sp.csr_matrix(
            (
                np.full(neurons * nnz_row, value, dtype=dtype),
                cols.ravel(),
                indptr.copy(),
            ),
            shape=(neurons, neurons),
        )


def radixnet(
    neurons: int,
    layers: int,
    seed: int = 0,
    dtype: np.dtype | type = np.float64,
    value: float = 1.0 / 16.0,
) -> list[sp.csr_matrix]:
    """Generate a RadiX-Net network in the Graph Challenge convention.

    Parameters
    ----------
    neurons : int
        Neurons per layer, ``16 * 2**m`` (1024, 4096, 16384, 65536, ...).
    layers : int
        Number of layers (any depth >= 1).
    seed : int
        Seed of the per-group relabellings; the first group does not depend on it.
    dtype : numpy dtype
    value : float
        Value of every nonzero (1/16 in the challenge).

    Returns
    -------
    list of scipy.sparse.csr_matrix
        The ``(neurons, neurons)`` layers :func:`iter_radixnet` yields.
    """
    return list(iter_radixnet(neurons, layers, seed, dtype, value))
