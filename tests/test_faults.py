"""Workers that come and go during ``fit``: killed (SIGKILL), stopped (SIGSTOP), retired or paused
at their memory limit, on real worker processes (a worker closed at the end of its ``--lifetime``:
``tests/test_contract.py``). A run
either restores its last checkpoint and ends with the weights of an uninterrupted run (checked
against the independent float64 reference), or stops with a clear error; it never waits for ever
and never hands out weights that mix two steps."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from checkpoint_watch import when_checkpoint
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin
from model_reference import DenseReference
from polling import HANG_GUARD, poll, wait_until
from random_layers import random_layers
from retirement import pausing_cluster, retire_after_steps
from stopped_workers import stopped, wait_until_empty

from dasknn.exceptions import ModelFailedError, StepTimeoutError, WorkerLostError
from dasknn.model import SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.runtime.cluster import scheduler_workers
from dasknn.runtime.faults import RetirementRequests
from dasknn.runtime.keys import message_phase
from dasknn.runtime.measure import MONITOR_NAME, REPORTER_NAME

LR = 0.05
#: Every test runs with both ways a step's messages travel (DistributedSparseMLP's messages=).
MODES = pytest.mark.parametrize("messages", ["tasks", "posted"])


def _model() -> SparseMLP:
    weights, biases = random_layers([16, 24, 20, 6], 0.4, 0)
    return SparseMLP(weights, biases, activation="sigmoid", loss="mse")


def _data(rows: int = 240) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.uniform(size=(rows, 16)), rng.uniform(size=(rows, 6))


def _parts(model: SparseMLP) -> list[np.ndarray]:
    rng = np.random.default_rng(2)
    return [rng.integers(0, 2, size=n) for n in model.layer_sizes]


def _reference_weights(x, y, batch_size: int, epochs: int) -> DenseReference:
    """Plain SGD in dense float64 numpy over the batches ``fit`` draws (seed 0, shuffled)."""
    model = _model()
    reference = DenseReference(model.weights, model.biases, "sigmoid", "sigmoid", "mse")
    rng = np.random.default_rng(0)
    for _ in range(epochs):
        order = rng.permutation(x.shape[0])
        for start in range(0, x.shape[0], batch_size):
            rows = order[start : start + batch_size]
            reference.step(x[rows], y[rows], LR)
    return reference


def _assert_reference(trained: SparseMLP, reference: DenseReference) -> None:
    for k in range(trained.n_layers):
        np.testing.assert_allclose(trained.weights[k].toarray(), reference.W[k], atol=1e-12)
        np.testing.assert_allclose(trained.biases[k], reference.b[k], atol=1e-12)


@pytest.fixture
def cluster():
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        # the workers import and compile the model's code before the tests' short step timeouts
        # (on a loaded machine that alone took longer than their 2 s placements)
        model = _model()
        x, y = _data(8)
        with DistributedSparseMLP(model, client, partition=_parts(model)) as warm:
            warm.train_step(x, y, lr=LR)
        yield cluster, client


def _pids(client) -> dict[str, int]:
    return client.run(os.getpid)


@pytest.mark.slow
@MODES
def test_killed_worker_is_restored_from_the_checkpoint(cluster, tmp_path, messages):
    _, client = cluster
    x, y = _data()
    model = _model()
    with DistributedSparseMLP(
        model, client, partition=_parts(model), messages=messages, step_timeout=30
    ) as dist:
        dist.fit(x[:8], y[:8], batch_size=8, lr=0.0, progress=False)  # compile on the workers
        victim = max(_pids(client).items())
        killed = when_checkpoint(tmp_path, 10, lambda: os.kill(victim[1], signal.SIGKILL))
        dist.fit(x, y, batch_size=8, epochs=2, lr=LR, progress=False, checkpoint=tmp_path,
                 checkpoint_every=5)  # fmt: skip
        killed.join()
        assert victim[0] not in dist.part_workers  # the parts moved
        trained = dist.gather()
    _assert_reference(trained, _reference_weights(x, y, 8, 2))


@pytest.mark.slow
def test_a_fit_call_stops_once_its_recoveries_are_used_up(cluster, tmp_path):
    _, client = cluster
    x, y = _data()
    model = _model()
    with DistributedSparseMLP(model, client, partition=_parts(model), step_timeout=30) as dist:
        dist.max_recoveries = 0
        dist.fit(x[:8], y[:8], batch_size=8, lr=0.0, progress=False)  # compile on the workers
        victim = max(_pids(client).items())
        killed = when_checkpoint(tmp_path, 10, lambda: os.kill(victim[1], signal.SIGKILL))
        with pytest.raises(WorkerLostError, match=r"restored its checkpoint 0 times already"):
            dist.fit(x, y, batch_size=8, epochs=2, lr=LR, progress=False, checkpoint=tmp_path,
                     checkpoint_every=5)  # fmt: skip
        killed.join()


@pytest.mark.slow
@MODES
def test_a_retired_part_worker_hands_its_parts_over_and_fit_goes_on(cluster, messages):
    _, client = cluster
    x, y = _data()
    model = _model()
    with DistributedSparseMLP(
        model, client, partition=_parts(model), messages=messages, step_timeout=30
    ) as dist:
        leaving = dist.part_workers[1]
        retire = retire_after_steps(client, dist, 10, leaving)
        dist.fit(x, y, batch_size=8, epochs=2, lr=LR, progress=False)  # no checkpoint
        retire.join()
        assert leaving not in dist.part_workers
        wait_until(lambda: leaving not in scheduler_workers(client), HANG_GUARD, "retired")
        trained = dist.gather()
    _assert_reference(trained, _reference_weights(x, y, 8, 2))


@pytest.mark.slow
@MODES
def test_stopped_worker_is_reported_after_the_step_timeout(cluster, messages):
    _, client = cluster
    x, y = _data()
    model = _model()
    with DistributedSparseMLP(
        model, client, partition=_parts(model), messages=messages, step_timeout=2
    ) as dist:
        dist.fit(x[:8], y[:8], batch_size=8, lr=0.0, progress=False)
        address, pid = max(_pids(client).items())
        stop = threading.Timer(0.5, lambda: os.kill(pid, signal.SIGSTOP))
        stop.start()
        try:
            start = time.monotonic()
            # stopped while a step runs, or (rarely) between its end and the gather
            reported = f"(made no progress for|did not arrive within) 2 s .*{address}"
            with pytest.raises(StepTimeoutError, match=reported):
                dist.fit(x, y, batch_size=8, epochs=100, lr=LR, progress=False)
            assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing
            with pytest.raises(ModelFailedError, match="unusable after a failed step"):
                dist.gather()
        finally:
            stop.join()
            os.kill(pid, signal.SIGCONT)


def _is_call_data(key, token: str) -> bool:
    """Whether ``key`` is one of a model's ``fit`` data blocks (scattered, or held in its span)."""
    return isinstance(key, tuple) and str(key[0]).startswith(
        (f"dasknn-x-{token}", f"dasknn-y-{token}")
    )


