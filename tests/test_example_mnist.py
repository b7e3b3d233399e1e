"""examples/mnist_sparse.py learns: on a small slice in one process and model-parallel on two Dask
workers with a hypergraph partition (the same steps, so the same curve), and (slow, full training
runs) on the full split in one process and on two workers with a hypergraph partition (accuracy
>= 0.90; the two-worker run takes about 2 minutes here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "mnist_sparse.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("mnist_sparse_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def quiet(*_args):
    """Discard the example's log lines."""


SLICE = dict(layers=2, epochs=3, batch_size=64, lr=0.2, n_train=640, n_test=400, progress=False)


def test_learns_on_a_slice_in_one_process_and_on_two_workers(example):
    single = example.run(workers=0, log=quiet, **SLICE)
    assert single.losses[-1] < 0.6 * single.losses[0]
    assert single.accuracies[-1] > 0.4  # chance is 0.1
    dist = example.run(workers=2, method="hypergraph", log=quiet, **SLICE)
    # Model-parallel training performs the same SGD steps: the same curve up to float32 rounding.
    np.testing.assert_allclose(dist.losses, single.losses, rtol=1e-4)
    assert abs(dist.accuracies[-1] - single.accuracies[-1]) <= 0.01
    assert "(equal)" in dist.comm


@pytest.mark.slow
def test_full_split_in_one_process_reaches_090(example):
    result = example.run(workers=0, log=quiet, progress=False)
    assert result.losses == sorted(result.losses, reverse=True)
    assert result.accuracies[-1] >= 0.90


@pytest.mark.slow
def test_full_split_on_two_workers_with_hypergraph_partition_reaches_090(example):
    result = example.run(workers=2, method="hypergraph", log=quiet, progress=False)
    assert result.accuracies[-1] >= 0.90


def test_bad_split_is_rejected(example):
    with pytest.raises(ValueError, match="train \\+ test"):
        example.load_split(9000, 2000, "binary")
    with pytest.raises(ValueError, match="inputs must be"):
        example.mnist_inputs(np.zeros((1, 28, 28), dtype=np.uint8), "colour")
