"""The file of an LSH-sampled model (:class:`~dasknn.sampled.SampledMLP`, and
:class:`~dasknn.sampled_parallel.DistributedSampledMLP` in the same format): one ``.npz``
archive with a JSON header, read without pickle.

Format ``"dasknn-sampled-model"``, version 1:

- ``header``: a 0-d unicode array holding a JSON object with ``"format"``, ``"version"``,
  ``params`` (every hyperparameter of the model but its optimizer), ``n_features``,
  ``n_labels``, ``n_steps`` (training steps taken), ``epochs`` (epochs trained),
  ``loss_curve``, ``optimizer`` (``{"name", "params"}``: the model's ``optimizer_``),
  ``hidden`` and ``shards`` (one object a shard: ``rebuilds``, the times its hash functions
  were drawn anew), each with ``states`` (``null`` before the first step, or
  ``{"weights": {"step", "arrays"}, "bias": {...}}``, the Adam state of the layer's arrays
  under the optimizer) and ``progress`` (``null``, or the training progress of a checkpoint,
  :class:`~dasknn.model.checkpoint.Progress`);
- ``hidden_weights`` ``(n_features, H)``, ``hidden_bias`` ``(H,)`` and the hidden optimizer
  state ``hidden_{weights|bias}_{array}``;
- per shard ``p`` (its neurons ``ShardMap.make(n_labels, shards, seed).ids(p)``, neuron-major):
  ``shard{p}_weights`` ``(n_p, H)``, ``shard{p}_bias`` ``(n_p,)``, its optimizer state
  ``shard{p}_{weights|bias}_{array}`` and its hash tables as the queries read them
  (``shard{p}_keys``, ``_key_ptr``, ``_bucket_ptr``, ``_items``: the tables of the weights of
  its last rehash, which the current weights do not rebuild).

Everything is checked before a model is built from it (:meth:`~dasknn.sampled.SampledMLP.load`):
the header's names and numbers, the hyperparameters (as the constructor checks them), every
array's shape, dtype and finiteness, the optimizer state against a fresh state of the same
optimizer, and the tables' layout (pointers in order and in range, keys sorted in each table,
items among the shard's neurons, buckets within their cap). A file that is not such an archive,
of a newer version, or with anything missing or inconsistent is a ``ValueError`` naming it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dasknn.model.checkpoint import CheckpointFormat
from dasknn.model.persistence import json_header, read_parsed
from dasknn.optim import (
    NONNEGATIVE_STATES,
    Optimizer,
    ParamState,
    optimizer_config,
    optimizer_from_config,
)
from graph.atomic import write_atomically

__all__ = [
    "SAMPLED_FILE",
    "SAMPLED_FORMAT",
    "SAMPLED_VERSION",
    "LayerRecord",
    "SampledRecord",
    "check_layer",
    "check_tables",
    "read_sampled",
    "sampled_identity",
    "write_sampled",
]

SAMPLED_FORMAT = "dasknn-sampled-model"
SAMPLED_VERSION = 1

#: The arrays of a layer that the optimizer steps, by their key in its state.
STATE_KEYS = ("weights", "bias")
#: The arrays of a shard's hash tables, in the order of ``HashTables.arrays()``.
TABLE_ARRAYS = ("keys", "key_ptr", "bucket_ptr", "items")


@dataclass
class LayerRecord:
    """The hidden layer, or one output shard, of a sampled model.

    Attributes
    ----------
    weights, bias : numpy.ndarray
        ``(n_features, H)`` and ``(H,)`` for the hidden layer; ``(n_p, H)`` neuron-major and
        ``(n_p,)`` for a shard.
    states : dict of str to ParamState, or None
        The optimizer state of ``"weights"`` and ``"bias"`` (``None`` before the first step).
    rebuilds : int
        A shard's hash-function draws after the first (0 for the hidden layer).
    tables : tuple of numpy.ndarray
        A shard's tables ``(keys, key_ptr, bucket_ptr, items)`` (empty for the hidden layer).
    """

    weights: np.ndarray
    bias: np.ndarray
    states: dict[str, ParamState] | None = None
    rebuilds: int = 0
    tables: tuple = ()


@dataclass
class SampledRecord:
    """Everything a sampled model file holds.

    Attributes
    ----------
    params : dict
        The hyperparameters of :class:`~dasknn.sampled.SampledMLP` but ``optimizer``.
    n_features, n_labels : int
    hidden : LayerRecord
    shards : list of LayerRecord
        In shard order.
    optimizer : Optimizer
        The model's ``optimizer_``, which the layers' ``states`` belong to.
    n_steps, epochs : int
    loss_curve : list of float
    progress : dict or None
        A checkpoint's training progress (:class:`~dasknn.model.checkpoint.Progress` as JSON).
    """

    params: dict
    n_features: int
    n_labels: int
    hidden: LayerRecord
    shards: list[LayerRecord]
    optimizer: Optimizer
    n_steps: int = 0
    epochs: int = 0
    loss_curve: list[float] = field(default_factory=list)
    progress: dict | None = None


def _states_header(states: dict[str, ParamState] | None) -> dict | None:
    if states is None:
        return None
    return {k: {"step": s.step, "arrays": sorted(s.arrays)} for k, s in states.items()}


def write_sampled(path: str | os.PathLike, record: SampledRecord) -> None:
    """Write ``record`` to the ``.npz`` file ``path`` atomically (all or nothing).

    Raises
    ------
    FileNotFoundError, IsADirectoryError
        If the directory of ``path`` does not exist or ``path`` is a directory.
    """
    arrays: dict[str, np.ndarray] = {}
    layers = [("hidden", record.hidden)] + [(f"shard{p}", s) for p, s in enumerate(record.shards)]
    for prefix, layer in layers:
        arrays[f"{prefix}_weights"], arrays[f"{prefix}_bias"] = layer.weights, layer.bias
        for key, state in (layer.states or {}).items():
            for name, values in state.arrays.items():
                arrays[f"{prefix}_{key}_{name}"] = values
        for name, values in zip(TABLE_ARRAYS, layer.tables, strict=False):
            arrays[f"{prefix}_{name}"] = values
    header = {
        "format": SAMPLED_FORMAT,
        "version": SAMPLED_VERSION,
        "params": record.params,
        "n_features": record.n_features,
        "n_labels": record.n_labels,
        "n_steps": record.n_steps,
        "epochs": record.epochs,
        "loss_curve": [float(v) for v in record.loss_curve],
        "optimizer": optimizer_config(record.optimizer),
        "hidden": {"states": _states_header(record.hidden.states)},
        "shards": [
            {"rebuilds": s.rebuilds, "states": _states_header(s.states)} for s in record.shards
        ],
        "progress": record.progress,
    }
    arrays["header"] = np.array(json.dumps(header))
    write_atomically(Path(path), lambda handle: np.savez(handle, **arrays))


def _count(value, name: str, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _states(stored, prefix: str, entry) -> dict[str, ParamState] | None:
    """The optimizer states of a layer as the header lists them (arrays checked later)."""
    if entry is None:
        return None
    if not isinstance(entry, dict) or set(entry) != set(STATE_KEYS):
        raise ValueError(f"the optimizer state of {prefix} must hold {list(STATE_KEYS)}")
    states = {}
    for key in STATE_KEYS:
        item = entry[key]
        if not isinstance(item, dict) or not isinstance(item.get("arrays"), list):
            raise ValueError(f"the optimizer state {prefix}_{key} must list its arrays")
        names = item["arrays"]
        if not all(isinstance(n, str) for n in names):
            raise ValueError(f"the optimizer state {prefix}_{key} must name its arrays")
        step = _count(item.get("step"), f"the step count of {prefix}_{key}")
        states[key] = ParamState(step, {n: stored[f"{prefix}_{key}_{n}"] for n in names})
    return states


def _parse(stored: dict[str, np.ndarray]) -> SampledRecord:
    if "header" not in stored or stored["header"].ndim != 0:
        raise ValueError("no header: not a dasknn sampled model file")
    header = json_header(
        stored["header"], SAMPLED_FORMAT, "a dasknn sampled model file", 1, SAMPLED_VERSION
    )
    params = header.get("params")
    if not isinstance(params, dict):
        raise ValueError(f"the hyperparameters must be a JSON object, got {params!r}")
    shards = header.get("shards")
    if not isinstance(shards, list) or not shards or not all(isinstance(s, dict) for s in shards):
        raise ValueError("the shards must be a non-empty list of JSON objects")
    hidden = header.get("hidden")
    if not isinstance(hidden, dict):
        raise ValueError("the hidden layer must be a JSON object")
    curve = header.get("loss_curve")
    if not isinstance(curve, list) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in curve
    ):
        raise ValueError("the loss curve must be a list of numbers")
    record = SampledRecord(
        params=params,
        n_features=_count(header.get("n_features"), "n_features", 1),
        n_labels=_count(header.get("n_labels"), "n_labels", 1),
        hidden=LayerRecord(
            stored["hidden_weights"],
            stored["hidden_bias"],
            _states(stored, "hidden", hidden.get("states")),
        ),
        shards=[
            LayerRecord(
                stored[f"shard{p}_weights"],
                stored[f"shard{p}_bias"],
                _states(stored, f"shard{p}", entry.get("states")),
                _count(entry.get("rebuilds"), f"the rebuilds of shard {p}"),
                tuple(stored[f"shard{p}_{name}"] for name in TABLE_ARRAYS),
            )
            for p, entry in enumerate(shards)
        ],
        optimizer=optimizer_from_config(header.get("optimizer")),
        n_steps=_count(header.get("n_steps"), "n_steps"),
        epochs=_count(header.get("epochs"), "epochs"),
        loss_curve=[float(v) for v in curve],
    )
    if header.get("progress") is not None and not isinstance(header["progress"], dict):
        raise ValueError("the training progress must be a JSON object")
    record.progress = header.get("progress")
    return record


def read_sampled(path: str | os.PathLike) -> SampledRecord:
    """Read a sampled model file written by :func:`write_sampled` (its entries; the values are
    checked against the hyperparameters by :meth:`~dasknn.sampled.SampledMLP.load`).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        Naming ``path``: not a sampled model file (not a zip archive, truncated, corrupt,
        another format), a newer format version, a missing entry or a malformed header.
    """
    return read_parsed(path, _parse, "sampled model file")


def sampled_identity(record: SampledRecord) -> dict:
    """What makes two sampled models the same network: every hyperparameter but the
    optimizer, and the input and output widths."""
    return {
        "params": dict(record.params),
        "n_features": record.n_features,
        "n_labels": record.n_labels,
    }


def check_layer(
    name: str, layer: LayerRecord, shape: tuple, bias: int, dtype: np.dtype, optimizer: Optimizer
) -> None:
    """``ValueError`` naming ``name`` unless the layer's weights have ``shape`` and its bias
    ``(bias,)``, both ``dtype``, every value is finite, and its optimizer state (if any) has
    the arrays, shapes and dtypes of a fresh state of ``optimizer`` (second moments >= 0)."""
    params = {"weights": (layer.weights, shape), "bias": (layer.bias, (bias,))}
    for key, (values, want) in params.items():
        if values.shape != want or values.dtype != dtype:
            raise ValueError(
                f"{name}_{key} has shape {values.shape} and dtype {values.dtype}, expected "
                f"{want} {dtype}"
            )
        if not np.isfinite(values).all():
            raise ValueError(f"{name}_{key} holds NaN or infinite values")
    for key, state in (layer.states or {}).items():
        fresh = optimizer.init_state(params[key][0])
        if set(state.arrays) != set(fresh.arrays):
            raise ValueError(
                f"the optimizer state {name}_{key} holds {sorted(state.arrays)}, expected "
                f"{sorted(fresh.arrays)}"
            )
        for array, values in state.arrays.items():
            want = fresh.arrays[array]
            if values.shape != want.shape or values.dtype != want.dtype:
                raise ValueError(
                    f"the optimizer state {name}_{key}_{array} has shape {values.shape} and "
                    f"dtype {values.dtype}, expected {want.shape} {want.dtype}"
                )
            if not np.isfinite(values).all() or (
                array in NONNEGATIVE_STATES and (values < 0).any()
            ):
                raise ValueError(f"the optimizer state {name}_{key}_{array} holds bad values")


def check_tables(name: str, tables: tuple, n_tables: int, n_items: int, cap: int) -> None:
    """``ValueError`` naming ``name`` unless ``tables`` are ``n_tables`` tables of ``n_items``
    items in the layout of :func:`dasknn.kernels.lsh.build_buckets`: int64 ``keys`` strictly
    increasing in each table, int64 pointers from 0 that never decrease and end at the lengths
    they index, int32 ``items`` in ``[0, n_items)``, at most ``cap`` a bucket."""
    keys, key_ptr, bucket_ptr, items = tables
    for array, kind in ((keys, np.int64), (key_ptr, np.int64), (bucket_ptr, np.int64),
                        (items, np.int32)):  # fmt: skip
        if array.ndim != 1 or array.dtype != kind:
            raise ValueError(f"{name}'s hash tables must be 1-D arrays of {np.dtype(kind)}")
    if key_ptr.shape[0] != n_tables + 1 or bucket_ptr.shape[0] != keys.shape[0] + 1:
        raise ValueError(f"{name}'s hash tables do not hold {n_tables} tables")
    for ptr, end in ((key_ptr, keys.shape[0]), (bucket_ptr, items.shape[0])):
        if ptr[0] != 0 or ptr[-1] != end or (np.diff(ptr) < 0).any():
            raise ValueError(f"{name}'s hash tables have pointers out of order or range")
    sizes = np.diff(bucket_ptr)
    if (sizes < 1).any() or (sizes > cap).any():
        raise ValueError(f"{name}'s hash tables have buckets empty or over their cap of {cap}")
    if items.size and (items.min() < 0 or items.max() >= n_items):
        raise ValueError(f"{name}'s hash tables hold items outside its {n_items} neurons")
    steps = np.diff(keys)
    starts = key_ptr[1:-1]
    inside = np.ones(steps.shape[0], dtype=bool)
    inside[starts[(starts > 0) & (starts <= steps.shape[0])] - 1] = False
    if (steps[inside] <= 0).any():
        raise ValueError(f"{name}'s hash tables have keys out of order")


#: The checkpoint format of :class:`SampledRecord` (``SampledMLP``, ``DistributedSampledMLP``).
SAMPLED_FILE = CheckpointFormat(write_sampled, read_sampled, sampled_identity)