def _call_data(client, token: str) -> list[str]:
    """The keys of a model's ``fit`` data blocks on the scheduler and in the workers' data."""
    on_scheduler = client.run_on_scheduler(
        lambda dask_scheduler: [str(k) for k in dask_scheduler.tasks if _is_call_data(k, token)]
    )
    on_workers = client.run(
        lambda dask_worker: [str(k) for k in dask_worker.data if _is_call_data(k, token)]
    )
    return [*on_scheduler, *(k for ks in on_workers.values() for k in ks)]


@pytest.mark.slow
def test_a_worker_stopped_before_fit_is_named_after_the_step_timeout(cluster):
    """A part worker stopped (SIGSTOP) between two ``fit`` calls: the call's data blocks,
    scattered to the part workers first, are given up after ``step_timeout`` with a
    StepTimeoutError naming the worker (a ``Client.scatter`` timeout bounds only the wait for a
    running worker, not until Dask removes the worker); once the worker goes
    on, no block of the call is left on the scheduler or a worker."""
    _, client = cluster
    x, y = _data()
    model = _model()
    with DistributedSparseMLP(model, client, partition=_parts(model), step_timeout=2) as dist:
        dist.fit(x[:8], y[:8], batch_size=8, lr=0.0, progress=False)
        address = max(_pids(client))
        with stopped(client, address):
            start = time.monotonic()
            named = f"^the workers did not take the x blocks within 2 s .*worker {address} "
            with pytest.raises(StepTimeoutError, match=named):
                dist.fit(x, y, batch_size=8, lr=LR, progress=False)
            assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing
        client.run(os.getpid)  # the worker went on and answered: a late scatter is registered
        time.sleep(1)  # lets a late scatter land: a block that may never come has no condition
    wait_until_empty(lambda: _call_data(client, dist.token), 10, "a data block of fit stayed")


def _model_plugins(client, token: str) -> list[str]:
    """The names of the scheduler's and the workers' plugins that hold ``token``, and of the
    transfer monitor's and the retirement watch's, which leave with the last model holding
    them."""
    on_scheduler = client.run_on_scheduler(
        lambda dask_scheduler: [*dask_scheduler.plugins, *dask_scheduler.worker_plugins]
    )
    on_workers = client.run(lambda dask_worker: list(dask_worker.plugins))
    names = [*on_scheduler, *(n for ns in on_workers.values() for n in ns)]
    shared = (MONITOR_NAME, REPORTER_NAME, RetirementRequests.name)
    return [n for n in names if token in n or n in shared]


