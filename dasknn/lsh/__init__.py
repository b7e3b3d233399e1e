"""Locality-sensitive hashing for sampling neurons: SimHash and DWTA families, bucketed tables
(one process; kernels in :mod:`dasknn.kernels.lsh`), queried by :mod:`dasknn.sampled`."""

from dasknn.lsh.families import DWTA, FAMILIES, MAX_CODE_BITS, HashFamily, SimHash, make_family
from dasknn.lsh.mips import mips_items, mips_queries
from dasknn.lsh.tables import HashTables, check_bucket_size

__all__ = [
    "DWTA",
    "FAMILIES",
    "MAX_CODE_BITS",
    "HashFamily",
    "HashTables",
    "SimHash",
    "check_bucket_size",
    "make_family",
    "mips_items",
    "mips_queries",
]
