"""The file of a pruned model on compressed states (:class:`~dasknn.model.CompressedMLP`): one
``.npz`` archive with a JSON header, read without pickle.

Format ``"dasknn-compressed-model"``, version 2:

- ``header``: a 0-d unicode array holding a JSON object with ``"format"``, ``"version"``,
  ``n_layers``, ``pattern`` (:func:`compressed_pattern`: a digest of every layer's shape and
  index, so a layer's shape or index edited apart from the rest is refused), ``precision``
  (``"fp64" | "fp32" | "bf16" | "fp16"``), ``compute`` (``"sparse" | "dense"``),
  ``activation``, ``output_activation``, ``loss``, ``steps`` (training steps taken),
  ``loss_scaler`` (``null``, or fp16's ``{"scale", "growth_interval",
  "good_steps", "skipped_steps"}``) and ``optimizer`` (``null`` or ``{"name", "params",
  "steps"}``, ``steps`` the step counts of every layer's weight and bias state) and ``progress``
  (absent or ``null``, or the training progress of a checkpoint,
  :class:`~dasknn.model.checkpoint.Progress`);
- per layer ``k`` (0-based): ``w{k}_shape`` (``n_in, n_out``), ``w{k}_index`` (the sorted int32
  flat index of the unpruned weights), ``w{k}_values`` (the master weights at the index, in the
  arithmetic dtype: float64 for ``"fp64"``, float32 otherwise) and ``b{k}`` (the bias, same
  dtype);
- the optimizer state: ``opt_w{k}_{name}`` and ``opt_b{k}_{name}`` for every state array (one
  value per unpruned weight, or per bias entry).

The 16-bit compute weights are not stored: they are rebuilt from the master weights, as after
every update. Everything is checked before a model is built from it: the header's names and
numbers, every index (:func:`~dasknn.compressed.check_index`: sorted, no duplicate, in range, at
most ``2**31 - 1`` entries a layer), the values' and biases' lengths, dtypes and finiteness, that
the layers chain, that the memory a layer's shape makes the model allocate (its row pointers, and
with ``compute="dense"`` its dense compute weights) is at most :data:`MAX_EXPANSION` times the
bytes of the layer's arrays in the file, the pattern's digest, and the optimizer state's names,
lengths and values. A file that is not such an archive, of a newer version, or with anything
missing or inconsistent is a ``ValueError`` naming it. Version 1 files (no digest) are read too.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dasknn.compressed import PRECISIONS, check_index
from dasknn.compressed.stack import COMPUTES
from dasknn.model.checkpoint import CheckpointFormat
from dasknn.model.persistence import (
    json_header,
    optimizer_entries,
    read_param_state,
    read_parsed,
)
from dasknn.optim import Optimizer, ParamState, optimizer_from_config
from graph.atomic import write_atomically

__all__ = [
    "COMPRESSED_FILE",
    "COMPRESSED_FORMAT",
    "COMPRESSED_VERSION",
    "MAX_EXPANSION",
    "CompressedRecord",
    "compressed_identity",
    "compressed_pattern",
    "read_compressed",
    "write_compressed",
]

COMPRESSED_FORMAT = "dasknn-compressed-model"
COMPRESSED_VERSION = 2
#: The most bytes a layer's shape may make the model allocate (row pointers, and dense compute
#: weights) per byte of the layer's arrays in the file (index, values, bias). A layer pruned to
#: 99.9% stores at least 1/667 of the bytes of its dense compute weights (8 or 12 bytes per
#: unpruned weight, at most 8 per dense entry), so only shapes the arrays do not back are refused.
MAX_EXPANSION = 1024
#: Bytes per dense compute weight of each precision (its storage dtype).
_STORAGE_BYTES = {"fp64": 8, "fp32": 4, "bf16": 2, "fp16": 2}


@dataclass
class CompressedRecord:
    """Everything a compressed model file holds.

    Attributes
    ----------
    values, indices : list of 1-D arrays
        Per layer, the master weights and the flat index of the unpruned entries.
    shapes : list of (n_in, n_out)
    biases : list of 1-D arrays
    precision, compute, activation, output_activation, loss : str
    steps : int
        Training steps taken.
    loss_scaler : dict or None
        fp16's dynamic loss scale: ``scale``, ``growth_interval``, ``good_steps``,
        ``skipped_steps``.
    optimizer : Optimizer or None
    optimizer_state : list of (ParamState, ParamState)
        Per layer, the state of the weight values and of the bias (empty without an optimizer).
    progress : dict or None
        A checkpoint's training progress (:class:`~dasknn.model.checkpoint.Progress` as JSON).
    """

    values: list[np.ndarray]
    indices: list[np.ndarray]
    shapes: list[tuple[int, int]]
    biases: list[np.ndarray]
    precision: str
    compute: str
    activation: str
    output_activation: str
    loss: str
    steps: int = 0
    loss_scaler: dict | None = None
    optimizer: Optimizer | None = None
    optimizer_state: list[tuple[ParamState, ParamState]] = field(default_factory=list)
    progress: dict | None = None


def compressed_pattern(shapes, indices) -> str:
    """SHA-256 of a pruned network's pattern: every layer's shape and flat index."""
    digest = hashlib.sha256()
    for shape, index in zip(shapes, indices, strict=True):
        digest.update(np.asarray(shape, dtype=np.int64).tobytes())
        digest.update(np.asarray(index, dtype=np.int64).tobytes())
    return digest.hexdigest()


def write_compressed(path: str | os.PathLike, record: CompressedRecord) -> None:
    """Write ``record`` to the ``.npz`` file ``path`` atomically (all or nothing).

    Raises
    ------
    FileNotFoundError, IsADirectoryError
        If the directory of ``path`` does not exist or ``path`` is a directory.
    """
    header = {
        "format": COMPRESSED_FORMAT,
        "version": COMPRESSED_VERSION,
        "n_layers": len(record.values),
        "pattern": compressed_pattern(record.shapes, record.indices),
        "precision": record.precision,
        "compute": record.compute,
        "activation": record.activation,
        "output_activation": record.output_activation,
        "loss": record.loss,
        "steps": record.steps,
        "loss_scaler": record.loss_scaler,
        "optimizer": None,
        "progress": record.progress,
    }
    arrays: dict[str, np.ndarray] = {}
    layers = zip(record.values, record.indices, record.shapes, record.biases, strict=True)
    for k, (values, index, shape, bias) in enumerate(layers):
        arrays[f"w{k}_shape"] = np.array(shape, dtype=np.int64)
        arrays[f"w{k}_index"] = index
        arrays[f"w{k}_values"] = values
        arrays[f"b{k}"] = bias
    if record.optimizer is not None:
        header["optimizer"] = optimizer_entries(record.optimizer, record.optimizer_state, arrays)
    arrays["header"] = np.array(json.dumps(header))
    write_atomically(Path(path), lambda handle: np.savez(handle, **arrays))


def _header(stored: dict[str, np.ndarray]) -> dict:
    if "header" not in stored or stored["header"].ndim != 0:
        raise ValueError("no header: not a dasknn compressed model file")
    described = "a dasknn compressed model file"
    header = json_header(stored["header"], COMPRESSED_FORMAT, described, 1, COMPRESSED_VERSION)
    if header["version"] >= 2 and not isinstance(header.get("pattern"), str):
        raise ValueError("the header lacks the pattern's digest")
    for name, allowed in (("precision", PRECISIONS), ("compute", COMPUTES)):
        if header.get(name) not in allowed:
            raise ValueError(f"unknown {name} {header.get(name)!r}; expected one of {allowed}")
    for name in ("activation", "output_activation", "loss"):
        if not isinstance(header.get(name), str):
            raise ValueError(f"{name} must be a name, got {header.get(name)!r}")
    steps = header.get("steps")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise ValueError(f"bad step count {steps!r}")
    return header


def _count(value, name: str, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _loss_scaler(header: dict) -> dict | None:
    scaler = header.get("loss_scaler")
    if header["precision"] != "fp16":
        if scaler is not None:
            raise ValueError(f"a loss scaler for precision {header['precision']!r}")
        return None
    if not isinstance(scaler, dict) or set(scaler) != {
        "scale",
        "growth_interval",
        "good_steps",
        "skipped_steps",
    }:
        raise ValueError(
            "fp16 needs its loss scaler: scale, growth_interval, good_steps, skipped_steps"
        )
    scale = scaler["scale"]
    if not isinstance(scale, int | float) or not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"the loss scale must be finite and > 0, got {scale!r}")
    interval = _count(scaler["growth_interval"], "growth_interval", 1)
    good = _count(scaler["good_steps"], "good_steps", 0)
    if good >= interval:
        raise ValueError(f"good_steps {good} must be below growth_interval {interval}")
    _count(scaler["skipped_steps"], "skipped_steps", 0)
    return scaler


def _check_allocation(k: int, shape: tuple[int, int], arrays: list[np.ndarray], header: dict):
    """``ValueError`` if layer ``k``'s ``shape`` makes the model allocate more than
    :data:`MAX_EXPANSION` times the bytes of its ``arrays`` in the file: its int64 row pointers
    (``n_in + 1``) and, with ``compute="dense"``, its dense compute weights in the storage
    dtype."""
    n_in, n_out = shape
    needed = 8 * (n_in + 1)
    what = "row pointers"
    if header["compute"] == "dense":
        needed += n_in * n_out * _STORAGE_BYTES[header["precision"]]
        what = "dense compute weights and row pointers"
    held = sum(a.nbytes for a in arrays)
    if needed > MAX_EXPANSION * held:
        raise ValueError(
            f"w{k}_shape {shape} would allocate {needed:,} bytes ({what}) for the {held:,} "
            f"bytes of w{k}_index, w{k}_values and b{k} in the file, more than {MAX_EXPANSION} "
            "times as many: a shape the layer's arrays do not back"
        )


def _layer(stored: dict, k: int, arithmetic: np.dtype, header: dict) -> tuple:
    """Layer ``k``'s ``(values, index, shape, bias)``, checked."""
    shape = stored[f"w{k}_shape"]
    if shape.shape != (2,) or shape.dtype.kind not in "iu":
        raise ValueError(f"w{k}_shape must be two integers, got {shape.dtype} {shape.shape}")
    shape = (int(shape[0]), int(shape[1]))
    index = check_index(stored[f"w{k}_index"], shape, name=f"w{k}_index")
    values = stored[f"w{k}_values"]
    if values.dtype != arithmetic or values.shape != index.shape:
        raise ValueError(
            f"w{k}_values must be {arithmetic} of shape {index.shape} (one value per index "
            f"entry), got {values.dtype} {values.shape}"
        )
    bias = stored[f"b{k}"]
    if bias.dtype != arithmetic or bias.shape != (shape[1],):
        raise ValueError(
            f"b{k} must be {arithmetic} of shape ({shape[1]},), got {bias.dtype} {bias.shape}"
        )
    for name, array in ((f"w{k}_values", values), (f"b{k}", bias)):
        if not np.isfinite(array).all():
            raise ValueError(f"{name} holds NaN or infinite values")
    _check_allocation(k, shape, [index, values, bias], header)
    return values, index, shape, bias


