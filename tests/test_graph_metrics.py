"""Metrics of graph.metrics against a brute-force, word-by-word simulation of the exchanges."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import graph


def simulate(layers, parts, nparts):
    """Replay forward and backward passes word by word; count what each part sends."""
    words = np.zeros(nparts, dtype=np.int64)
    sent = np.zeros(nparts, dtype=np.int64)
    received = np.zeros(nparts, dtype=np.int64)
    for k, layer in enumerate(layers, start=1):
        dense = layer.toarray()
        links = set()  # (sender, receiver, direction) of this layer
        for i in range(dense.shape[0]):
            owner = parts[k - 1][i]
            delivered = set()
            for j in range(dense.shape[1]):
                if dense[i, j] == 0:
                    continue
                consumer = parts[k][j]
                if consumer != owner and consumer not in delivered:
                    delivered.add(consumer)
                    words[owner] += 1  # forward: x_{k-1}(i) to the consumer part
                    links.add((owner, consumer, "fwd"))
                    words[consumer] += 1  # backward: the consumer's partial sum back
                    links.add((consumer, owner, "bwd"))
        for sender, receiver, _ in links:
            sent[sender] += 1
            received[receiver] += 1
    return words, sent, received


@st.composite
def networks_and_partitions(draw):
    nparts = draw(st.integers(1, 5))
    widths = draw(st.lists(st.integers(nparts, 9), min_size=2, max_size=4))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    density = draw(st.floats(0.05, 0.9))
    layers = [
        sp.random(widths[k], widths[k + 1], density=density, format="csr", random_state=rng)
        for k in range(len(widths) - 1)
    ]
    parts = [rng.integers(0, nparts, size=w) for w in widths]
    return layers, parts, nparts


@settings(max_examples=60, deadline=None)
@given(networks_and_partitions())
def test_metrics_match_brute_force_simulation(case):
    layers, parts, nparts = case
    metrics = graph.partition_metrics(layers, parts, nparts)
    words, sent, received = simulate(layers, parts, nparts)
    np.testing.assert_array_equal(metrics.send_volume, words)
    np.testing.assert_array_equal(metrics.messages_sent, sent)
    np.testing.assert_array_equal(metrics.messages_received, received)
    assert metrics.total_volume == words.sum() == metrics.layer_volume.sum()
    loads = np.zeros(nparts)
    for k, layer in enumerate(layers, start=1):
        for j in range(layer.shape[1]):
            loads[parts[k][j]] += layer[:, j].count_nonzero()
    np.testing.assert_array_equal(metrics.load, loads)


@settings(max_examples=30, deadline=None)
@given(networks_and_partitions())
def test_floor_never_exceeds_a_balanced_partition(case):
    layers, _, nparts = case
    partition = graph.partition_network(layers, nparts, method="random", seed=1)
    assert graph.volume_floor(layers, nparts) <= partition.metrics().total_volume


def test_single_part_sends_nothing():
    layers = [sp.random(6, 6, density=0.5, format="csr", random_state=0) for _ in range(3)]
    metrics = graph.partition_metrics(layers, [np.zeros(6, dtype=int)] * 4, 1)
    assert metrics.total_volume == 0 and metrics.max_messages == 0
    assert metrics.imbalance == pytest.approx(1.0)


def test_metrics_reject_a_partition_of_the_wrong_depth():
    layers = [sp.eye(4, format="csr")]
    with pytest.raises(ValueError, match="needs 2 part arrays"):
        graph.partition_metrics(layers, [np.zeros(4, dtype=int)], 2)
