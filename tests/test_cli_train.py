"""``dasknn train`` end to end on the test cluster, and its input errors."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.cli import main
from dasknn.model import SparseMLP


def test_train_prints_breakdown_and_volume_and_saves(dask_client, tmp_path, capsys):
    out = tmp_path / "model.npz"
    code = main(
        [
            "train", "radixnet:64:3", "--partition", "block", "--parts", "2", "--steps", "3",
            "--batch-size", "4", "--lr", "0.1", "--scheduler", dask_client.scheduler.address,
            "--save", str(out),
        ]
    )
    text = capsys.readouterr().out
    assert code == 0
    assert "ms/batch" in text and "local products" in text and "wait" in text
    assert "(equal)" in text
    model = SparseMLP.load(out)
    assert model.layer_sizes == [64, 64, 64, 64]
    assert np.isfinite(model.weights[0].data).all()


def test_train_on_mnist_with_hypergraph_partition(dask_client, capsys):
    code = main(
        [
            "train", "radixnet:64:2", "--data", "mnist", "--activation", "relu", "--parts", "2",
            "--steps", "2", "--batch-size", "8", "--scheduler", dask_client.scheduler.address,
        ]
    )
    text = capsys.readouterr().out
    assert code == 0
    assert "softmax_cross_entropy" in text and "(equal)" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["radixnet:64:2", "--parts", "0"], "--parts must be at least 1"),
        (["radixnet:64:2", "--parts", "65"], "65 parts"),
        (["radixnet:64:2", "--steps", "0"], "--steps"),
        (["radixnet:60:2"], "neurons"),
        (["/no/such/dir", "--data", "mnist"], "radixnet"),
        (["radixnet:32", "--data", "mnist"], "must be radixnet:N:L"),
        (["radixnet:32:x"], "must be radixnet:N:L"),
        (["radixnet:64:2", "--microbatches", "0"], "--microbatches must be at least 1"),
        (["radixnet:64:2", "--step-timeout", "0"], "--step-timeout must be a finite number"),
        (["radixnet:64:2", "--step-timeout", "inf"], "--step-timeout must be a finite number"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(argv, message, tmp_path, capsys):
    out = tmp_path / "model.npz"
    assert main(["train", *argv, "--save", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_train_with_microbatches_and_posted_messages(dask_client, capsys):
    code = main(
        [
            "train", "radixnet:64:2", "--partition", "block", "--parts", "2", "--steps", "2",
            "--batch-size", "6", "--microbatches", "3", "--messages", "posted", "--scheduler",
            dask_client.scheduler.address,
        ]
    )
    text = capsys.readouterr().out
    assert code == 0
    assert "3 microbatches a batch" in text and "(equal)" in text
