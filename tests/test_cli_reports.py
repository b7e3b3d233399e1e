"""What a user sees: ``dasknn train`` prints the loss per epoch and the held-out accuracy with a
progress bar that stays, and ``--json`` on train and partition holds the same figures, checked
against numpy computations written here."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

import graph
from dasknn.cli import main
from dasknn.datasets import load_mnist_test, load_network, mnist_to_challenge_inputs
from dasknn.model import SparseMLP


def _accuracy(model: SparseMLP, x: np.ndarray, labels: np.ndarray) -> float:
    """float64 numpy forward pass: relu hidden layers, a linear output; the class is the largest
    logit."""
    a = x
    for k, (w, b) in enumerate(zip(model.weights, model.biases, strict=True)):
        z = a @ sp.csr_matrix(w).toarray() + b
        a = z if k == len(model.weights) - 1 else np.maximum(z, 0)
    return float(np.mean(np.argmax(a, axis=1) == labels))


def test_train_prints_epochs_and_held_out_accuracy_and_writes_json(dask_client, tmp_path, capsys):
    saved, report = tmp_path / "model.npz", tmp_path / "train.json"
    argv = [
        "train",
        "radixnet:64:2",
        "--data",
        "mnist",
        "--samples",
        "640",
        "--validation-fraction",
        "0.25",
        "--epochs",
        "2",
        "--lr",
        "0.1",
        "--activation",
        "relu",
        "--scheduler",
        dask_client.scheduler.address,
        "--save",
        str(saved),
        "--json",
        str(report),
    ]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "epoch 1/2: loss" in out and "epoch 2/2: loss" in out
    assert out.count("held-out accuracy") == 2 and "(160 samples)" in out
    assert "dashboard: http://" in out and "/dasknn/comm" in out
    # the bar of every epoch stays: its last state, 8 of 8 batches of 64, is still on stderr
    assert "epoch 1/2: 100%" in err and "epoch 2/2: 100%" in err and "8/8" in err
    stats = json.loads(report.read_text())
    assert [e["epoch"] for e in stats["epochs"]] == [1, 2]
    assert stats["epochs"][1]["loss"] < stats["epochs"][0]["loss"]
    for epoch in stats["epochs"]:
        assert f"epoch {epoch['epoch']}/2: loss {epoch['loss']:.6g}" in out
    images, labels = load_mnist_test()
    x_held = mnist_to_challenge_inputs(images[480:640], side=32).toarray()
    accuracy = _accuracy(SparseMLP.load(saved), x_held, labels[480:640])
    assert stats["epochs"][-1]["validation_accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert accuracy > 0.2  # chance: 0.1
    assert stats["timing"]["batches"] == 16 and stats["timing"]["seconds_per_batch"] > 0
    comm = stats["comm"]
    assert comm["exact"] and comm["measured_bytes"] == comm["predicted_bytes"] > 0
    assert sum(row["measured_bytes"] for row in comm["records"]) == comm["measured_bytes"]
    assert sum(row["predicted_bytes"] for row in comm["records"]) == comm["predicted_bytes"]
    assert f"measured {comm['measured_bytes']:,d} B" in out


def test_train_scores_a_validation_file_and_rejects_a_bad_one(dask_client, tmp_path, capsys):
    rng = np.random.default_rng(0)
    held = tmp_path / "held.npz"
    np.savez(held, X=rng.uniform(0, 1, (20, 32)), y=rng.uniform(0, 1, (20, 32)))
    report = tmp_path / "train.json"
    common = [
        "train",
        "radixnet:32:2",
        "--samples",
        "64",
        "--epochs",
        "1",
        "--scheduler",
        dask_client.scheduler.address,
        "--json",
        str(report),
    ]
    assert main([*common, "--validation-data", str(held)]) == 0
    out = capsys.readouterr().out
    stats = json.loads(report.read_text())
    assert "held-out loss" in out and "validation_loss" in stats["epochs"][0]
    report.unlink()
    np.savez(held, X=rng.uniform(0, 1, (20, 32)))
    assert main([*common, "--validation-data", str(held)]) == 2
    err = capsys.readouterr().err
    assert "arrays X and y" in err and len(err.strip().splitlines()) == 1
    np.savez(held, X=rng.uniform(0, 1, (20, 31)), y=rng.uniform(0, 1, (20, 32)))
    assert main([*common, "--validation-data", str(held)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert main([*common, "--validation-fraction", "1.5"]) == 2
    assert "between 0 and 1" in capsys.readouterr().err
    assert not report.exists()


def test_partition_json_holds_the_table_and_the_volume_per_layer(tmp_path, capsys):
    report, parts_file = tmp_path / "partition.json", tmp_path / "parts.npz"
    assert (
        main(
            [
                "partition",
                "radixnet:64:3",
                "--parts",
                "2",
                "4",
                "--json",
                str(report),
                "--out",
                str(parts_file),
            ]
        )
        == 0
    )
    table = capsys.readouterr().out
    stats = json.loads(report.read_text())
    layers = load_network("radixnet:64:3")
    saved = graph.load_partitions(parts_file)
    assert [row["nparts"] for row in stats["parts"]] == [2, 4]
    for row in stats["parts"]:
        parts = saved[row["nparts"]].parts
        volume = []
        for k, w in enumerate(layers):  # forward + backward words, counted here
            coo = sp.coo_matrix(w)
            pairs = {(i, parts[k + 1][j]) for i, j in zip(coo.row, coo.col, strict=True)}
            volume.append(2 * sum(p != parts[k][i] for i, p in pairs))
        assert row["method_metrics"]["layer_volume"] == volume
        assert row["method_metrics"]["total_volume"] == sum(volume)
        assert f"| {row['nparts']} | {row['avg_volume_ratio']:.3f} |" in table
