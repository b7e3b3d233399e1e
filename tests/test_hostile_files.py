"""Hostile files and options: errors name the file and line, come before any work, and reach the
command line as one line and exit code 2."""

from __future__ import annotations

import gzip
import os
import stat
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from polling import HANG_GUARD

from dasknn import SparseMLP
from dasknn.challenge.engine import prepare_run
from dasknn.challenge.inputs import load_inputs
from dasknn.cli import main
from dasknn.datasets import (
    radixnet,
    read_categories,
    read_challenge_network,
    read_sparse_tsv,
    write_categories,
    write_sparse_tsv,
)
from dasknn.runtime.cluster import LOCAL_HOST, local_cluster
from graph.atomic import write_text_atomically

NEURONS = 32


@pytest.fixture()
def network(tmp_path) -> Path:
    net = tmp_path / "net"
    net.mkdir()
    for k, w in enumerate(radixnet(NEURONS, 4), start=1):
        write_sparse_tsv(net / f"n{NEURONS}-l{k}.tsv", w)
    return net


def test_a_missing_layer_is_named(network):
    (network / f"n{NEURONS}-l3.tsv").unlink()
    with pytest.raises(FileNotFoundError, match=f"n{NEURONS}-l3.tsv"):
        read_challenge_network(network)


def test_an_index_too_long_for_the_parser_names_file_and_line(tmp_path):
    path = tmp_path / "in.tsv"
    path.write_text("1\t2\t1.0\n2\t1234567890123456\t1.0\n")
    with pytest.raises(ValueError, match=r"in.tsv, line 2: an index does not fit"):
        read_sparse_tsv(path)


def test_an_absurd_row_id_is_an_error_before_any_work(tmp_path):
    path = tmp_path / "in.tsv"
    lines = [f"{r}\t{c}\t1\n" for r in range(1, 200) for c in (1,)]
    path.write_text("".join(lines) + "100000000\t1\t1\n")
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"in.tsv, line 200: row 100000000 is absurd"):
            load_inputs(path, NEURONS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # no work for 10^8 rows: their row pointers alone would take 800 MB
    assert peak < 100 * 2**20, peak
    path.write_text("".join(lines) + "1400\t1\t1\n")
    assert load_inputs(path, NEURONS).shape == (1400, NEURONS)


def test_empty_inputs_are_an_error(tmp_path):
    path = tmp_path / "in.tsv"
    path.write_text("\n")
    with pytest.raises(ValueError, match="in.tsv: no inputs"):
        load_inputs(path, NEURONS)


@pytest.mark.parametrize(
    "line, message",
    [("12a", "expected an integer id"), ("1_0", "expected an integer id"),
     ("99999999999999999999999", "ids run from 1"), ("0", "ids run from 1"),
     ("\udcff", "expected an integer id")],
)
def test_category_file_errors_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "cat.tsv"
    path.write_bytes(b"1\n" + line.encode(errors="surrogateescape") + b"\n")
    with pytest.raises(ValueError, match=f"cat.tsv, line 2: {message}"):
        read_categories(path)


def test_corrupt_gzip_names_the_file(tmp_path):
    path = tmp_path / "in.tsv.gz"
    path.write_bytes(gzip.compress(b"1\t1\t1\n" * 100)[:-20])
    with pytest.raises(ValueError, match="in.tsv.gz: cannot read file"):
        read_sparse_tsv(path)
    with pytest.raises(ValueError, match="in.tsv.gz: cannot read file"):
        read_categories(path)


def _cli(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err
    return code, err


def test_cli_empty_inputs_and_golden_fail(tmp_path, network, capsys):
    (tmp_path / "in.tsv").write_text("")
    (tmp_path / "golden.tsv").write_text("")
    code, err = _cli(capsys, ["challenge", "--network", str(network), "--inputs",
                              str(tmp_path / "in.tsv"), "--golden", str(tmp_path / "golden.tsv"),
                              "--bias", "-0.3", "--workers", "1", "--quiet"])
    assert code == 2 and "no inputs" in err and len(err.strip().splitlines()) == 1


def test_cli_missing_layer_fails_in_one_line(tmp_path, network, capsys):
    (network / f"n{NEURONS}-l3.tsv").unlink()
    code, err = _cli(capsys, ["partition", str(network), "--parts", "2"])
    assert code == 2 and f"n{NEURONS}-l3" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["challenge", "partition", "train"])
def test_an_output_path_naming_a_directory_fails_before_the_job(tmp_path, network, capsys,
                                                                 command):
    write_categories(tmp_path / "in.tsv", np.arange(1, 3))
    argv = {
        "challenge": ["challenge", "--network", str(network), "--inputs", str(tmp_path / "x"),
                      "--categories", str(tmp_path), "--workers", "1"],
        "partition": ["partition", str(network), "--parts", "2", "--out", str(tmp_path)],
        "train": ["train", "radixnet:32:2", "--save", str(tmp_path)],
    }[command]
    code, err = _cli(capsys, argv)
    assert code == 2 and "is a directory" in err and len(err.strip().splitlines()) == 1


def test_an_unreachable_scheduler_fails_quickly_in_one_line(tmp_path, network, capsys,
                                                             monkeypatch):
    monkeypatch.setenv("DASKNN_CONNECT_TIMEOUT", "1")
    write_sparse_tsv(tmp_path / "in.tsv", np.eye(4, NEURONS))
    start = time.perf_counter()
    code, err = _cli(capsys, ["challenge", "--network", str(network), "--inputs",
                              str(tmp_path / "in.tsv"), "--bias", "-0.3", "--quiet",
                              "--scheduler", "tcp://127.0.0.1:9"])
    # below Dask's own 30 s connect timeout: the 1 s one was used (a hang guard, not a timing)
    assert time.perf_counter() - start < HANG_GUARD
    assert code == 2 and "cannot reach the Dask scheduler" in err
    assert len(err.strip().splitlines()) == 1


def test_output_files_respect_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        write_text_atomically(tmp_path / "a.txt", "x")
        write_categories(tmp_path / "c.tsv", np.arange(1, 4))
        SparseMLP.radixnet(neurons=32, layers=1).save(tmp_path / "m.npz")
        os.umask(0o022)
        write_text_atomically(tmp_path / "b.txt", "x")
    finally:
        os.umask(old)
    for name in ("a.txt", "c.tsv", "m.npz"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o640, name
    assert stat.S_IMODE((tmp_path / "b.txt").stat().st_mode) == 0o644


def test_local_clusters_listen_on_localhost_only():
    with local_cluster(1) as cluster:
        assert cluster.scheduler_address.startswith(f"tcp://{LOCAL_HOST}:")
        assert cluster.dashboard_link.startswith(f"http://{LOCAL_HOST}:")
        workers = cluster.scheduler_info["workers"]
        assert workers and all(address.startswith(f"tcp://{LOCAL_HOST}:") for address in workers)
        for server in cluster.scheduler.http_server._sockets.values():
            assert server.getsockname()[0] == LOCAL_HOST


def test_a_value_that_does_not_fit_the_dtype_is_an_error(tmp_path, network):
    path = network / f"n{NEURONS}-l2.tsv"
    path.write_text(path.read_text() + "1\t1\t1e300\n")
    with pytest.raises(ValueError, match=r"l2.tsv, line \d+: value 1e\+300 does not fit float32"):
        read_challenge_network(network, dtype=np.float32)
    with pytest.raises(ValueError, match="layer 2 has a weight that does not fit float32"):
        prepare_run(str(network), np.eye(2, NEURONS), bias=-0.3, dtype="float32")
