"""Columns with equal inputs, grouped for the CPU challenge kernel.

``group_columns`` is checked against a dictionary of input lists; the kernel's group path against
the float64 scipy reference (exactly, on dyadic networks whose columns repeat) and against its own
one-column path (bit for bit, on continuous weights where every multiply-add rounds).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from test_challenge_correctness import dyadic_inputs, reference_challenge

from dasknn.datasets import radixnet
from dasknn.kernels.inference import (
    advance,
    live_activations,
    live_rows,
    pack_layers,
    start_batch,
)
from dasknn.kernels.lane_vectors import GROUP, LANES, VECTOR_BYTES, accumulator_bytes
from dasknn.kernels.shared_inputs import group_columns


def _repeating_layer(rng: np.random.Generator, n: int, signed: bool) -> sp.csr_matrix:
    """An ``(n, n)`` layer whose columns copy a few distinct input lists (classes of 1 to 9
    columns, weights drawn per entry), a few columns empty."""
    dense = np.zeros((n, n))
    c = 0
    while c < n:
        width = int(rng.integers(1, 10))
        inputs = rng.random(n) < rng.uniform(0.0, 0.4)
        for col in range(c, min(n, c + width)):
            values = (rng.integers(-4, 5, n) / 2.0 if signed else rng.uniform(-0.5, 1.0, n))
            dense[:, col] = np.where(inputs, values, 0.0)
            dense[inputs & (dense[:, col] == 0.0), col] = 0.5  # keep the pattern exact
        c += width
    perm = rng.permutation(n)
    return sp.csr_matrix(dense[:, perm])


def _classes(layer: sp.csr_matrix) -> dict[bytes, list[int]]:
    csc = sp.csc_matrix(layer)
    csc.sort_indices()
    classes: dict[bytes, list[int]] = {}
    for c in range(csc.shape[1]):
        key = csc.indices[csc.indptr[c]:csc.indptr[c + 1]].astype(np.int64).tobytes()
        classes.setdefault(key, []).append(c)
    return classes


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 90), depth=st.integers(1, 4))
def test_groups_are_maximal_and_exact(seed, n, depth):
    rng = np.random.default_rng(seed)
    layers = [_repeating_layer(rng, n, signed=False) for _ in range(depth)]
    packed = pack_layers(layers, np.float64)
    cols, ptr, counts = group_columns(packed.indptr, packed.indices)
    for k, layer in enumerate(layers):
        assert sorted(cols[k]) == list(range(n))
        groups = [cols[k, ptr[k, g]:ptr[k, g + 1]] for g in range(counts[k])]
        assert ptr[k, 0] == 0 and np.all(ptr[k, counts[k]:] == n)
        class_of = {c: key for key, members in _classes(layer).items() for c in members}
        for group in groups:
            assert len(group) in (1, GROUP)
            assert len({class_of[int(c)] for c in group}) == 1
        full = sum(len(members) // GROUP for members in _classes(layer).values())
        assert sum(len(group) == GROUP for group in groups) == full


def test_radixnet_columns_all_in_full_groups():
    packed = pack_layers(radixnet(1024, 3), np.float32)
    assert np.all(packed.n_groups == 1024 // GROUP)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    n=st.integers(4, 70),
    depth=st.integers(1, 8),
    rows=st.integers(1, 150),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_group_path_exact_on_dyadic_networks(seed, n, depth, rows, dtype):
    """Weights k/2, inputs k/4 (see ``_dyadic_network`` in test_challenge_correctness): every
    operation is exact, so the group path must give the reference's bits."""
    rng = np.random.default_rng(seed)
    layers = [_repeating_layer(rng, n, signed=True) for _ in range(depth)]
    inputs, bias = dyadic_inputs(rng, rows, n)
    expected, activations = reference_challenge(inputs, layers, bias, ymax=32.0)
    state = advance(start_batch(sp.csr_matrix(inputs), dtype), pack_layers(layers, dtype), bias)
    np.testing.assert_array_equal(live_rows(state) + 1, expected)
    np.testing.assert_array_equal(live_activations(state), activations.astype(dtype))


