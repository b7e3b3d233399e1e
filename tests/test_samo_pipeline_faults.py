"""A pipeline model (DistributedCompressedMLP) whose stage worker is killed (SIGKILL, a real
worker process of a LocalCluster) ends in a WorkerLostError naming the worker and the stage
replica it held, within a few seconds, in both message modes: never a hang and never Dask's own
CommClosedError. The failed step's keys leave the scheduler, and the stages still there stop
waiting for the lost one. Reading the model (replica, gather, predict, the reports) after a lost
or stopped stage worker ends in the same errors, and so does ``dasknn samo``, on one line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from distributed import Client
from distributed.diagnostics.plugin import WorkerPlugin
from polling import HANG_GUARD, poll, wait_until
from stopped_workers import stopped, wait_until_empty

from dasknn.exceptions import ModelFailedError, StepTimeoutError, WorkerLostError
from dasknn.model import CompressedMLP
from dasknn.pipeline_parallel import DistributedCompressedMLP
from dasknn.pipeline_parallel._worker_state import StageState
from dasknn.pruning import magnitude_masks
from dasknn.runtime.cluster import local_cluster, scheduler_workers
from dasknn.runtime.keys import parse_pipeline_key

SIZES = (12, 10, 8, 4)
#: The start of the names of the pipeline models' worker plugins.
PLUGINS = StageState.plugin_name("")


@pytest.fixture
def client():
    """A client of a cluster of two worker processes of the test's own: each test kills or
    stops workers, and none depends on how the nannies brought back those of the one before."""
    with local_cluster(2) as cluster, Client(cluster) as client:
        yield client


def _model() -> CompressedMLP:
    rng = np.random.default_rng(0)
    weights = [rng.uniform(-1, 1, (a, b)) for a, b in zip(SIZES[:-1], SIZES[1:], strict=True)]
    return CompressedMLP(weights, magnitude_masks(weights, 0.5))


def _data(rows: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.uniform(0, 1, (rows, SIZES[0])), rng.integers(0, SIZES[-1], rows)


def _model_keys(dask_scheduler, token: str) -> list[str]:
    keys = [parse_pipeline_key(key) for key in dask_scheduler.tasks]
    return sorted(key.kind for key in keys if key is not None and key.token == token)


def _pipeline_keys(dask_scheduler) -> list[str]:
    """The scheduler's pipeline keys, of any model, as strings."""
    return sorted(str(key) for key in dask_scheduler.tasks if parse_pipeline_key(key) is not None)


def _keys_left(client, token: str, kept=("postbox",), seconds: float = 30.0) -> list[str]:
    """The kinds of the model's keys the scheduler still holds, other than ``kept``, once none
    is left or after ``seconds``."""

    def left() -> list[str]:
        return [k for k in client.run_on_scheduler(_model_keys, token=token) if k not in kept]

    poll(lambda: not left(), seconds)
    return left()


def _lost_message(pipe: DistributedCompressedMLP, stage: int) -> str:
    a, b = pipe.bounds[stage]
    layers = f"layer {b}" if b == a + 1 else f"layers {a + 1} to {b}"
    return (
        f"^lost worker {re.escape(pipe.workers[(stage, 0)])}: it held stage {stage} of replica 0, "
        f"{layers}; "
    )


@pytest.mark.slow
@pytest.mark.parametrize(("messages", "stage"), [("posted", 1), ("tasks", 0)])
def test_a_stage_worker_killed_during_fit_is_named(client, messages, stage):
    x, y = _data(64)
    pids = client.run(os.getpid)
    with DistributedCompressedMLP(
        _model(), client, stages=2, microbatches=2, messages=messages
    ) as pipe:
        victim = pipe.workers[(stage, 0)]
        killed_at = []

        def kill_during_training():
            poll(lambda: pipe.n_steps_ >= 3, 30, interval=0.001)
            killed_at.append(time.monotonic())
            os.kill(pids[victim], signal.SIGKILL)

        killer = threading.Thread(target=kill_during_training, daemon=True)
        killer.start()
        with pytest.raises(WorkerLostError, match=_lost_message(pipe, stage)) as raised:
            # 2,000 steps take far longer than the kill
            pipe.fit(x, y, batch_size=16, epochs=500, lr=0.1, progress=False)
        named_after = time.monotonic() - killed_at[0]
        killer.join()
        assert 3 <= pipe.n_steps_ < 100
        assert named_after < HANG_GUARD, named_after  # a hang guard, not a timing
        assert "the weights of those layers are gone" in str(raised.value)
        assert _keys_left(client, pipe.token) == []  # the failed step's futures were released
    assert _keys_left(client, pipe.token, kept=()) == []


