"""Load the inputs of a challenge run: a sparse-input tsv(.gz) or an MNIST IDX image file."""

from __future__ import annotations

import gzip
import math
import os
from pathlib import Path

import scipy.sparse as sp

from dasknn.datasets import mnist_to_challenge_inputs, read_mnist_idx, read_sparse_tsv

__all__ = ["load_inputs", "is_idx_file"]


def is_idx_file(path: str | os.PathLike) -> bool:
    """True when ``path`` (gzip-compressed or not) starts with an IDX magic number."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            head = fh.read(4)
    except (OSError, EOFError):
        return False
    return len(head) == 4 and head[0] == 0 and head[1] == 0 and head[3] in (1, 2, 3)


def load_inputs(path: str | os.PathLike, neurons: int) -> sp.csr_matrix:
    """Read the input rows for a network of ``neurons`` neurons.

    A challenge sparse-input file (``row col value``, 1-based) must have no column beyond
    ``neurons``. An IDX image file (MNIST) is converted with
    :func:`dasknn.datasets.mnist_to_challenge_inputs` at ``side = sqrt(neurons)``.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        On a malformed file, a file with no input rows, a column beyond the width, or a width that
        is not a square for images.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"input file {path} does not exist")
    if is_idx_file(path):
        images = read_mnist_idx(path)
        if images.ndim != 3:
            raise ValueError(f"{path}: IDX images must have shape (n, h, w), got {images.shape}")
        if images.shape[0] == 0:
            raise ValueError(f"{path}: no inputs (the file holds 0 images)")
        side = math.isqrt(int(neurons))
        if side * side != neurons:
            raise ValueError(
                f"{path}: images need a square number of neurons, the network has {neurons}"
            )
        return mnist_to_challenge_inputs(images, side)
    inputs = read_sparse_tsv(path)
    if inputs.shape[0] == 0:
        raise ValueError(f"{path}: no inputs (the file holds no entries)")
    if inputs.shape[1] > neurons:
        raise ValueError(
            f"{path}: the inputs have column {inputs.shape[1]} but the network has only "
            f"{neurons} neurons (width mismatch)"
        )
    inputs.resize((inputs.shape[0], int(neurons)))
    return inputs
