"""Partition a network that does not fit in memory: :func:`partition_stream` runs the forward
sweep on an iterable of layers, appending each phase's parts to a temporary file renamed into
place at the end (docs/partitioning.md, "Networks that do not fit in memory").
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from graph._kernels import remote_pairs
from graph.atomic import check_output_path, write_atomically
from graph.backends import BACKENDS, MTKAHYPAR_PRESETS
from graph.baselines import block_parts, random_parts
from graph.checks import check_csr
from graph.floor import layer_volume_floor
from graph.multiphase import PhaseSettings, iter_phase_parts
from graph.network_partition import _FORMAT, NetworkPartition
from graph.partition import METHODS

__all__ = [
    "PhaseReport", "layer_report", "partition_layers", "partition_stream", "phase_reports_dict",
]

#: Most parts for which the report counts links in a dense table (16 MiB of flags at most).
_LINK_TABLE = 4096


@dataclass(frozen=True)
class PhaseReport:
    """What one phase of a streamed partition achieved, beside a random placement of its layer.

    Attributes
    ----------
    layer : int
        The layer (1-based).
    volume, messages : int
        Words and messages (forward plus backward) of the layer under the partition.
    random_volume, random_messages : int
        The same under a random balanced placement of the layer's inputs and outputs.
    floor : int
        :func:`graph.layer_volume_floor` of the layer.
    imbalance : float
        Largest part load over the mean (load: nonzeros of the neurons a part owns).
    seconds : float
        Time of the phase (hypergraph, solve and this report).
    """

    layer: int
    volume: int
    messages: int
    random_volume: int
    random_messages: int
    floor: int
    imbalance: float
    seconds: float

    @property
    def ratio(self) -> float:
        """``volume / random_volume`` (H/R); 0 when the random placement exchanges nothing."""
        return self.volume / self.random_volume if self.random_volume else 0.0


def _words_and_messages(
    layer: sp.csr_matrix, input_parts: np.ndarray, output_parts: np.ndarray, nparts: int
) -> tuple[int, int]:
    """Forward plus backward words and messages of one layer, as :func:`graph.partition_metrics`."""
    remote, links = remote_pairs(
        layer.indptr.astype(np.int64),
        layer.indices.astype(np.int64),
        np.asarray(input_parts, dtype=np.int64),
        np.asarray(output_parts, dtype=np.int64),
        nparts,
        nparts <= _LINK_TABLE,
    )
    return 2 * int(remote), 2 * int(links)


def layer_report(
    k: int,
    layer: sp.spmatrix,
    input_parts: np.ndarray,
    output_parts: np.ndarray,
    nparts: int,
    seed: int = 0,
    seconds: float = 0.0,
) -> PhaseReport:
    """Measure layer ``k`` under a partition and under a random balanced placement (seeded by
    ``(seed, k)``); cost: a few sorts of the layer's nonzeros."""
    layer = sp.csr_matrix(layer)
    volume, messages = _words_and_messages(layer, input_parts, output_parts, nparts)
    rng = np.random.default_rng((seed, k))
    random_in = rng.permutation(layer.shape[0]) % nparts
    random_out = rng.permutation(layer.shape[1]) % nparts
    random_volume, random_messages = _words_and_messages(layer, random_in, random_out, nparts)
    column_nnz = np.bincount(layer.indices, minlength=layer.shape[1])
    load = np.bincount(output_parts, weights=column_nnz, minlength=nparts)
    imbalance = float(load.max() / load.mean()) if load.sum() else 1.0
    return PhaseReport(
        k,
        volume,
        messages,
        random_volume,
        random_messages,
        layer_volume_floor(layer, nparts),
        imbalance,
        seconds,
    )


def _check_layer(k: int, layer: sp.spmatrix, nparts: int) -> None:
    if not sp.issparse(layer) or layer.ndim != 2:
        raise ValueError(f"layer {k} is not a 2-d scipy sparse matrix")
    check_csr(layer, name=f"layer {k}")
    smallest = min(layer.shape) if k == 1 else layer.shape[1]
    if nparts > smallest:
        raise ValueError(
            f"cannot split into {nparts} parts: layer {k} has only {smallest} neurons"
        )


def _checked(layers: Iterable[sp.spmatrix], nparts: int) -> Iterable[sp.spmatrix]:
    for k, layer in enumerate(layers, start=1):
        _check_layer(k, layer, nparts)
        yield layer


