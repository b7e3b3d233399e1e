"""The partitioner on the official 1024-neuron Graph Challenge network (skips without ../shared)."""

from __future__ import annotations

import numpy as np
import pytest

import graph
from dasknn.datasets import read_challenge_network
from graph.hypergraph import build_phase_hypergraph


@pytest.fixture(scope="module")
def official_12(official_1024_dir):
    return read_challenge_network(official_1024_dir, layers=12)


def test_neurons_fall_into_64_classes_of_16(official_12):
    inputs = np.arange(1024) % 64
    for layer in (official_12[0], official_12[8]):
        hypergraph = build_phase_hypergraph(layer, 64, inputs, max_chunk=16)
        assert hypergraph.num_free == 64
        assert np.all(hypergraph.vertex_weights == 16 * 32)


@pytest.mark.parametrize(
    ("nparts", "ratio_bound", "floor_bound"), [(128, 0.139, 1.2), (512, 0.507, 1.1)]
)
def test_quality_against_random_and_floor(official_12, nparts, ratio_bound, floor_bound):
    hyper = graph.partition_network(official_12, nparts)
    rand = graph.partition_network(official_12, nparts, method="random")
    h, r = hyper.metrics(), rand.metrics()
    floor = graph.volume_floor(official_12, nparts)
    assert floor <= h.total_volume <= floor_bound * floor
    assert h.avg_volume / r.avg_volume <= ratio_bound
    assert h.imbalance <= 1.01
    # The unpermuted first six layers (circulants) reach the floor exactly.
    layer_floor = [graph.layer_volume_floor(layer, nparts) for layer in official_12[:6]]
    np.testing.assert_array_equal(h.layer_volume[:6], layer_floor)


def test_refinement_removes_volume_at_128(official_12):
    refined = graph.partition_network(official_12, 128, refine=True, max_sweeps=2)
    gains = refined.info["refinement_gains"]
    assert sum(gains) > 0
    plain = graph.partition_network(official_12, 128)
    assert refined.metrics().total_volume == plain.metrics().total_volume - sum(gains)
    assert refined.metrics().imbalance <= 1.01
