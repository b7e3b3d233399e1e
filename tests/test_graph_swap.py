"""The swap phase solver, identical-net merging and the ``auto`` backend, on real RadiX-Net phases
against an objective computed independently with numpy."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import graph
import graph.hypergraph
import graph.swap
from dasknn.datasets import radixnet
from graph.backends import SWAP_MIN_PARTS, block_weight_limits, choose_backend, run_backend
from graph.hypergraph import PhaseHypergraph, build_phase_hypergraph, merge_identical_nets
from graph.swap import solve_by_swaps


def _km1(offsets, pins, weights, vertex_parts: np.ndarray, fixed_parts: np.ndarray) -> int:
    """Connectivity-1 of the nets, from a (net, part) incidence matrix."""
    full = np.concatenate([vertex_parts, fixed_parts])
    nets = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    touched = sp.csr_matrix(
        (np.ones(len(pins)), (nets, full[pins])), shape=(len(offsets) - 1, full.max() + 1)
    )
    touched.sum_duplicates()
    return int(np.dot(weights, np.diff(touched.indptr) - 1))


def _phase(nparts: int, max_chunk: int, seed: int = 0) -> PhaseHypergraph:
    layers = radixnet(256, 3, seed=seed)
    inputs = np.random.default_rng(seed).permutation(256) % nparts
    return build_phase_hypergraph(layers[1], nparts, inputs, max_chunk=max_chunk)


def _cost(hypergraph: PhaseHypergraph, vertex_parts: np.ndarray) -> int:
    h = hypergraph
    return _km1(h.net_offsets, h.net_pins, h.net_weights, vertex_parts, h.fixed_parts)


def test_merged_nets_keep_every_placement_cost():
    rng = np.random.default_rng(0)
    # 40 nets over 12 vertices, many repeated (in any pin order), weights 1..3
    base = [rng.choice(12, size=rng.integers(1, 5), replace=False) for _ in range(10)]
    chosen = rng.integers(0, 10, size=40)
    nets = [rng.permutation(base[c]) for c in chosen]
    offsets = np.concatenate([[0], np.cumsum([len(n) for n in nets])])
    pins = np.concatenate(nets)
    weights = rng.integers(1, 4, size=40)
    merged_offsets, merged_pins, merged_weights = merge_identical_nets(offsets, pins, weights)
    assert len(merged_offsets) - 1 == len({tuple(sorted(base[c])) for c in chosen})
    assert merged_weights.sum() == weights.sum()
    for _ in range(20):
        parts = rng.integers(0, 4, size=12)
        no_fixed = np.zeros(0, dtype=np.int64)
        assert _km1(merged_offsets, merged_pins, merged_weights, parts, no_fixed) == _km1(
            offsets, pins, weights, parts, no_fixed
        )


def test_nets_that_only_share_a_hash_stay_apart(monkeypatch):
    offsets = np.array([0, 2, 4, 6])
    pins = np.array([1, 0, 0, 1, 2, 3])
    monkeypatch.setattr(
        graph.hypergraph, "_set_hashes", lambda o, i: np.zeros((2, len(o) - 1), dtype=np.uint64)
    )
    merged_offsets, merged_pins, merged_weights = merge_identical_nets(offsets, pins, [1, 1, 1])
    np.testing.assert_array_equal(merged_offsets, offsets)
    np.testing.assert_array_equal(merged_pins, [0, 1, 0, 1, 2, 3])
    np.testing.assert_array_equal(merged_weights, [1, 1, 1])


@pytest.mark.parametrize(("nparts", "max_chunk"), [(8, 4), (4, 2), (16, 2)])
def test_swaps_from_a_random_start_leave_no_improving_move_or_swap(
    nparts, max_chunk, monkeypatch
):
    # sweeps until none improves, each vertex trying every part its nets touch
    monkeypatch.setattr(graph.swap, "MIN_SWEEP_GAIN", 0.0)
    monkeypatch.setattr(graph.swap, "SWAP_TARGETS", nparts)
    hypergraph = _phase(nparts, max_chunk)
    limits = block_weight_limits(hypergraph, nparts, 0.01)
    limits -= np.bincount(hypergraph.fixed_parts, minlength=nparts)
    weights = hypergraph.vertex_weights
    start = np.random.default_rng(1).permutation(hypergraph.num_free) % nparts  # within limits
    parts = solve_by_swaps(hypergraph, nparts, limits, seed=0, initial=start)
    assert _cost(hypergraph, parts) < _cost(hypergraph, start)
    load = np.bincount(parts, weights=weights, minlength=nparts)
    assert (load <= limits).all()
    cost = _cost(hypergraph, parts)
    for v in range(hypergraph.num_free):
        for q in range(nparts):  # every move that the limits allow
            if q != parts[v] and load[q] + weights[v] <= limits[q]:
                moved = parts.copy()
                moved[v] = q
                assert _cost(hypergraph, moved) >= cost
        for u in range(v + 1, hypergraph.num_free):  # every swap that the limits allow
            p, q = parts[v], parts[u]
            shift = weights[u] - weights[v]
            if p != q and load[p] + shift <= limits[p] and load[q] - shift <= limits[q]:
                swapped = parts.copy()
                swapped[v], swapped[u] = q, p
                assert _cost(hypergraph, swapped) >= cost


def test_swaps_beat_random_placements():
    hypergraph = _phase(8, 4, seed=1)
    parts = run_backend(hypergraph, 8, 0.01, 0, "swap")
    assert np.bincount(parts, minlength=8).max() == hypergraph.num_free // 8
    rng = np.random.default_rng(2)
    spread = np.arange(hypergraph.num_free) % 8
    random_costs = [_cost(hypergraph, rng.permutation(spread)) for _ in range(20)]
    assert _cost(hypergraph, parts) < 0.5 * min(random_costs)


def test_auto_takes_swaps_only_for_many_parts_and_fixed_vertices():
    assert choose_backend(_phase(8, 4), 8) == "kahypar"
    layers = radixnet(1024, 2, seed=0)
    first = build_phase_hypergraph(layers[0], SWAP_MIN_PARTS, None, max_chunk=1)
    assert choose_backend(first, SWAP_MIN_PARTS) == "kahypar"
    inputs = np.arange(1024) % SWAP_MIN_PARTS
    second = build_phase_hypergraph(layers[1], SWAP_MIN_PARTS, inputs, max_chunk=1)
    assert choose_backend(second, SWAP_MIN_PARTS) == "swap"


def test_auto_partition_of_many_parts_is_balanced_and_beats_random():
    layers = radixnet(1024, 4, seed=0)
    hyper = graph.partition_network(layers, SWAP_MIN_PARTS, exact_assignment=False)
    rand = graph.partition_network(layers, SWAP_MIN_PARTS, method="random", seed=0)
    h, r = hyper.metrics(), rand.metrics()
    assert hyper.info["backend"] == "auto"
    assert h.imbalance <= 1.01
    assert h.total_volume < 0.5 * r.total_volume


def test_a_bad_initial_placement_is_named():
    hypergraph = _phase(8, 4)
    limits = block_weight_limits(hypergraph, 8, 0.01)
    limits -= np.bincount(hypergraph.fixed_parts, minlength=8)
    with pytest.raises(ValueError, match="each of the 64 free vertices a part"):
        solve_by_swaps(hypergraph, 8, limits, initial=np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="more weight on a part than its limit"):
        solve_by_swaps(hypergraph, 8, limits, initial=np.zeros(64, dtype=np.int64))
