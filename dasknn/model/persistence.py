"""The model file: one ``.npz`` archive with a JSON header, read without pickle.

Format version 2 (see ``docs/training.md``, ``## Saving, checkpoints and resuming``):

- ``header``: a 0-d unicode array holding a JSON object with ``"format": "dasknn-model"``,
  ``"version": 2``, ``n_layers``, ``dtype``, ``activation``, ``output_activation``, ``loss``,
  ``pattern`` (a digest of the sparsity pattern), ``optimizer`` (``null`` or
  ``{"name", "params", "steps"}``, ``steps`` the step count of every layer's weight and bias
  state), ``nparts`` (``null`` or the number of parts of the stored partition) and ``progress``
  (``null`` or the training progress of a checkpoint, :class:`~dasknn.model.checkpoint.Progress`);
- per layer ``k`` (0-based): ``w{k}_shape``, ``w{k}_indptr``, ``w{k}_indices``, ``w{k}_data``
  (CSR, original neuron order) and ``b{k}``;
- the optimizer state: ``opt_w{k}_{name}`` and ``opt_b{k}_{name}`` for every state array (the
  length of the weight values or of the bias);
- a partition: ``part{k}`` for ``k = 0 .. L``.

Files of version 1 (no header; ``format``, ``n_layers``, ``dtype``, the activation and loss names
as entries) are still read. A newer version, a file that is not a model file, or arrays that do not
fit the header are a ``ValueError`` naming the file; nothing is unpickled
(``allow_pickle=False``). Every layer passes :func:`graph.checks.csr_from_arrays` before anything
reads it.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tokenize
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from dasknn.model.validation import check_float_dtype
from dasknn.optim import (
    NONNEGATIVE_STATES,
    Optimizer,
    ParamState,
    optimizer_config,
    optimizer_from_config,
)
from graph.atomic import write_atomically
from graph.checks import csr_from_arrays

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "ModelRecord",
    "add_pattern",
    "optimizer_entries",
    "pattern_digest",
    "read_arrays",
    "read_model",
    "read_param_state",
    "read_parsed",
    "write_model",
]

FORMAT_NAME = "dasknn-model"
FORMAT_VERSION = 2


def pattern_digest(patterns) -> str:
    """SHA-256 of a network's sparsity pattern: every layer's shape, ``indptr`` and ``indices``.

    ``patterns`` yields ``(shape, indptr, indices)`` per layer (or CSR matrices).
    """
    digest = hashlib.sha256()
    for item in patterns:
        add_pattern(digest, item)
    return digest.hexdigest()


def add_pattern(digest, item) -> None:
    """Add one layer's pattern (``(shape, indptr, indices)`` or a CSR matrix) to ``digest``
    (a :mod:`hashlib` object) as :func:`pattern_digest` does."""
    shape, indptr, indices = (item.shape, item.indptr, item.indices) if sp.issparse(item) else item
    for array in (shape, indptr, indices):  # little-endian int64 bytes, read in place
        digest.update(np.ascontiguousarray(array, dtype="<i8"))


@dataclass
class ModelRecord:
    """Everything a model file holds.

    Attributes
    ----------
    weights : list of scipy.sparse.csr_matrix
        ``(n_{k-1}, n_k)`` per layer, original neuron order.
    biases : list of numpy.ndarray
    activation, output_activation, loss, dtype : str
    optimizer : Optimizer or None
        The optimizer of the last training step.
    optimizer_state : list of (ParamState, ParamState)
        Per layer, the state of the weight values and of the bias (empty without an optimizer).
    partition : list of numpy.ndarray or None
        ``L + 1`` arrays of part ids (a distributed model's placement).
    nparts : int or None
    progress : dict or None
        A checkpoint's training progress (:class:`~dasknn.model.checkpoint.Progress` as JSON).
    """

    weights: list[sp.csr_matrix]
    biases: list[np.ndarray]
    activation: str
    output_activation: str
    loss: str
    dtype: str
    optimizer: Optimizer | None = None
    optimizer_state: list[tuple[ParamState, ParamState]] = field(default_factory=list)
    partition: list[np.ndarray] | None = None
    nparts: int | None = None
    progress: dict | None = None

    @property
    def layer_sizes(self) -> list[int]:
        """``[n_0, n_1, ..., n_L]``."""
        return [self.weights[0].shape[0]] + [w.shape[1] for w in self.weights]

    @property
    def pattern(self) -> str:
        """:func:`pattern_digest` of the weights."""
        return pattern_digest(self.weights)


def optimizer_entries(
    optimizer: Optimizer, state: Sequence[tuple[ParamState, ParamState]], arrays: dict
) -> dict:
    """The header entry of ``optimizer`` (its config and every layer's weight and bias step
    counts); puts the state arrays of layer ``k`` into ``arrays`` as ``opt_w{k}_{name}`` and
    ``opt_b{k}_{name}``."""
    for k, (ws, bs) in enumerate(state):
        for name, values in ws.arrays.items():
            arrays[f"opt_w{k}_{name}"] = values
        for name, values in bs.arrays.items():
            arrays[f"opt_b{k}_{name}"] = values
    return {**optimizer_config(optimizer), "steps": [[ws.step, bs.step] for ws, bs in state]}


def write_model(path: str | os.PathLike, record: ModelRecord) -> None:
    """Write ``record`` to the ``.npz`` file ``path`` atomically (all or nothing).

    Raises
    ------
    FileNotFoundError, IsADirectoryError
        If the directory of ``path`` does not exist or ``path`` is a directory.
    """
    header = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "n_layers": len(record.weights),
        "dtype": record.dtype,
        "activation": record.activation,
        "output_activation": record.output_activation,
        "loss": record.loss,
        "pattern": record.pattern,
        "optimizer": None,
        "nparts": record.nparts,
        "progress": record.progress,
    }
    arrays: dict[str, np.ndarray] = {}
    for k, (w, b) in enumerate(zip(record.weights, record.biases, strict=True)):
        arrays[f"w{k}_shape"] = np.array(w.shape, dtype=np.int64)
        arrays[f"w{k}_indptr"] = w.indptr
        arrays[f"w{k}_indices"] = w.indices
        arrays[f"w{k}_data"] = w.data
        arrays[f"b{k}"] = b
    if record.optimizer is not None:
        header["optimizer"] = optimizer_entries(record.optimizer, record.optimizer_state, arrays)
    if record.partition is not None:
        for k, parts in enumerate(record.partition):
            arrays[f"part{k}"] = np.asarray(parts, dtype=np.int64)
    arrays["header"] = np.array(json.dumps(header))
    write_atomically(Path(path), lambda handle: np.savez(handle, **arrays))


#: What reading a damaged or foreign archive can raise (zipfile: an encrypted entry is a
#: ``RuntimeError``, an entry of a newer zip version a ``NotImplementedError``; numpy: a bad
#: ``.npy`` header a ``ValueError``, ``SyntaxError``, ``tokenize.TokenError`` or ``struct.error``).
_UNREADABLE = (
    OSError,
    ValueError,
    EOFError,
    zipfile.BadZipFile,
    zlib.error,
    NotImplementedError,
    RuntimeError,
    SyntaxError,
    tokenize.TokenError,
    struct.error,
    KeyError,
    IndexError,
    TypeError,
    OverflowError,
    MemoryError,
)


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` archive ``path``, read without pickle.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        Naming ``path``, if it is a directory, a pickle, or not a readable ``.npz`` archive of
        plain arrays (truncated, corrupt, encrypted, of a newer zip version, holding objects).
    """
    if not path.exists():
        raise FileNotFoundError(f"model file {path} does not exist")
    if path.is_dir():
        raise ValueError(f"{path}: is a directory, not a .npz model file")
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise ValueError("a single array, not an .npz archive")
        with loaded as npz:
            return {key: npz[key] for key in npz.files}
    except _UNREADABLE as exc:
        reason = str(exc) or type(exc).__name__
        if "pickle" in reason:  # numpy's message advises allow_pickle=, which dasknn never uses
            reason = "it holds pickled data (Python objects), which dasknn never reads"
        raise ValueError(f"{path}: not a readable .npz model file: {reason}") from None


def read_parsed(path: str | os.PathLike, parse, described: str):
    """``parse(arrays)`` of the ``.npz`` archive ``path`` (:func:`read_arrays`), its errors as
    ``ValueError`` naming the file and what it should be (``described``, such as
    ``"compressed model file"``): a missing entry, or what ``parse`` raised.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        Naming ``path``, if it is not a readable archive or ``parse`` refuses it.
    """
    path = Path(path)
    stored = read_arrays(path)
    try:
        return parse(stored)
    except KeyError as exc:
        raise ValueError(f"{path}: {described} lacks the entry {exc.args[0]!r}") from None
    except (ValueError, TypeError, OverflowError, AttributeError) as exc:
        raise ValueError(f"{path}: invalid {described}: {exc}") from None


def _header(stored: dict[str, np.ndarray]) -> dict:
    """The JSON header, or the equivalent of a version 1 file's scalar entries."""
    if "header" not in stored:
        if int(stored["format"]) != 1:
            raise ValueError(f"unknown model file format {int(stored['format'])}")
        names = ("dtype", "activation", "output_activation", "loss")
        header = {name: str(stored[name]) for name in names}
        return {**header, "version": 1, "n_layers": int(stored["n_layers"]), "optimizer": None}
    return json_header(stored["header"], FORMAT_NAME, "a dasknn model file", 2, FORMAT_VERSION)


def json_header(
    entry: np.ndarray, format_name: str, described: str, oldest: int, newest: int
) -> dict:
    """The JSON header of a dasknn file, checked for its format name and version.

    Parameters
    ----------
    entry : numpy.ndarray
        The stored ``header`` entry, one string.
    format_name : str
        The ``format`` the header must name.
    described : str
        What such a file is, for the errors (``"a dasknn model file"``).
    oldest, newest : int
        The range of format versions with a JSON header that this dasknn reads.

    Raises
    ------
    ValueError
        If the entry is not a JSON object naming ``format_name``, or its ``version`` is not an
        integer from ``oldest`` to ``newest``.
    """
    try:
        header = json.loads(str(entry))
    except json.JSONDecodeError as exc:
        raise ValueError(f"the header is not JSON: {exc}") from None
    except RecursionError:
        raise ValueError("the header is JSON nested too deeply to be a dasknn header") from None
    if not isinstance(header, dict) or header.get("format") != format_name:
        raise ValueError(f"the header does not describe {described}")
    version = header.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < oldest:
        raise ValueError(f"bad format version {version!r}")
    if version > newest:
        raise ValueError(
            f"format version {version} is newer than this dasknn reads ({newest}); "
            "upgrade dasknn to read it"
        )
    return header


def read_param_state(stored, prefix: str, expected: ParamState, step, length: int) -> ParamState:
    """The stored state arrays ``{prefix}{name}`` of one parameter, checked against the names
    and length of a fresh state of the same optimizer."""
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"bad optimizer step count {step!r}")
    arrays = {}
    for name, fresh in expected.arrays.items():
        values = stored[f"{prefix}{name}"]
        if values.shape != (length,) or values.dtype != fresh.dtype:
            raise ValueError(
                f"optimizer state {prefix}{name} has shape {values.shape} and dtype "
                f"{values.dtype}, expected ({length},) {fresh.dtype}"
            )
        if not np.isfinite(values).all():
            raise ValueError(f"optimizer state {prefix}{name} holds NaN or infinite values")
        if name in NONNEGATIVE_STATES and (values < 0).any():
            raise ValueError(
                f"optimizer state {prefix}{name} holds negative values (a mean of squares "
                "cannot be negative)"
            )
        arrays[name] = values
    return ParamState(step=step, arrays=arrays)


