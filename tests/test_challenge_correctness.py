"""Graph Challenge inference against an independent float64 scipy reference.

The reference below shares no code with dasknn's kernel: it multiplies the transposed layer (scipy
CSR) with the dense live activations in float64, adds the bias where the product is nonzero, applies
ReLU and the clip, and drops dead rows. To keep the full-MNIST case fast it computes each *distinct*
live row once (rows whose activations are bitwise equal have equal fates, and the MNIST rows that
survive saturate to the same vector), which changes no value.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from dasknn.challenge import run_challenge
from dasknn.datasets import (
    load_mnist_test,
    mnist_to_challenge_inputs,
    radixnet,
    read_challenge_network,
)
from dasknn.kernels.inference import advance, live_activations, live_rows, pack_layers, start_batch
from dasknn.runtime.cluster import scheduler_workers

pytestmark = pytest.mark.minversions  # also run at the minimum versions (.ci/run)


def _distinct(features_by_row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct columns of ``features_by_row`` (N, m) and the group of every column.

    Columns are bucketed by a random projection, and a column joins its bucket's first column only
    when it is bitwise equal to it, so a hash collision never merges two different rows.
    """
    cols = np.ascontiguousarray(features_by_row.T)
    key = cols @ np.random.default_rng(0).random(cols.shape[1])
    _, first, bucket = np.unique(key, return_index=True, return_inverse=True)
    candidate = first[bucket.ravel()]
    same = (cols == cols[candidate]).all(axis=1)
    leader = np.where(same, candidate, np.arange(cols.shape[0]))
    reps, group = np.unique(leader, return_inverse=True)
    return features_by_row[:, reps], group.ravel()


def reference_challenge(inputs, layers, bias: float, ymax: float = 32.0):
    """Float64 reference: (sorted 1-based categories, their final activations row by row)."""
    inputs = sp.csr_matrix(inputs, dtype=np.float64)
    owner = np.flatnonzero(np.diff(inputs.indptr))
    y, group = _distinct(inputs[owner].toarray().T)
    for w in layers:
        z = sp.csr_matrix(sp.csr_matrix(w, dtype=np.float64).T) @ y
        z[z != 0] += bias
        np.clip(z, 0.0, ymax, out=z)
        alive = z.any(axis=0)
        keep = alive[group]
        owner = owner[keep]
        y, regroup = _distinct(z[:, alive])
        group = regroup[np.cumsum(alive)[group[keep]] - 1]
    return owner + 1, y.T[group]


@pytest.fixture(scope="module")
def client(dask_client):
    """The two-worker LocalCluster every test module shares (conftest's ``dask_client``)."""
    return dask_client


@pytest.fixture(scope="module")
def mnist_images() -> np.ndarray:
    return load_mnist_test()[0]


def test_reference_matches_dense_numpy():
    """The deduplicating reference agrees with a plain dense loop (guards the oracle itself)."""
    rng = np.random.default_rng(3)
    layers = [sp.random(48, 48, density=0.15, random_state=rng, format="csr") for _ in range(8)]
    base = (rng.random((20, 48)) < 0.4).astype(float)
    inputs = np.vstack([base, base[:10], np.zeros((3, 48))])
    y = inputs.copy()
    for w in layers:
        z = y @ w.toarray()
        z[z != 0] += -0.05
        y = np.clip(z, 0, 32)
    expected = np.flatnonzero(y.any(axis=1)) + 1
    got, activations = reference_challenge(inputs, layers, -0.05)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(activations, y[expected - 1])


def test_official_1024x120_all_mnist(official_1024_dir, client, mnist_images):
    """All 10,000 MNIST test images (32x32) through the official network, float32 (default)."""
    layers = read_challenge_network(official_1024_dir)
    inputs = mnist_to_challenge_inputs(mnist_images, 32)
    expected, _ = reference_challenge(inputs, layers, -0.30)
    categories, stats = run_challenge(layers, inputs, client=client, progress=False)
    np.testing.assert_array_equal(categories, expected)
    assert stats.categories == expected.size and stats.inputs == 10000
    assert stats.edges == 120 * 32768 and stats.mode == "broadcast"
    assert stats.macs_needed <= stats.macs_done < stats.inputs * stats.edges
    assert set(stats.peak_memory) == set(scheduler_workers(client))


@pytest.fixture(scope="module")
def generated_4096(mnist_images):
    """Generated 4096 x 120 network, the first 1,000 MNIST images at 64x64, reference categories.

    A subset keeps the suite fast: after ~15 layers the survivors are saturated dense rows, so
    1,000 images already exercise every phase (early deaths, sparse-to-dense, steady state).
    """
    layers = radixnet(4096, 120)
    inputs = mnist_to_challenge_inputs(mnist_images[:1000], 64)
    expected, _ = reference_challenge(inputs, layers, -0.35)
    assert 0 < expected.size < 1000
    return layers, inputs, expected


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dtype", "resident_layers"), [("float64", 16), ("float32", None)]
)
def test_generated_4096x120_mnist_64(client, generated_4096, dtype, resident_layers):
    layers, inputs, expected = generated_4096
    categories, stats = run_challenge(
        layers, inputs, client=client, dtype=dtype, resident_layers=resident_layers,
        batch_size=300, progress=False,
    )
    np.testing.assert_array_equal(categories, expected)
    assert stats.mode == ("streamed" if resident_layers else "broadcast")


