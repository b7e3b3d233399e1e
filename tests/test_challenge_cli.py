"""``dasknn challenge`` on real LocalClusters: files in, categories out, and bad input."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from distributed import Client, LocalCluster

from dasknn.cli import main
from dasknn.datasets import (
    load_mnist_test,
    mnist_to_challenge_inputs,
    radixnet,
    read_categories,
    write_categories,
    write_sparse_tsv,
)

pytestmark = pytest.mark.minversions  # also run at the minimum versions (.ci/run)

NEURONS = 64
BIAS = -0.3


@pytest.fixture(scope="module")
def scheduler_address():
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address=":0")
    with cluster, Client(cluster):
        yield cluster.scheduler_address


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A 64-neuron, 10-layer RadiX-Net as challenge files, 8x8 MNIST inputs, and their categories.

    The expected categories come from a plain float64 numpy loop written here.
    """
    root = tmp_path_factory.mktemp("challenge")
    layers = radixnet(NEURONS, 10)
    net = root / "net"
    net.mkdir()
    for k, w in enumerate(layers, start=1):
        write_sparse_tsv(net / f"n{NEURONS}-l{k}.tsv", w)
    inputs = mnist_to_challenge_inputs(load_mnist_test()[0][:400], 8)
    write_sparse_tsv(root / "inputs.tsv.gz", inputs)
    y = inputs.toarray()
    for w in layers:
        z = y @ w.toarray()
        z[z != 0] += BIAS
        y = np.clip(z, 0, 32)
    golden = np.flatnonzero(y.any(axis=1)) + 1
    assert 0 < golden.size < 400
    write_categories(root / "golden.tsv", golden)
    return {"root": root, "net": net, "inputs": root / "inputs.tsv.gz",
            "golden": root / "golden.tsv"}


@pytest.mark.slow  # the default run keeps test_idx_inputs_on_own_local_cluster
def test_tsv_inputs_on_scheduler_address(files, scheduler_address, tmp_path, capsys):
    out, report = tmp_path / "cats.tsv", tmp_path / "report.json"
    code = main([
        "challenge", "--network", str(files["net"]), "--bias", str(BIAS),
        "--inputs", str(files["inputs"]), "--categories", str(out), "--golden",
        str(files["golden"]), "--scheduler", scheduler_address, "--batch-size", "64",
        "--json", str(report),
    ])
    printed = capsys.readouterr().out
    assert code == 0
    assert "CHALLENGE PASSED" in printed and "edges/s" in printed
    np.testing.assert_array_equal(read_categories(out), read_categories(files["golden"]))
    stats = json.loads(report.read_text())
    assert stats["passed"] is True and stats["inputs"] == 400 and stats["workers"] == 2
    assert stats["edges"] == 10 * NEURONS * 32 and stats["rate"] > 0
    assert len(stats["peak_memory"]) == 2 and min(stats["peak_memory"].values()) > 0


