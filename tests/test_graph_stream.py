"""The streamed partition: same parts as partition_network, file round trip, bounded memory."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn.datasets.radixnet import iter_radixnet, radixnet
from graph import load_partitions, partition_network, partition_stream
from graph.metrics import layer_volume


def test_iter_radixnet_yields_radixnet_layers():
    listed = radixnet(64, 5, seed=3)
    streamed = list(iter_radixnet(64, 5, seed=3))
    assert len(streamed) == 5
    for a, b in zip(listed, streamed, strict=True):
        assert (a != b).nnz == 0


def test_stream_equals_partition_network(tmp_path):
    layers = radixnet(256, 6, seed=1)
    whole = partition_network(layers, 8)
    rows = []
    out = tmp_path / "parts.npz"
    reports = partition_stream(iter_radixnet(256, 6, seed=1), 8, parts_out=out, report=rows.append)
    assert rows == reports and len(reports) == 6
    loaded = load_partitions(out)[8]
    assert len(loaded.parts) == len(whole.parts)
    for a, b in zip(loaded.parts, whole.parts, strict=True):
        np.testing.assert_array_equal(a, b)
    metrics = whole.metrics()
    assert [r.volume for r in reports] == metrics.layer_volume.tolist()
    np.testing.assert_allclose([r.imbalance for r in reports], metrics.layer_imbalance)
    for k, row in enumerate(reports, start=1):
        assert row.layer == k
        assert row.floor <= row.volume <= row.random_volume
        assert 0 < row.messages and 0 < row.random_messages
        assert row.volume == layer_volume(layers[k - 1], whole.parts[k - 1], whole.parts[k], 8)


def test_stored_parts_are_compact(tmp_path):
    out = tmp_path / "parts.npz"
    partition_stream(iter_radixnet(64, 2), 4, parts_out=out)
    with np.load(out) as data:
        assert data["P4_parts_1"].dtype == np.int16


def test_layers_are_released_after_their_phase(tmp_path):
    refs = []
    alive_at_phase = []

    def layers():
        for layer in iter_radixnet(64, 6):
            refs.append(weakref.ref(layer))
            yield layer
            del layer

    def report(row):
        gc.collect()
        alive_at_phase.append(sum(ref() is not None for ref in refs))

    partition_stream(layers(), 4, parts_out=tmp_path / "p.npz", report=report)
    assert max(alive_at_phase) <= 1
    gc.collect()
    assert all(ref() is None for ref in refs)


def test_mismatched_layer_leaves_no_file(tmp_path):
    def layers():
        yield from iter_radixnet(64, 3)
        yield sp.random(32, 64, density=0.2, format="csr", random_state=0)

    out = tmp_path / "p.npz"
    with pytest.raises(ValueError, match="layer 4 has 32 inputs"):
        partition_stream(layers(), 4, parts_out=out)
    assert list(tmp_path.iterdir()) == []


def test_bad_inputs_fail_before_any_phase(tmp_path):
    out = tmp_path / "p.npz"
    phases = []
    listed = radixnet(64, 3) + [sp.random(32, 64, density=0.2, format="csr", random_state=0)]
    with pytest.raises(ValueError, match="layer 4 has 32 inputs"):
        partition_stream(listed, 4, parts_out=out, report=phases.append)
    with pytest.raises(ValueError, match="cannot split into 128 parts"):
        partition_stream(iter_radixnet(64, 3), 128, parts_out=out, report=phases.append)
    with pytest.raises(ValueError, match="epsilon"):
        partition_stream(iter_radixnet(64, 3), 4, parts_out=out, epsilon=2.0)
    assert phases == []
    assert list(tmp_path.iterdir()) == []


def test_challenge_files_stream_one_layer_at_a_time(tmp_path):
    from dasknn.datasets import iter_challenge_network, read_challenge_network, write_sparse_tsv

    layers = radixnet(64, 3)
    for k, layer in enumerate(layers, start=1):
        write_sparse_tsv(tmp_path / f"n64-l{k}.tsv", layer)
    streamed = iter_challenge_network(tmp_path)
    assert not isinstance(streamed, list)
    for a, b in zip(streamed, read_challenge_network(tmp_path), strict=True):
        assert (a != b).nnz == 0
    with pytest.raises(FileNotFoundError):
        iter_challenge_network(tmp_path, layers=5)
    out = tmp_path / "parts.npz"
    partition_stream(iter_challenge_network(tmp_path), 4, parts_out=out)
    whole = partition_network(layers, 4)
    for a, b in zip(load_partitions(out)[4].parts, whole.parts, strict=True):
        np.testing.assert_array_equal(a, b)
