"""The result of partitioning a network: one part array per layer, with save/load and metrics."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from graph.atomic import write_atomically
from graph.metrics import PartitionMetrics, partition_metrics

__all__ = ["NetworkPartition", "load_partitions", "save_partitions"]

_FORMAT = "dasknn-network-partition-1"


@dataclass
class NetworkPartition:
    """A partition of every layer of a network.

    Attributes
    ----------
    parts : list of numpy.ndarray
        ``parts[k][j]`` is the part that owns neuron ``j`` of layer ``k``; ``k = 0`` are the input
        features, ``k = 1 .. L`` the outputs of the stored ``layers[k-1]``.
    nparts : int
    method : str
        How it was made (``hypergraph``, ``random``, ``block``).
    seconds : float
        Time spent partitioning.
    info : dict
        Further facts about the run (backend, sweeps, refinement gain, ...), JSON-serialisable.
    layers : list of scipy.sparse matrices, optional
        The network it partitions (kept in memory only, not saved).
    """

    parts: list[np.ndarray]
    nparts: int
    method: str = "hypergraph"
    seconds: float = 0.0
    info: dict = field(default_factory=dict)
    layers: Sequence[sp.spmatrix] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.parts = [np.asarray(p, dtype=np.int64) for p in self.parts]
        if self.nparts < 1:
            raise ValueError(f"a partition needs at least one part, not {self.nparts}")
        for k, p in enumerate(self.parts):
            if p.ndim != 1:
                raise ValueError(f"parts[{k}] must be one-dimensional")
            if len(p) and (p.min() < 0 or p.max() >= self.nparts):
                raise ValueError(f"parts[{k}] holds part ids outside 0..{self.nparts - 1}")

    @property
    def num_layers(self) -> int:
        """Number of weight layers (``len(parts) - 1``)."""
        return len(self.parts) - 1

    def metrics(self, layers: Sequence[sp.spmatrix] | None = None) -> PartitionMetrics:
        """Volume, messages, load and imbalance of this partition on ``layers``.

        Parameters
        ----------
        layers : list of scipy.sparse matrices, optional
            The network; defaults to the one the partition was made for.
        """
        layers = self.layers if layers is None else layers
        if layers is None:
            raise ValueError("this partition holds no layers; pass the network to metrics()")
        if len(layers) != self.num_layers:
            raise ValueError(
                f"the network has {len(layers)} layers, the partition {self.num_layers}"
            )
        for k, layer in enumerate(layers, start=1):
            if layer.shape != (len(self.parts[k - 1]), len(self.parts[k])):
                raise ValueError(
                    f"layer {k} of shape {layer.shape} does not match the partition, which has "
                    f"{len(self.parts[k - 1])} x {len(self.parts[k])} neurons there"
                )
        return partition_metrics(layers, self.parts, self.nparts)

    def save(self, path: str | os.PathLike) -> None:
        """Write the partition to an ``.npz`` file atomically (no partial file on error)."""
        save_partitions(path, {self.nparts: self})

    @classmethod
    def load(cls, path: str | os.PathLike) -> NetworkPartition:
        """Read a file written by :meth:`save` (it must hold exactly one partition)."""
        partitions = load_partitions(path)
        if len(partitions) != 1:
            raise ValueError(
                f"{path} holds partitions for P = {sorted(partitions)}; use load_partitions()"
            )
        return next(iter(partitions.values()))


def save_partitions(path: str | os.PathLike, partitions: Mapping[int, NetworkPartition]) -> None:
    """Write several partitions (keyed by part count) to one ``.npz`` file, atomically: arrays
    ``P{nparts}_parts_{k}`` (``k = 0 .. L``) and ``P{nparts}_meta`` (JSON bytes).

    Parameters
    ----------
    path : str or os.PathLike
        The file, replaced whole (unchanged on an error).
    partitions : mapping of int to NetworkPartition
        The partitions by their part count.

    Raises
    ------
    ValueError
        If a key is not its partition's ``nparts``.
    FileNotFoundError, IsADirectoryError
        If the directory of ``path`` does not exist or ``path`` is a directory.
    """
    arrays: dict[str, np.ndarray] = {}
    for nparts, partition in partitions.items():
        if nparts != partition.nparts:
            raise ValueError(f"key {nparts} does not match a partition into {partition.nparts}")
        for k, parts in enumerate(partition.parts):
            arrays[f"P{nparts}_parts_{k}"] = parts
        meta = {
            "format": _FORMAT,
            "nparts": partition.nparts,
            "method": partition.method,
            "seconds": partition.seconds,
            "info": partition.info,
        }
        arrays[f"P{nparts}_meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    write_atomically(path, lambda handle: np.savez_compressed(handle, **arrays))


def load_partitions(path: str | os.PathLike) -> dict[int, NetworkPartition]:
    """Read every partition of a file written by :func:`save_partitions`.

    Parameters
    ----------
    path : str or os.PathLike
        A file written by :func:`save_partitions` (or :meth:`NetworkPartition.save`).

    Returns
    -------
    dict of int to NetworkPartition
        The partitions by their part count.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        Naming ``path``, if it is not a partition file or holds no partition.
    """
    try:
        with np.load(path) as data:
            metas = {
                name: json.loads(bytes(data[name]).decode())
                for name in data.files
                if name.endswith("_meta")
            }
            result = {}
            for name, meta in metas.items():
                if meta.get("format") != _FORMAT:
                    raise ValueError("unknown format")
                prefix = name[: -len("meta")]
                count = sum(1 for key in data.files if key.startswith(prefix + "parts_"))
                parts = [data[f"{prefix}parts_{k}"] for k in range(count)]
                nparts = int(meta["nparts"])
                result[nparts] = NetworkPartition(
                    parts, nparts, meta["method"], float(meta["seconds"]), meta["info"]
                )
    except FileNotFoundError:
        raise
    except (KeyError, OSError, ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a dasknn network partition file ({exc})") from None
    if not result:
        raise ValueError(f"{path}: not a dasknn network partition file (no partition in it)")
    return result
