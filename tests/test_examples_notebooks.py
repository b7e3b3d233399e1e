"""The notebooks in ``examples/`` run top to bottom (nbclient, a real Jupyter kernel) on small
sizes, and what they show is checked: against float64 references written here where there is
one. The notebooks are stored executed, with their outputs (``examples/execute_notebooks.py``), so
that they read on a repository page; the tests run them again."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _execute(name: str, parameters: str, probe: str, tmp_path: Path) -> tuple[dict, list]:
    """Run ``examples/<name>.ipynb`` with ``parameters`` appended to its parameters cell and
    ``probe`` (which prints one JSON line after ``RESULT``) as an extra last cell; return the
    probe's values and the executed cells."""
    nb = nbformat.read(EXAMPLES / f"{name}.ipynb", as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    counts = [cell.execution_count for cell in code]
    assert counts == list(range(1, len(code) + 1)), (
        f"{name}.ipynb is not stored executed top to bottom: python examples/execute_notebooks.py "
        f"{name}"
    )
    assert any(cell.outputs for cell in code), f"{name}.ipynb is stored without outputs"
    if any("matplotlib" in cell.source for cell in code):
        assert _images(nb.cells) >= 1, f"{name}.ipynb is stored without its plots"
    for cell in code:
        cell.outputs, cell.execution_count = [], None
    tagged = [cell for cell in code if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1
    tagged[0].source += "\n# test sizes\n" + parameters
    nb.cells.append(nbformat.v4.new_code_cell(probe))
    nbclient.NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    printed = "".join(
        out.get("text", "") for out in nb.cells[-1].outputs if out.output_type == "stream"
    )
    line = next(line for line in printed.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :]), nb.cells


def _images(cells) -> int:
    return sum(
        "image/png" in out.get("data", {})
        for cell in cells
        if cell.cell_type == "code"
        for out in cell.outputs
    )


def _layer_volume(layer: sp.spmatrix, inputs: np.ndarray, outputs: np.ndarray) -> int:
    """Forward plus backward words of one layer: per input neuron, one word each way to every
    other part owning one of its consumers."""
    coo = sp.coo_matrix(layer)
    pairs = {(i, outputs[j]) for i, j in zip(coo.row, coo.col, strict=True)}
    return 2 * sum(part != inputs[i] for i, part in pairs)


@pytest.mark.slow
def test_partitioning_notebook(tmp_path):
    probe = (
        "import json\n"
        "print('RESULT ' + json.dumps({'P': P, 'h': [p.tolist() for p in hypergraph[P].parts],"
        " 'r': [p.tolist() for p in random[P].parts],"
        " 'h_layers': h.layer_volume.tolist(), 'r_layers': r.layer_volume.tolist(),"
        " 'floor': floor}))"
    )
    result, cells = _execute(
        "partitioning", 'NETWORK = "radixnet:64:4"\nPARTS = [2, 4]', probe, tmp_path
    )
    assert _images(cells) >= 2
    from dasknn.datasets import load_network

    layers = load_network("radixnet:64:4")
    assert result["P"] == 4
    for name in ("h", "r"):
        parts = [np.asarray(p) for p in result[name]]
        assert len(parts) == len(layers) + 1 and all(len(p) == 64 for p in parts)
        expected = [_layer_volume(w, parts[k], parts[k + 1]) for k, w in enumerate(layers)]
        assert result[f"{name}_layers"] == expected
    assert sum(result["h_layers"]) < sum(result["r_layers"])
    assert all(h >= f for h, f in zip(result["h_layers"], result["floor"], strict=True))


@pytest.mark.slow
def test_model_parallel_training_notebook(tmp_path, dask_client):
    parameters = (
        "NEURONS, LAYERS = 64, 2\nTRAIN, HELD_OUT = 512, 256\nEPOCHS, BATCH, LR = 2, 64, 0.1\n"
        f"CLUSTER = {dask_client.scheduler.address!r}"
    )
    probe = (
        "import json\n"
        "print('RESULT ' + json.dumps({'loss': dist.loss_curve_,"
        " 'batches': len(dist.batch_loss_curve_), 'accuracy': accuracy,"
        " 'measured': report.total(), 'predicted': report.total('predicted'),"
        " 'exact': report.exact,"
        " 'layers': sorted({str(row['what']) for row in report.records()})}))"
    )
    result, cells = _execute("model_parallel_training", parameters, probe, tmp_path)
    assert _images(cells) == 1  # one figure, redrawn in place every epoch
    assert len(result["loss"]) == 2 and result["batches"] == 2 * 8
    assert result["loss"][1] < result["loss"][0]
    assert len(result["accuracy"]) == 2 and result["accuracy"][-1] > 0.3  # chance: 0.1
    assert result["measured"] == result["predicted"] > 0 and result["exact"]
    assert {"1", "2", "3"} <= set(result["layers"])
    printed = "".join(out.get("text", "") for cell in cells for out in cell.get("outputs", []))
    assert "held-out accuracy" in printed and "predicted" in printed
    assert "dashboard page: http://" in printed and "/dasknn/comm" in printed


@pytest.mark.slow
def test_graph_challenge_notebook(tmp_path, dask_client):
    from dasknn.datasets import load_mnist_test, mnist_to_challenge_inputs, radixnet

    parameters = (
        f'NETWORK = "radixnet:64:6"\nIMAGES = 300\nBIAS = -0.3\nBATCH = 100\n'
        f"CLUSTER = {dask_client.scheduler.address!r}"
    )
    probe = "import json\nprint('RESULT ' + json.dumps(categories.tolist()))"
    categories, cells = _execute("graph_challenge", parameters, probe, tmp_path)
    assert _images(cells) == 1
    y = mnist_to_challenge_inputs(load_mnist_test()[0][:300], side=8).toarray()
    for w in radixnet(64, 6):  # float64 reference
        z = y @ w.toarray()
        z[z != 0] -= 0.3
        y = np.clip(z, 0, 32)
    expected = np.flatnonzero(y.any(axis=1)) + 1
    assert 0 < expected.size < 300
    np.testing.assert_array_equal(categories, expected)


@pytest.mark.slow
def test_data_parallel_embeddings_notebook(tmp_path, dask_client):
    parameters = (
        "CONTEXT, MAX_VOCAB = 3, 400\nEMBED, HIDDEN = 8, (16,)\nTRAIN = 3000\n"
        "EPOCHS, BATCH, LR = 1, 500, 3e-3\n"
        f"CLUSTER = {dask_client.scheduler.address!r}"
    )
    probe = (
        "import json\n"
        "np.savez('one.npz', one.embedding, *one.dense_variables())\n"
        "print('RESULT ' + json.dumps({'difference': difference,"
        " 'exact': {a: r.exact for a, r in reports.items()},"
        " 'bytes': {a: r.total() for a, r in reports.items()},"
        " 'loss': one.loss_curve_, 'choice': search.choice,"
        " 'sampled': [p for p, _ in search.samples],"
        " 'test': [x_test[:200].tolist(), y_test[:200].tolist()],"
        " 'perplexity': one.perplexity(x_test[:200], y_test[:200])}))"
    )
    result, cells = _execute("data_parallel_embeddings", parameters, probe, tmp_path)
    assert _images(cells) == 1
    assert set(result["difference"]) == {"hybrid", "ps", "ar"}
    assert all(d < 1e-4 for d in result["difference"].values())  # float32, summation order
    assert all(result["exact"].values()) and all(b > 0 for b in result["bytes"].values())
    # the fit's minimum within the sampled counts (doubling from P = machines while time falls)
    assert len(result["sampled"]) <= 5
    assert min(result["sampled"]) <= result["choice"] <= max(result["sampled"])
    # the one-process model's held-out perplexity, from its saved values in float64
    saved = np.load(tmp_path / "one.npz")
    embedding, *dense = (saved[f"arr_{i}"].astype(np.float64) for i in range(len(saved.files)))
    x, y = (np.asarray(a) for a in result["test"])
    h = embedding[x].reshape(len(x), -1)  # the windows' rows, concatenated
    pairs = list(zip(dense[0::2], dense[1::2], strict=True))  # (weight, bias) per layer
    for k, (w, b) in enumerate(pairs):
        h = h @ w + b
        if k < len(pairs) - 1:
            h = np.maximum(h, 0)
    h -= h.max(axis=1, keepdims=True)
    log_p = h - np.log(np.exp(h).sum(axis=1, keepdims=True))
    want = float(np.exp(-log_p[np.arange(len(y)), y].mean()))
    assert result["perplexity"] == pytest.approx(want, rel=1e-4)


@pytest.mark.slow
def test_compressed_training_notebook(tmp_path, dask_client):
    parameters = (
        "TRAIN, HELD_OUT = 2000, 500\nDENSE_EPOCHS, SPARSE_EPOCHS, BATCH, LR = 3, 2, 100, 2e-3\n"
        f"CLUSTER = {dask_client.scheduler.address!r}"
    )
    probe = (
        "import json\n"
        "np.savez('pruned.npz', *pruned.weights, *pruned.biases)\n"
        "print('RESULT ' + json.dumps({'sparse': sparse_accuracy, 'dense': dense_accuracy,"
        " 'pipeline': pipeline_accuracy, 'sparsity': memory.sparsity, 'idle': list(idle.values()),"
        " 'states': memory.states, 'nnz': memory.nnz}))"
    )
    result, cells = _execute("compressed_training", parameters, probe, tmp_path)
    assert _images(cells) == 1
    assert result["sparsity"] == pytest.approx(0.9, abs=0.01)
    assert result["dense"] > 0.75 and result["sparse"] > 0.75 and result["pipeline"] > 0.75
    assert len(result["idle"]) == 2 and all(0 <= f <= 1 for f in result["idle"])
    saved = np.load(tmp_path / "pruned.npz")
    arrays = [saved[f"arr_{i}"].astype(np.float64) for i in range(len(saved.files))]
    weights, biases = arrays[:3], arrays[3:]
    assert sum(int(np.count_nonzero(w)) for w in weights) <= result["nnz"]
    from dasknn.datasets import load_mnist_test

    images, labels = load_mnist_test()
    h = images[2000:2500].reshape(-1, 784).astype(np.float64) / 255
    for k, (w, b) in enumerate(zip(weights, biases, strict=True)):
        h = h @ w + b
        if k < 2:
            h = np.maximum(h, 0)
    accuracy = float(np.mean(h.argmax(axis=1) == labels[2000:2500]))
    assert result["sparse"] == pytest.approx(accuracy, abs=0.005)


@pytest.mark.slow
def test_sampled_training_notebook(tmp_path, dask_client):
    parameters = (
        "SAMPLES, FEATURES, LABELS = 3000, 2000, 3000\nHIDDEN, ACTIVE_FRACTION = 32, 0.05\n"
        "EPOCHS, BATCH = 2, 128\n"
        f"CLUSTER = {dask_client.scheduler.address!r}"
    )
    probe = (
        "import json\nimport numpy as np\nimport scipy.sparse as sp\n"
        "np.savez('sampled.npz', **model.parameters())\n"
        "sp.save_npz('x_test.npz', sp.csr_matrix(x_test))\n"
        "sp.save_npz('y_test.npz', sp.csr_matrix(y_test))\n"
        "print('RESULT ' + json.dumps({'one': one_p1, 'dist': dist_p1,"
        " 'oracle': data.oracle_precision_at_1, 'measured': report.by('phase'),"
        " 'predicted': report.by('phase', 'predicted')}))"
    )
    result, cells = _execute("sampled_training", parameters, probe, tmp_path)
    assert 0 < result["oracle"] <= 1
    assert result["one"] > 0.01 and result["dist"] > 0.01  # chance: 1 / 3000
    assert sum(result["measured"].values()) > 0
    assert set(result["predicted"]) <= set(result["measured"])
    # precision@1 of the one-process model, from its parameters in float64
    v = {k: a.astype(np.float64) for k, a in np.load(tmp_path / "sampled.npz").items()}
    x = sp.load_npz(tmp_path / "x_test.npz").astype(np.float64)
    y = sp.load_npz(tmp_path / "y_test.npz").tocsr()
    hidden = np.maximum(x @ v["hidden_weights"] + v["hidden_bias"], 0)
    top = (hidden @ v["output_weights"].T + v["output_bias"]).argmax(axis=1)
    hits = [top[i] in y.indices[y.indptr[i] : y.indptr[i + 1]] for i in range(x.shape[0])]
    assert result["one"] == pytest.approx(np.mean(hits), abs=2 / x.shape[0])