class _KillWhenStageRuns(WorkerPlugin):
    """Kills its worker (SIGKILL) as the stage task of ``step`` of the pipeline model ``token``
    starts executing there, if it is the worker at ``address``: a loss in the middle of a step,
    while the other stages wait for its messages."""

    name = "test-kill-when-stage-runs"
    #: The signal sent, and the kinds of the step's tasks that send it as they start.
    sent_signal = signal.SIGKILL
    kinds = ("run",)

    def __init__(self, token: str, step: int, address: str) -> None:
        self.token, self.step, self.address = token, step, address

    def setup(self, worker) -> None:
        self.worker = worker

    def transition(self, key, start, finish, **kwargs) -> None:
        parsed = parse_pipeline_key(key)
        if (
            finish == "executing"
            and self.worker.address == self.address
            and parsed is not None
            and (parsed.token, parsed.step) == (self.token, self.step)
            and parsed.kind in self.kinds
        ):
            os.kill(os.getpid(), self.sent_signal)


def _ready() -> bool:
    return True


@pytest.mark.slow
def test_the_other_stages_drop_a_step_whose_stage_worker_was_lost(client):
    """With posted messages a stage that waits for a lost stage's message is freed at once (not
    after the 600 s message timeout): its worker runs the next task within seconds."""
    x, y = _data(16)
    with DistributedCompressedMLP(_model(), client, stages=2, microbatches=2) as pipe:
        pipe.train_step(x, y, lr=0.1)
        victim, survivor = pipe.workers[(1, 0)], pipe.workers[(0, 0)]
        client.register_plugin(_KillWhenStageRuns(pipe.token, 2, victim))
        try:
            with pytest.raises(WorkerLostError, match=_lost_message(pipe, 1)):
                pipe.train_step(x, y, lr=0.1)
            # the message timeout is 600 s: a task running on the survivor at all shows it free
            assert client.submit(_ready, workers=[survivor], pure=False).result(timeout=30)
        finally:
            client.unregister_worker_plugin(_KillWhenStageRuns.name)
        assert _keys_left(client, pipe.token) == []


def _kill(client, address: str) -> None:
    """Kill the worker process at ``address`` (SIGKILL) and wait until the scheduler lists it no
    more."""
    os.kill(client.run(os.getpid, workers=[address])[address], signal.SIGKILL)
    wait_until(
        lambda: address not in scheduler_workers(client), 30, f"the scheduler still lists {address}"
    )


@pytest.mark.slow
def test_a_stage_worker_lost_between_steps_is_named_at_the_next_step(client):
    x, y = _data(16)
    with DistributedCompressedMLP(_model(), client, stages=2, microbatches=2) as pipe:
        pipe.train_step(x, y, lr=0.1)
        _kill(client, pipe.workers[(1, 0)])
        for _ in range(2):  # the step's scatter finds it gone, every time
            start = time.monotonic()
            with pytest.raises(WorkerLostError, match=_lost_message(pipe, 1)):
                pipe.train_step(x, y, lr=0.1)
            assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing
        assert _keys_left(client, pipe.token) == []
    assert _keys_left(client, pipe.token, kept=()) == []


@pytest.mark.slow
def test_reading_the_model_after_a_lost_stage_worker_names_it(client):
    """replica, gather, predict, score, step_report, idle_* and comm_report each name the lost
    stage worker with its stage (WorkerLostError) within a poll or two; step_report and the
    idle_* do not wait for Dask's 30 s connect timeout, and comm_report does not report the counts
    as if nothing had happened."""
    x, y = _data(16)
    with DistributedCompressedMLP(_model(), client, stages=2, microbatches=2) as pipe:
        pipe.train_step(x, y, lr=0.1)
        _kill(client, pipe.workers[(1, 0)])
        reads = {
            "replica": lambda: pipe.replica(0),
            "gather": pipe.gather,
            "predict": lambda: pipe.predict(x),
            "score": lambda: pipe.score(x, y),
            "step_report": pipe.step_report,
            "idle_fractions": pipe.idle_fractions,
            "idle_breakdown": pipe.idle_breakdown,
            "idle_sources": pipe.idle_sources,
            "comm_report": pipe.comm_report,
        }
        for name, read in reads.items():
            start = time.monotonic()
            with pytest.raises(WorkerLostError, match=_lost_message(pipe, 1)) as raised:
                read()
            assert time.monotonic() - start < HANG_GUARD, name  # a hang guard, not a timing
            assert "; the weights of those layers are gone (a fit call given fit(checkpoint" in str(
                raised.value
            )


