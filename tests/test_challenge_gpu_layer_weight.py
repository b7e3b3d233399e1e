"""One weight per layer on the device: a network whose nonzeros share one weight a layer (every
RadiX-Net network) keeps that weight, not a copy per nonzero, on the GPU.

``tests/conftest.py`` turns numba's CUDA simulator on where no GPU is present, so the kernels run
on the CPU here. Each mode's results are compared bit for bit with the same network given one
weight per nonzero (expanded on the host here), and with a float64 numpy reference written here.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from challenge_reference import reference_activations

from dasknn.challenge import run_challenge
from dasknn.datasets import radixnet
from dasknn.kernels import cuda_inference
from dasknn.kernels.cuda_inference import (
    CompactLayers,
    DeviceNetwork,
    compact_layers,
    infer_rows_cuda,
    weight_bytes,
)
from dasknn.kernels.inference import pack_layers

pytestmark = [
    pytest.mark.skipif(cuda_inference.cuda_runtime() == "none",
                       reason="no CUDA GPU and numba's CUDA simulator is off"),
    pytest.mark.usefixtures("short_switch_interval"),
]

BIAS = -0.25  # dyadic, as the weights (1/16) and the inputs (1): the sums are exact


def binary_inputs(rows: int, neurons: int, density: float, seed: int) -> sp.csr_matrix:
    """Random inputs whose nonzeros are all 1 (as the challenge's)."""
    x = sp.random(rows, neurons, density=density, random_state=seed, format="csr")
    x.data[:] = 1.0
    return x


def radixnet_pair(neurons: int, depth: int, dtype) -> tuple[list, CompactLayers, CompactLayers]:
    """A RadiX-Net network's layers, its compact form (one weight a layer) and the same network
    with one weight per nonzero."""
    layers = radixnet(neurons, depth, seed=2)
    compact = compact_layers(pack_layers(layers, dtype))
    assert compact.per_layer and compact.values.shape == (depth,)
    return layers, compact, compact.per_entry()


def check_against_reference(result, x, layers) -> None:
    """The rows left and their activations equal the float64 reference exactly (the weights, the
    bias and the inputs are dyadic, so every sum is exact in float32 too)."""
    expected = reference_activations(x, layers, BIAS)
    alive = np.flatnonzero(expected.any(axis=1))
    assert 0 < alive.size < x.shape[0]
    np.testing.assert_array_equal(result.rows, alive)
    np.testing.assert_array_equal(result.activations, expected[alive])


def assert_bit_for_bit(a, b) -> None:
    np.testing.assert_array_equal(a.rows, b.rows)
    assert a.activations.dtype == b.activations.dtype
    np.testing.assert_array_equal(a.activations.view(np.uint8), b.activations.view(np.uint8))
    assert a.macs_done == b.macs_done


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "dtype"),
    [
        ("fused", np.float32),
        ("fused", np.float64),
        ("sectioned", np.float32),
        ("tiled", np.float64),
    ],
)
def test_one_weight_a_layer_equals_one_weight_a_nonzero_bit_for_bit(monkeypatch, mode, dtype):
    monkeypatch.setattr(cuda_inference, "SECTION_OUTPUTS", 16)  # 2 sections of 16 neurons
    layers, compact, expanded = radixnet_pair(32, 3, dtype)
    x = binary_inputs(32, 32, 0.25, seed=5)  # one group; half its rows die
    tiled = mode == "tiled"
    results = []
    for network in (compact, expanded):
        device = DeviceNetwork(network, tiled=tiled, footprint=32)
        results.append(
            infer_rows_cuda(x, device, BIAS, compact_every=2, mode=mode, activations=True)
        )
    assert_bit_for_bit(*results)
    check_against_reference(results[0], x, layers)