class _Records(logging.Handler):
    """The levels of the records that reach it (at any level)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.levels: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.levels.append(record.levelno)


@pytest.mark.slow
def test_idx_inputs_on_own_local_cluster(tmp_path, capsys):
    """No --scheduler: the command starts (and stops) its own LocalCluster; IDX images in."""
    images = load_mnist_test()[0][:300]
    idx = tmp_path / "images-idx3-ubyte.gz"
    header = bytes([0, 0, 0x08, 3]) + b"".join(int(d).to_bytes(4, "big") for d in images.shape)
    with gzip.open(idx, "wb") as fh:
        fh.write(header + images.tobytes())
    out = tmp_path / "cats.tsv"
    dask_logger = logging.getLogger("distributed")
    records = _Records()
    dask_logger.addHandler(records)
    dask_logger.setLevel(logging.INFO)
    try:
        code = main([
            "challenge", "--network", "radixnet:1024:12", "--inputs", str(idx), "--categories",
            str(out), "--workers", "1", "--threads", "2", "--dtype", "float64", "--quiet",
        ])
    finally:
        dask_logger.removeHandler(records)
    assert code == 0
    assert capsys.readouterr().out == ""
    # the scheduler of the command's cluster runs in this process: its informational records
    # ("State start", ...) are held back by the default --dask-log-level, and the level the
    # caller had is back afterwards
    assert all(level >= logging.WARNING for level in records.levels), records.levels
    assert dask_logger.level == logging.INFO
    y = mnist_to_challenge_inputs(images, 32)
    for w in radixnet(1024, 12):
        z = (y @ w).toarray()
        z[z != 0] += -0.30
        y = sp.csr_matrix(np.clip(z, 0, 32))
    np.testing.assert_array_equal(read_categories(out), np.flatnonzero(y.getnnz(axis=1)) + 1)


def test_golden_mismatch_fails(files, scheduler_address, tmp_path, capsys):
    wrong = tmp_path / "wrong.tsv"
    write_categories(wrong, read_categories(files["golden"])[1:])
    code = main([
        "challenge", "--network", str(files["net"]), "--bias", str(BIAS), "--inputs",
        str(files["inputs"]), "--golden", str(wrong), "--scheduler", scheduler_address,
        "--resident-layers", "3", "--quiet",
    ])
    assert code == 1
    assert "CHALLENGE FAILED" in capsys.readouterr().out


def _run_bad(files, tmp_path, capsys, *extra) -> str:
    out = tmp_path / "cats.tsv"
    argv = ["challenge", "--categories", str(out), "--quiet", *extra]
    assert main(argv) == 2
    assert not out.exists() and not list(tmp_path.glob(".cats.tsv*"))
    return capsys.readouterr().err


def test_width_mismatch(files, tmp_path, capsys):
    wide = tmp_path / "wide.tsv"
    wide.write_text(f"1\t{NEURONS + 5}\t1\n")
    err = _run_bad(files, tmp_path, capsys, "--network", str(files["net"]), "--bias", "-0.3",
                   "--inputs", str(wide))
    assert "width mismatch" in err


def test_bad_input_line(files, tmp_path, capsys):
    bad = tmp_path / "bad.tsv"
    bad.write_text("1\t2\t1\n3\tx\t1\n")
    err = _run_bad(files, tmp_path, capsys, "--network", str(files["net"]), "--bias", "-0.3",
                   "--inputs", str(bad))
    assert "line 2" in err


def test_missing_layer(files, tmp_path, capsys):
    net = tmp_path / "net"
    net.mkdir()
    for k in (1, 2, 4):
        name = f"n{NEURONS}-l{k}.tsv"
        (net / name).write_text((files["net"] / name).read_text())
    err = _run_bad(files, tmp_path, capsys, "--network", str(net), "--layers", "4", "--bias",
                   "-0.3", "--inputs", str(files["inputs"]))
    assert f"n{NEURONS}-l3" in err


def test_width_without_challenge_bias(files, tmp_path, capsys):
    err = _run_bad(files, tmp_path, capsys, "--network", str(files["net"]), "--inputs",
                   str(files["inputs"]))
    assert "bias" in err


def test_missing_golden_and_inputs(files, tmp_path, capsys):
    err = _run_bad(files, tmp_path, capsys, "--network", str(files["net"]), "--bias", "-0.3",
                   "--inputs", str(tmp_path / "nope.tsv"))
    assert "nope.tsv" in err
    err = _run_bad(files, tmp_path, capsys, "--network", str(files["net"]), "--bias", "-0.3",
                   "--inputs", str(files["inputs"]), "--golden", str(tmp_path / "none.tsv"))
    assert "none.tsv" in err


def test_missing_output_directory(files, tmp_path, capsys):
    report = tmp_path / "nowhere" / "report.json"
    err = _run_bad(files, tmp_path, capsys, "--network", str(files["net"]), "--bias", "-0.3",
                   "--inputs", str(files["inputs"]), "--json", str(report))
    assert "nowhere" in err


def test_bad_options(files, tmp_path, capsys):
    common = ["--network", str(files["net"]), "--bias", "-0.3", "--inputs", str(files["inputs"])]
    assert "batch_size" in _run_bad(files, tmp_path, capsys, *common, "--batch-size", "0")
    assert "workers" in _run_bad(files, tmp_path, capsys, *common, "--workers", "0")
    nan_net = tmp_path / "nan"
    nan_net.mkdir()
    (nan_net / "n64-l1.tsv").write_text("1\t1\tnan\n")
    assert "n64-l1.tsv, line 1" in _run_bad(files, tmp_path, capsys, "--network", str(nan_net),
                                            "--bias", "-0.3", "--inputs", str(files["inputs"]))
