"""Fuzzing the readers (layer, input, IDX image, category and model files): mutated or random
bytes load into something valid or raise ``ValueError``
/ ``FileNotFoundError`` naming the file, never another exception or a crash."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dasknn import SparseMLP
from dasknn.challenge.inputs import load_inputs
from dasknn.datasets import (
    radixnet,
    read_categories,
    read_challenge_network,
    write_categories,
    write_sparse_tsv,
)
from graph.checks import check_csr

NEURONS = 32
FUZZ = settings(max_examples=200, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])


def _bytes_of(write, name: str) -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        write(path)
        return path.read_bytes()


LAYER = _bytes_of(lambda p: write_sparse_tsv(p, radixnet(NEURONS, 1)[0]), "layer.tsv")
INPUTS = _bytes_of(lambda p: write_sparse_tsv(p, sp.random(20, NEURONS, 0.2, random_state=0)),
                   "inputs.tsv")
CATEGORIES = _bytes_of(lambda p: write_categories(p, np.arange(1, 40, 3)), "cat.tsv")
IMAGES = bytes([0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 8, 0, 0, 0, 8]) + bytes(range(192))
MODEL = _bytes_of(lambda p: SparseMLP.radixnet(neurons=NEURONS, layers=2).save(p), "m.npz")
# bytes a mutation puts in: digits, separators, signs, exponents, and arbitrary ones
PIECES = st.sampled_from([b"0", b"9", b"\t", b"\n", b" ", b"-", b".", b"e", b"e999", b"nan",
                          b"99999999999999999999", b"\x00", b"\xff", b"1e-400", b"+"])


@st.composite
def mutated(draw, original: bytes) -> bytes:
    """``original`` with a few bytes changed, pieces inserted, or cut; or random bytes."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=200))
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, max(0, len(data) - 1)))
        action = draw(st.sampled_from(["flip", "insert", "cut", "delete"]))
        if action == "flip" and data:
            data[at] = draw(st.integers(0, 255))
        elif action == "insert":
            data[at:at] = draw(PIECES)
        elif action == "cut":
            del data[at:]
        elif data:
            del data[at : at + draw(st.integers(1, 8))]
    return bytes(data)


def _expect_valid_or_named_error(load, path: Path) -> object | None:
    try:
        return load(path)
    except (ValueError, FileNotFoundError) as error:
        assert path.name in str(error), str(error)
        return None


@FUZZ
@given(mutated(LAYER))
def test_layer_files(payload):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"n{NEURONS}-l1.tsv"
        path.write_bytes(payload)
        layers = _expect_valid_or_named_error(read_challenge_network, path.parent)
        if layers is not None:
            check_csr(layers[0], (NEURONS, NEURONS))


@FUZZ
@given(mutated(INPUTS))
def test_input_files(payload):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "inputs.tsv"
        path.write_bytes(payload)
        inputs = _expect_valid_or_named_error(lambda p: load_inputs(p, NEURONS), path)
        if inputs is not None:
            check_csr(inputs, (None, NEURONS))
            assert inputs.shape[0] >= 1


@FUZZ
@given(mutated(IMAGES))
def test_idx_image_files(payload):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "images.idx"
        path.write_bytes(payload)
        inputs = _expect_valid_or_named_error(lambda p: load_inputs(p, 64), path)
        if inputs is not None:
            check_csr(inputs, (None, 64))
            assert inputs.shape[0] >= 1


@FUZZ
@given(mutated(CATEGORIES))
def test_category_files(payload):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cat.tsv"
        path.write_bytes(payload)
        ids = _expect_valid_or_named_error(read_categories, path)
        if ids is not None:
            assert ids.dtype == np.int64 and (ids >= 1).all()


@FUZZ
@given(mutated(MODEL))
def test_model_file_bytes(payload):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.npz"
        path.write_bytes(payload)
        model = _expect_valid_or_named_error(SparseMLP.load, path)
        if model is not None:
            model.predict(np.ones((2, model.n_inputs)))


_ARRAYS = dict(np.load(io.BytesIO(MODEL)))
ENTRY_VALUES = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
    st.sampled_from([np.nan, np.inf, -1.0, 1e300]).map(np.float64),
    st.text(max_size=5).map(np.str_),
)


@FUZZ
@given(st.sampled_from(sorted(_ARRAYS)), st.data())
def test_model_file_entries(key, data):
    arrays = {name: value.copy() for name, value in _ARRAYS.items()}
    value = arrays[key]
    replacement = data.draw(ENTRY_VALUES)
    if value.ndim and value.size and data.draw(st.booleans()):
        position = data.draw(st.integers(0, value.size - 1))
        try:
            value.reshape(-1)[position] = replacement
        except (ValueError, OverflowError, TypeError):
            arrays[key] = np.asarray(replacement)
    else:
        arrays[key] = np.asarray(replacement)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.npz"
        np.savez(path, **arrays)
        model = _expect_valid_or_named_error(SparseMLP.load, path)
        if model is not None:
            model.predict(np.ones((2, model.n_inputs)))
