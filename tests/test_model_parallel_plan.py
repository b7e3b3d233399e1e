"""The communication plan, checked against a direct count of each neuron's connectivity."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn.datasets import radixnet
from dasknn.model_parallel._layout import chunk_entries, original_pattern
from dasknn.model_parallel._plan import (
    build_comm_plan,
    iter_layers,
    normalize_partition,
    renumbering,
    reorder,
)


def _network(seed=0):
    rng = np.random.default_rng(seed)
    sizes = [40, 32, 48, 24]
    return [
        sp.random(sizes[k], sizes[k + 1], density=0.08, format="csr", random_state=rng)
        for k in range(3)
    ]


def _connectivity_words(weight, parts_in, parts_out):
    """Sum over input neurons of (number of parts spanned by the neuron and its consumers) - 1."""
    dense = weight.toarray() != 0
    total = 0
    for i in range(weight.shape[0]):
        spanned = {int(parts_in[i])} | {int(p) for p in parts_out[np.flatnonzero(dense[i])]}
        total += len(spanned) - 1
    return total


@pytest.mark.parametrize("nparts", [1, 2, 3, 4])
def test_forward_words_equal_connectivity_minus_one(nparts):
    weights = _network()
    rng = np.random.default_rng(nparts)
    parts = [rng.integers(0, nparts, size=n) for n in [40, 32, 48, 24]]
    plan, _ = build_comm_plan(weights, parts, nparts)
    for k, weight in enumerate(weights, start=1):
        expected = _connectivity_words(weight, parts[k - 1], parts[k])
        assert plan.forward_words(k) == expected
        assert plan.backward_words(k) == (expected if k >= 2 else 0)


def test_chunks_and_messages_rebuild_the_layer():
    """Every part's chunk times its assembled inputs equals the full product on its columns."""
    weights = _network(1)
    parts = [np.array([0, 2, 2, 1] * 10), *(np.arange(n) % 3 for n in [32, 48, 24])]
    parts[2][:] = np.where(parts[2] == 1, 0, parts[2])  # part 1 empty in layer 2
    plan, chunks = build_comm_plan(weights, parts, 3)
    rng = np.random.default_rng(2)
    for k, weight in enumerate(weights, start=1):
        x = rng.normal(size=(5, weight.shape[0]))
        full = x @ weight.toarray()
        order_in, offsets_in = plan.orders[k - 1], plan.offsets[k - 1]
        for m in range(3):
            part_plan = plan.layers[k - 1][m]
            blocks = []
            for n in range(3):
                local = x[:, order_in[offsets_in[n] : offsets_in[n + 1]]]
                if n == m:
                    idx = part_plan.own
                else:
                    idx = plan.layers[k - 1][n].send.get(m, np.empty(0, dtype=np.int64))
                assert len(idx) == part_plan.groups[n + 1] - part_plan.groups[n]
                blocks.append(local[:, idx])
            x_in = np.concatenate(blocks, axis=1)
            chunk = chunks[k - 1][m]
            compact = sp.csr_matrix(
                (chunk.data, chunk.indices, part_plan.indptr), shape=(x_in.shape[1], chunk.shape[1])
            )
            columns = plan.orders[k][plan.offsets[k][m] : plan.offsets[k][m + 1]]
            np.testing.assert_allclose(compact.T @ x_in.T, full[:, columns].T, atol=1e-12)


def test_layers_are_renumbered_one_at_a_time_when_asked_for():
    weights = _network(3)
    parts = [np.arange(n) % 3 for n in [40, 32, 48, 24]]
    plan, chunks = build_comm_plan(weights, parts, 3)
    orders, offsets = renumbering(weights, parts, 3)
    taken = []

    def drawn():
        for weight in weights:
            taken.append(weight)
            yield weight

    layers = iter_layers(drawn(), orders, offsets)
    for k in range(1, len(weights) + 1):
        layer_plans, layer_chunks = next(layers)
        assert len(taken) == k
        for made, expected in zip(layer_plans, plan.layers[k - 1], strict=True):
            for name in ("indptr", "groups", "own"):
                np.testing.assert_array_equal(getattr(made, name), getattr(expected, name))
            assert made.send.keys() == expected.send.keys()
            for n, rows in made.send.items():
                np.testing.assert_array_equal(rows, expected.send[n])
        for chunk, expected in zip(layer_chunks, chunks[k - 1], strict=True):
            assert (chunk != expected).nnz == 0
    assert next(layers, None) is None