@pytest.mark.slow
@pytest.mark.parametrize("given", ["client", "address", "cluster"])
def test_a_stopped_worker_does_not_hold_up_close(cluster, given):
    """A worker stopped (SIGSTOP) after a step, still listed by the scheduler: ``close()`` of a
    model with ``reuse_memory=True`` waits for it at most ``step_timeout`` (not until Dask
    removes the worker), and no plugin of the model is left once it goes on. Given the
    scheduler's address or the cluster object, the model closes the client it opened at the end
    of ``close()``: the removals it asked for are carried out all the same."""
    local, client = cluster
    where = {"client": client, "address": local.scheduler_address, "cluster": local}[given]
    x, y = _data(8)
    model = _model()
    dist = DistributedSparseMLP(
        model, where, partition=_parts(model), reuse_memory=True, step_timeout=2
    )
    try:
        assert (dist.client is client) == (given == "client")
        dist.train_step(x, y, lr=LR)
        assert _model_plugins(client, dist.token)  # the test sees the model's plugins
        with stopped(client, dist.part_workers[1]):
            start = time.monotonic()
            dist.close()
            assert time.monotonic() - start < HANG_GUARD  # worker-ttl is minutes; a hang guard
            assert (dist.client.status == "closed") == (given != "client")
    finally:
        dist.close()
    wait_until_empty(
        lambda: _model_plugins(client, dist.token),
        10,
        "a plugin of the model stayed after the worker went on",
    )


class _StopOtherThenKillSelfOnStep(WorkerPlugin):
    """On the worker ``killed``: the moment a task of step ``step`` or later starts executing,
    stops (SIGSTOP) the worker process ``stopped_pid``, then kills (SIGKILL) its own process: a
    step that loses one part worker while another does not answer."""

    name = "dasknn-test-stop-other-then-kill-self"

    def __init__(self, killed: str, stopped_pid: int, step: int):
        self.killed_address = killed
        self.stopped_pid = stopped_pid
        self.step = step
        self.here = False

    def setup(self, worker) -> None:
        self.here = worker.address == self.killed_address

    def transition(self, key, start, finish, **kwargs) -> None:
        if self.here and finish == "executing" and message_phase(key) is not None:
            if key[1] >= self.step:
                os.kill(self.stopped_pid, signal.SIGSTOP)
                os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.slow
def test_a_worker_lost_while_another_is_stopped_is_named_within_the_step_timeout(cluster):
    """``messages="posted"``: a part worker killed in a step while the other one is stopped. The
    step's results do not arrive within ``step_timeout``; the lost worker is the step's failure
    (a ``WorkerLostError`` naming it, which a checkpoint recovers, where it was a
    ``StepTimeoutError``), and the clean-up after the loss (the step's waits ended on the part
    workers still listed) waits for the stopped one at most ``step_timeout`` (not until Dask
    removes the stopped worker)."""
    _, client = cluster
    x, y = _data(96)
    model = _model()
    dist = DistributedSparseMLP(
        model, client, partition=_parts(model), messages="posted", step_timeout=3
    )
    pids = _pids(client)
    victim, survivor = dist.part_workers[1], dist.part_workers[0]
    try:
        dist.fit(x[:8], y[:8], batch_size=8, lr=0.0, progress=False)  # step 1: compile
        client.register_plugin(_StopOtherThenKillSelfOnStep(victim, pids[survivor], step=4))
        try:
            start = time.monotonic()
            with pytest.raises(WorkerLostError, match=f"{victim} \\(part \\d\\) of the model"):
                dist.fit(x, y, batch_size=8, epochs=3, lr=LR, progress=False)
            took = time.monotonic() - start
        finally:
            os.kill(pids[survivor], signal.SIGCONT)
        assert took < HANG_GUARD, took  # the results' wait, the clean-up's: a hang guard
        with pytest.raises(ModelFailedError, match="unusable after a failed step"):
            dist.gather()
    finally:
        dist.close()
        client.unregister_worker_plugin(_StopOtherThenKillSelfOnStep.name)


