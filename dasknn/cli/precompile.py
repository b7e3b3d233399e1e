"""``dasknn precompile``: compile the CPU kernels into numba's on-disk cache.

Every numba kernel of dasknn is compiled on its first call in each process and kept in numba's
cache beside its module (``dasknn/kernels/__pycache__``, or ``NUMBA_CACHE_DIR``); a later
process with the same installation loads it in milliseconds. A fresh installation compiles
about 70 s of kernels (one core; the sampled model's LSH kernels are most of it) at the first
steps of its workers, each worker the kernels it runs. This command runs every mode's
one-process code paths on tiny problems, in ``float32`` and ``float64``, so that the workers of
a cluster started afterwards on the same installation (a shared file system under
dask-jobqueue, a container image) load the kernels instead of compiling them. It writes nothing
but numba's cache.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

import graph
from dasknn.datasets import make_extreme_classification, radixnet
from dasknn.datasets.tsv_parser import parse_triples
from dasknn.inference._cpu_inference import warm_kernel
from dasknn.kernels.cuda_inference import compact_layers
from dasknn.kernels.footprint_tiles import tile_layers
from dasknn.kernels.inference import pack_layers
from dasknn.model import DenseMLP, EmbeddingMLP, SparseMLP
from dasknn.pruning import magnitude_masks
from dasknn.sampled import SampledMLP
from graph.stream import layer_report

__all__ = ["WORKLOADS", "add_parser", "run"]

DTYPES = ("float32", "float64")


def _challenge(dtype: str) -> None:
    """The CPU engine's kernel, the host side of the tiled GPU kernel, the TSV parser."""
    warm_kernel(dtype)
    compact = compact_layers(pack_layers(radixnet(64, 2), np.dtype(dtype), groups=False))
    tile_layers(compact.indptr, compact.indices)
    parse_triples(b"1\t1\t1\n2\t2\t1\n")


def _model_parallel(dtype: str) -> None:
    """The training kernels and optimizers of a sparse MLP (MSE and softmax)."""
    rng = np.random.default_rng(0)
    x = rng.random((8, 64)).astype(dtype)
    y = np.eye(4, dtype=dtype)[rng.integers(0, 4, 8)]
    for loss in ("mse", "softmax_cross_entropy"):
        model = SparseMLP.radixnet(64, 2, loss=loss, dtype=np.dtype(dtype), n_outputs=4)
        model.fit(x, y, batch_size=4, epochs=1, lr=0.1, progress=False)


def _sampled(dtype: str) -> None:
    """The LSH (SimHash and DWTA) and sampled-layer kernels of a two-shard model."""
    data = make_extreme_classification(n_samples=64, n_features=50, n_labels=40, seed=0)
    for family in ("simhash", "dwta"):
        model = SampledMLP(hidden=8, active_fraction=0.25, hash_family=family, k=2, n_tables=4,
                           shards=2, dtype=dtype).initialize(50, 40)  # fmt: skip
        model.fit(data.X, data.Y, batch_size=16, epochs=1)


def _data_parallel(dtype: str) -> None:
    """The embedding and dense kernels of an embedding MLP (softmax and sampled)."""
    rng = np.random.default_rng(0)
    windows, targets = rng.integers(0, 30, (32, 3)), rng.integers(0, 30, 32)
    for output in ("softmax", "sampled"):
        model = EmbeddingMLP(30, 3, embed_dim=4, hidden=(8,), output=output, n_sampled=8,
                             dtype=dtype)  # fmt: skip
        model.fit(windows, targets, batch_size=16, epochs=1, lr=0.1)


def _pipeline(dtype: str) -> None:
    """The compressed-state kernels of a pruned network."""
    rng = np.random.default_rng(0)
    dense = DenseMLP.init([16, 8, 4], seed=0, dtype=np.dtype(dtype))
    pruned = dense.prune(magnitude_masks(dense.weights, 0.5))
    pruned.fit(rng.random((8, 16)).astype(dtype), rng.integers(0, 4, 8), batch_size=4,
               epochs=1, lr=0.1, progress=False)  # fmt: skip


def _partition(dtype: str) -> None:
    """The partitioner's kernels: net hashing, the swap search and the streamed report (once;
    they take no float data)."""
    if dtype != DTYPES[0]:
        return
    layers = radixnet(1024, 2)
    partition = graph.partition_network(layers, 256, exact_assignment=False)
    layer_report(2, layers[1], partition.parts[1], partition.parts[2], 256)


#: The workload of each mode, in the order a first run of the test suite meets them.
WORKLOADS: dict[str, Callable[[str], None]] = {
    "challenge": _challenge,
    "model-parallel": _model_parallel,
    "sampled": _sampled,
    "data-parallel": _data_parallel,
    "pipeline": _pipeline,
    "partition": _partition,
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``dasknn precompile``."""
    parser = subparsers.add_parser(
        "precompile",
        help="compile the CPU kernels into numba's cache for the processes started afterwards",
        description=(
            "Run every mode's one-process code paths on tiny problems in float32 and float64, "
            "so that numba's on-disk cache holds the compiled kernels and the workers started "
            "afterwards on this installation load them instead of compiling them."
        ),
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=tuple(WORKLOADS),
        default=tuple(WORKLOADS),
        help="the modes whose kernels to compile (default: all)",
    )
    parser.add_argument("--quiet", action="store_true", help="print nothing")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the workloads of ``args.modes``; print the seconds each took unless ``--quiet``."""
    for name in dict.fromkeys(args.modes):
        start = time.perf_counter()
        for dtype in DTYPES:
            WORKLOADS[name](dtype)
        if not args.quiet:
            print(f"{name}: {time.perf_counter() - start:.1f} s")
    return 0
