"""The slots of worker addresses per host (runtime.affinity); the plugin itself is tested through
``DistributedCompressedMLP(pin_cores=True)`` in test_samo_pipeline.py."""

from __future__ import annotations

from dasknn.runtime.affinity import host_slots


def test_host_slots_number_the_workers_of_each_host_in_order():
    addresses = [
        "tcp://10.0.0.2:4000",
        "tcp://10.0.0.1:4001",
        "tcp://10.0.0.2:4002",
        "tcp://10.0.0.1:4003",
        "tcp://10.0.0.2:4004",
    ]
    assert host_slots(addresses) == {
        "tcp://10.0.0.2:4000": 0,
        "tcp://10.0.0.1:4001": 0,
        "tcp://10.0.0.2:4002": 1,
        "tcp://10.0.0.1:4003": 1,
        "tcp://10.0.0.2:4004": 2,
    }
