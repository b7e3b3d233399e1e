"""The file of an embedding model (:class:`~dasknn.model.EmbeddingMLP`): one ``.npz`` archive
with a JSON header, read without pickle.

Format ``"dasknn-embedding-model"``, version 1:

- ``header``: a 0-d unicode array holding a JSON object with ``"format"``, ``"version"``,
  ``spec`` (every field of :class:`~dasknn.model.embedding_network.EmbeddingSpec`),
  ``n_steps`` (training steps taken), ``optimizer`` (``null`` or ``{"name", "params",
  "states"}``, ``states`` a list of ``{"key", "step", "arrays"}``: the optimizer state of each
  variable stepped, its step count and the names of its arrays) and ``progress`` (``null``, or
  the training progress of a checkpoint, :class:`~dasknn.model.checkpoint.Progress`);
- ``embedding`` (V, d), per dense layer ``k`` (0-based, the output layer last) ``w{k}``
  ``(n_in, n_out)`` and ``b{k}``;
- the optimizer state: ``opt{i}_{name}`` for array ``name`` of the ``i``-th entry of
  ``states``.

Everything is checked before a model is built from it (by
:meth:`~dasknn.model.EmbeddingMLP.load`): the header's names and numbers, the spec (as the
constructor checks its arguments), every array's shape, dtype and finiteness, and the optimizer
state's keys, names, shapes, dtypes and values against a fresh state of the same optimizer. A
file that is not such an archive, of a newer version, or with anything missing or inconsistent
is a ``ValueError`` naming it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from dasknn.model.checkpoint import CheckpointFormat
from dasknn.model.persistence import json_header, read_parsed
from dasknn.optim import Optimizer, ParamState, optimizer_config, optimizer_from_config
from graph.atomic import write_atomically

__all__ = [
    "EMBEDDING_FILE",
    "EMBEDDING_FORMAT",
    "EMBEDDING_VERSION",
    "EmbeddingRecord",
    "embedding_identity",
    "spec_identity",
    "read_embedding",
    "write_embedding",
]

EMBEDDING_FORMAT = "dasknn-embedding-model"
EMBEDDING_VERSION = 1


@dataclass
class EmbeddingRecord:
    """Everything an embedding model file holds.

    Attributes
    ----------
    spec : dict
        The fields of the model's :class:`~dasknn.model.embedding_network.EmbeddingSpec`.
    embedding : numpy.ndarray (V, d)
    weights, biases : list of numpy.ndarray
        The dense layers, hidden ones first.
    n_steps : int
    optimizer : Optimizer or None
    states : dict of str to ParamState
        The optimizer state of every variable stepped, by the model's key.
    progress : dict or None
        A checkpoint's training progress (:class:`~dasknn.model.checkpoint.Progress` as JSON).
    """

    spec: dict
    embedding: np.ndarray
    weights: list[np.ndarray]
    biases: list[np.ndarray]
    n_steps: int = 0
    optimizer: Optimizer | None = None
    states: dict[str, ParamState] = field(default_factory=dict)
    progress: dict | None = None


def write_embedding(path: str | os.PathLike, record: EmbeddingRecord) -> None:
    """Write ``record`` to the ``.npz`` file ``path`` atomically (all or nothing).

    Raises
    ------
    FileNotFoundError, IsADirectoryError
        If the directory of ``path`` does not exist or ``path`` is a directory.
    """
    arrays: dict[str, np.ndarray] = {"embedding": record.embedding}
    for k, (w, b) in enumerate(zip(record.weights, record.biases, strict=True)):
        arrays[f"w{k}"], arrays[f"b{k}"] = w, b
    optimizer = None
    if record.optimizer is not None:
        states = []
        for i, (key, state) in enumerate(record.states.items()):
            states.append({"key": key, "step": state.step, "arrays": sorted(state.arrays)})
            for name, values in state.arrays.items():
                arrays[f"opt{i}_{name}"] = values
        optimizer = {**optimizer_config(record.optimizer), "states": states}
    header = {
        "format": EMBEDDING_FORMAT,
        "version": EMBEDDING_VERSION,
        "spec": record.spec,
        "n_steps": record.n_steps,
        "optimizer": optimizer,
        "progress": record.progress,
    }
    arrays["header"] = np.array(json.dumps(header))
    write_atomically(Path(path), lambda handle: np.savez(handle, **arrays))


def _count(value, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def _parse(stored: dict[str, np.ndarray]) -> EmbeddingRecord:
    if "header" not in stored or stored["header"].ndim != 0:
        raise ValueError("no header: not a dasknn embedding model file")
    header = json_header(
        stored["header"], EMBEDDING_FORMAT, "a dasknn embedding model file", 1, EMBEDDING_VERSION
    )
    spec = header.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("hidden"), list):
        raise ValueError(f"the spec must be a JSON object with a list of hidden widths: {spec!r}")
    layers = len(spec["hidden"]) + 1
    record = EmbeddingRecord(
        spec=spec,
        embedding=stored["embedding"],
        weights=[stored[f"w{k}"] for k in range(layers)],
        biases=[stored[f"b{k}"] for k in range(layers)],
        n_steps=_count(header.get("n_steps"), "n_steps"),
    )
    config = header.get("optimizer")
    if config is not None:
        if not isinstance(config, dict) or not isinstance(config.get("states"), list):
            raise ValueError("the optimizer must be a JSON object with a list of states")
        record.optimizer = optimizer_from_config(config)
        for i, entry in enumerate(config["states"]):
            if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
                raise ValueError(f"optimizer state {i} must name its variable")
            names = entry.get("arrays")
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ValueError(f"optimizer state {i} must list its arrays by name")
            step = _count(entry.get("step"), f"the step count of optimizer state {i}")
            arrays = {name: stored[f"opt{i}_{name}"] for name in names}
            record.states[entry["key"]] = ParamState(step=step, arrays=arrays)
    if header.get("progress") is not None and not isinstance(header["progress"], dict):
        raise ValueError("the training progress must be a JSON object")
    record.progress = header.get("progress")
    return record


def read_embedding(path: str | os.PathLike) -> EmbeddingRecord:
    """Read an embedding model file written by :func:`write_embedding` (its entries; the
    values are checked against the spec by :meth:`~dasknn.model.EmbeddingMLP.load`).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        Naming ``path``: not an embedding model file (not a zip archive, truncated, corrupt,
        another format), a newer format version, a missing entry or a malformed header.
    """
    return read_parsed(path, _parse, "embedding model file")


def embedding_identity(record: EmbeddingRecord) -> dict:
    """What makes two embedding models the same network: every field of the spec."""
    return {"spec": {**record.spec, "hidden": list(record.spec.get("hidden", []))}}


def spec_identity(spec) -> dict:
    """:func:`embedding_identity` of a model of the
    :class:`~dasknn.model.embedding_network.EmbeddingSpec` ``spec``."""
    fields = asdict(spec)
    return {"spec": {**fields, "hidden": list(fields["hidden"])}}


#: The checkpoint format of :class:`EmbeddingRecord` (``EmbeddingMLP``,
#: ``DistributedEmbeddingMLP``).
EMBEDDING_FILE = CheckpointFormat(write_embedding, read_embedding, embedding_identity)
