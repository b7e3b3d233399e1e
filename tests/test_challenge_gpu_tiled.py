"""Footprint tiles and the tiled CUDA kernel (``mode="tiled"``), on numba's CUDA simulator.

``tests/conftest.py`` turns the simulator on where no GPU is present, so the kernel code runs on
the CPU here; the results are checked against a float64 numpy / scipy reference written in this
file and against the sectioned kernel's, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from challenge_reference import reference_activations
from test_challenge_gpu import random_inputs

from dasknn.challenge import run_challenge
from dasknn.datasets import (
    challenge_bias,
    load_mnist_test,
    mnist_to_challenge_inputs,
    radixnet,
    read_challenge_network,
)
from dasknn.kernels import cuda_inference
from dasknn.kernels.cuda_inference import (
    DeviceNetwork,
    compact_layers,
    infer_rows_cuda,
    pack_bit_rows,
)
from dasknn.kernels.footprint_tiles import check_tileable, tile_layers
from dasknn.kernels.inference import pack_layers

pytestmark = [
    pytest.mark.skipif(cuda_inference.cuda_runtime() == "none",
                       reason="no CUDA GPU and numba's CUDA simulator is off"),
    pytest.mark.usefixtures("short_switch_interval"),
]


def uneven_network(neurons: int, depth: int, seed: int) -> list[sp.csr_matrix]:
    """Layers whose columns have 1 to 12 random inputs (unequal degrees), dyadic weights (exact
    float64 sums)."""
    rng = np.random.default_rng(seed)
    layers = []
    for _ in range(depth):
        degrees = rng.integers(1, 13, neurons)
        rows = np.concatenate([rng.choice(neurons, d, replace=False) for d in degrees])
        cols = np.repeat(np.arange(neurons), degrees)
        values = rng.integers(1, 8, rows.size) / 16.0
        layers.append(sp.csr_matrix((values, (rows, cols)), shape=(neurons, neurons)))
    return layers


def test_tiles_cover_every_entry_once_with_sorted_footprints():
    for network, footprint, tile_outputs in ((pack_layers(uneven_network(48, 3, seed=4),
                                                          np.float64), 16, 5),
                                             (pack_layers(radixnet(64, 3, seed=1), np.float32),
                                              32, 16)):
        compact = compact_layers(network)
        tiles = tile_layers(compact.indptr, compact.indices, footprint, tile_outputs)
        n_layers, n = compact.n_layers, compact.neurons
        assert tiles.layer_tiles[0] == 0 and tiles.layer_tiles[-1] == tiles.n_tiles
        seen = np.zeros(compact.indices.size, dtype=np.int64)
        for k in range(n_layers):
            columns = []
            for t in range(tiles.layer_tiles[k], tiles.layer_tiles[k + 1]):
                cols = tiles.tile_cols[tiles.tile_ptr[t]:tiles.tile_ptr[t + 1]].astype(np.int64)
                foot = tiles.foot[tiles.foot_ptr[t]:tiles.foot_ptr[t + 1]].astype(np.int64)
                assert 1 <= cols.size <= tile_outputs and foot.size <= footprint
                entries = np.concatenate([np.arange(compact.indptr[k, c], compact.indptr[k, c + 1])
                                          for c in cols])
                inputs = compact.indices[entries].astype(np.int64)
                # the footprint is the sorted union of the tile's inputs
                np.testing.assert_array_equal(foot, np.unique(inputs))
                np.testing.assert_array_equal(foot[tiles.local[entries]], inputs)
                seen[entries] += 1
                columns.extend(cols)
            np.testing.assert_array_equal(np.sort(columns), np.arange(n))
        np.testing.assert_array_equal(seen, 1)
    # RadiX-Net: the 16 outputs o + M q share their 32 inputs, so 16 columns fill a footprint of 32
    assert tiles.n_tiles == 3 * 64 // 16
    assert np.all(np.diff(tiles.foot_ptr) == 32)
    # a window of layers 1..2 is the same tiles, rebased
    lo, hi = int(compact.indptr[1, 0]), int(compact.indptr[2, -1])
    part = tiles.window(1, 3, lo, hi)
    np.testing.assert_array_equal(part.layer_tiles, tiles.layer_tiles[1:] - tiles.layer_tiles[1])
    np.testing.assert_array_equal(part.local, tiles.local[lo:hi])
    np.testing.assert_array_equal(part.foot[part.foot_ptr[0]:part.foot_ptr[-1]],
                                  tiles.foot[tiles.foot_ptr[tiles.layer_tiles[1]]:])
    assert part.tile_ptr[0] == 0 and part.tile_ptr[-1] == 2 * 64


@pytest.mark.slow
@pytest.mark.parametrize(("network", "dtype", "bias"),
                         [("uneven", np.float64, -0.1875), ("radixnet", np.float32, -0.3)])
def test_tiled_equals_reference_and_sectioned_bit_for_bit(monkeypatch, network, dtype, bias):
    monkeypatch.setattr(cuda_inference, "SECTION_OUTPUTS", 16)  # 2 tile ranges a group
    layers = uneven_network(32, 3, seed=2) if network == "uneven" else radixnet(32, 3, seed=5)
    x = random_inputs(32, 32, 0.3, seed=6).tolil()  # one group of 32 rows
    x[7] = 0  # an empty input row is never a category
    x = x.tocsr()
    expected = reference_activations(x, layers, bias)
    alive = np.flatnonzero(expected.any(axis=1))
    assert 0 < alive.size < 32
    packed = pack_layers(layers, dtype)
    footprint = 16 if network == "uneven" else 32  # 12 and 32 inputs a column at most
    tiled = infer_rows_cuda(x, DeviceNetwork(packed, tiled=True, footprint=footprint), bias,
                            compact_every=2, mode="tiled", activations=True)
    sectioned = infer_rows_cuda(x, DeviceNetwork(packed), bias, compact_every=2,
                                mode="sectioned", activations=True)
    np.testing.assert_array_equal(tiled.rows, sectioned.rows)
    assert tiled.activations.dtype == dtype
    np.testing.assert_array_equal(tiled.activations.view(np.uint8),
                                  sectioned.activations.view(np.uint8))  # bit for bit
    np.testing.assert_array_equal(tiled.rows, alive)
    if dtype == np.float64:  # dyadic weights, bias and inputs: the sums are exact
        np.testing.assert_array_equal(tiled.activations, expected[alive])
    else:
        np.testing.assert_allclose(tiled.activations, expected[alive], rtol=1e-5)  # float32
    assert tiled.macs_done > 0


@pytest.mark.slow
def test_tiled_streamed_windows_equal_resident():
    layers = radixnet(64, 3, seed=2)
    x = random_inputs(40, 64, 0.25, seed=5)  # a full group and a partly empty one
    packed = pack_layers(layers, np.float32)
    resident = DeviceNetwork(packed, tiled=True, footprint=32)
    streamed = DeviceNetwork(packed, budget=resident.nbytes // 2, tiled=True, footprint=32,
                             tile_warps=1)  # blocks of one warp: a warp takes every tile
    assert streamed.streamed and streamed.layers_per_window == 1 and not resident.streamed
    assert resident.tile_warps == 12  # 48 KB of shared memory: 12 footprints of 32 x 32 float32
    # the tiles replace the uint16 indices: a uint8 position a weight entry, footprints of 32
    # inputs for 16 columns, and their offsets
    untiled = DeviceNetwork(packed).nbytes
    assert resident.nbytes < untiled
    assert resident.nbytes <= cuda_inference.weight_bytes(packed, tiled=True)[0]
    expected = reference_activations(x, layers, -0.3)
    alive = np.flatnonzero(expected.any(axis=1))
    results = [infer_rows_cuda(x, network, -0.3, compact_every=2, mode="tiled", activations=True)
               for network in (resident, streamed)]
    for result in results:
        np.testing.assert_array_equal(result.rows, alive)
        np.testing.assert_allclose(result.activations, expected[alive], rtol=1e-5)  # float32
    np.testing.assert_array_equal(results[0].activations, results[1].activations)


def test_too_wide_column_and_mode_mismatch_are_named():
    layers = uneven_network(32, 2, seed=1)
    packed = pack_layers(layers, np.float32)
    widest = int(np.diff(packed.indptr, axis=1).max())
    assert widest > 8
    with pytest.raises(ValueError, match=rf"has {widest} inputs, more than the footprint limit "
                                         r"of 8 of mode='tiled'; use mode='sectioned'"):
        DeviceNetwork(packed, tiled=True, footprint=8)
    with pytest.raises(ValueError, match="tile_warps must be between 1 and 6"):
        DeviceNetwork(packed, tiled=True, footprint=64, tile_warps=7)
    with pytest.raises(ValueError, match="multiple of 8"):
        check_tileable(np.ones((1, 4), dtype=np.int64), footprint=12)
    x = random_inputs(4, 32, 0.5, seed=0)
    with pytest.raises(ValueError, match=r"mode='tiled' needs a DeviceNetwork built with "
                                         r"tiled=True"):
        infer_rows_cuda(x, DeviceNetwork(packed), -0.3, mode="tiled")
    with pytest.raises(ValueError, match="tiled=False"):
        infer_rows_cuda(x, DeviceNetwork(packed, tiled=True), -0.3, mode="auto")
    wide = sp.csr_matrix(np.ones((72, 72)) / 72)  # every column has 72 inputs
    with pytest.raises(ValueError, match="72 inputs, more than the footprint limit of 64"):
        run_challenge([wide], random_inputs(4, 72, 0.5, seed=0), -0.3, device="cuda",
                      cuda_mode="tiled", client="tcp://127.0.0.1:1")


def test_engine_tiled_on_cuda_workers_equals_reference(simulator_dask_client):
    layers = radixnet(64, 3, seed=3)
    x = random_inputs(50, 64, 0.2, seed=8)
    categories, stats = run_challenge(layers, x, -0.3, client=simulator_dask_client, device="cuda",
                                      batch_size=25, compact_every=2, cuda_mode="tiled",
                                      progress=False)
    expected = np.flatnonzero(reference_activations(x, layers, -0.3).any(axis=1)) + 1
    assert 0 < expected.size < 50
    np.testing.assert_array_equal(categories, expected)
    assert stats.device == "cuda" and stats.batches == 2 and stats.macs_done > 0


@pytest.mark.gpu
@pytest.mark.skipif(cuda_inference.cuda_runtime() != "gpu", reason="no CUDA GPU on this machine")
def test_official_network_tiled_on_gpu_equals_sectioned(official_1024_dir):
    layers = read_challenge_network(official_1024_dir, neurons=1024)
    x = pack_bit_rows(mnist_to_challenge_inputs(load_mnist_test()[0][:3000], 32))
    packed = pack_layers(layers, np.float32)
    bias = challenge_bias(1024)
    sectioned = infer_rows_cuda(x, DeviceNetwork(packed), bias, mode="sectioned",
                                activations=True)
    for footprint in (64, 32):
        tiled = infer_rows_cuda(x, DeviceNetwork(packed, tiled=True, footprint=footprint), bias,
                                mode="tiled", activations=True)
        np.testing.assert_array_equal(tiled.rows, sectioned.rows)
        np.testing.assert_array_equal(tiled.activations, sectioned.activations)