def test_one_weight_a_layer_takes_four_bytes_a_layer():
    _, compact, expanded = radixnet_pair(64, 3, np.float32)
    nnz = int(compact.indptr[-1, -1])
    assert nnz == 3 * 64 * 32
    layer = 64 * 32 * 2 + 65 * 4  # uint16 indices and int32 offsets of one layer
    assert weight_bytes(compact) == (3 * layer + 3 * 4, layer + 4)
    assert weight_bytes(expanded) == (3 * layer + nnz * 4, layer + 64 * 32 * 4)


@pytest.mark.slow  # the device arrays on the simulator: the default run keeps the sizes above
def test_device_holds_one_weight_a_layer():
    _, compact, expanded = radixnet_pair(64, 3, np.float32)
    nnz = int(compact.indptr[-1, -1])
    for tiled in (False, True):
        small = DeviceNetwork(compact, tiled=tiled, footprint=32)
        large = DeviceNetwork(expanded, tiled=tiled, footprint=32)
        assert large.nbytes - small.nbytes == (nnz - 3) * 4  # the per-entry weights, less 3
        (window,) = small.windows()
        assert window.per_layer and window.values.size == 3
        np.testing.assert_array_equal(window.values.copy_to_host(), compact.values)
        (window,) = large.windows()
        assert not window.per_layer and window.values.size == nnz


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "dtype"), [("sectioned", np.float64), ("tiled", np.float32)])
def test_streamed_windows_of_one_weight_a_layer(mode, dtype):
    layers, compact, expanded = radixnet_pair(32, 4, dtype)
    x = binary_inputs(32, 32, 0.2, seed=5)
    tiled = mode == "tiled"
    resident = DeviceNetwork(compact, tiled=tiled, footprint=32)
    layer = resident.nbytes // 4  # the layers have equal sizes
    # two layers a window; the per-entry network's layer alone is larger than this budget
    streamed = DeviceNetwork(compact, budget=2 * layer, tiled=tiled, footprint=32)
    assert streamed.streamed and streamed.layers_per_window == 2 and not resident.streamed
    assert [w.values.size for w in streamed.windows()] == [2, 2]
    entry_layer = layer + (32 * 32 - 1) * np.dtype(dtype).itemsize  # a weight a nonzero
    with pytest.raises(MemoryError, match=f"one layer needs {entry_layer} bytes"):
        DeviceNetwork(expanded, budget=2 * layer, tiled=tiled, footprint=32)
    with pytest.raises(MemoryError, match=f"one layer needs {layer} bytes"):
        DeviceNetwork(compact, budget=layer - 1, tiled=tiled, footprint=32)
    results = [
        infer_rows_cuda(x, network, BIAS, compact_every=1, mode=mode, activations=True)
        for network in (streamed, DeviceNetwork(expanded, tiled=tiled, footprint=32))
    ]
    assert_bit_for_bit(*results)
    check_against_reference(results[0], x, layers)


@pytest.mark.slow
def test_engine_keeps_resident_what_per_entry_weights_would_stream(simulator_dask_client):
    layers = radixnet(32, 3, seed=4)
    x = binary_inputs(30, 32, 0.25, seed=8)
    whole, layer = weight_bytes(pack_layers(layers, np.float32))
    assert whole == 3 * layer and layer == 32 * 32 * 2 + 33 * 4 + 4
    expected = np.flatnonzero(reference_activations(x, layers, BIAS).any(axis=1)) + 1
    assert 0 < expected.size < 30
    # the weight budget of three layers with their weights one a nonzero: 1.5 layers of those
    budget = int(1.5 * (layer + 32 * 32 * 4))
    categories, stats = run_challenge(layers, x, BIAS, client=simulator_dask_client,
                                      device="cuda", weight_budget=budget, progress=False)
    np.testing.assert_array_equal(categories, expected)
    assert stats.mode == "broadcast" and stats.weight_bytes == whole
    categories, stats = run_challenge(layers, x, BIAS, client=simulator_dask_client,
                                      device="cuda", weight_budget=2 * layer, progress=False)
    np.testing.assert_array_equal(categories, expected)
    assert stats.mode == "streamed" and stats.resident_layers == 2