class _StopWorkerWhenAStepIsDone(SchedulerPlugin):
    """Stops (SIGSTOP) a worker from inside the scheduler as soon as a training step that started
    after the plugin was added has finished: every task done, the results in memory, before the
    client hears of it (and so before it gathers them)."""

    name = "dasknn-test-stop-when-done"
    _BUSY = ("waiting", "processing", "no-worker", "queued")

    def __init__(self, address: str, step_prefix: str):
        self.address = address
        self.step_prefix = step_prefix  # of the keys of a training step's last tasks
        self.started = self.stopped = False

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        step_key = isinstance(key, tuple) and str(key[0]).startswith(self.step_prefix)
        self.started |= step_key and finish == "processing"
        if self.stopped or not self.started or finish != "memory":
            return
        if any(ts.state in self._BUSY for ts in self.scheduler.tasks.values()):
            return
        self.stopped = True
        os.kill(self.scheduler.workers[self.address].pid, signal.SIGSTOP)


def _model_keys(dask_scheduler, token: str) -> list:
    return [str(key) for key in dask_scheduler.tasks if token in str(key)]


@pytest.mark.slow
@MODES
def test_worker_stopped_between_the_step_and_the_gather_is_reported_after_the_step_timeout(
    cluster, messages
):
    """The step has finished (all its futures done) when the worker holding part of its results
    stops: the gather of the results gives up after ``step_timeout`` (``Client.gather`` alone
    would wait for ever), names the worker, and the cancelled gather holds no key once the model
    is closed (garbage collector off)."""
    _, client = cluster
    x, y = _data()
    model = _model()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with DistributedSparseMLP(
            model, client, partition=_parts(model), messages=messages, step_timeout=3
        ) as dist:
            dist.fit(x[:8], y[:8], batch_size=8, lr=0.0, progress=False)
            address, token = dist.part_workers[1], dist.token
            pid = _pids(client)[address]
            prefix = {"tasks": "dasknn-bwd-", "posted": "dasknn-run-"}[messages]
            plugin = _StopWorkerWhenAStepIsDone(address, prefix)
            client.register_plugin(plugin)
            try:
                start = time.monotonic()
                with pytest.raises(
                    StepTimeoutError,
                    match=f"results of a finished step did not arrive within 3 s .*{address} "
                    r"\(part \d\) has not been heard from",
                ):
                    dist.train_step(x[:8], y[:8], lr=LR)
                assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing
                assert client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins[
                    plugin.name].stopped)  # fmt: skip
            finally:
                os.kill(pid, signal.SIGCONT)
            with pytest.raises(ModelFailedError, match="unusable after a failed step"):
                dist.gather()
        wait_until_empty(
            lambda: client.run_on_scheduler(_model_keys, token=token),
            30,
            "model keys were still held after close()",
        )
    finally:
        if was_enabled:
            gc.enable()


@pytest.mark.slow
@MODES
def test_paused_worker_is_an_error_naming_the_memory_limit(tmp_path, messages):
    """Workers whose memory limit lies below what a worker process with dasknn loaded takes
    (about 200 MiB here): Dask pauses them; the run stops with an error naming the limit."""
    with pausing_cluster(tmp_path) as cluster, Client(cluster) as client:
        x, y = _data()
        model = _model()
        start = time.monotonic()
        with pytest.raises(StepTimeoutError, match="paused at its memory limit: .* of 200 MiB"):
            # Placing the model (the workers pause as dasknn loads) or its first step.
            with DistributedSparseMLP(
                model, client, partition=_parts(model), messages=messages, step_timeout=3
            ) as dist:
                dist.fit(x, y, batch_size=8, lr=LR, progress=False)
        assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing


def _latest_step(dask_worker) -> int:
    """The highest step a model-parallel model began on this worker (0 if none)."""
    states = [p for n, p in dask_worker.plugins.items() if n.startswith("dasknn-model-")]
    return max((state._latest_step for state in states), default=0)


@pytest.mark.slow
def test_cli_reports_a_lost_worker_in_one_line(cluster):
    # the command runs in a process of its own, as a user runs it: this process also runs the
    # cluster's scheduler, whose own log lines (asyncio's "Task exception was never retrieved"
    # after a lost worker) would otherwise share the command's stderr
    _, client = cluster
    pids = _pids(client)

    def kill_once_training():
        # placed and training (the command runs 3,000 steps): its parts began step 3
        if poll(lambda: min(client.run(_latest_step).values()) >= 3, 60):
            os.kill(max(pids.items())[1], signal.SIGKILL)

    killer = threading.Thread(target=kill_once_training, daemon=True)
    killer.start()
    argv = [
        "train", "radixnet:32:2", "--parts", "2", "--partition", "random", "--steps", "3000",
        "--batch-size", "4", "--scheduler", client.scheduler.address,
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "dasknn", *argv], capture_output=True, text=True, timeout=180
    )
    killer.join()
    err = done.stderr
    assert done.returncode == 2, err
    errors = [line for line in err.splitlines() if line and not line.startswith("epoch ")]  # bar
    assert len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith("dasknn train: error: worker(s) tcp://"), err
    assert "left the cluster" in errors[0]
