"""The ``dasknn partition`` command: table, files, and clear errors on bad input."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import graph
from dasknn.cli import main
from dasknn.datasets import radixnet


def test_prints_table_and_writes_files(tmp_path, capsys):
    out, report = tmp_path / "parts.npz", tmp_path / "table.md"
    code = main(
        ["partition", "radixnet:256:4", "--parts", "4", "8", "--backend", "kahypar",
         "--out", str(out), "--report", str(report)]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "| P | vol avg H/R | floor/R |" in printed
    assert printed.count("\n| 4 |") == 1 and printed.count("\n| 8 |") == 1
    assert report.read_text().strip() == printed.strip()
    partitions = graph.load_partitions(out)
    assert sorted(partitions) == [4, 8]
    layers = radixnet(256, 4, seed=0)
    row = next(line for line in printed.splitlines() if line.startswith("| 8 |"))
    avg_volume = float(row.split("|")[7])
    assert partitions[8].metrics(layers).avg_volume == pytest.approx(avg_volume, abs=0.5)
    assert [len(p) for p in partitions[8].parts] == [256] * 5
    assert sorted(tmp_path.iterdir()) == sorted([out, report])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["radixnet:256:2", "--parts", "0"], "--parts 0 is impossible"),
        (["radixnet:256:2", "--parts", "4", "512"], "--parts 512 is impossible"),
        (["radixnet:256:two"], "radixnet:N:L"),
        (["/nonexistent/net"], "neither an existing directory"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "parts.npz"
    code = main(["partition", *args, "--out", str(out), "--report", str(tmp_path / "t.md")])
    assert code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_unknown_method_is_rejected_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["partition", "radixnet:256:2", "--method", "metis"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_malformed_network_directory(tmp_path, capsys):
    net = tmp_path / "net"
    net.mkdir()
    (net / "n4-l1.tsv").write_text("1\t2\t0.5\nnot a line\n")
    code = main(["partition", str(net), "--parts", "2", "--report", str(tmp_path / "t.md")])
    assert code == 2
    err = capsys.readouterr().err
    assert "n4-l1.tsv" in err
    assert not (tmp_path / "t.md").exists()


def test_missing_output_directory_leaves_nothing(tmp_path, capsys):
    code = main(
        ["partition", "radixnet:256:2", "--parts", "2", "--out", str(tmp_path / "no" / "p.npz")]
    )
    assert code == 2
    assert "does not exist" in capsys.readouterr().err


def test_console_entry_point_runs():
    result = subprocess.run(
        [sys.executable, "-m", "dasknn", "partition", "radixnet:256:2", "--parts", "2",
         "--method", "block", "--baseline", "random"],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert np.isfinite(float(result.stdout.splitlines()[-1].split("|")[2]))


def test_refine_flag(capsys):
    assert main(["partition", "radixnet:256:3", "--parts", "8", "--refine"]) == 0
    printed = capsys.readouterr().out
    assert "refined" in printed.splitlines()[0]
    assert "\n| 8 |" in printed


def test_stream_writes_parts_and_report_per_layer(tmp_path, capsys):
    import json

    out, figures = tmp_path / "parts.npz", tmp_path / "layers.json"
    code = main(
        ["partition", "radixnet:256:5", "--parts", "8", "--stream",
         "--out", str(out), "--json", str(figures)]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert printed.count("\n| 5 |") == 1
    report = json.loads(figures.read_text())
    assert report["layers_done"] == 5
    layers = radixnet(256, 5, seed=0)
    partition = graph.load_partitions(out)[8]
    whole = graph.partition_network(layers, 8)
    assert report["totals"]["volume"] == partition.metrics(layers).total_volume
    assert report["totals"]["volume"] == whole.metrics().total_volume


def test_stream_needs_out(capsys):
    assert main(["partition", "radixnet:256:2", "--parts", "8", "--stream"]) == 2
    assert "needs --out" in capsys.readouterr().err
