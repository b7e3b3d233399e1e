"""``dasknn parallax`` and ``dasknn slide`` end to end on the test cluster (their statistics
against what the run must give: steps, finite held-out figures, the measured traffic equal to the
prediction), and their option errors: one line, exit code 2, before any work."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dasknn.cli import main

PARALLAX = [
    "parallax", "--packages", "dbm,curses,sqlite3", "--max-vocab", "200", "--embed-dim", "8",
    "--hidden", "16", "--batch-size", "64", "--sparse-partitions", "2", "--no-progress",
]  # fmt: skip
SLIDE = [
    "slide", "--samples", "400", "--features", "100", "--labels", "200", "--held-out", "100",
    "--hidden", "16", "--k", "4", "--tables", "4", "--batch-size", "50", "--no-progress",
]  # fmt: skip


def _run(argv, client, tmp_path, capsys):
    out = tmp_path / "stats.json"
    code = main([*argv, "--scheduler", client.scheduler.address, "--json", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(out.read_text()), captured.out


def test_parallax_trains_and_reports_the_measured_bytes(dask_client, tmp_path, capsys):
    stats, text = _run([*PARALLAX, "--epochs", "2"], dask_client, tmp_path, capsys)
    windows = stats["windows"]["training"]
    assert stats["steps"] == 2 * math.ceil(windows / 64)
    assert [e["epoch"] for e in stats["epochs"]] == [1, 2]
    assert all(math.isfinite(e["held_out_perplexity"]) for e in stats["epochs"])
    assert all(0 <= e["held_out_accuracy"] <= 1 for e in stats["epochs"])
    assert stats["comm"]["exact"] and stats["comm"]["measured_bytes"] > 0
    assert "epoch 2/2" in text and "(equal)" in text


@pytest.mark.slow
def test_parallax_resumes_its_checkpoint_to_the_losses_of_an_uninterrupted_run(
    dask_client, tmp_path, capsys
):
    whole, _ = _run([*PARALLAX, "--epochs", "2", "--checkpoint-dir", str(tmp_path / "whole")],
                    dask_client, tmp_path, capsys)  # fmt: skip
    part = tmp_path / "part"
    _run([*PARALLAX, "--epochs", "1", "--checkpoint-dir", str(part), "--checkpoint-every", "5"],
         dask_client, tmp_path, capsys)  # fmt: skip
    resumed, text = _run([*PARALLAX, "--epochs", "2", "--resume", str(part)], dask_client,
                         tmp_path, capsys)  # fmt: skip
    assert [e["epoch"] for e in resumed["epochs"]] == [1, 2]
    for got, want in zip(resumed["epochs"], whole["epochs"], strict=True):
        assert got == pytest.approx(want, rel=1e-6)
    assert "epoch 1/2: loss" in text and "epoch 2/2: loss" in text and "held-out perplexity" in text


def test_slide_trains_and_reports_the_measured_bytes(dask_client, tmp_path, capsys):
    stats, text = _run([*SLIDE, "--epochs", "1"], dask_client, tmp_path, capsys)
    assert stats["shards"] == 2 and stats["steps"] == math.ceil(300 / 50)
    assert 0 <= stats["epochs"][0]["held_out_precision_at_1"] <= 1
    assert 0 < stats["held_out_oracle_precision_at_1"] <= 1
    assert stats["comm"]["exact"] and stats["comm"]["measured_bytes"] > 0
    assert "epoch 1/1" in text and "(equal)" in text


def test_slide_checkpoints_and_resumes_its_run(dask_client, tmp_path, capsys):
    run = tmp_path / "run"
    argv = [*SLIDE, "--epochs", "2", "--checkpoint-dir", str(run), "--checkpoint-every", "4"]
    whole, _ = _run(argv, dask_client, tmp_path, capsys)
    assert [p.name for p in run.iterdir()] == ["checkpoint-000000012.npz"]
    assert stats_epochs(whole) == [1, 2] and whole["steps"] == 12
    resumed, text = _run([*SLIDE, "--epochs", "2", "--resume", str(run)], dask_client, tmp_path,
                         capsys)  # fmt: skip
    assert resumed["steps"] == 12 and resumed["epochs"] == whole["epochs"]
    assert "epoch 2/2: loss" in text and "held-out P@1" in text
    code = main([*SLIDE, "--epochs", "3", "--resume", str(run), "--scheduler",
                 dask_client.scheduler.address])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "schedule_steps" in err and err.count("\n") == 1


def stats_epochs(stats: dict) -> list[int]:
    return [e["epoch"] for e in stats["epochs"]]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([*PARALLAX, "--hidden", "8,x"], "--hidden must be comma-separated positive sizes"),
        ([*PARALLAX, "--sparse-partitions", "none"], "--sparse-partitions must be a count"),
        ([*PARALLAX, "--lr", "nan"], "--lr must be a finite number > 0"),
        ([*PARALLAX, "--epochs", "0"], "--epochs must be at least 1"),
        ([*PARALLAX, "--workers", "0"], "--workers must be at least 1"),
        ([*PARALLAX, "--checkpoint-every", "0"], "--checkpoint-every must be at least 1"),
        ([*SLIDE, "--active-fraction", "0"], "--active-fraction must lie in (0, 1]"),
        ([*SLIDE, "--held-out", "400"], "--held-out 400 leaves no training row"),
        ([*SLIDE, "--xmc", "/nonexistent.txt"], "no such file"),
        ([*SLIDE, "--step-timeout", "0"], "--step-timeout must be a finite number of seconds"),
        ([*SLIDE, "--checkpoint-every", "0"], "--checkpoint-every must be at least 1"),
        ([*SLIDE, "--resume", "/nonexistent"], "--resume '/nonexistent' does not exist"),
    ],
)
def test_bad_options_exit_2_with_one_line_before_any_work(argv, message, tmp_path, capsys):
    out = tmp_path / "stats.json"
    assert main([*argv, "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


def test_a_loss_that_is_not_finite_exits_2_with_one_line(dask_client, tmp_path, capsys):
    out = tmp_path / "stats.json"
    argv = [*SLIDE, "--lr", "1e300", "--scheduler", dask_client.scheduler.address]
    with np.errstate(all="ignore"):
        code = main([*argv, "--json", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("dasknn slide: error: step ") and "the loss is" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