def _parse(stored: dict[str, np.ndarray]) -> CompressedRecord:
    header = _header(stored)
    n_layers = header.get("n_layers")
    if not isinstance(n_layers, int) or isinstance(n_layers, bool):
        raise ValueError(f"n_layers must be an integer, got {n_layers!r}")
    if not 1 <= n_layers <= len(stored):
        raise ValueError(f"n_layers is {n_layers}, the file cannot hold that")
    arithmetic = np.dtype(np.float64 if header["precision"] == "fp64" else np.float32)
    layers = [_layer(stored, k, arithmetic, header) for k in range(n_layers)]
    for k in range(1, n_layers):
        if layers[k][2][0] != layers[k - 1][2][1]:
            raise ValueError(
                f"layer {k + 1} has {layers[k][2][0]} inputs, layer {k} {layers[k - 1][2][1]} "
                "outputs"
            )
    shapes, indices = [s for _, _, s, _ in layers], [i for _, i, _, _ in layers]
    if header["version"] >= 2 and header["pattern"] != compressed_pattern(shapes, indices):
        raise ValueError(
            "the layers' shapes and indices do not match the header's pattern digest (a layer "
            "edited apart from the rest)"
        )
    record = CompressedRecord(
        values=[v for v, _, _, _ in layers],
        indices=[i for _, i, _, _ in layers],
        shapes=[s for _, _, s, _ in layers],
        biases=[b for _, _, _, b in layers],
        precision=header["precision"],
        compute=header["compute"],
        activation=header["activation"],
        output_activation=header["output_activation"],
        loss=header["loss"],
        steps=header["steps"],
        loss_scaler=_loss_scaler(header),
    )
    if header.get("progress") is not None and not isinstance(header["progress"], dict):
        raise ValueError("the training progress must be a JSON object")
    record.progress = header.get("progress")
    config = header.get("optimizer")
    if config is not None:
        record.optimizer = optimizer_from_config(config)
        steps = config.get("steps")
        if not isinstance(steps, list) or len(steps) != n_layers:
            raise ValueError(f"the optimizer needs {n_layers} pairs of step counts")
        for k, (values, _, _, bias) in enumerate(layers):
            pair = steps[k] if isinstance(steps[k], list) and len(steps[k]) == 2 else [None, None]
            fresh_w, fresh_b = (
                record.optimizer.init_state(values),
                record.optimizer.init_state(bias),
            )
            record.optimizer_state.append(
                (
                    read_param_state(stored, f"opt_w{k}_", fresh_w, pair[0], len(values)),
                    read_param_state(stored, f"opt_b{k}_", fresh_b, pair[1], len(bias)),
                )
            )
    return record


