"""``dasknn samo`` end to end on the test cluster (its figures against the sizes written out
here), the planner's choice under ``--memory-limit``, and its input errors."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from dasknn.cli import main
from dasknn.datasets import load_mnist_test
from dasknn.model import CompressedMLP
from dasknn.optim import Adam

HIDDEN = 32
SIZES = [784, HIDDEN, 10]
SMALL = ["--hidden", str(HIDDEN), "--samples", "256", "--held-out", "128", "--batch-size", "64"]


def run_samo(client, tmp_path, capsys, *options):
    out = tmp_path / "samo.json"
    argv = ["samo", *SMALL, "--scheduler", client.scheduler.address, "--json", str(out)]
    code = main([*argv, *options])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(out.read_text()), captured.out


def test_samo_trains_two_stages_and_reports_bytes_memory_and_accuracy(
    dask_client, tmp_path, capsys
):
    stats, text = run_samo(
        dask_client, tmp_path, capsys, "--dense-epochs", "1", "--epochs", "2", "--stages", "2",
        "--microbatches", "2",
    )  # fmt: skip
    phi = 784 * HIDDEN + HIDDEN * 10
    nnz = phi - round(0.9 * phi)  # global magnitude pruning removes round(p * phi) weights
    assert (stats["phi"], stats["nnz"]) == (phi, nnz)
    categories = stats["memory"]["categories"]
    biases = HIDDEN + 10
    assert categories["index"] == 4 * nnz + 8 * (784 + HIDDEN + 2)  # int32 index, row pointers
    assert categories["optimizer_states"] == 8 * (nnz + biases)  # Adam: two float32 moments
    assert categories["gradients"] == 4 * (nnz + biases)
    assert stats["plan"]["stages"] == 2 and stats["plan"]["bounds"] == [[0, 1], [1, 2]]
    comm = stats["comm"]  # the 8 steps and the 2 held-out scores of 128 rows
    assert comm["exact"] and comm["steps"] == stats["steps"] == 8
    phases = comm["phases"]
    for phase in ("forward", "backward"):  # activations and partial sums, float32, of 64 rows
        assert phases[phase]["measured_bytes"] == 8 * 64 * HIDDEN * 4
        assert phases[phase]["measured_messages"] == 8 * 2  # (S - 1) m a step
    assert phases["predict"]["measured_bytes"] == 2 * 128 * HIDDEN * 4
    assert phases["allreduce"]["measured_bytes"] == 0
    assert [e["epoch"] for e in stats["epochs"]] == [1, 2]
    assert all(0 <= e["held_out_accuracy"] <= 1 for e in stats["epochs"])
    assert len(stats["idle_fractions_last_step"]) == 2
    assert "epoch 2/2" in text and "(equal)" in text and "formula samo" in text


def test_save_writes_the_trained_model_that_load_reads(dask_client, tmp_path, capsys):
    saved = tmp_path / "pruned.npz"
    stats, text = run_samo(
        dask_client, tmp_path, capsys, "--dense-epochs", "0", "--stages", "2",
        "--microbatches", "2", "--save", str(saved), "--pin-cores",
    )  # fmt: skip
    pinned = stats["pinned_cores"]  # read on the stage workers while the pipeline was open
    allowed = os.sched_getaffinity(0)
    assert len(pinned) == 2 and set(pinned.values()) <= allowed
    assert len(set(pinned.values())) == min(2, len(allowed))
    model = CompressedMLP.load(saved)
    assert model.layer_sizes == SIZES and model.nnz == stats["nnz"]
    assert model.steps_ == stats["steps"] and model.optimizer == Adam(lr=1e-3)
    assert all(layer.optimizer_state[0].step == stats["steps"] for layer in model.stack.layers)
    x, y = load_mnist_test()
    held_x = x[-128:].reshape(128, -1).astype(np.float32) / 255.0
    assert model.score(held_x, y[-128:]) == stats["epochs"][-1]["held_out_accuracy"]
    assert f"saved the trained model to {saved}" in text


def test_checkpoint_dir_and_resume_end_with_the_model_of_an_uninterrupted_run(
    dask_client, tmp_path, capsys
):
    common = ("--dense-epochs", "0", "--stages", "2", "--precision", "fp64")
    run_samo(dask_client, tmp_path, capsys, *common, "--epochs", "2", "--save",
             str(tmp_path / "whole.npz"))  # fmt: skip
    checkpoints = tmp_path / "checkpoints"
    run_samo(dask_client, tmp_path, capsys, *common, "--epochs", "1", "--checkpoint-dir",
             str(checkpoints), "--checkpoint-every", "3")  # fmt: skip
    assert [p.name for p in checkpoints.iterdir()] == ["checkpoint-000000004.npz"]
    stats, _ = run_samo(dask_client, tmp_path, capsys, *common, "--epochs", "2", "--resume",
                        str(checkpoints), "--save", str(tmp_path / "resumed.npz"))  # fmt: skip
    whole, resumed = CompressedMLP.load(tmp_path / "whole.npz"), CompressedMLP.load(
        tmp_path / "resumed.npz"
    )
    assert resumed.steps_ == whole.steps_ == 8
    for got, want in zip(resumed.weights + resumed.biases, whole.weights + whole.biases,
                         strict=True):  # fmt: skip
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
    assert [e["epoch"] for e in stats["epochs"]] == [2]  # the first came from the checkpoint


def test_memory_limit_gives_one_stage_and_two_replicas(dask_client, tmp_path, capsys):
    stats, text = run_samo(
        dask_client, tmp_path, capsys, "--dense-epochs", "0", "--memory-limit", "10000000",
        "--precision", "fp16", "--microbatches", "2", "--step-timeout", "120",
    )  # fmt: skip
    assert (stats["plan"]["stages"], stats["plan"]["replicas"]) == (1, 2)
    nnz, biases = stats["nnz"], HIDDEN + 10
    comm = stats["comm"]  # the 4 steps of one epoch
    assert comm["exact"] and comm["steps"] == stats["steps"] == 4
    phases = comm["phases"]
    allreduce = 2 * (nnz + biases) * 2  # 2 (D - 1) (nnz + biases), float16, a step
    assert phases["allreduce"]["measured_bytes"] == 4 * allreduce
    assert phases["allreduce"]["measured_messages"] == 4 * 2 * 1 * 2 * 1  # 2 S D (D - 1)
    assert phases["forward"]["measured_bytes"] == phases["backward"]["measured_bytes"] == 0
    assert stats["skipped_steps"] == 0 and stats["loss_scale"] == 2.0**16
    assert "1 stage(s) x 2 replica(s)" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--hidden", "30,x"], "--hidden must be comma-separated positive sizes"),
        (["--sparsity", "1.0"], "--sparsity must lie in [0, 1)"),
        (["--samples", "9000"], "overlap"),
        (["--stages", "3"], "--stages 3 for a network of 2 layers"),
        (["--stages", "2", "--replicas", "2"], "4 workers needed, --workers is 2"),
        (["--microbatches", "3"], "a batch of 64 rows does not split"),
        (["--samples", "201", "--microbatches", "2"], "a batch of 9 rows"),
        (["--memory-limit", "1000", "--stages", "2"], "not with --stages"),
        (["--memory-limit", "1000"], "do not fit"),
        (["--lr", "-1"], "learning rate"),
        (["--batch-size", "0"], "--batch-size must be at least 1"),
        (["--step-timeout", "0"], "--step-timeout must be a finite number of seconds > 0"),
        (["--step-timeout", "inf"], "--step-timeout must be a finite number of seconds > 0"),
        (["--save", "/nonexistent-dir/m.npz"], "the directory of '/nonexistent-dir/m.npz'"),
        (["--checkpoint-every", "0"], "--checkpoint-every must be at least 1"),
        (["--resume", "/nonexistent-dir"], "--resume '/nonexistent-dir' does not exist"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, message, tmp_path, capsys):
    out = tmp_path / "samo.json"
    argv = ["samo", "--hidden", "30", "--dense-epochs", "0", *argv, "--json", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


def test_bf16_without_ml_dtypes_names_the_install_command(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    assert main(["samo", "--precision", "bf16"]) == 2
    assert "pip install ml_dtypes" in capsys.readouterr().err