def _dyadic_network(seed: int, neurons: int, depth: int, rows: int):
    """Weights k/2, inputs k/4, bias -k/4: every float32 and float64 operation is exact.

    Values stay below 2**12 in magnitude with at most 2**-(2 + depth) resolution, so depth <= 8
    needs at most 22 significant bits: float32 rounding cannot occur, and categories and activations
    must equal the reference bit for bit. Signed weights make exact cancellations (products that are
    exactly zero and must not get the bias) common.
    """
    rng = np.random.default_rng(seed)
    layers = []
    for _ in range(depth):
        mask = rng.random((neurons, neurons)) < 0.2
        values = rng.integers(-4, 5, size=(neurons, neurons)) / 2.0
        layers.append(sp.csr_matrix(np.where(mask, values, 0.0)))
    return (layers, *dyadic_inputs(rng, rows, neurons))


def dyadic_inputs(rng: np.random.Generator, rows: int, neurons: int) -> tuple[np.ndarray, float]:
    """Inputs k/4 (``(rows, neurons)``, 30 % nonzero) and a bias -k/4 of a dyadic network."""
    inputs = np.where(rng.random((rows, neurons)) < 0.3, rng.integers(0, 5, (rows, neurons)), 0)
    return inputs / 4.0, -int(rng.integers(0, 4)) / 4.0


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    neurons=st.integers(4, 48),
    depth=st.integers(1, 8),
    rows=st.integers(1, 150),
    window=st.integers(1, 8),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_kernel_exact_on_dyadic_networks(seed, neurons, depth, rows, window, dtype):
    layers, inputs, bias = _dyadic_network(seed, neurons, depth, rows)
    expected, activations = reference_challenge(inputs, layers, bias, ymax=32.0)
    state = start_batch(sp.csr_matrix(inputs), dtype)
    for first in range(0, depth, window):
        advance(state, pack_layers(layers[first : first + window], dtype), bias, 32.0)
    np.testing.assert_array_equal(live_rows(state) + 1, expected)
    np.testing.assert_array_equal(live_activations(state), activations.astype(dtype))


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    neurons=st.integers(4, 64),
    depth=st.integers(1, 12),
    rows=st.integers(1, 80),
    bias=st.floats(-0.5, 0.2),
)
def test_kernel_float64_on_random_networks(seed, neurons, depth, rows, bias):
    """Continuous random weights in float64: same categories, activations to rounding."""
    rng = np.random.default_rng(seed)
    layers = [
        sp.random(neurons, neurons, density=0.25, random_state=rng, format="csr",
                  data_rvs=lambda n: rng.uniform(-0.5, 1.0, n))
        for _ in range(depth)
    ]
    inputs = sp.random(rows, neurons, density=0.3, random_state=rng, format="csr")
    expected, activations = reference_challenge(inputs, layers, bias, ymax=2.0)
    state = start_batch(inputs, np.float64)
    advance(state, pack_layers(layers, np.float64), bias, 2.0)
    np.testing.assert_array_equal(live_rows(state) + 1, expected)
    np.testing.assert_allclose(live_activations(state), activations, rtol=1e-12, atol=1e-12)


@settings(max_examples=6, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    batch_size=st.integers(1, 40),
    dtype=st.sampled_from(["float32", "float64"]),
    streamed=st.booleans(),
)
def test_engine_matches_reference_for_any_batching(client, seed, batch_size, dtype, streamed):
    layers, inputs, bias = _dyadic_network(seed, 32, 6, 60)
    expected, _ = reference_challenge(inputs, layers, bias)
    categories, stats = run_challenge(
        layers, inputs, bias=bias, client=client, batch_size=batch_size, dtype=dtype,
        resident_layers=2 if streamed else None, progress=False,
    )
    np.testing.assert_array_equal(categories, expected)
    assert stats.batches == -(-60 // batch_size)


def test_engine_by_scheduler_address_and_weight_budget(client):
    """A scheduler address instead of a client; a small weight budget switches to streaming."""
    layers, inputs, bias = _dyadic_network(7, 32, 8, 50)
    expected, _ = reference_challenge(inputs, layers, bias)
    budget = 3 * (layers[0].nnz * 8 + 16 * 33)
    categories, stats = run_challenge(
        layers, inputs, bias=bias, client=client.scheduler.address, weight_budget=budget,
        progress=False,
    )
    np.testing.assert_array_equal(categories, expected)
    assert stats.mode == "streamed" and stats.weight_buffers == 2
    assert stats.resident_layers * stats.weight_buffers * layers[0].nnz * 8 <= budget