class _StopWhenStageRuns(_KillWhenStageRuns):
    """Stops its worker (SIGSTOP) as the first task of ``step`` (the stage's task with posted
    messages, its first pass with tasks) starts executing there, if it is the worker at
    ``address``: a stage that stops answering in the middle of a step while the scheduler still
    lists it."""

    name = "test-stop-when-stage-runs"
    sent_signal = signal.SIGSTOP
    kinds = ("run", "fwd", "bwd")


@pytest.mark.slow
@pytest.mark.parametrize("messages", ["posted", "tasks"])
def test_a_stopped_stage_worker_is_named_after_the_step_timeout(client, messages):
    """A stage worker stopped (SIGSTOP) during a step, still listed by the scheduler, ends the
    step after ``step_timeout`` in a StepTimeoutError naming it, its stage and its state; the
    step's keys leave the scheduler, the other stage's worker is free at once, and the model
    refuses further steps."""
    x, y = _data(16)
    pids = client.run(os.getpid)
    with DistributedCompressedMLP(
        _model(), client, stages=2, microbatches=2, messages=messages, step_timeout=3
    ) as pipe:
        pipe.train_step(x, y, lr=0.1)
        victim, survivor = pipe.workers[(1, 0)], pipe.workers[(0, 0)]
        client.register_plugin(_StopWhenStageRuns(pipe.token, 2, victim))
        try:
            start = time.monotonic()
            named = (
                rf"^the step did not finish within 3 s \(step_timeout\): .*worker "
                rf"{re.escape(victim)} \(stage 1 of replica 0, layers? [0-9 to]+\) has not been "
                "heard from for"
            )
            with pytest.raises(StepTimeoutError, match=named):
                pipe.train_step(x, y, lr=0.1)
            assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing
            assert _keys_left(client, pipe.token) == []  # the step's futures were released
            # the surviving stage dropped the step (else it waits for the 600 s message timeout)
            assert client.submit(_ready, workers=[survivor], pure=False).result(timeout=30)
            with pytest.raises(ModelFailedError, match="unusable after a failed step"):
                pipe.train_step(x, y, lr=0.1)
        finally:
            os.kill(pids[victim], signal.SIGCONT)
            client.unregister_worker_plugin(_StopWhenStageRuns.name)
    assert _keys_left(client, pipe.token, kept=()) == []
    # resumed, the stopped worker runs tasks again (its task of the failed step, stopped before
    # it started, was cancelled)
    assert client.submit(_ready, workers=[victim], pure=False).result(timeout=25)


def _plugins(client) -> list[str]:
    """The names of the worker plugins on every worker."""
    held = client.run(lambda dask_worker: list(dask_worker.plugins))
    return sorted(name for names in held.values() for name in names)


@pytest.mark.slow
def test_a_stopped_stage_worker_is_named_by_a_read_and_does_not_hold_up_close(client):
    """A stage worker stopped (SIGSTOP) after a step, still listed by the scheduler: reading the
    last step's records (and so the idle fractions) ends after ``step_timeout`` in a
    StepTimeoutError naming it, its stage and its state, instead of waiting for ever; ``close()``
    waits for it at most ``step_timeout`` too (not until Dask removes the worker),
    and the model's plugins leave it once it goes on."""
    x, y = _data(16)
    pipe = DistributedCompressedMLP(_model(), client, stages=2, microbatches=2, step_timeout=2.5)
    try:
        pipe.train_step(x, y, lr=0.1)
        victim = pipe.workers[(1, 0)]
        named = (
            r"^the stages' records of the last step did not arrive within 2.5 s \(step_timeout\): "
            rf".*worker {re.escape(victim)} \(stage 1 of replica 0, layers? [0-9 to]+\) has not "
            "been heard from for"
        )
        with stopped(client, victim):
            start = time.monotonic()
            with pytest.raises(StepTimeoutError, match=named):
                pipe.idle_fractions()
            assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing
            start = time.monotonic()
            pipe.close()  # the worker stays listed: Dask's worker-ttl would take minutes
            assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing
    finally:
        pipe.close()
    wait_until(
        lambda: pipe.token not in str(_plugins(client)), 30, "the model's plugins stayed"
    )


def _recorded_step(dask_worker) -> int:
    """The highest training step a pipeline model's stage recorded on this worker (0 if none)."""
    states = [p for n, p in dask_worker.plugins.items() if n.startswith(PLUGINS)]
    return max((max(state.events, default=0) for state in states), default=0)


