"""A training step of every mode touches no large memory afresh, also without the malloc setting
(``reuse_memory=False``) on a cluster of Dask's defaults, whose nannies set
``MALLOC_TRIM_THRESHOLD_``: there every array above glibc's 128 KiB mmap threshold that a step
makes anew is mapped and faulted in page by page again. The workers' minor page faults are
counted over the steps of each of two ``fit`` calls after a warm-up one."""

from __future__ import annotations

import resource
import sys

import numpy as np
import pytest
from distributed import Client, LocalCluster

from dasknn import (
    DistributedCompressedMLP,
    DistributedEmbeddingMLP,
    DistributedSampledMLP,
    DistributedSparseMLP,
)
from dasknn.datasets import make_extreme_classification
from dasknn.model import DenseMLP, EmbeddingMLP, SparseMLP
from dasknn.pruning import magnitude_masks
from dasknn.sampled import SampledMLP

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and rusage"),
]

BATCH, STEPS = 256, 20
PAGE = resource.getpagesize()
#: What a step may fault in a worker beyond the inputs Dask delivers it: Dask's own messages,
#: Python's small objects and the fit call's fixed costs shared by its steps. The arrays the
#: steps used to make anew came to 1.8-5.2 MiB a worker and step.
ALLOWANCE = 512 * 2**10


def _minor_faults(dask_worker=None) -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _mode(name: str):
    """``(make(client) -> model, X, y, fit keywords, bytes of the inputs Dask delivers a worker
    a step at most)``; the arrays of a step are of 256 KiB to 1 MiB."""
    rng = np.random.default_rng(0)
    rows = BATCH * STEPS
    x = rng.random((rows, 1024), dtype=np.float32)
    fit = {"batch_size": BATCH, "epochs": 1, "shuffle": False}
    if name == "model-parallel":
        model = SparseMLP.radixnet(neurons=1024, layers=4, n_outputs=10, activation="relu",
                                   loss="softmax_cross_entropy", scale="he", dtype=np.float32,
                                   seed=0)  # fmt: skip
        y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, rows)]
        make = lambda c: DistributedSparseMLP(model, c, reuse_memory=False)  # noqa: E731
        # every part's columns of the fit call's inputs, scattered once for its steps
        return make, x, y, {**fit, "lr": 0.01, "progress": False}, x[:BATCH].nbytes
    if name == "data-parallel":
        model = EmbeddingMLP(8192, 3, embed_dim=64, hidden=(128,))
        make = lambda c: DistributedEmbeddingMLP(  # noqa: E731
            model, c, sparse_partitions=2, reuse_memory=False
        )
        words = rng.integers(0, 8192, (rows, 3))
        return make, words, rng.integers(0, 8192, rows), {**fit, "lr": 0.1}, 0
    if name == "pipeline":
        dense = DenseMLP.init([1024, 300, 100, 10], seed=0)
        pruned = dense.prune(magnitude_masks(dense.weights, 0.9))
        make = lambda c: DistributedCompressedMLP(  # noqa: E731
            pruned, c, stages=2, microbatches=2, reuse_memory=False
        )
        # the fit call's inputs, scattered once to the first stage for its steps
        fit = {**fit, "lr": 0.05, "progress": False}
        return make, x, rng.integers(0, 10, rows), fit, x[:BATCH].nbytes
    data = make_extreme_classification(n_samples=rows, n_features=2000, n_labels=5000, seed=0)
    # no rehash within the fit: the step, not the periodic rebuild of the tables
    sampled = SampledMLP(hidden=64, active_fraction=0.05, shards=2, rehash_every=1000)
    make = lambda c: DistributedSampledMLP(  # noqa: E731
        sampled.initialize(2000, 5000), c, reuse_memory=False
    )
    return make, data.X, data.Y, fit, 0


@pytest.mark.parametrize("name", ["model-parallel", "data-parallel", "pipeline", "sampled"])
def test_a_step_faults_in_no_large_array_without_the_malloc_setting(name):
    make, x, y, fit, scattered = _mode(name)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster,
        Client(cluster) as client,
        make(client) as model,
    ):
        model.fit(x, y, **fit)  # warm-up: kernels, plans, the pools' arrays
        counts = [client.run(_minor_faults)]
        for _ in range(2):
            model.fit(x, y, **fit)
            counts.append(client.run(_minor_faults))
    # the fewer of two fits: a pool may still grow once where a loaded machine runs more steps
    # at once than in the warm-up (the data-parallel steps a task follow their time)
    per_step = {
        w: min(b[w] - a[w] for a, b in zip(counts, counts[1:], strict=False)) * PAGE / STEPS
        for w in counts[0]
    }
    assert max(per_step.values()) <= scattered + ALLOWANCE, per_step
