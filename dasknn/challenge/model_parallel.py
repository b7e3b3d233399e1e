"""Model-parallel Graph Challenge inference (H-SpFF): every layer split by neurons
(:func:`graph.partition_layers`) and run by :class:`dasknn.model_parallel.DistributedSparseMLP`
as ``min(max(Y @ W + b, 0), 32)``, equal to the challenge's for ``b <= 0``, so a positive bias is
refused (docs/challenge.md, "Model-parallel mode"). The network is read or generated a layer at a
time (a :class:`~dasknn.model.LayerSource`), so the client never holds it whole.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass

import numpy as np
import scipy.sparse as sp
from distributed import Client, Security
from tqdm.auto import tqdm

import graph
from dasknn.challenge.engine import network_source, prepare_inputs
from dasknn.challenge.network_checks import check_network
from dasknn.model import LayerSource
from dasknn.model.validation import check_float_dtype
from dasknn.model_parallel import DistributedSparseMLP, normalize_partition
from dasknn.runtime.cluster import open_client, scheduler_workers
from dasknn.runtime.step_timeout import DEFAULT_STEP_TIMEOUT, check_step_timeout

__all__ = [
    "ModelParallelRun", "ModelParallelStats", "check_model_parallel", "prepare_model_parallel",
    "run_challenge_model_parallel",
]

CLIP = 32.0
#: Batches of a run on the workers at once (one's messages travel while another computes).
IN_FLIGHT = 2


@dataclass
class ModelParallelStats:
    """What a model-parallel challenge run did and how fast.

    Attributes
    ----------
    inputs, neurons, layers, edges, categories : int
        Input rows, neurons per layer, layers, nonzeros of all layers, rows alive at the end.
    seconds : float
        Wall time of the inference (partitioning and placement apart).
    rate : float
        ``inputs * edges / seconds`` (edges per second).
    partition_seconds, placement_seconds : float
        Time to partition the network and to place its chunks on the workers.
    nparts, workers : int
        Parts of every layer and Dask workers holding them.
    method : str
        Partition method.
    measured_bytes, predicted_bytes : int
        Activation payload moved between workers, and the partition's prediction.
    batch_size : int
        Rows per batch.
    dtype : str
        ``float32`` or ``float64``.
    """

    inputs: int
    neurons: int
    layers: int
    edges: int
    categories: int
    seconds: float
    rate: float
    partition_seconds: float
    placement_seconds: float
    nparts: int
    workers: int
    method: str
    measured_bytes: int
    predicted_bytes: int
    batch_size: int
    dtype: str

    def as_dict(self) -> dict:
        """The statistics as a plain dictionary (for JSON)."""
        return asdict(self)

    def summary(self) -> str:
        """A few human-readable lines."""
        same = "equal" if self.measured_bytes == self.predicted_bytes else "DIFFERENT"
        return "\n".join(
            [
                f"network: {self.neurons} neurons x {self.layers} layers, {self.edges} edges; "
                f"{self.inputs} inputs, {self.categories} categories",
                f"time: {self.seconds:.3f} s, rate: {self.rate:.4g} edges/s (model-parallel, "
                f"{self.method} partition into {self.nparts} parts on {self.workers} workers, "
                f"batches of {self.batch_size}, {self.dtype})",
                f"partitioning {self.partition_seconds:.2f} s, placing the chunks "
                f"{self.placement_seconds:.2f} s",
                f"activations moved between workers: {self.measured_bytes:,} B measured, "
                f"{self.predicted_bytes:,} B predicted ({same})",
            ]
        )


def check_model_parallel(bias: float, width: int, nparts: int | None) -> None:
    """Raise ``ValueError`` when a model-parallel run cannot reproduce the challenge's layers."""
    if bias > 0:
        raise ValueError(
            f"model-parallel mode needs a bias <= 0 (got {bias}): only then does adding it to the "
            "nonzero entries alone equal adding it everywhere before the ReLU"
        )
    if nparts is not None and not 1 <= nparts <= width:
        raise ValueError(f"nparts must be between 1 and the {width} neurons, got {nparts}")