def read_compressed(path: str | os.PathLike) -> CompressedRecord:
    """Read a compressed model file written by :func:`write_compressed`, checked.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        Naming ``path``: not a compressed model file (not a zip archive, truncated, corrupt,
        another format), a newer format version, a missing entry, or inconsistent contents (an
        unsorted, duplicate or out-of-range index, values or biases of the wrong length or dtype
        or not finite, layers that do not chain, a layer's shape that would allocate more than
        :data:`MAX_EXPANSION` times its arrays' bytes, a bad loss scaler or optimizer state).
    """
    return read_parsed(path, _parse, "compressed model file")


def compressed_identity(record: CompressedRecord) -> dict:
    """What makes two compressed models the same network: layer shapes, pattern digest,
    precision, compute, activations and loss."""
    return {
        "layer_shapes": [tuple(int(n) for n in shape) for shape in record.shapes],
        "pattern": compressed_pattern(record.shapes, record.indices),
        "precision": record.precision,
        "compute": record.compute,
        "activation": record.activation,
        "output_activation": record.output_activation,
        "loss": record.loss,
    }


#: The checkpoint format of :class:`CompressedRecord` (``CompressedMLP``,
#: ``DistributedCompressedMLP``).
COMPRESSED_FILE = CheckpointFormat(write_compressed, read_compressed, compressed_identity)