def _signal_once_training(client, sent_signal) -> tuple[threading.Thread, list]:
    """A started thread that waits (up to 60 s) until both workers' stages of a pipeline model
    recorded step 3 (placed and training: the commands run 8,000 steps), then sends
    ``sent_signal`` to one of them, and the list it then appends
    ``(address, time.monotonic(), pid)`` to."""
    pids = client.run(os.getpid)
    sent: list = []

    def training() -> dict | None:
        steps = client.run(_recorded_step)
        return steps if len(steps) == 2 and min(steps.values()) >= 3 else None

    def send_once_training() -> None:
        steps = poll(training, 60)
        if steps:
            os.kill(pids[max(steps)], sent_signal)
            sent.append((max(steps), time.monotonic(), pids[max(steps)]))

    thread = threading.Thread(target=send_once_training, daemon=True)
    thread.start()
    return thread, sent


def _command_lines(stderr: str) -> list[str]:
    """The lines of a command's ``stderr`` other than Dask's own warnings (shown from
    ``--dask-log-level warning`` by default, such as the client's "Couldn't gather 2 keys,
    rescheduling" as a worker dies under a gather)."""
    dask_warning = re.compile(r"^\S+ \S+ - distributed(\.\w+)* - WARNING - ")
    return [line for line in stderr.strip().splitlines() if not dask_warning.match(line)]


@pytest.mark.slow
def test_samo_command_with_a_killed_stage_worker_prints_one_line_and_writes_nothing(
    client, tmp_path
):
    """``dasknn samo`` in a process of its own, as a user runs it, against the module's
    cluster: a stage worker killed mid-run ends it with exit code 2 and the WorkerLostError on
    one line naming the worker and its stage, no traceback, and neither ``--json`` nor
    ``--save`` written."""
    killer, killed = _signal_once_training(client, signal.SIGKILL)
    report, saved = tmp_path / "samo.json", tmp_path / "model.npz"
    argv = [
        "samo", "--hidden", "16", "--samples", "256", "--held-out", "0", "--batch-size", "64",
        "--dense-epochs", "0", "--epochs", "2000", "--stages", "2", "--no-progress",
        "--scheduler", client.scheduler.address, "--json", str(report), "--save", str(saved),
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "dasknn", *argv], capture_output=True, text=True, timeout=120
    )
    killer.join()
    err = done.stderr
    assert killed and done.returncode == 2, err
    lines = _command_lines(err)
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith(f"dasknn samo: error: lost worker {killed[0][0]}: it held stage ")
    assert "of replica 0" in lines[0] and "the step failed" in lines[0]
    assert not report.exists() and not saved.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary file left either


@pytest.mark.slow
def test_samo_command_with_a_stopped_stage_worker_prints_the_step_timeout_on_one_line(
    client, tmp_path
):
    """``dasknn samo --step-timeout 3`` with a stage worker stopped (SIGSTOP) mid-run: exit code
    2 within seconds, the StepTimeoutError on one line naming the worker, its stage and its
    state, and no ``--json`` written (closing the model does not wait for the stopped worker until
    Dask removes it)."""
    stopper, stopped_at = _signal_once_training(client, signal.SIGSTOP)
    report = tmp_path / "samo.json"
    argv = [
        "samo", "--hidden", "16", "--samples", "256", "--held-out", "0", "--batch-size", "64",
        "--dense-epochs", "0", "--epochs", "2000", "--stages", "2", "--step-timeout", "3",
        "--no-progress", "--scheduler", client.scheduler.address, "--json", str(report),
    ]  # fmt: skip
    try:
        done = subprocess.run(
            [sys.executable, "-m", "dasknn", *argv], capture_output=True, text=True, timeout=120
        )
        ended = time.monotonic()
    finally:
        stopper.join()
        for *_, pid in stopped_at:
            os.kill(pid, signal.SIGCONT)
    err = done.stderr
    assert stopped_at and done.returncode == 2, err
    victim, stopped_time, _ = stopped_at[0]
    # the step's timeout, close's, the exit: a hang guard, not a timing
    assert ended - stopped_time < 3 + 3 + HANG_GUARD
    lines = _command_lines(err)
    assert "Traceback" not in err and len(lines) == 1, err
    named = (
        r"^dasknn samo: error: the step('s data)? did not (finish|reach its stage) within 3 s "
        rf"\(step_timeout\): .*worker {re.escape(victim)} \(stage [01] of replica 0, layers? "
        r"[0-9 to]+\) has not been heard from for"
    )
    assert re.match(named, lines[0]), err
    assert not report.exists()