def _check_settings(nparts: int, epsilon: float, backend: str, preset: str, max_chunk: int) -> None:
    """``ValueError`` naming the first setting of a streamed partition that cannot be used."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown partitioning backend {backend!r}; choose one of {BACKENDS}")
    if preset not in MTKAHYPAR_PRESETS:
        raise ValueError(f"unknown Mt-KaHyPar preset {preset!r}; choose one of {MTKAHYPAR_PRESETS}")
    if int(nparts) < 1:
        raise ValueError(f"cannot split into {nparts} parts: need at least 1")
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon must lie in [0, 1), not {epsilon}")
    if max_chunk < 1:
        raise ValueError(f"max_chunk must be at least 1, not {max_chunk}")


def partition_layers(
    layers: Iterable[sp.spmatrix],
    nparts: int,
    method: str = "hypergraph",
    *,
    epsilon: float = 0.01,
    backend: str = "auto",
    seed: int = 0,
    preset: str = "DEFAULT",
    max_chunk: int = 16,
    exact_assignment: bool = True,
) -> NetworkPartition:
    """Partition a network whose layers come one at a time, holding one layer and the parts.

    The parts are those :func:`graph.partition_network` gives for the same layers and settings
    (without refinement); :func:`partition_stream` writes them to a file with a report instead.

    Parameters
    ----------
    layers : iterable of scipy.sparse matrices
        Layers ``(n_in, n_out)`` in order, not referenced after their phase.
    nparts : int
        Number of parts, at most the neurons of every layer.
    method : {"hypergraph", "random", "block"}
        As :func:`graph.partition_network`'s; ``random`` and ``block`` use only the sizes.
    epsilon, backend, seed, preset, max_chunk, exact_assignment
        As :func:`graph.partition_network`'s.

    Returns
    -------
    NetworkPartition
        Its ``parts`` are ``L + 1`` int64 arrays (``n`` words a neuron in memory).

    Raises
    ------
    ValueError
        On bad settings before any layer is read; on a bad layer (not sparse, fewer than
        ``nparts`` neurons, inputs not the previous outputs) when it is read.
    """
    if method not in METHODS:
        raise ValueError(f"unknown partitioning method {method!r}; choose one of {METHODS}")
    _check_settings(nparts, epsilon, backend, preset, max_chunk)
    nparts = int(nparts)
    start = time.perf_counter()
    if method == "hypergraph":
        settings = PhaseSettings(
            nparts, epsilon, seed, backend, preset, max_chunk, exact_assignment
        )
        parts = [p for _, _, p in iter_phase_parts(_checked(layers, nparts), settings)]
        info = {"backend": backend, "preset": preset, "epsilon": epsilon, "seed": seed,
                "max_chunk": max_chunk, "exact_assignment": exact_assignment, "streamed": True}
    else:
        sizes: list[int] = []
        for layer in _checked(layers, nparts):
            if sizes and layer.shape[0] != sizes[-1]:
                raise ValueError(
                    f"layer {len(sizes)} has {layer.shape[0]} inputs but layer {len(sizes) - 1} "
                    f"has {sizes[-1]} outputs"
                )
            sizes += [layer.shape[1]] if sizes else list(layer.shape)
        if not sizes:
            raise ValueError("the network has no layers")
        parts = random_parts(sizes, nparts, seed) if method == "random" else block_parts(
            sizes, nparts
        )
        info = {"seed": seed, "streamed": True} if method == "random" else {"streamed": True}
    if len(parts) < 2:
        raise ValueError("the network has no layers")
    return NetworkPartition(parts, nparts, method, time.perf_counter() - start, info)


def partition_stream(
    layers: Iterable[sp.spmatrix],
    nparts: int,
    *,
    parts_out: str | os.PathLike,
    epsilon: float = 0.01,
    backend: str = "auto",
    seed: int = 0,
    preset: str = "DEFAULT",
    max_chunk: int = 16,
    exact_assignment: bool = True,
    report: Callable[[PhaseReport], None] | None = None,
) -> list[PhaseReport]:
    """Partition a network layer by layer, keeping only the previous phase's parts in memory;
    the parts :func:`graph.partition_network` (hypergraph, no refinement) gives.

    Parameters
    ----------
    layers : iterable of scipy.sparse matrices
        Layers ``(n_in, n_out)``, one at a time (e.g.
        :func:`dasknn.datasets.radixnet.iter_radixnet`), not referenced after their phase.
    nparts : int
        Number of parts, at most the neurons of every layer.
    parts_out : str or os.PathLike
        The partition file (:func:`graph.save_partitions`'s format, ``int16`` parts when
        ``nparts <= 32767``), written when every phase is done.
    epsilon, backend, seed, preset, max_chunk, exact_assignment
        As :func:`graph.partition_network`'s.
    report : callable, optional
        Called with the :class:`PhaseReport` of every phase as soon as it is done.

    Returns
    -------
    list of PhaseReport
        One per layer.

    Raises
    ------
    ValueError
        On bad settings before any phase; on a bad layer (not sparse, fewer than ``nparts``
        neurons, inputs not the previous outputs) before its phase. No file is left behind.
    FileNotFoundError, IsADirectoryError
        Before any phase runs, if ``parts_out`` cannot be written.

    Notes
    -----
    Memory: one layer, its phase hypergraph and two part arrays. Disk: ``(L + 1) * n * 2`` bytes
    in a temporary file beside ``parts_out`` while the sweep runs.
    """
    _check_settings(nparts, epsilon, backend, preset, max_chunk)
    nparts = int(nparts)
    target = check_output_path(parts_out)
    if isinstance(layers, (list, tuple)):
        if not layers:
            raise ValueError("the network has no layers")
        for k, layer in enumerate(layers, start=1):
            _check_layer(k, layer, nparts)
            if k > 1 and layers[k - 2].shape[1] != layer.shape[0]:
                raise ValueError(
                    f"layer {k} has {layer.shape[0]} inputs but layer {k - 1} has "
                    f"{layers[k - 2].shape[1]} outputs"
                )
    dtype = np.dtype(np.int16 if nparts <= np.iinfo(np.int16).max else np.int32)
    settings = PhaseSettings(nparts, epsilon, seed, backend, preset, max_chunk, exact_assignment)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".parts")
    sizes: list[int] = []
    reports: list[PhaseReport] = []
    start = time.perf_counter()
    try:
        with os.fdopen(fd, "wb") as raw:
            previous = None
            tick = time.perf_counter()
            for k, layer, parts in iter_phase_parts(_checked(layers, nparts), settings):
                raw.write(parts.astype(dtype).tobytes())
                sizes.append(len(parts))
                if layer is not None:
                    row = layer_report(
                        k, layer, previous, parts, nparts, seed, time.perf_counter() - tick
                    )
                    reports.append(row)
                    if report is not None:
                        report(row)
                    tick = time.perf_counter()
                previous = parts
                del layer
        if not reports:
            raise ValueError("the network has no layers")
        info = {
            "backend": backend,
            "preset": preset,
            "epsilon": epsilon,
            "seed": seed,
            "max_chunk": max_chunk,
            "exact_assignment": exact_assignment,
            "streamed": True,
            "sweep_seconds": time.perf_counter() - start,
        }
        _write_partition_file(target, tmp, sizes, dtype, nparts, info, start)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return reports


def _write_partition_file(
    target: Path,
    raw_path: str,
    sizes: list[int],
    dtype: np.dtype,
    nparts: int,
    info: dict,
    start: float,
) -> None:
    """Turn the appended raw parts into a :func:`graph.save_partitions` file, array by array."""
    import zipfile

    meta = {
        "format": _FORMAT,
        "nparts": nparts,
        "method": "hypergraph",
        "seconds": time.perf_counter() - start,
        "info": info,
    }
    offsets = np.concatenate([[0], np.cumsum(sizes)]) * dtype.itemsize

    def write(handle) -> None:
        with open(raw_path, "rb") as raw, zipfile.ZipFile(
            handle, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True
        ) as archive:
            for k, size in enumerate(sizes):
                raw.seek(int(offsets[k]))
                array = np.frombuffer(raw.read(size * dtype.itemsize), dtype=dtype)
                with archive.open(f"P{nparts}_parts_{k}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, array, allow_pickle=False)
            blob = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
            with archive.open(f"P{nparts}_meta.npy", "w") as member:
                np.lib.format.write_array(member, blob, allow_pickle=False)

    write_atomically(target, write)


def phase_reports_dict(reports: list[PhaseReport]) -> list[dict]:
    """The reports as JSON-ready dictionaries."""
    return [asdict(row) | {"ratio": row.ratio} for row in reports]