def test_the_chunks_patterns_give_the_layer_back_in_the_original_order():
    weights = _network(4)
    weights[0].data[:3] = 0.0  # explicit zeros are entries too
    parts = [np.random.default_rng(5).integers(0, 3, size=n) for n in [40, 32, 48, 24]]
    plan, chunks = build_comm_plan(weights, parts, 3)
    for k, weight in enumerate(weights, start=1):
        layer_chunks = chunks[k - 1]
        indptr, indices, position = original_pattern(
            [(c.indptr, c.indices) for c in layer_chunks], plan.orders[k - 1], plan.orders[k],
            plan.offsets[k],
        )
        np.testing.assert_array_equal(indptr, weight.indptr)
        np.testing.assert_array_equal(indices, weight.indices)
        values = np.concatenate([c.data for c in layer_chunks])[position]
        np.testing.assert_array_equal(values, weight.data)
        entries = chunk_entries(weight, plan, k)
        for chunk, entry in zip(layer_chunks, entries, strict=True):
            np.testing.assert_array_equal(weight.data[entry], chunk.data)


def test_reorder_makes_parts_contiguous():
    parts = np.array([2, 0, 1, 0, 2, 2])
    order, offsets = reorder(parts, 4)
    assert list(parts[order]) == [0, 0, 1, 2, 2, 2]
    assert list(offsets) == [0, 2, 3, 6, 6]
    assert list(order[:2]) == [1, 3]


def test_reorder_puts_the_flagged_neurons_first_within_each_part():
    parts = np.array([2, 0, 1, 0, 2, 2, 0])
    first = np.array([False, False, True, True, False, True, False])
    order, offsets = reorder(parts, 3, first)
    assert list(order) == [3, 1, 6, 2, 5, 0, 4]
    assert list(offsets) == [0, 3, 4, 7]


def test_each_part_sends_a_prefix_of_its_neurons():
    """Boundary-first order: in every layer, the neurons of a part that another part reads are
    its first ``sent_prefix()`` ones, and they are exactly the ones read elsewhere (a direct
    walk of the dense pattern)."""
    weights = _network(3)
    rng = np.random.default_rng(4)
    parts = [rng.integers(0, 3, size=n) for n in (40, 32, 48, 24)]
    plan, _ = build_comm_plan(weights, parts, 3)
    for k, weight in enumerate(weights, start=1):
        dense = weight.toarray() != 0
        for m, layer_plan in enumerate(plan.layers[k - 1]):
            sent = set()
            for rows in layer_plan.send.values():
                sent |= set(rows.tolist())
            original = plan.orders[k - 1][plan.offsets[k - 1][m] : plan.offsets[k - 1][m + 1]]
            read_elsewhere = [
                r for r, i in enumerate(original)
                if any(parts[k][j] != m for j in np.flatnonzero(dense[i]))
            ]
            assert sorted(sent) == read_elsewhere == list(range(len(read_elsewhere)))
            assert layer_plan.sent_prefix() == len(read_elsewhere)


def test_radixnet_block_partition_predicted_volume():
    weights = radixnet(64, 3)
    parts = [np.arange(64) * 2 // 64 for _ in range(4)]
    plan, _ = build_comm_plan(weights, parts, 2)
    sent = [plan.forward_words(k) for k in (1, 2, 3)]
    assert sent == [_connectivity_words(w, parts[0], parts[0]) for w in weights]
    assert plan.predicted_bytes(8, 8)[(1, "backward")] == 0
    assert plan.predicted_bytes(8, 8)[(2, "forward")] == sent[1] * 8 * 8


@pytest.mark.parametrize(
    ("partition", "message"),
    [
        ([np.zeros(4, int)] * 2, "has 2 part arrays"),
        ([np.zeros(4, int), np.zeros(5, int), np.zeros(3, int)], "layer 1 has shape"),
        ([np.zeros(4), np.zeros(6, int), np.zeros(3, int)], "integer part ids"),
        ([np.zeros(4, int), np.full(6, -1), np.zeros(3, int)], "outside"),
        ("abc", "NetworkPartition or a list"),
    ],
)
def test_bad_partitions_are_rejected(partition, message):
    with pytest.raises(ValueError, match=message):
        normalize_partition(partition, [4, 6, 3])


def test_nparts_larger_than_used_ids_and_too_small():
    parts, nparts = normalize_partition([np.zeros(4, int), np.ones(6, int)], [4, 6], nparts=5)
    assert nparts == 5
    with pytest.raises(ValueError, match="outside"):
        normalize_partition([np.zeros(4, int), np.ones(6, int) * 3], [4, 6], nparts=2)
