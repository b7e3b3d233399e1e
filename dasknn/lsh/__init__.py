"""Locality-sensitive hashing for sampling neurons: SimHash and DWTA families, bucketed tables.

One process, no Dask (the numba kernels are in :mod:`dasknn.kernels.lsh`): the sampled layers
(:mod:`dasknn.sampled`) query these tables with a layer's input to find the neurons likely to have
large activations.
"""

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