def _one_column_groups(packed):
    n_layers, n = packed.group_cols.shape
    return dataclasses.replace(
        packed,
        group_cols=np.tile(np.arange(n, dtype=np.int32), (n_layers, 1)),
        group_ptr=np.tile(np.arange(n + 1, dtype=np.int32), (n_layers, 1)),
        n_groups=np.full(n_layers, n, dtype=np.int64),
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_path_equals_one_column_path_bit_for_bit(seed, dtype):
    rng = np.random.default_rng(seed)
    n = 96
    layers = [_repeating_layer(rng, n, signed=False) for _ in range(6)]
    inputs = sp.random(200, n, density=0.3, random_state=rng, format="csr")
    packed = pack_layers(layers, dtype)
    assert np.any(packed.n_groups < n)  # the group path runs
    grouped = advance(start_batch(inputs, dtype), packed, -0.05, 2.0)
    single = advance(start_batch(inputs, dtype), _one_column_groups(packed), -0.05, 2.0)
    np.testing.assert_array_equal(live_rows(grouped), live_rows(single))
    np.testing.assert_array_equal(live_activations(grouped), live_activations(single))
    assert (grouped.macs_done, grouped.macs_needed) == (single.macs_done, single.macs_needed)
    assert live_rows(grouped).size > 0


def test_tiles_start_on_vector_boundaries():
    rng = np.random.default_rng(3)
    layers = [_repeating_layer(rng, 50, signed=False) for _ in range(3)]
    inputs = sp.random(300, 50, density=0.3, random_state=rng, format="csr")
    state = start_batch(inputs, np.float32)
    assert state.block.ctypes.data % VECTOR_BYTES == 0
    raw = np.empty(state.block.nbytes + VECTOR_BYTES, dtype=np.uint8)
    skip = -raw.ctypes.data % VECTOR_BYTES + 16  # a misaligned copy, as a pickled state may be
    misaligned = raw[skip:skip + state.block.nbytes].view(np.float32).reshape(state.block.shape)
    misaligned[...] = state.block
    state.block = misaligned
    advance(state, pack_layers(layers, np.float32), -0.05, 2.0)
    assert state.block.ctypes.data % VECTOR_BYTES == 0


@pytest.mark.parametrize(
    ("features", "float32_columns", "float64_columns"),
    [
        ("+sse2,+avx,+avx2,+fma,+avx512f,+avx512vl", GROUP, GROUP // 2),
        ("+sse2,+avx,+avx2,+fma,-avx512f", 1, 1),
        ("+sse2,-avx", 1, 1),
    ],
)
def test_columns_a_pass_fit_half_the_vector_registers(features, float32_columns,
                                                      float64_columns):
    budget = accumulator_bytes(features)
    assert max(1, budget // (LANES * 4)) == float32_columns
    assert max(1, budget // (LANES * 8)) == float64_columns


_AVX2_RUN = """
import sys
import numpy as np
import scipy.sparse as sp
from dasknn.kernels.inference import advance, live_activations, pack_layers, start_batch
from dasknn.kernels.lane_vectors import ACCUMULATOR_BYTES
layers = [sp.load_npz(f"{sys.argv[1]}/w{k}.npz") for k in range(int(sys.argv[2]))]
inputs = sp.load_npz(f"{sys.argv[1]}/x.npz")
state = advance(start_batch(inputs, np.float32), pack_layers(layers, np.float32), -0.05, 2.0)
np.save(f"{sys.argv[1]}/out.npy", live_activations(state))
print(ACCUMULATOR_BYTES)
"""


@pytest.mark.slow
def test_one_column_a_pass_without_avx512_gives_the_same_bits(tmp_path):
    """Compiled for the host without AVX-512 (a fresh numba cache), the kernel runs one column a
    pass; its activations equal this process's bit for bit."""
    import os
    import subprocess
    import sys

    import llvmlite.binding as llvm

    host = llvm.get_host_cpu_features().flatten().split(",")
    if "+avx512f" not in host or "+fma" not in host:
        pytest.skip("the host has no AVX-512 to take away (or no FMA)")
    features = ",".join("-" + f[1:] if f.startswith("+avx512") else f for f in host)
    rng = np.random.default_rng(4)
    layers = [_repeating_layer(rng, 70, signed=False) for _ in range(4)]
    inputs = sp.random(150, 70, density=0.3, random_state=rng, format="csr")
    for k, layer in enumerate(layers):
        sp.save_npz(tmp_path / f"w{k}.npz", layer)
    sp.save_npz(tmp_path / "x.npz", inputs)
    env = {**os.environ, "NUMBA_CPU_FEATURES": features,
           "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}
    done = subprocess.run([sys.executable, "-c", _AVX2_RUN, str(tmp_path), str(len(layers))],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) == 8 * 32  # one float32 column of 64 lanes a pass
    state = advance(start_batch(inputs, np.float32), pack_layers(layers, np.float32), -0.05, 2.0)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), live_activations(state))


def test_packing_without_groups_is_for_the_gpu_form_only():
    layers = radixnet(256, 2)
    plain = pack_layers(layers, np.float32, groups=False)
    grouped = pack_layers(layers, np.float32)
    assert plain.group_cols is None and plain.n_groups is None
    assert grouped.nbytes - plain.nbytes == (grouped.group_cols.nbytes + grouped.group_ptr.nbytes
                                             + grouped.n_groups.nbytes)
    state = start_batch(sp.csr_matrix(np.ones((3, 256))), np.float32)
    with pytest.raises(ValueError, match="packed with groups=False"):
        advance(state, plain, -0.3)
