"""The shared core of the distributed models: one exceptions module re-exported at the root,
the worker plugin base (:class:`~dasknn.runtime.model_plugin.ModelPlugin`) on real workers, and
the one communication report (:class:`~dasknn.runtime.comm_report.CommReport`)."""

from __future__ import annotations

import json
import pickle

import pytest
from distributed import Client, LocalCluster

import dasknn
from dasknn import exceptions
from dasknn.runtime.comm_report import CommReport, counts_of
from dasknn.runtime.model_plugin import ModelPlugin, call_plugin

pytestmark = pytest.mark.minversions


def test_every_error_is_defined_once_and_exported_at_the_root():
    for name in exceptions.__all__:
        error = getattr(exceptions, name)
        assert issubclass(error, Exception)
        assert getattr(dasknn, name) is error, name
        assert name in dasknn.__all__
    assert issubclass(exceptions.ModelClosedError, RuntimeError)
    assert issubclass(exceptions.NonFiniteLossError, FloatingPointError)


def test_a_non_finite_loss_error_survives_pickling_with_its_fields():
    error = pickle.loads(pickle.dumps(exceptions.NonFiniteLossError(7, float("nan"), 3)))
    assert (error.step, error.layer) == (7, 3)
    assert "step 7" in str(error) and "layer 3" in str(error)


# ---------------------------------------------------------------------- the report
MEASURED = counts_of(
    [
        (1, "forward", "a", "b", 100, 2),
        (1, "forward", "b", "a", 50, 1),
        (1, "forward", "a", "b", 20, 1),  # a repeated key is summed
        (2, "backward", "a", "b", 10, 1),
    ]
)


def test_counts_of_sums_the_monitor_records_by_key():
    assert MEASURED == {
        (1, "forward", "a", "b"): (120, 3),
        (1, "forward", "b", "a"): (50, 1),
        (2, "backward", "a", "b"): (10, 1),
    }


def test_a_prediction_summed_over_pairs_is_compared_at_its_resolution():
    predicted = {(1, "forward", None, None): (170, 4), (2, "backward", "a", "b"): (10, 1)}
    report = CommReport(MEASURED, predicted, steps=2)
    assert report.exact
    assert report.total() == report.total("predicted") == 180
    assert report.messages() == 5 and report.total(phase="backward") == 10
    assert report.by("phase") == {"forward": 170, "backward": 10}
    assert report.by("sender") == {"a": 130, "b": 50}
    assert report.compared()[(1, "forward", None, None)] == ((170, 4), (170, 4))


def test_a_difference_or_an_unpredicted_message_is_not_exact():
    off_by_one = {(1, "forward", None, None): (170, 4), (2, "backward", "a", "b"): (11, 1)}
    assert not CommReport(MEASURED, off_by_one).exact
    unpredicted = CommReport(MEASURED, {(1, "forward", None, None): (170, 4)})
    assert not unpredicted.exact
    assert unpredicted.compared()[(2, "backward", "a", "b")] == ((10, 1), (0, 0))


def test_the_report_reads_as_records_json_and_text():
    report = CommReport(
        MEASURED,
        {(1, "forward", None, None): (170, 4), (2, "backward", "a", "b"): (10, 1)},
        steps=2,
        details={"wire_bytes": 400},
    )
    records = report.records()
    assert [r["phase"] for r in records] == ["forward", "backward"]
    assert records[0]["measured_bytes"] == records[0]["predicted_bytes"] == 170
    loaded = json.loads(report.to_json())
    assert loaded["exact"] is True and loaded["details"] == {"wire_bytes": 400}
    assert loaded["measured_bytes"] == 180 and len(loaded["records"]) == 2
    text = report.format()
    assert "equal" in text and "180 B in 5 messages" in text
    with pytest.raises(ValueError, match="which must be"):
        report.total("guessed")


# ---------------------------------------------------------------------- the plugin base
class _Counter(ModelPlugin):
    kind = "counter"

    def setup(self, worker) -> None:
        self.count = 0

    def add(self, n: int) -> int:
        self.count += n
        return self.count


def _add_on_worker(token: str, n: int) -> int:
    return _Counter.on_worker(token).add(n)


def test_a_model_plugin_is_found_by_its_token_and_gone_after_removal():
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        plugin = _Counter("tok1")
        assert plugin.name == "dasknn-counter-tok1" == _Counter.plugin_name("tok1")
        client.register_plugin(plugin, name=plugin.name)
        assert client.submit(_add_on_worker, "tok1", 2, pure=False).result() == 2
        assert list(client.run(call_plugin, plugin.name, "add", 3).values()) == [5]
        client.unregister_worker_plugin(plugin.name)
        with pytest.raises(exceptions.ModelClosedError, match="holds no state of model tok1"):
            client.submit(_add_on_worker, "tok1", 1, pure=False).result()


# ---------------------------------------------------------------------- a paused worker's advice
def _paused(memory: int, managed: int) -> dict:
    mib = 2**20
    return {
        "status": "paused",
        "memory_limit": 200 * mib,
        "metrics": {"memory": memory * mib, "managed_bytes": managed * mib},
    }


def test_a_worker_paused_by_its_own_memory_is_told_to_get_more_not_smaller_batches():
    from dasknn.runtime.step_timeout import describe_worker

    own = describe_worker(_paused(150, 10), now=0.0)
    assert "paused at its memory limit: 150 MiB used of 200 MiB (75%)" in own
    assert "140 MiB of it the process's own memory, not Dask's data" in own
    assert "smaller batches" not in own
    data = describe_worker(_paused(150, 120), now=0.0)
    assert "120 MiB of it Dask's data" in data and "smaller batches" in data
