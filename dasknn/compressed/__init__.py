"""Compressed model states of pruned networks (SAMO): flat indices, compress / expand, storage
precisions and loss scaling, the compressed states of a run of layers, memory accounting."""

from dasknn.compressed.index import check_index, compress, expand, flat_index
from dasknn.compressed.memory import FORMULAS, MemoryReport, formula_bytes
from dasknn.compressed.precision import PRECISIONS, LossScaler, Precision, get_precision
from dasknn.compressed.stack import COMPUTES, CompressedLayer, CompressedStack

__all__ = [
    "COMPUTES",
    "FORMULAS",
    "PRECISIONS",
    "CompressedLayer",
    "CompressedStack",
    "LossScaler",
    "MemoryReport",
    "Precision",
    "check_index",
    "compress",
    "expand",
    "flat_index",
    "formula_bytes",
    "get_precision",
]
