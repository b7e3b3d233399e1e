"""The notebooks in ``examples/`` run top to bottom (nbclient, a real Jupyter kernel) on small
sizes, and what they show is checked: against float64 references written here where there is
one. The notebooks are stored without outputs."""

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
    assert all(not cell.outputs and cell.execution_count is None for cell in code), (
        f"{name}.ipynb is stored with outputs"
    )
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


def test_model_parallel_training_notebook(tmp_path, dask_client):
    parameters = (
        "NEURONS, LAYERS = 64, 2\nTRAIN, HELD_OUT = 512, 256\nEPOCHS, BATCH, LR = 2, 64, 0.1\n"
        f"CLUSTER = {dask_client.scheduler.address!r}"
    )
    probe = (
        "import json\n"
        "print('RESULT ' + json.dumps({'loss': dist.loss_curve_,"
        " 'batches': len(dist.batch_loss_curve_), 'accuracy': accuracy,"
        " 'measured': report.payload, 'predicted': report.predicted,"
        " 'layers': sorted({str(k) for k, _ in report.layers})}))"
    )
    result, cells = _execute("model_parallel_training", parameters, probe, tmp_path)
    assert _images(cells) == 1  # one figure, redrawn in place every epoch
    assert len(result["loss"]) == 2 and result["batches"] == 2 * 8
    assert result["loss"][1] < result["loss"][0]
    assert len(result["accuracy"]) == 2 and result["accuracy"][-1] > 0.3  # chance: 0.1
    assert result["measured"] == result["predicted"] > 0
    assert {"1", "2", "3"} <= set(result["layers"])
    printed = "".join(out.get("text", "") for cell in cells for out in cell.get("outputs", []))
    assert "held-out accuracy" in printed and "predicted" in printed
    assert "dashboard page: http://" in printed and "/dasknn/comm" in printed


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
