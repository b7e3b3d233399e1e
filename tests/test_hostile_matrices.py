"""Every sparse matrix is checked before a kernel reads it: saved models, user CSR, partitions."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
import scipy.sparse as sp

import graph
from dasknn import SparseMLP
from dasknn.challenge.engine import prepare_run
from graph.checks import check_csr, csr_from_arrays


def _good():
    return sp.random(6, 5, density=0.5, random_state=0, format="csr")


def _hostile(kind: str) -> sp.csr_matrix:
    m = _good()
    data, indices, indptr = m.data.copy(), m.indices.copy(), m.indptr.copy()
    if kind == "index too large":
        indices[0] = 10_000_000
    elif kind == "negative index":
        indices[0] = -1
    elif kind == "indptr decreases":
        indptr[2], indptr[3] = indptr[3], indptr[2] - 1
    elif kind == "indptr overruns":
        indptr[-1] += 5
    elif kind == "not finite":
        data[0] = np.nan
    matrix = sp.csr_matrix(m.shape)
    matrix.data, matrix.indices, matrix.indptr = data, indices, indptr
    return matrix


KINDS = ["index too large", "negative index", "indptr decreases", "indptr overruns", "not finite"]


@pytest.mark.parametrize("kind", KINDS)
def test_check_csr_names_the_matrix(kind):
    with pytest.raises(ValueError, match="^layer 3"):
        check_csr(_hostile(kind), name="layer 3")


@pytest.mark.parametrize("kind", KINDS)
def test_every_entry_point_rejects_a_hostile_csr(kind):
    hostile = _hostile(kind)
    with pytest.raises(ValueError, match=r"weights\[0\]"):
        SparseMLP([hostile])
    with pytest.raises(ValueError, match="layer 1"):
        graph.partition_network([hostile], 2)
    square = sp.csr_matrix((5, 5))
    square.data, square.indices, square.indptr = hostile.data, hostile.indices, hostile.indptr[:6]
    with pytest.raises(ValueError):
        prepare_run([square], sp.identity(5, format="csr"), bias=0.0)
    with pytest.raises(ValueError, match="inputs"):
        prepare_run([sp.identity(5, format="csr")], square, bias=0.0)


def test_check_csr_accepts_other_formats_and_checks_coo():
    m = _good()
    for converted in (m.tocsc(), m.tocoo(), m.tolil(), m.toarray(), m.tobsr()):
        assert (check_csr(converted, (6, 5)) != m).nnz == 0
    coo = m.tocoo()
    coo.col[0] = 99
    with pytest.raises(ValueError, match="column index 99"):
        check_csr(coo)
    with pytest.raises(ValueError, match="expected 7"):
        check_csr(m, (7, None))
    with pytest.raises(ValueError, match="shape"):
        csr_from_arrays(m.data, m.indices, m.indptr, (-1, 5))


def _saved_with(tmp_path, key, change):
    model = SparseMLP.radixnet(neurons=64, layers=2, seed=0)
    model.save(tmp_path / "good.npz")
    stored = dict(np.load(tmp_path / "good.npz"))
    stored[key] = change(stored[key].copy())
    np.savez(tmp_path / "bad.npz", **stored)
    return tmp_path / "bad.npz"


def _set(position, value):
    def change(array):
        array[position] = value
        return array

    return change


@pytest.mark.parametrize(
    "key, change",
    [
        ("w0_indices", _set(3, 10_000_000)),
        ("w0_indices", _set(3, -5)),
        ("w1_indptr", _set(5, 10**6)),
        ("w1_indptr", lambda a: a[::-1]),
        ("w0_data", _set(0, np.inf)),
        ("w0_shape", _set(0, -3)),
        ("header", lambda a: np.array(str(a).replace('"n_layers": 2', '"n_layers": 10000000'))),
    ],
)
def test_hostile_saved_model_is_a_value_error_naming_the_file(tmp_path, key, change):
    path = _saved_with(tmp_path, key, change)
    with pytest.raises(ValueError, match="bad.npz"):
        SparseMLP.load(path)


def test_index_beyond_the_shape_does_not_reach_predict(tmp_path):
    """Before the checks, this model loaded and predict ended the process (segmentation fault)."""
    path = _saved_with(tmp_path, "w0_indices", _set(3, 10_000_000))
    code = textwrap.dedent(
        f"""
        import numpy as np
        from dasknn import SparseMLP
        try:
            SparseMLP.load({str(path)!r}).predict(np.ones((4, 64)))
        except ValueError as error:
            print("rejected:", error)
        """
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120)
    assert child.returncode == 0, child.stderr
    assert "rejected:" in child.stdout and "bad.npz" in child.stdout


def test_a_null_byte_in_an_array_header_is_a_value_error(tmp_path):
    SparseMLP.radixnet(neurons=64, layers=2, seed=0).save(tmp_path / "m.npz")
    with zipfile.ZipFile(tmp_path / "m.npz") as source:
        members = {name: source.read(name) for name in source.namelist()}
    name = next(n for n in members if n != "header.npy")
    # the .npy header: its shape "(64, 64)" becomes "\x0064, 64)"
    end = members[name].index(b"\n") + 1
    members[name] = members[name][:end].replace(b"(", b"\x00", 1) + members[name][end:]
    with zipfile.ZipFile(tmp_path / "null.npz", "w") as target:
        for member, data in members.items():
            target.writestr(member, data)
    with pytest.raises(ValueError, match="null.npz: not a readable .npz model file"):
        SparseMLP.load(tmp_path / "null.npz")


@pytest.mark.parametrize("cut", [0.3, 0.7, 0.99])
def test_truncated_or_corrupt_model_file_is_a_value_error(tmp_path, cut):
    SparseMLP.radixnet(neurons=64, layers=2, seed=0).save(tmp_path / "m.npz")
    payload = (tmp_path / "m.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(payload[: int(cut * len(payload))])
    with pytest.raises(ValueError, match="cut.npz"):
        SparseMLP.load(tmp_path / "cut.npz")
    with pytest.raises(ValueError, match="is a directory"):
        SparseMLP.load(tmp_path)
    with open(tmp_path / "array.npz", "wb") as handle:
        np.save(handle, np.arange(3))
    with pytest.raises(ValueError, match="array.npz: not a readable .npz model file"):
        SparseMLP.load(tmp_path / "array.npz")