def run_challenge_model_parallel(
    network: str | os.PathLike | Sequence[sp.spmatrix],
    inputs: str | os.PathLike | sp.spmatrix | np.ndarray,
    bias: float | None = None,
    client: Client | str | None = None,
    *,
    nparts: int | None = None,
    method: str = "hypergraph",
    neurons: int | None = None,
    layers: int | None = None,
    seed: int = 0,
    batch_size: int = 1000,
    dtype: str | np.dtype | type = "float32",
    progress: bool = True,
    security: Security | bool | None = None,
    step_timeout: float = DEFAULT_STEP_TIMEOUT,
    partition: graph.NetworkPartition | str | os.PathLike | None = None,
) -> tuple[np.ndarray, ModelParallelStats]:
    """Run Graph Challenge inference with every layer split by neurons across the workers.

    Parameters
    ----------
    network, inputs, bias, neurons, layers, seed, dtype
        As for :func:`dasknn.challenge.run_challenge`; ``bias`` must be <= 0.
    client : distributed.Client or str, optional
        The cluster; by default a LocalCluster with one single-threaded worker per core.
    nparts : int, optional
        Parts of every layer (default: one per worker).
    method : ``"hypergraph"``, ``"random"`` or ``"block"``
        Partition method of :func:`graph.partition_layers` (that of
        :func:`graph.partition_network`).
    batch_size : int
        Input rows per forward pass.
    progress : bool
        Show a progress bar over batches.
    security : distributed.Security or bool, optional
        TLS for the client opened here, as for :func:`dasknn.challenge.run_challenge`.
    step_timeout : float
        The ``step_timeout`` of :class:`dasknn.model_parallel.DistributedSparseMLP`.
    partition : graph.NetworkPartition, str or os.PathLike, optional
        A partition of this network to use instead of partitioning it: a
        :class:`graph.NetworkPartition` or a file of :func:`graph.save_partitions` (as
        ``dasknn partition --stream`` writes), whose partition into ``nparts`` parts is taken
        (the only one when ``nparts`` is not given); ``method`` is then the partition's.

    Returns
    -------
    categories : int64 array
        Sorted 1-based ids of the input rows that are not all zero at the end.
    stats : ModelParallelStats

    Raises
    ------
    ValueError
        On inconsistent layers or inputs, a positive bias, an impossible part count or a
        partition that does not fit the network, before any work is scheduled.
    FileNotFoundError
        For a network directory, input file or partition file that does not exist.

    Notes
    -----
    The layers are made (read from the directory, generated, or taken from the sequence) four
    times, one at a time (three with a ``partition``): to check them, to partition them, to
    renumber them and to place them on the workers. The client holds at most two layers, the
    parts of every layer and the communication plan; the workers hold the network.
    """
    step_timeout = check_step_timeout(step_timeout)
    prepared = prepare_model_parallel(
        network, inputs, bias, nparts=nparts, method=method, neurons=neurons, layers=layers,
        seed=seed, batch_size=batch_size, dtype=dtype, partition=partition,
    )  # fmt: skip
    with ExitStack() as stack:
        client = open_client(stack, client, security=security)
        return prepared.run(client, progress=progress, step_timeout=step_timeout)


@dataclass(frozen=True)
class ModelParallelRun:
    """A checked model-parallel challenge run, ready for a cluster (:func:`prepare_model_parallel`):
    the network as a :class:`~dasknn.model.LayerSource`, its ``edges``, the input rows (CSR), the
    bias, the run's options and the partition given (``None``: made by :meth:`run`)."""

    source: LayerSource
    edges: int
    inputs: sp.csr_matrix
    bias: float
    nparts: int | None
    method: str
    seed: int
    batch_size: int
    partition: graph.NetworkPartition | None = None

    def run(
        self, client: Client, *, progress: bool = True, step_timeout: float = DEFAULT_STEP_TIMEOUT
    ) -> tuple[np.ndarray, ModelParallelStats]:
        """Partition, place and run the batches on ``client``'s workers (``nparts`` defaults to
        one part per worker); ``(categories, stats)`` as :func:`run_challenge_model_parallel`.
        ``ValueError`` when the cluster has no workers or fewer neurons than parts."""
        n_workers = len(scheduler_workers(client))
        if n_workers == 0:
            raise ValueError("the cluster has no workers")
        nparts = self.partition.nparts if self.partition else self.nparts or n_workers
        check_model_parallel(self.bias, self.source.n_inputs, nparts)
        return _run(client, self, nparts, n_workers, progress, step_timeout)


