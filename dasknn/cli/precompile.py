"""``dasknn precompile``: compile the CPU kernels into numba's on-disk cache.

Every numba kernel of dasknn is compiled on its first call in each process and kept in numba's
cache beside its module (``dasknn/kernels/__pycache__``, or ``NUMBA_CACHE_DIR``); a later
process with the same installation loads it in milliseconds. A fresh installation compiles
about two minutes of kernels (on two cores) at the first steps of its workers, each worker the
kernels it runs. This command runs every mode's one-process code paths on tiny problems, in
``float32`` and ``float64``, so that the workers of a cluster started afterwards on the same
installation (a shared file system under dask-jobqueue, a container image) load the kernels
instead of compiling them. It writes nothing but numba's cache.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

__all__ = ["WORKLOADS", "add_parser", "run"]

DTYPES = ("float32", "float64")


def _challenge(dtype: str) -> None:
    from dasknn.inference._cpu_inference import warm_kernel

    warm_kernel(dtype)


def _footprint_tiles(dtype: str) -> None:
    from dasknn.datasets import radixnet
    from dasknn.kernels.cuda_inference import compact_layers
    from dasknn.kernels.footprint_tiles import tile_layers
    from dasknn.kernels.inference import pack_layers

    compact = compact_layers(pack_layers(radixnet(64, 2), np.dtype(dtype)))
    tile_layers(compact.indptr, compact.indices)


def _model_parallel(dtype: str) -> None:
    from dasknn.model import SparseMLP

    rng = np.random.default_rng(0)
    x = rng.random((8, 64)).astype(dtype)
    y = np.eye(4, dtype=dtype)[rng.integers(0, 4, 8)]
    for loss in ("mse", "softmax_cross_entropy"):
        model = SparseMLP.radixnet(64, 2, loss=loss, dtype=np.dtype(dtype), n_outputs=4)
        model.fit(x, y, batch_size=4, epochs=1, lr=0.1, progress=False)


def _sampled(dtype: str) -> None:
    from dasknn.datasets import make_extreme_classification
    from dasknn.sampled import SampledMLP

    data = make_extreme_classification(n_samples=64, n_features=50, n_labels=40, seed=0)
    for family in ("simhash", "dwta"):
        model = SampledMLP(hidden=8, active_fraction=0.25, hash_family=family, k=2, n_tables=4,
                           shards=2, dtype=dtype).initialize(50, 40)  # fmt: skip
        model.fit(data.X, data.Y, batch_size=16, epochs=1)


def _embedding(dtype: str) -> None:
    from dasknn.model import EmbeddingMLP

    rng = np.random.default_rng(0)
    windows, targets = rng.integers(0, 30, (32, 3)), rng.integers(0, 30, 32)
    for output in ("softmax", "sampled"):
        model = EmbeddingMLP(30, 3, embed_dim=4, hidden=(8,), output=output, n_sampled=8,
                             dtype=dtype)  # fmt: skip
        model.fit(windows, targets, batch_size=16, epochs=1, lr=0.1)


def _compressed(dtype: str) -> None:
    from dasknn.model import DenseMLP
    from dasknn.pruning import magnitude_masks

    rng = np.random.default_rng(0)
    dense = DenseMLP.init([16, 8, 4], seed=0, dtype=np.dtype(dtype))
    pruned = dense.prune(magnitude_masks(dense.weights, 0.5))
    pruned.fit(rng.random((8, 16)).astype(dtype), rng.integers(0, 4, 8), batch_size=4,
               epochs=1, lr=0.1, progress=False)  # fmt: skip


def _tsv(dtype: str) -> None:
    from dasknn.datasets.tsv_parser import parse_triples

    parse_triples(b"1\t1\t1\n2\t2\t1\n")


#: ``(name, workload)`` in the order a first run of the test suite meets them.
WORKLOADS: tuple[tuple[str, Callable[[str], None]], ...] = (
    ("challenge", _challenge),
    ("footprint tiles", _footprint_tiles),
    ("model-parallel", _model_parallel),
    ("sampled", _sampled),
    ("embedding", _embedding),
    ("compressed", _compressed),
    ("tsv", _tsv),
)


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
    parser.add_argument("--quiet", action="store_true", help="print nothing")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run :data:`WORKLOADS`; print the seconds each took unless ``--quiet``."""
    for name, workload in WORKLOADS:
        start = time.perf_counter()
        for dtype in DTYPES:
            workload(dtype)
        if not args.quiet:
            print(f"{name}: {time.perf_counter() - start:.1f} s")
    return 0
