"""Shared fixtures: the read-only data beside the project, and a real Dask LocalCluster."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
OFFICIAL_1024 = SHARED / "data" / "graphchallenge" / "neuron1024"
MNIST_DIR = SHARED / "data" / "mnist"


@pytest.fixture(scope="session")
def official_1024_dir() -> Path:
    """The official 1024-neuron challenge network; skips when ``../shared`` is absent."""
    if not (OFFICIAL_1024 / "n1024-l1.tsv.gz").exists():
        pytest.skip("../shared/data/graphchallenge/neuron1024 is not available")
    return OFFICIAL_1024


@pytest.fixture(scope="session")
def shared_mnist_dir() -> Path:
    """The MNIST test set in ``../shared``; skips when absent."""
    if not (MNIST_DIR / "t10k-images-idx3-ubyte.gz").exists():
        pytest.skip("../shared/data/mnist is not available")
    return MNIST_DIR


@pytest.fixture(scope="session")
def dask_client():
    """A real ``distributed.LocalCluster`` (2 worker processes x 1 thread) and its client."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    )
    client = Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()
