"""Graph Challenge file readers and writers: real files, round trips and every bad input."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn.datasets import (
    challenge_bias,
    load_network,
    read_categories,
    read_challenge_network,
    read_sparse_tsv,
    write_categories,
    write_sparse_tsv,
)


def _write_layer(path, triples, compress=False):
    text = "".join(f"{r}\t{c}\t{v}\n" for r, c, v in triples)
    if compress:
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)


def test_official_network_shape_and_structure(official_1024_dir):
    layers = read_challenge_network(official_1024_dir)
    assert len(layers) == 120
    for w in layers:
        assert w.shape == (1024, 1024)
        assert w.nnz == 32768
        assert np.all(np.diff(w.indptr) == 32)
        assert np.all(np.bincount(w.indices, minlength=1024) == 32)
        assert np.all(w.data == 0.0625)


def test_official_layer_selection_and_dtype(official_1024_dir):
    layers = read_challenge_network(
        official_1024_dir, neurons=1024, layers=[3, 1], dtype=np.float32
    )
    first = read_challenge_network(official_1024_dir, layers=1)[0]
    assert layers[1].dtype == np.float32
    assert (layers[1] != first).nnz == 0
    with gzip.open(official_1024_dir / "n1024-l3.tsv.gz", "rt") as fh:
        row, col, value = fh.readline().split()
    assert layers[0][int(row) - 1, int(col) - 1] == np.float32(value)


def test_small_network_plain_and_gzip(tmp_path):
    _write_layer(tmp_path / "n4-l1.tsv", [(1, 2, 0.5), (4, 4, -1.0)])
    _write_layer(tmp_path / "n4-l2.tsv.gz", [(2, 1, 2.0)], compress=True)
    layers = read_challenge_network(tmp_path)
    assert len(layers) == 2
    expected = np.zeros((4, 4))
    expected[0, 1], expected[3, 3] = 0.5, -1.0
    np.testing.assert_array_equal(layers[0].toarray(), expected)
    assert layers[1][1, 0] == 2.0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("1\t2\t0.5\n3\tx\t1\n", "line 2"),
        ("1\t2\t0.5\n3\t1\n", "line 2"),
        ("1\t2\t0.5\n1\t2\t0.5\t9\n", "line 2"),
        ("1\t2\t0.5\n0\t1\t1\n", "1-based"),
        ("1\t5\t0.5\n", "out of range"),
        ("1\t2\t0.5\n1\t2\tnan\n", "line 2"),
        ("1\t2\t1e400\n", "not finite"),
        ("1.5\t2\t1\n", "line 1"),
    ],
)
def test_malformed_layer_names_file_and_line(tmp_path, content, message):
    (tmp_path / "n4-l1.tsv").write_text(content)
    with pytest.raises(ValueError, match=message) as info:
        read_challenge_network(tmp_path)
    assert "n4-l1.tsv" in str(info.value)


def test_missing_layers_and_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_challenge_network(tmp_path / "nowhere")
    _write_layer(tmp_path / "n4-l1.tsv", [(1, 1, 1.0)])
    with pytest.raises(FileNotFoundError, match="n4-l2"):
        read_challenge_network(tmp_path, layers=2)
    _write_layer(tmp_path / "n8-l1.tsv", [(1, 1, 1.0)])
    with pytest.raises(ValueError, match="cannot infer the width"):
        read_challenge_network(tmp_path)
    assert len(read_challenge_network(tmp_path, neurons=8)) == 1
    with pytest.raises(FileNotFoundError, match="n16-l"):
        read_challenge_network(tmp_path, neurons=16)


def test_sparse_tsv_round_trip(tmp_path):
    rng = np.random.default_rng(3)
    matrix = sp.random(30, 12, density=0.2, format="csr", random_state=rng)
    matrix.data = np.round(matrix.data * 8) / 8 + 1
    for name in ("inputs.tsv", "inputs.tsv.gz"):
        write_sparse_tsv(tmp_path / name, matrix)
        back = read_sparse_tsv(tmp_path / name, shape=(30, 12))
        np.testing.assert_array_equal(back.toarray(), matrix.toarray())
    with pytest.raises(ValueError, match="out of range"):
        read_sparse_tsv(tmp_path / "inputs.tsv", shape=(30, 5))
    with pytest.raises(FileNotFoundError):
        read_sparse_tsv(tmp_path / "absent.tsv")


def test_categories_round_trip_and_errors(tmp_path):
    ids = np.array([1, 5, 9, 1000])
    write_categories(tmp_path / "cat.tsv", ids)
    np.testing.assert_array_equal(read_categories(tmp_path / "cat.tsv"), ids)
    (tmp_path / "bad.tsv").write_text("1\nseven\n")
    with pytest.raises(ValueError, match="line 2"):
        read_categories(tmp_path / "bad.tsv")
    with pytest.raises(ValueError, match="1-based"):
        write_categories(tmp_path / "zero.tsv", np.array([0, 1]))
    assert not (tmp_path / "zero.tsv").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.tsv", "cat.tsv"]


def test_challenge_bias():
    assert [challenge_bias(n) for n in (1024, 4096, 16384, 65536)] == [-0.30, -0.35, -0.40, -0.45]
    with pytest.raises(ValueError, match="2048"):
        challenge_bias(2048)


def test_load_network_specs(tmp_path):
    layers = load_network("radixnet:1024:3")
    assert len(layers) == 3 and layers[0].shape == (1024, 1024)
    assert len(load_network("radixnet:1024:8", layers=7)) == 7
    _write_layer(tmp_path / "n4-l1.tsv", [(1, 1, 1.0)])
    assert load_network(tmp_path)[0].shape == (4, 4)
    for bad in ("radixnet:1024", "radixnet:a:3", "radixnet:1000:3"):
        with pytest.raises(ValueError):
            load_network(bad)
    with pytest.raises(ValueError, match="contradicts"):
        load_network("radixnet:1024:3", neurons=4096)
    with pytest.raises(FileNotFoundError, match="neither"):
        load_network(tmp_path / "missing")
