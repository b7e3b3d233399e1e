"""LSH families and tables against theory and independent numpy computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dasknn.lsh import DWTA, HashTables, SimHash, make_family


def _pairs_at_angle(rng, n: int, dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random pairs of unit vectors at angle ``theta`` (uniformly rotated)."""
    x = rng.standard_normal((n, dim))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    u = rng.standard_normal((n, dim))
    u -= (u * x).sum(1, keepdims=True) * x
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    y = math.cos(theta) * x + math.sin(theta) * u
    return x.astype(np.float32), y.astype(np.float32)


def _simhash_bits(family: SimHash, v: np.ndarray) -> np.ndarray:
    """``(n, k * n_tables)`` bits computed with numpy from the family's projections."""
    proj = (v[:, family.index].astype(np.float64) * family.sign).sum(-1)
    return proj >= 0


def _unpack(codes: np.ndarray, k: int, bits: int) -> np.ndarray:
    """``(n, n_tables * k)`` per-function codes of ``(n, n_tables)`` table codes."""
    mask = (1 << bits) - 1
    parts = [(codes >> (j * bits)) & mask for j in range(k)]
    return np.stack(parts, axis=2).reshape(codes.shape[0], -1)


@pytest.mark.parametrize("theta", [0.3, 0.9, 1.6, 2.4])
def test_simhash_bit_collisions_follow_the_angle(theta):
    rng = np.random.default_rng(1)
    n = 3000
    x, y = _pairs_at_angle(rng, n, 48, theta)
    family = SimHash(48, 4, 8, seed=7)
    cx, cy = family.codes(x), family.codes(y)
    bx, by = _unpack(cx, 4, 1), _unpack(cy, 4, 1)
    np.testing.assert_array_equal(bx.astype(bool), _simhash_bits(family, x))
    rate = (bx == by).mean()
    p = 1 - theta / math.pi
    assert abs(rate - p) < 4 * math.sqrt(p * (1 - p) / n)


@pytest.mark.slow
@pytest.mark.parametrize(("dim", "dense"), [(130, True), (4700, False)])
def test_simhash_codes_are_the_signs_of_the_projections(dim, dense):
    # a dense projection matrix (one matrix product) or the sparse kernel, by the family's size
    family = SimHash(dim, 9, 100, seed=5)
    assert (family.dense is not None) == dense
    v = np.random.default_rng(4).standard_normal((300, dim)).astype(np.float32)
    functions = np.zeros((dim, 900))
    for f, (index, sign) in enumerate(zip(family.index, family.sign, strict=True)):
        functions[index, f] = sign
    proj = v.astype(np.float64) @ functions
    clear = np.abs(proj) > 1e-3  # away from 0, where rounding could flip a sign
    assert clear.mean() > 0.99
    for vectors in (v, v.astype(np.float64)):
        bits = _unpack(family.codes(vectors), 9, 1).astype(bool)
        np.testing.assert_array_equal(bits[clear], proj[clear] >= 0)


def test_simhash_k_bit_and_l_table_rates():
    rng = np.random.default_rng(2)
    x, y = _pairs_at_angle(rng, 1, 64, 0.9)
    k, tables, group = 3, 3000, 4
    family = SimHash(64, k, tables, seed=3)
    cx, cy = family.codes(x)[0], family.codes(y)[0]
    q = (_unpack(cx[None], k, 1) == _unpack(cy[None], k, 1)).mean()
    sigma_q = math.sqrt(q * (1 - q) / (k * tables))
    same = cx == cy
    pk = q**k
    tol = 4 * (math.sqrt(pk * (1 - pk) / tables) + k * q ** (k - 1) * sigma_q)
    assert abs(same.mean() - pk) < tol
    any_table = same.reshape(-1, group).any(1)
    pl = 1 - (1 - pk) ** group
    n_groups = tables // group
    dpl = group * (1 - pk) ** (group - 1) * k * q ** (k - 1) * sigma_q
    assert abs(any_table.mean() - pl) < 4 * (math.sqrt(pl * (1 - pl) / n_groups) + dpl)


