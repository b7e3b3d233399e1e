"""Hash families for sampling neurons: signed random projections (SimHash) and densified
winner-take-all (DWTA). A family of ``L`` tables of ``K`` functions maps a vector of ``dim``
values to one code per table; its random parts come from ``numpy.random.default_rng(seed)``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Integral

import numpy as np

from dasknn.kernels.lsh import dwta_codes, pack_sign_bits, simhash_codes

__all__ = ["DWTA", "FAMILIES", "MAX_CODE_BITS", "HashFamily", "SimHash", "make_family"]

#: ``take(shape, dtype)``: an uninitialized array (``np.empty`` or a pool's).
Take = Callable[..., np.ndarray]

#: The most bits a table's code may have.
MAX_CODE_BITS = 30

#: The largest ``dim * k * n_tables`` for which SimHash also keeps a dense projection matrix.
DENSE_PROJECTION_ENTRIES = 1 << 22


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class HashFamily:
    """``n_tables`` tables of ``k`` hash functions on vectors of ``dim`` values.

    Attributes
    ----------
    dim : int
        Values of a hashed vector.
    k : int
        Hash functions a table (their bits make the table's code).
    n_tables : int
        Number of tables.
    seed : int
        Seed of the random parts (``numpy.random.default_rng(seed)``).

    Raises
    ------
    ValueError
        If ``dim``, ``k`` or ``n_tables`` is not an integer >= 1, ``seed`` < 0, or a code would
        exceed ``MAX_CODE_BITS`` bits.
    """

    dim: int
    k: int
    n_tables: int
    seed: int

    def __post_init__(self) -> None:
        for name in ("dim", "k", "n_tables"):
            object.__setattr__(self, name, _positive_int(name, getattr(self, name)))
        if isinstance(self.seed, bool) or not isinstance(self.seed, Integral) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        if self.code_bits > MAX_CODE_BITS:
            raise ValueError(
                f"a table's code would have {self.code_bits} bits; at most {MAX_CODE_BITS} "
                f"(lower k)"
            )

    @property
    def code_bits(self) -> int:
        """Bits of one table's code."""
        raise NotImplementedError

    def codes(self, vectors: np.ndarray, take: Take = np.empty) -> np.ndarray:
        """The ``(n, n_tables)`` int64 codes of the rows of ``vectors`` (``(n, dim)``); the
        temporaries in arrays of ``take(shape, dtype)`` (default: new)."""
        raise NotImplementedError

    def _check(self, vectors: np.ndarray) -> np.ndarray:
        vectors = np.asarray(vectors)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"vectors must have shape (n, {self.dim}), got {vectors.shape}")
        return np.ascontiguousarray(vectors)


