"""The transfer monitor of :mod:`dasknn.runtime.measure`: every fetched key is counted once, with
its exact sender (the worker it came from, not a guess among its holders) and its size."""

from __future__ import annotations

import numpy as np
import pytest
from distributed import Client, LocalCluster

from dasknn.runtime.cluster import scheduler_workers
from dasknn.runtime.keys import (
    collective_key,
    describe,
    message_phase,
    parse_collective_key,
    phase_names,
    step_key,
)
from dasknn.runtime.measure import install_comm_monitor, read_transfers, reset_transfers

pytestmark = pytest.mark.minversions  # also run at the minimum versions (.ci/run)


def _copy(x):
    return np.array(x, copy=True)


def _incoming(dask_worker):
    return [
        (entry["who"], key, nbytes)
        for entry in dask_worker.transfer_incoming_log
        for key, nbytes in entry["keys"].items()
    ]


def test_every_transfer_is_counted_with_its_exact_sender():
    with LocalCluster(
        n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:
        install_comm_monitor(client)
        install_comm_monitor(client)  # a second install keeps the plugins and their counts
        a, b, c = sorted(scheduler_workers(client))
        token = "0123456789abcdef"
        key = collective_key("allgather", token, "allgather", 0, 1)
        x = client.submit(np.arange, 1000, key=key, workers=[a], pure=False)
        # b copies x; then c fetches it from one of its two holders.
        y = client.submit(_copy, x, workers=[b], allow_other_workers=False, pure=False)
        y.result()
        z = client.submit(_copy, x, workers=[c], allow_other_workers=False, pure=False)
        z.result()
        records = read_transfers(client, token)
        assert sum(r[5] for r in records) == 2
        assert all(r[:2] == (None, "allgather") and r[4] == x.result().nbytes for r in records)
        logged = {
            (sender, receiver)
            for receiver, entries in client.run(_incoming).items()
            for sender, k, _ in entries
            if k == key
        }
        assert {(r[2], r[3]) for r in records} == logged
        assert (a, b) in logged and len(logged) == 2
        reset_transfers(client, token)
        assert read_transfers(client, token) == []


def test_keys_are_built_and_parsed_in_one_place():
    key = collective_key("allreduce", "abc", "reduce-scatter", 2, 0)
    assert parse_collective_key(key) == ("allreduce", "abc", "reduce-scatter", 2, 0)
    assert describe(key) == ("abc", "reduce-scatter", None)
    names = phase_names("abc")
    assert step_key(names["fwd"], 3, 1, 0, 1, 2) == ("dasknn-fwd-abc", 3, 1, 0, 1, 2)
    assert describe(("dasknn-fwd-abc", 3, 1, 0, 1, 0)) == ("abc", "forward", 2)
    assert message_phase(("dasknn-bwd-abc", 3, 2, 0, 1, 1)) == ("abc", "backward", 2)
    assert describe(("dasknn-lse-abc", 3, 2, 0, -1, 0)) == ("abc", "other", 2)
    for other in ("x", ("dasknn-nothing-abc", 1, 2, 3), ("dasknn-fwd-abc", 1)):
        assert describe(other) == (None, "other", None)
        assert parse_collective_key(other) is None


def test_unknown_collectives_have_no_keys():
    with pytest.raises(ValueError, match="collective"):
        collective_key("nope", "t", "p", 0, 1)
