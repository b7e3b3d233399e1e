"""Bucketed hash tables: the items' codes sorted into CSR-like buckets with a capped size."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

import numpy as np

from dasknn.kernels.lsh import build_buckets, query_union
from dasknn.lsh.families import HashFamily, Take

__all__ = ["HashTables", "check_bucket_size"]


def check_bucket_size(bucket_size) -> int:
    """``bucket_size`` as an int.

    Parameters
    ----------
    bucket_size : int
        The most items a bucket keeps.

    Raises
    ------
    ValueError
        Unless ``bucket_size`` is an integer >= 1.
    """
    if isinstance(bucket_size, bool) or not isinstance(bucket_size, Integral) or bucket_size < 1:
        raise ValueError(f"bucket_size must be an integer >= 1, got {bucket_size!r}")
    return int(bucket_size)


@dataclass(frozen=True)
class HashTables:
    """The tables of one hash family over ``n_items`` vectors.

    Attributes
    ----------
    keys, key_ptr, bucket_ptr, items : numpy.ndarray
        The CSR-like layout of :func:`dasknn.kernels.lsh.build_buckets`.
    n_items : int
    bucket_size : int
        The cap of every bucket; larger buckets keep a seeded uniform reservoir sample.
    """

    keys: np.ndarray
    key_ptr: np.ndarray
    bucket_ptr: np.ndarray
    items: np.ndarray
    n_items: int
    bucket_size: int

    @classmethod
    def build(
        cls,
        family: HashFamily,
        vectors: np.ndarray,
        bucket_size: int,
        seed: int,
        take: Take = np.empty,
    ) -> HashTables:
        """Hash the rows of ``vectors`` with ``family`` and bucket them (reservoir ``seed``);
        the hashing's temporaries in arrays of ``take`` (default: new)."""
        return cls.from_codes(family.codes(vectors, take), bucket_size, seed)

    @classmethod
    def from_codes(cls, codes: np.ndarray, bucket_size: int, seed: int) -> HashTables:
        """Tables from the ``(n_items, n_tables)`` codes of the items."""
        bucket_size = check_bucket_size(bucket_size)
        codes = np.ascontiguousarray(codes, dtype=np.int64)
        keys, key_ptr, bucket_ptr, items = build_buckets(codes, bucket_size, int(seed))
        return cls(keys, key_ptr, bucket_ptr, items, codes.shape[0], bucket_size)

    @property
    def n_tables(self) -> int:
        return len(self.key_ptr) - 1

    def bucket(self, table: int, code: int) -> np.ndarray:
        """The ids in the bucket ``code`` of ``table`` (empty if there is none)."""
        lo, hi = self.key_ptr[table], self.key_ptr[table + 1]
        pos = lo + np.searchsorted(self.keys[lo:hi], code)
        if pos < hi and self.keys[pos] == code:
            return self.items[self.bucket_ptr[pos] : self.bucket_ptr[pos + 1]]
        return self.items[:0]

    def query(self, codes: np.ndarray) -> np.ndarray:
        """The union of the buckets of one query's ``codes`` (one per table), each id once."""
        codes = np.ascontiguousarray(codes, dtype=np.int64)
        return query_union(
            self.keys, self.key_ptr, self.bucket_ptr, self.items, codes, self.n_items
        )

    def arrays(self) -> tuple:
        """``(keys, key_ptr, bucket_ptr, items)`` for the kernels."""
        return self.keys, self.key_ptr, self.bucket_ptr, self.items