@dataclass(frozen=True)
class SimHash(HashFamily):
    """Signed random projections: each function is a sparse +-1 projection over
    ``ceil(density * dim)`` distinct coordinates; its bit is ``projection >= 0``.

    Vectors at angle ``theta`` share a bit with probability ``p = 1 - theta / pi``, a code with
    ``p**k``, some table's code with ``1 - (1 - p**k)**n_tables``.

    Up to ``DENSE_PROJECTION_ENTRIES`` entries the codes come from one dense matrix product
    (docs/sampled.md), otherwise from :func:`~dasknn.kernels.lsh.simhash_codes`; a projection
    within rounding of 0 may take either sign between the two.

    Attributes
    ----------
    dim, k, n_tables, seed : int
        As :class:`HashFamily`'s.
    density : float
        Share of the coordinates each projection reads, in ``(0, 1]``.
    """

    density: float = 1.0 / 3.0
    index: np.ndarray = field(init=False, repr=False, compare=False)
    sign: np.ndarray = field(init=False, repr=False, compare=False)
    dense: np.ndarray | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (0 < float(self.density) <= 1):
            raise ValueError(f"density must lie in (0, 1], got {self.density!r}")
        rng = np.random.default_rng(self.seed)
        n_functions = self.k * self.n_tables
        width = max(1, int(np.ceil(self.density * self.dim)))
        index = np.argsort(rng.random((n_functions, self.dim)), axis=1)[:, :width]
        object.__setattr__(self, "index", np.ascontiguousarray(index, dtype=np.int32))
        sign = rng.integers(0, 2, size=(n_functions, width)) * 2 - 1
        object.__setattr__(self, "sign", sign.astype(np.float32))
        dense = None
        if self.dim * n_functions <= DENSE_PROJECTION_ENTRIES:
            dense = np.zeros((self.dim, n_functions), dtype=np.float32)
            dense[index, np.arange(n_functions)[:, None]] = self.sign
        object.__setattr__(self, "dense", dense)

    @property
    def code_bits(self) -> int:
        return self.k

    def codes(self, vectors: np.ndarray, take: Take = np.empty) -> np.ndarray:
        vectors = self._check(vectors)
        if self.dense is None:
            return simhash_codes(vectors, self.index, self.sign, self.k, self.n_tables)
        dtype = np.result_type(vectors.dtype, np.float32)
        projections = np.matmul(
            vectors.astype(dtype, copy=False),
            self.dense.astype(dtype, copy=False),
            out=take((vectors.shape[0], self.dense.shape[1]), dtype),
        )
        return pack_sign_bits(projections, self.k, self.n_tables)


@dataclass(frozen=True)
class DWTA(HashFamily):
    """Densified winner-take-all: ``k`` bins of ``bin_size`` coordinates (pieces of random
    permutations) a table, each coding its argmax in ``log2(bin_size)`` bits
    (:func:`dasknn.kernels.lsh.dwta_codes`).

    Attributes
    ----------
    dim, k, n_tables, seed : int
        As :class:`HashFamily`'s.
    bin_size : int
        Coordinates a bin, a power of two >= 2.
    """

    bin_size: int = 8
    bins: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        size = self.bin_size
        if (
            isinstance(size, bool)
            or not isinstance(size, Integral)
            or size < 2
            or size & (size - 1) != 0
        ):
            raise ValueError(f"bin_size must be a power of two >= 2, got {size!r}")
        super().__post_init__()
        rng = np.random.default_rng(self.seed)
        needed = self.k * self.n_tables * size
        perms = [rng.permutation(self.dim) for _ in range(-(-needed // self.dim))]
        bins = np.concatenate(perms)[:needed].reshape(self.k * self.n_tables, size)
        object.__setattr__(self, "bins", np.ascontiguousarray(bins, dtype=np.int32))

    @property
    def code_bits(self) -> int:
        return self.k * (int(self.bin_size).bit_length() - 1)

    def codes(self, vectors: np.ndarray, take: Take = np.empty) -> np.ndarray:
        vectors = self._check(vectors)
        bits = int(self.bin_size).bit_length() - 1
        return dwta_codes(vectors, self.bins, self.k, self.n_tables, bits)


FAMILIES = {"simhash": SimHash, "dwta": DWTA}


def make_family(
    name: str, dim: int, k: int, n_tables: int, seed: int, bin_size: int = 8
) -> HashFamily:
    """The hash family ``name`` (``"simhash"`` or ``"dwta"``; ``bin_size`` for DWTA only).

    Parameters
    ----------
    name : str
        ``"simhash"`` (:class:`SimHash`, default density) or ``"dwta"`` (:class:`DWTA`).
    dim, k, n_tables, seed : int
        As :class:`HashFamily`'s.
    bin_size : int
        :class:`DWTA`'s bin size (ignored for SimHash).

    Raises
    ------
    ValueError
        For an unknown ``name`` or the family's own bad hyperparameters.
    """
    if name not in FAMILIES:
        raise ValueError(f"unknown hash family {name!r}; expected one of {sorted(FAMILIES)}")
    if name == "dwta":
        return DWTA(dim, k, n_tables, seed, bin_size=bin_size)
    return SimHash(dim, k, n_tables, seed)