def _parse(path: Path, stored: dict[str, np.ndarray]) -> ModelRecord:
    header = _header(stored)
    n_layers = header["n_layers"]
    if not isinstance(n_layers, int) or not 1 <= n_layers <= len(stored):
        raise ValueError(f"n_layers is {n_layers!r}, the file cannot hold that")
    dtype = check_float_dtype(str(header["dtype"]))
    weights, biases = [], []
    for k in range(n_layers):
        weights.append(
            csr_from_arrays(
                stored[f"w{k}_data"],
                stored[f"w{k}_indices"],
                stored[f"w{k}_indptr"],
                stored[f"w{k}_shape"],
                name=f"{path}: layer {k + 1}",
            )
        )
        biases.append(stored[f"b{k}"])
    record = ModelRecord(
        weights,
        biases,
        activation=str(header["activation"]),
        output_activation=str(header["output_activation"]),
        loss=str(header["loss"]),
        dtype=dtype.name,
    )
    if header.get("pattern") not in (None, record.pattern):
        raise ValueError("the sparsity pattern does not match the header's digest")
    if header["optimizer"] is not None:
        config = header["optimizer"]
        record.optimizer = optimizer_from_config(config)
        steps = config.get("steps")
        if not isinstance(steps, list) or len(steps) != n_layers:
            raise ValueError(f"the optimizer needs {n_layers} pairs of step counts")
        for k, (w, b) in enumerate(zip(weights, biases, strict=True)):
            w_data, b_data = np.asarray(w.data, dtype=dtype), np.asarray(b, dtype=dtype)
            w_steps, b_steps = steps[k] if len(steps[k]) == 2 else (None, None)
            record.optimizer_state.append(
                (
                    read_param_state(
                        stored, f"opt_w{k}_", record.optimizer.init_state(w_data), w_steps, w.nnz
                    ),
                    read_param_state(
                        stored, f"opt_b{k}_", record.optimizer.init_state(b_data), b_steps, len(b)
                    ),
                )
            )
    if header.get("nparts") is not None:
        nparts = header["nparts"]
        if not isinstance(nparts, int) or nparts < 1:
            raise ValueError(f"bad number of parts {nparts!r}")
        partition = [stored[f"part{k}"] for k in range(n_layers + 1)]
        for k, (parts, size) in enumerate(zip(partition, record.layer_sizes, strict=True)):
            if parts.shape != (size,) or not np.issubdtype(parts.dtype, np.integer):
                raise ValueError(f"part{k} must hold {size} integer part ids")
            if size and (parts.min() < 0 or parts.max() >= nparts):
                raise ValueError(f"part{k} holds part ids outside [0, {nparts})")
        record.partition, record.nparts = partition, nparts
    if header.get("progress") is not None and not isinstance(header["progress"], dict):
        raise ValueError("the training progress must be a JSON object")
    record.progress = header.get("progress")
    return record


def read_model(path: str | os.PathLike) -> ModelRecord:
    """Read a model file written by :func:`write_model` (or a version 1 file).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        Naming ``path``: not a model file (not a zip archive, truncated, corrupt), a newer format
        version, a missing entry, or inconsistent contents (an index out of range, a decreasing
        ``indptr``, a value that is not finite, optimizer state of the wrong length).
    """
    path = Path(path)
    stored = read_arrays(path)
    try:
        return _parse(path, stored)
    except KeyError as exc:
        raise ValueError(f"{path}: model file lacks the entry {exc.args[0]!r}") from None
    except (ValueError, TypeError, OverflowError, AttributeError) as exc:
        message = str(exc)
        if not message.startswith(str(path)):
            message = f"{path}: invalid model file: {message}"
        raise ValueError(message) from None
