"""partition_network and its pieces on small real networks, with the real partitioners."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import graph
from dasknn.datasets import radixnet
from graph.assignment import assignment_applies, solve_by_assignment
from graph.backends import run_backend
from graph.hypergraph import build_phase_hypergraph, identical_vertex_chunks
from graph.multiphase import assign_input_owners


@pytest.fixture(scope="module")
def small_net():
    return radixnet(256, 8, seed=0)


def _phase_km1(hypergraph, vertex_parts):
    """Connectivity-1 of a phase hypergraph, computed pin by pin."""
    full = np.concatenate([vertex_parts, hypergraph.fixed_parts])
    total = 0
    for e in range(hypergraph.num_nets):
        pins = hypergraph.net_pins[hypergraph.net_offsets[e] : hypergraph.net_offsets[e + 1]]
        total += hypergraph.net_weights[e] * (len(set(full[pins].tolist())) - 1)
    return total


@pytest.mark.parametrize("max_chunk", [1, 4])
def test_phase_connectivity_is_the_layer_volume(small_net, max_chunk):
    rng = np.random.default_rng(3)
    layer = small_net[2]
    inputs = rng.integers(0, 8, size=256)
    hypergraph = build_phase_hypergraph(layer, 8, inputs, max_chunk=max_chunk)
    vertex_parts = rng.integers(0, 8, size=hypergraph.num_free)
    outputs = hypergraph.neuron_parts(vertex_parts)
    assert _phase_km1(hypergraph, vertex_parts) == graph.layer_volume(layer, inputs, outputs, 8)
    assert hypergraph.vertex_weights.sum() == layer.nnz


def test_refinement_hypergraph_counts_both_layers(small_net):
    rng = np.random.default_rng(4)
    before, layer, after = (rng.integers(0, 8, size=256) for _ in range(3))
    from graph.multiphase import consumer_part_matrix

    consumers = consumer_part_matrix(small_net[3], after, 8)
    hypergraph = build_phase_hypergraph(small_net[2], 8, before, consumers, max_chunk=4)
    vertex_parts = rng.integers(0, 8, size=hypergraph.num_free)
    mine = hypergraph.neuron_parts(vertex_parts)
    expected = graph.layer_volume(small_net[2], before, mine, 8) + graph.layer_volume(
        small_net[3], mine, after, 8
    )
    assert _phase_km1(hypergraph, vertex_parts) == expected


def test_identical_vertices_are_merged_exactly():
    # Columns 0, 2, 3 share rows {0, 1}; column 1 has rows {1}; column 4 rows {0, 1, 2}.
    dense = np.array([[1, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    csc = sp.csc_matrix(dense)
    weights = np.diff(csc.indptr)
    chunk_of, count = identical_vertex_chunks(csc.indptr, csc.indices, weights, chunk=3)
    assert count == 3
    assert chunk_of[0] == chunk_of[2] == chunk_of[3]
    assert len({chunk_of[0], chunk_of[1], chunk_of[4]}) == 3
    # Chunks are equal: a class of 3 with chunk 2 splits into chunks of gcd(3, 2) = 1.
    _, count = identical_vertex_chunks(csc.indptr, csc.indices, weights, chunk=2)
    assert count == 5


def test_input_owners_are_consumers_and_balanced(small_net):
    rng = np.random.default_rng(5)
    outputs = rng.permutation(256) % 8
    owners = assign_input_owners(small_net[0], outputs, 8)
    coo = small_net[0].tocoo()
    consumers = {(i, outputs[j]) for i, j in zip(coo.row, coo.col, strict=True)}
    assert all((i, owners[i]) in consumers for i in range(256))
    assert np.bincount(owners, minlength=8).max() <= 256 // 8 + 2


@pytest.mark.parametrize("with_outputs", [False, True])
def test_assignment_is_the_exact_optimum(with_outputs):
    from itertools import permutations

    from graph.multiphase import consumer_part_matrix

    rng = np.random.default_rng(11)
    # 8 neurons in 4 identical pairs -> 4 chunks of 2 for 4 parts: exactly one chunk per part.
    base = np.zeros((12, 4))
    for column in range(4):
        base[rng.choice(12, size=6, replace=False), column] = 1.0
    layer = sp.csr_matrix(np.repeat(base, 2, axis=1))
    inputs = rng.integers(0, 4, size=12)
    consumers = None
    if with_outputs:
        consumers = consumer_part_matrix(
            sp.csr_matrix(np.repeat(rng.random((4, 3)) < 0.6, 2, axis=0)), [0, 2, 3], 4
        )
    hypergraph = build_phase_hypergraph(layer, 4, inputs, consumers, max_chunk=2)
    assert assignment_applies(hypergraph, 4)
    best = min(_phase_km1(hypergraph, np.array(p)) for p in permutations(range(4)))
    assert _phase_km1(hypergraph, solve_by_assignment(hypergraph, 4)) == best


def test_refinement_never_adds_volume(small_net):
    plain = graph.partition_network(small_net, 16, backend="kahypar", max_chunk=1)
    refined = graph.partition_network(
        small_net, 16, backend="kahypar", max_chunk=1, refine=True, max_sweeps=2
    )
    gains = refined.info["refinement_gains"]
    assert all(g >= 0 for g in gains)
    assert refined.metrics().total_volume == plain.metrics().total_volume - sum(gains)
    assert refined.metrics().imbalance <= 1.01


@pytest.mark.parametrize("backend", graph.BACKENDS)
def test_hypergraph_beats_random_and_keeps_balance(small_net, backend):
    nparts = 8
    hyper = graph.partition_network(
        small_net, nparts, backend=backend, seed=0, exact_assignment=False
    )
    rand = graph.partition_network(small_net, nparts, method="random", seed=0)
    h, r = hyper.metrics(), rand.metrics()
    assert len(hyper.parts) == len(small_net) + 1
    assert h.imbalance <= 1.01
    assert graph.volume_floor(small_net, nparts) <= h.total_volume < 0.5 * r.total_volume
    # Phase 1 places every input on a part that consumes it: the first layer sends nothing extra.
    assert h.layer_volume[0] == graph.layer_volume(
        small_net[0], hyper.parts[0], hyper.parts[1], nparts
    )


def test_same_seed_same_partition(small_net):
    a = graph.partition_network(small_net[:3], 4, backend="kahypar", seed=7)
    b = graph.partition_network(small_net[:3], 4, backend="kahypar", seed=7)
    for x, y in zip(a.parts, b.parts, strict=True):
        np.testing.assert_array_equal(x, y)


def test_backend_partition_respects_fixed_vertices(small_net):
    inputs = np.arange(256) % 4
    hypergraph = build_phase_hypergraph(small_net[1], 4, inputs, max_chunk=1)
    for backend in graph.BACKENDS:
        vertex_parts = run_backend(hypergraph, 4, 0.01, 0, backend)
        assert len(vertex_parts) == hypergraph.num_free
        assert np.bincount(vertex_parts, minlength=4).max() <= 64


@pytest.mark.parametrize("method", ["random", "block"])
def test_baselines_are_balanced(small_net, method):
    partition = graph.partition_network(small_net, 16, method=method)
    for parts in partition.parts:
        counts = np.bincount(parts, minlength=16)
        assert counts.max() - counts.min() <= 1
    assert partition.metrics().imbalance == pytest.approx(1.0)


def test_save_and_load_round_trip(small_net, tmp_path):
    partition = graph.partition_network(small_net, 4, method="random", seed=2)
    path = tmp_path / "p.npz"
    partition.save(path)
    loaded = graph.NetworkPartition.load(path)
    assert loaded.nparts == 4 and loaded.method == "random"
    for x, y in zip(partition.parts, loaded.parts, strict=True):
        np.testing.assert_array_equal(x, y)
    assert loaded.metrics(small_net).total_volume == partition.metrics().total_volume
    with pytest.raises(ValueError, match="holds no layers"):
        loaded.metrics()


def test_load_rejects_other_files(tmp_path):
    path = tmp_path / "bad.npz"
    np.savez(path, x=np.arange(3))
    with pytest.raises(ValueError, match="not a dasknn network partition"):
        graph.NetworkPartition.load(path)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nparts": 0}, "cannot split into 0 parts"),
        ({"nparts": 257}, "cannot split into 257 parts"),
        ({"nparts": 2, "method": "metis"}, "unknown partitioning method"),
        ({"nparts": 2, "backend": "patoh"}, "unknown partitioning backend"),
        ({"nparts": 2, "epsilon": -0.1}, "epsilon"),
    ],
)
def test_bad_arguments_are_named(small_net, kwargs, message):
    with pytest.raises(ValueError, match=message):
        graph.partition_network(small_net, **kwargs)


def test_bad_networks_are_named():
    with pytest.raises(ValueError, match="no layers"):
        graph.partition_network([], 2)
    with pytest.raises(ValueError, match="layer 2 has 5 inputs"):
        graph.partition_network([sp.eye(4, format="csr"), sp.eye(5, format="csr")], 2)


def test_accepts_any_scipy_sparse_format(small_net):
    as_coo = [layer.tocoo() for layer in small_net[:3]]
    as_csr = small_net[:3]
    a = graph.partition_network(as_coo, 8)
    b = graph.partition_network(as_csr, 8)
    assert a.metrics().total_volume == b.metrics().total_volume