def test_dwta_codes_and_collision_rate_match_a_direct_estimate():
    rng = np.random.default_rng(4)
    dim, k, tables, size = 64, 2, 2000, 8
    x = rng.random(dim).astype(np.float32) + 0.01
    y = (0.6 * x + 0.4 * rng.random(dim)).astype(np.float32)
    family = DWTA(dim, k, tables, seed=5, bin_size=size)
    codes = family.codes(np.stack([x, y]))
    per_bin = _unpack(codes, k, 3)
    np.testing.assert_array_equal(per_bin[0], np.argmax(x[family.bins], axis=1))
    rate = (per_bin[0] == per_bin[1]).mean()
    n_direct = k * tables
    direct = np.empty(n_direct, dtype=bool)
    for i in range(n_direct):
        pick = rng.choice(dim, size, replace=False)
        direct[i] = np.argmax(x[pick]) == np.argmax(y[pick])
    p = direct.mean()
    assert abs(rate - p) < 4 * math.sqrt(2 * p * (1 - p) / n_direct)


def test_dwta_empty_bins_borrow_the_next_non_empty_code():
    rng = np.random.default_rng(6)
    dim, k, tables, size = 40, 3, 5, 4
    family = DWTA(dim, k, tables, seed=8, bin_size=size)
    v = np.zeros((3, dim), dtype=np.float32)
    v[0, rng.choice(dim, 5, replace=False)] = rng.random(5) + 0.1
    v[1] = rng.standard_normal(dim)
    codes = _unpack(family.codes(v), k, 2)
    n_bins = k * tables
    for row in range(3):
        values = v[row][family.bins]
        own = np.argmax(values, axis=1)
        empty = ~(values != 0).any(1)
        expected = np.zeros(n_bins, dtype=np.int64)
        for f in range(n_bins):
            if not empty[f]:
                expected[f] = own[f]
                continue
            for step in range(1, n_bins):
                if not empty[(f + step) % n_bins]:
                    expected[f] = own[(f + step) % n_bins]
                    break
        np.testing.assert_array_equal(codes[row], expected)


def _python_buckets(codes: np.ndarray) -> list[dict]:
    tables = []
    for t in range(codes.shape[1]):
        buckets: dict = {}
        for i, c in enumerate(codes[:, t]):
            buckets.setdefault(int(c), []).append(i)
        tables.append(buckets)
    return tables


@pytest.mark.minversions  # also at the minimum versions (.ci/run)
@pytest.mark.parametrize("spread", [1, 1 << 24])  # codes sorted by counting / by merging
def test_tables_hold_the_buckets_and_the_union(spread):
    rng = np.random.default_rng(9)
    codes = rng.integers(0, 6, size=(200, 4)) * spread
    reference = _python_buckets(codes)
    full = HashTables.from_codes(codes, 1000, seed=0)
    capped = HashTables.from_codes(codes, 7, seed=0)
    for t, buckets in enumerate(reference):
        assert list(full.keys[full.key_ptr[t] : full.key_ptr[t + 1]]) == sorted(buckets)
        for code, ids in buckets.items():
            assert list(full.bucket(t, code)) == ids
            got = capped.bucket(t, code)
            assert len(got) == min(7, len(ids)) and len(set(got)) == len(got)
            assert set(got) <= set(ids)
        assert len(full.bucket(t, 99 * spread)) == 0
    query = np.array([0, 3, 5, 99]) * spread
    union = set().union(*(set(reference[t].get(int(c), [])) for t, c in enumerate(query)))
    got = full.query(query)
    assert len(got) == len(set(got)) and set(got) == union


def test_bucket_reservoir_is_uniform():
    n, cap, trials = 20, 5, 2000
    codes = np.zeros((n, 1), dtype=np.int64)
    counts = np.zeros(n)
    for seed in range(trials):
        counts[HashTables.from_codes(codes, cap, seed).bucket(0, 0)] += 1
    assert counts.sum() == trials * cap
    assert stats.chisquare(counts).pvalue > 1e-3


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: SimHash(8, 0, 2, 0), "k must be"),
        (lambda: SimHash(8, 2, 0, 0), "n_tables must be"),
        (lambda: SimHash(8, 31, 1, 0), "31 bits"),
        (lambda: DWTA(8, 11, 1, 0, bin_size=8), "33 bits"),
        (lambda: DWTA(8, 2, 1, 0, bin_size=6), "power of two"),
        (lambda: DWTA(8, 2, 1, 0, bin_size=1), "power of two"),
        (lambda: HashTables.from_codes(np.zeros((3, 1)), 0, 0), "bucket_size"),
        (lambda: make_family("minhash", 8, 2, 2, 0), "unknown hash family"),
    ],
)
def test_bad_hash_parameters(make, message):
    with pytest.raises(ValueError, match=message):
        make()