def prepare_model_parallel(
    network: str | os.PathLike | Sequence[sp.spmatrix],
    inputs: str | os.PathLike | sp.spmatrix | np.ndarray,
    bias: float | None = None,
    *,
    nparts: int | None = None,
    method: str = "hypergraph",
    neurons: int | None = None,
    layers: int | None = None,
    seed: int = 0,
    batch_size: int = 1000,
    dtype: str | np.dtype | type = "float32",
    partition: graph.NetworkPartition | str | os.PathLike | None = None,
) -> ModelParallelRun:
    """Check a model-parallel run before any cluster is touched, reading the network once a
    layer at a time; parameters as :func:`run_challenge_model_parallel`'s.

    Raises
    ------
    ValueError, FileNotFoundError
        Naming the bad option, layer or input, the positive bias or the impossible part count.
    """
    dtype = check_float_dtype(dtype)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if method not in graph.METHODS:
        raise ValueError(f"unknown partitioning method {method!r}; choose one of {graph.METHODS}")
    make = network_source(network, neurons, layers, seed, dtype)  # layers made as dtype values
    # the check reads a directory's or spec's values as float64, so it can name one beyond dtype
    as_read = network_source(network, neurons, layers, seed) if _is_path(network) else make
    checked = check_network(as_read(), dtype, tiled=False)
    matrix, bias = prepare_inputs(inputs, bias, checked.width)
    check_model_parallel(bias, checked.width, nparts)
    if partition is not None:
        partition = _given_partition(partition, nparts, [checked.width] * (checked.layers + 1))
        nparts = partition.nparts
    source = LayerSource(
        make,
        [(checked.width, checked.width)] * checked.layers,
        biases=lambda k: np.full(checked.width, bias),
        activation="clipped_relu",
        loss="mse",
        dtype=dtype,
    )
    return ModelParallelRun(
        source, checked.edges, matrix, bias, nparts, method, seed, batch_size, partition
    )


def _is_path(network) -> bool:
    """Whether ``network`` names a directory or a spec (else it is a sequence of matrices)."""
    return isinstance(network, str | os.PathLike)


def _given_partition(partition, nparts: int | None, sizes: list[int]) -> graph.NetworkPartition:
    """The partition to use of ``partition`` (a ``NetworkPartition`` or a partition file), checked
    against the layer ``sizes``; ``ValueError`` naming the mismatch."""
    if not isinstance(partition, graph.NetworkPartition):
        found = graph.load_partitions(partition)
        if nparts is None and len(found) > 1:
            raise ValueError(
                f"{os.fspath(partition)!r} holds partitions into {sorted(found)} parts: choose "
                "one with nparts"
            )
        chosen = nparts if nparts is not None else next(iter(found))
        if chosen not in found:
            raise ValueError(
                f"{os.fspath(partition)!r} holds no partition into {chosen} parts, only "
                f"{sorted(found)}"
            )
        partition = found[chosen]
    elif nparts is not None and nparts != partition.nparts:
        raise ValueError(f"nparts {nparts} differs from the partition's {partition.nparts}")
    normalize_partition(partition, sizes)
    return partition


def _run(
    client, prepared: ModelParallelRun, nparts: int, n_workers: int, progress: bool,
    step_timeout: float,
) -> tuple[np.ndarray, ModelParallelStats]:  # fmt: skip
    source, matrix, method = prepared.source, prepared.inputs, prepared.method
    batch_size = prepared.batch_size
    start = time.perf_counter()
    partition = prepared.partition
    if partition is None:
        partition = graph.partition_layers(
            source.iter_weights(), nparts, method=method, seed=prepared.seed
        )
    method = partition.method
    partition_seconds = time.perf_counter() - start
    start = time.perf_counter()
    dist = DistributedSparseMLP(source, client, partition=partition, step_timeout=step_timeout)
    placement_seconds = time.perf_counter() - start
    try:
        alive = np.zeros(matrix.shape[0], dtype=bool)
        # Densify IN_FLIGHT batches at a time; predict keeps them all in flight on the workers.
        step = batch_size * IN_FLIGHT
        starts = range(0, matrix.shape[0], step)
        start = time.perf_counter()
        for first in tqdm(
            starts, desc="challenge (model-parallel)", unit="block", disable=not progress
        ):
            block = matrix[first : first + step].toarray()
            out = dist.predict(block, batch_size=batch_size, in_flight=IN_FLIGHT)
            alive[first : first + block.shape[0]] = np.any(out != 0, axis=1)
        seconds = time.perf_counter() - start
        report = dist.comm_report()
    finally:
        dist.close()
    categories = np.flatnonzero(alive) + 1
    stats = ModelParallelStats(
        inputs=matrix.shape[0],
        neurons=source.n_inputs,
        layers=source.n_layers,
        edges=prepared.edges,
        categories=len(categories),
        seconds=seconds,
        rate=matrix.shape[0] * prepared.edges / seconds if seconds > 0 else float("inf"),
        partition_seconds=partition_seconds,
        placement_seconds=placement_seconds,
        nparts=nparts,
        workers=n_workers,
        method=method,
        measured_bytes=report.total(),
        predicted_bytes=report.total("predicted"),
        batch_size=batch_size,
        dtype=source.dtype.name,
    )
    return categories, stats
