"""MNIST in its IDX format, and its conversion to Graph Challenge inputs."""

from __future__ import annotations

import gzip
import math
import os
import zlib
from importlib import resources
from pathlib import Path

import numpy as np
import scipy.sparse as sp

__all__ = ["read_mnist_idx", "mnist_to_challenge_inputs", "load_mnist_test", "resize_matrix"]

_IDX_TYPES = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_mnist_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (images or labels), gzip-compressed or not.

    Parameters
    ----------
    path : path
        An IDX file such as ``t10k-images-idx3-ubyte.gz``.

    Returns
    -------
    numpy.ndarray
        The header's shape (``(n, 28, 28)`` images, ``(n,)`` labels) and stored type.

    Raises
    ------
    ValueError
        If the magic number, the type code or the size does not match the header.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"IDX file {path} does not exist")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            data = fh.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"{path}: cannot read IDX file: {exc}") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{path}: not an IDX file (bad magic number)")
    code, ndim = data[2], data[3]
    if code not in _IDX_TYPES:
        raise ValueError(f"{path}: unknown IDX type code 0x{code:02x}")
    if ndim == 0 or len(data) < 4 + 4 * ndim:
        raise ValueError(f"{path}: truncated IDX header")
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_TYPES[code])
    expected = math.prod(shape) * dtype.itemsize
    body = data[4 + 4 * ndim :]
    if len(body) != expected:
        raise ValueError(
            f"{path}: header says shape {shape} ({expected} bytes) but the file holds "
            f"{len(body)} bytes"
        )
    return np.frombuffer(body, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))


def load_mnist_test() -> tuple[np.ndarray, np.ndarray]:
    """Return the bundled MNIST test set: images ``(10000, 28, 28)`` uint8 and labels ``(10000,)``.

    MNIST is by Yann LeCun, Corinna Cortes and Christopher J.C. Burges (CC BY-SA 3.0).
    """
    folder = resources.files("dasknn.datasets") / "data"
    with resources.as_file(folder / "t10k-images-idx3-ubyte.gz") as images_path:
        images = read_mnist_idx(images_path)
    with resources.as_file(folder / "t10k-labels-idx1-ubyte.gz") as labels_path:
        labels = read_mnist_idx(labels_path)
    return images, labels


def resize_matrix(n_in: int, n_out: int) -> np.ndarray:
    """Linear-interpolation matrix ``R`` of shape ``(n_out, n_in)`` with pixel centres aligned.

    Output pixel ``u`` interpolates the input at ``x = (u + 0.5) * n_in / n_out - 0.5``, clamped
    to ``[0, n_in - 1]``.

    Parameters
    ----------
    n_in, n_out : int
        Pixels of a row (or column) before and after resizing.

    Returns
    -------
    numpy.ndarray, float64 ``(n_out, n_in)``
        ``R @ row`` is the resized row; ``R @ image @ R.T`` resizes an image.
    """
    x = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
    x = np.clip(x, 0.0, n_in - 1)
    lo = np.floor(x).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    frac = x - lo
    R = np.zeros((n_out, n_in))
    R[np.arange(n_out), lo] += 1.0 - frac
    R[np.arange(n_out), hi] += frac
    return R


def mnist_to_challenge_inputs(
    images: np.ndarray, side: int = 32, threshold: float = 0.5
) -> sp.csr_matrix:
    """Convert MNIST images into Graph Challenge input rows.

    Pixels are divided by 255, resized to ``side`` x ``side`` by :func:`resize_matrix`
    (``R @ img @ R.T``), set to 1 where strictly above ``threshold`` (else 0), and flattened
    row-major into ``side * side`` features.

    Parameters
    ----------
    images : array of shape (n, h, w)
        Grey-level images (uint8 0..255 or floats in [0, 1] when the dtype is floating).
    side : int
        Output side: 32 for the 1024-neuron network, 64 for 4096, 128 for 16384, 256 for 65536.
    threshold : float
        Binarisation threshold in ``[0, 1]``.

    Returns
    -------
    scipy.sparse.csr_matrix
        Shape ``(n, side * side)``, float64 entries equal to 1.
    """
    images = np.asarray(images)
    if images.ndim != 3:
        raise ValueError(f"images must have shape (n, height, width), got {images.shape}")
    if side < 1:
        raise ValueError(f"side must be >= 1, got {side}")
    scaled = images.astype(np.float64)
    if not np.issubdtype(images.dtype, np.floating):
        scaled /= 255.0
    if not np.all(np.isfinite(scaled)):
        raise ValueError("images contain NaN or infinite values")
    rows_r = resize_matrix(images.shape[1], side)
    cols_r = resize_matrix(images.shape[2], side)
    resized = np.einsum("ui,nij,vj->nuv", rows_r, scaled, cols_r, optimize=True)
    binary = (resized > threshold).reshape(images.shape[0], side * side)
    return sp.csr_matrix(binary.astype(np.float64))
