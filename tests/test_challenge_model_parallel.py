"""Model-parallel Graph Challenge inference (H-SpFF) on a real LocalCluster, against scipy."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn.challenge import run_challenge_model_parallel
from dasknn.cli import main
from dasknn.datasets import (
    challenge_bias,
    load_mnist_test,
    mnist_to_challenge_inputs,
    radixnet,
    write_categories,
)


def scipy_categories(inputs: sp.csr_matrix, layers, bias: float) -> np.ndarray:
    """The challenge in float64 with scipy.sparse: bias on the nonzeros only, ReLU, clip at 32."""
    y = sp.csr_matrix(inputs, dtype=np.float64)
    for w in layers:
        z = (y @ w).tocsr()
        z.data += bias
        z.data = np.minimum(np.maximum(z.data, 0.0), 32.0)
        z.eliminate_zeros()
        y = z
    return np.flatnonzero(np.diff(y.indptr) > 0) + 1


@pytest.fixture(scope="module")
def case():
    images, _ = load_mnist_test()
    inputs = mnist_to_challenge_inputs(images[:300], side=32)
    layers = radixnet(1024, 18, seed=3)
    return inputs, layers, scipy_categories(inputs, layers, challenge_bias(1024))


@pytest.mark.parametrize(
    ("method", "nparts", "dtype"),
    [
        pytest.param("hypergraph", 2, "float64", marks=pytest.mark.slow),
        ("random", 3, "float64"),
        ("hypergraph", 4, "float32"),
    ],
)
def test_categories_equal_scipy_and_volume_equals_prediction(
    dask_client, case, method, nparts, dtype
):
    inputs, layers, expected = case
    categories, stats = run_challenge_model_parallel(
        layers, inputs, client=dask_client, nparts=nparts, method=method, batch_size=128,
        dtype=dtype, progress=False,
    )
    np.testing.assert_array_equal(categories, expected)
    assert 0 < stats.categories == len(expected) < inputs.shape[0]
    assert stats.measured_bytes == stats.predicted_bytes > 0
    assert (stats.nparts, stats.workers, stats.method) == (nparts, 2, method)


def test_hypergraph_moves_fewer_bytes_than_random(dask_client, case):
    inputs, layers, _ = case
    moved = {
        method: run_challenge_model_parallel(
            layers, inputs[:64], client=dask_client, nparts=2, method=method, progress=False,
        )[1].measured_bytes
        for method in ("hypergraph", "random")
    }
    assert moved["hypergraph"] < 0.8 * moved["random"]


def test_bad_input_is_refused_before_any_work(dask_client, case):
    inputs, layers, _ = case
    before = dask_client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
    with pytest.raises(ValueError, match="bias <= 0"):
        run_challenge_model_parallel(layers, inputs, bias=0.25, client=dask_client)
    with pytest.raises(ValueError, match="nparts"):
        run_challenge_model_parallel(layers, inputs, client=dask_client, nparts=5000)
    with pytest.raises(ValueError, match="width mismatch"):
        run_challenge_model_parallel(layers, inputs[:, :512], client=dask_client)
    after = dask_client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
    assert after <= before  # earlier tests may still release keys; nothing new was scheduled


def test_cli_model_parallel_passes_against_golden(dask_client, case, tmp_path, capsys):
    # 18 layers: after 6 of them one of these rows sits exactly at 0.3 - 0.3, where float64
    # rounding in the summation order decides; by 18 layers no row is at such a tie
    inputs, layers, expected = case
    network = tmp_path / "net"
    network.mkdir()
    for k, w in enumerate(layers, start=1):
        coo = w.tocoo()
        triples = zip(coo.row, coo.col, coo.data, strict=True)
        (network / f"n1024-l{k}.tsv").write_text(
            "".join(f"{r + 1}\t{c + 1}\t{v}\n" for r, c, v in triples)
        )
    golden = tmp_path / "golden.tsv"
    write_categories(golden, expected)
    sp_inputs = tmp_path / "inputs.tsv"
    coo = inputs.tocoo()
    triples = zip(coo.row, coo.col, coo.data, strict=True)
    sp_inputs.write_text("".join(f"{r + 1}\t{c + 1}\t{v:g}\n" for r, c, v in triples))
    out = tmp_path / "categories.tsv"
    code = main([
        "challenge", "--network", str(network), "--inputs", str(sp_inputs), "--golden",
        str(golden), "--categories", str(out), "--scheduler", dask_client.scheduler.address,
        "--model-parallel", "--parts", "2", "--dtype", "float64", "--quiet",
    ])
    assert code == 0
    assert "CHALLENGE PASSED" in capsys.readouterr().out
    assert out.read_text() == golden.read_text()
    code = main([
        "challenge", "--network", str(network), "--inputs", str(sp_inputs), "--bias", "0.5",
        "--categories", str(tmp_path / "never.tsv"), "--scheduler",
        dask_client.scheduler.address, "--model-parallel",
    ])
    assert code == 2
    assert "bias <= 0" in capsys.readouterr().err
    assert not (tmp_path / "never.tsv").exists()


def test_a_spec_is_made_in_the_run_dtype_and_matrices_as_given(case):
    from dasknn.challenge.engine import network_source

    made = next(network_source("radixnet:1024:2", dtype=np.float32)())
    expected = radixnet(1024, 1)[0]
    assert made.dtype == np.float32 and made.indices.dtype == np.int32
    np.testing.assert_array_equal(made.toarray(), expected.toarray())
    _, layers, _ = case
    given = next(network_source(layers, dtype=np.float32)())
    assert given.dtype == layers[0].dtype == np.float64