def test_step_timeout_must_be_a_positive_finite_number(client):
    for bad in (0, -1.0, float("nan"), float("inf"), "3", True, None):
        with pytest.raises(ValueError, match="step_timeout must be a number of seconds > 0"):
            DistributedCompressedMLP(_model(), client, stages=2, step_timeout=bad)


def _model_plugins(client) -> list[str]:
    """The names of pipeline models' plugins and key-cache bounds on the workers and the
    scheduler (worker plugins it hands to new workers, and its own plugins)."""

    def on_scheduler(dask_scheduler) -> list[str]:
        return [*dask_scheduler.worker_plugins, *dask_scheduler.plugins]

    names = _plugins(client) + client.run_on_scheduler(on_scheduler)
    return sorted(n for n in names if n.startswith((PLUGINS, "dasknn-key-cache-bound-")))


@pytest.mark.slow
def test_a_worker_stopped_before_the_constructor_is_named_and_nothing_is_left(client):
    """A stage worker stopped (SIGSTOP) before the model is placed: the constructor ends after
    ``step_timeout`` in a StepTimeoutError naming it and its stage, not waiting until
    Dask removes the worker (worker-ttl, 5 minutes); once the worker goes on, no plugin of the
    model is left on it, the other worker or the scheduler."""
    before = _model_plugins(client)
    victim = sorted(scheduler_workers(client))[1]  # stage 1 of replica 0
    named = (
        r"^the workers did not take the model while it was placed within 2 s \(step_timeout\): "
        rf"(.*; )?worker {re.escape(victim)} \(stage 1 of replica 0, layers? [0-9 to]+\) "
    )
    with stopped(client, victim):
        start = time.monotonic()
        with pytest.raises(StepTimeoutError, match=named):
            DistributedCompressedMLP(_model(), client, stages=2, reuse_memory=True, step_timeout=2)
        took = time.monotonic() - start
    assert took < HANG_GUARD, took  # worker-ttl is 5 minutes; a hang guard, not a timing
    wait_until_empty(  # only the new ones: an earlier model's may still be leaving
        lambda: sorted(set(_model_plugins(client)) - set(before)),
        30,
        "the model's plugins stayed",
    )


class _KillWhenPostboxStarts(WorkerPlugin):
    """Kills its worker (SIGKILL) as a pipeline model's postbox starts there, the last call of
    the placement, if it is the worker at ``address``."""

    name = "test-kill-when-postbox-starts"

    def __init__(self, address: str) -> None:
        self.address = address

    def setup(self, worker) -> None:
        self.worker = worker

    def transition(self, key, start, finish, **kwargs) -> None:
        parsed = parse_pipeline_key(key)
        if (
            finish == "executing"
            and self.worker.address == self.address
            and parsed is not None
            and parsed.kind == "postbox"
        ):
            os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.slow
def test_a_worker_lost_while_the_model_is_placed_is_named_and_nothing_is_left(client):
    """A stage worker killed (SIGKILL) while the model is placed: the constructor ends within a
    few seconds (the bounded close included) in a WorkerLostError naming it and its stage, not
    Dask's own error or a wait, and no plugin of the model is left on the scheduler or the
    workers, nor any key of the model (its postboxes) on the scheduler."""
    # a worker restarted by an earlier test is a fresh process: its first placement imports and
    # compiles the stage code, which must not count against this test's 3 s
    DistributedCompressedMLP(_model(), client, stages=2).close()
    before = _model_plugins(client)
    keys_before = set(client.run_on_scheduler(_pipeline_keys))
    victim = sorted(scheduler_workers(client))[1]  # stage 1 of replica 0
    client.register_plugin(_KillWhenPostboxStarts(victim))
    try:
        start = time.monotonic()
        named = (
            rf"^lost worker {re.escape(victim)}: it held stage 1 of replica 0, layers? "
            r"[0-9 to]+; the model could not be placed"
        )
        with pytest.raises(WorkerLostError, match=named):
            DistributedCompressedMLP(_model(), client, stages=2, step_timeout=3)
        # the loss is seen within a poll, then a bounded close: a hang guard, not a timing
        assert time.monotonic() - start < HANG_GUARD
    finally:
        client.unregister_worker_plugin(_KillWhenPostboxStarts.name)
    wait_until_empty(  # only the new ones: an earlier model's may still be leaving
        lambda: sorted(set(_model_plugins(client)) - set(before)),
        30,
        "the model's plugins stayed",
    )
    wait_until_empty(
        lambda: sorted(set(client.run_on_scheduler(_pipeline_keys)) - keys_before),
        10,
        "a key of the model (its postboxes) stayed on the scheduler",
    )
