"""The CPU inference step outside Dask: a batch through two windows of layers equals a float64
numpy reference, and a window leaves the state it was given (a value Dask holds) unchanged."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dasknn.datasets import radixnet
from dasknn.inference._cpu_inference import StreamedBatch, run_window
from dasknn.kernels.inference import pack_layers


def test_a_window_leaves_its_input_state_unchanged():
    layers = radixnet(64, 4, seed=5)
    rows = sp.random(70, 64, density=0.3, random_state=3, format="csr")
    rows.data[:] = 1.0
    bias, ymax = -0.2, 32.0
    first = run_window(rows, pack_layers(layers[:2], np.float64), bias, ymax, last=False)
    assert isinstance(first, StreamedBatch)
    block, live = first.state.block.copy(), first.state.rows.copy()
    second = pack_layers(layers[2:], np.float64)
    results = [run_window(first, second, bias, ymax, last=True) for _ in range(2)]
    np.testing.assert_array_equal(first.state.block, block)
    np.testing.assert_array_equal(first.state.rows, live)

    y = rows.toarray()
    for w in layers:
        z = y @ w.toarray()
        y = np.where(z != 0, np.clip(z + bias, 0.0, ymax), 0.0)
    expected = np.flatnonzero(y.any(axis=1))
    assert 0 < expected.size < 70
    for result in results:
        np.testing.assert_array_equal(result.rows, expected)
