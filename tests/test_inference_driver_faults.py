"""The batch driver when a worker stops or dies, or a batch fails, on real LocalCluster worker
processes: a stopped worker ends the run after ``step_timeout`` with a StepTimeoutError naming it
and its batches; a worker lost under a pinned batch is a WorkerLostError at once; a failing batch
raises its own error; in every case no key of the run stays on the scheduler."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import scipy.sparse as sp
from distributed import Client, LocalCluster, get_worker
from distributed.diagnostics.plugin import WorkerPlugin
from polling import HANG_GUARD
from stopped_workers import keys_on_scheduler, keys_on_workers, stopped, wait_until_empty

from dasknn.challenge import run_challenge
from dasknn.challenge.model_parallel import run_challenge_model_parallel
from dasknn.cli import main
from dasknn.datasets import radixnet, write_sparse_tsv
from dasknn.exceptions import StepTimeoutError, WorkerLostError
from dasknn.inference._driver import per_worker_slots, run_batches, shared_slots
from dasknn.runtime.cluster import scheduler_workers


def affine(batch, weights, last: bool, delay: dict[str, float]):
    """Task: ``rows * a + b`` for the window ``(a, b)``, after sleeping ``delay`` on its worker;
    the window ``"fail"`` raises."""
    time.sleep(delay.get(get_worker().address, 0.0))  # a slow batch on purpose, not a wait
    if isinstance(weights, str):
        raise ValueError(f"window {weights!r} failed on purpose")
    rows = batch.toarray() if sp.issparse(batch) else batch
    return rows * weights[0] + weights[1]


class KeyedStep:
    """Windows scattered to ``hold`` (or passed in the tasks); each batch preferably on the next
    of ``prefer`` (a loose restriction: the slot stays the scheduler's choice), or on its slot's
    worker. Only the keys are kept, so that the test holds no future."""

    def __init__(self, hold: str | None = None, prefer=(), delay=None) -> None:
        self.hold = hold
        self.prefer = itertools.cycle(prefer) if prefer else None
        self.delay = delay or {}
        self.keys: list[str] = []

    def place(self, client, weights, timeout):
        if self.hold is None:
            return weights
        [future] = client.scatter([weights], workers=[self.hold], hash=False)
        self.keys.append(future.key)
        return future

    def submit(self, client, batch, placed, worker, last, timeout):
        if worker is not None:
            where = dict(workers=[worker])
        elif self.prefer is not None:
            where = dict(workers=[next(self.prefer)], allow_other_workers=True)
        else:
            where = {}
        future = client.submit(affine, batch, placed, last, self.delay, pure=False, **where)
        self.keys.append(future.key)
        return future


def _held(keys: list[str], dask_scheduler=None) -> list[str]:
    return [key for key in keys if key in dask_scheduler.tasks]


def _keys_leave(client, keys: list[str]) -> None:
    wait_until_empty(
        lambda: client.run_on_scheduler(_held, keys), 30, "a key of the run stayed on the scheduler"
    )


@pytest.mark.slow
def test_stopped_worker_is_named_after_the_step_timeout(dask_client):
    """Two windows, one buffer: placing the second waits for the first window's batches, some
    of which the scheduler gave to the stopped worker (a shared slot: the driver asks the
    scheduler where they run)."""
    fast, victim = sorted(scheduler_workers(dask_client))
    step = KeyedStep(hold=fast, prefer=[fast, victim])
    rows = sp.csr_matrix(np.arange(48.0).reshape(24, 2))
    windows = [lambda: (2.0, 1.0), lambda: (0.5, 0.0)]
    named = (
        r"^no batch finished within 3 s \(step_timeout\): "
        rf"worker {re.escape(victim)} \(batch(es)? [0-9, ()a-z]+ of 12\) has not been heard from "
    )
    with stopped(dask_client, victim):
        start = time.monotonic()
        with pytest.raises(StepTimeoutError, match=named):
            run_batches(
                dask_client, rows, 2, step, windows, shared_slots(dask_client), weight_buffers=1,
                step_timeout=3, progress=False,
            )  # fmt: skip
        assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing
        assert len(step.keys) > 2  # the windows and the batches submitted
        _keys_leave(dask_client, step.keys)


def test_a_failing_batch_raises_its_error_and_leaves_no_key(dask_client):
    step = KeyedStep(hold=sorted(scheduler_workers(dask_client))[0])
    rows = sp.csr_matrix(np.ones((12, 2)))
    with pytest.raises(ValueError, match="'fail' failed on purpose"):
        run_batches(
            dask_client, rows, 2, step, [lambda: (1.0, 1.0), lambda: "fail"],
            shared_slots(dask_client), weight_buffers=2, progress=False,
        )  # fmt: skip
    _keys_leave(dask_client, step.keys)


def test_bad_step_timeout_is_refused_before_anything_is_scheduled(dask_client):
    step = KeyedStep()
    rows = sp.csr_matrix(np.ones((4, 2)))
    layers, x = radixnet(64, 2), sp.csr_matrix(np.ones((3, 64)))
    for bad in (0, -2, float("nan"), float("inf"), "3", True, None):
        with pytest.raises(ValueError, match="step_timeout must be a number of seconds > 0"):
            run_batches(dask_client, rows, 2, step, [lambda: (1.0, 0.0)], [None],
                        step_timeout=bad, progress=False)  # fmt: skip
        with pytest.raises(ValueError, match="step_timeout must be a number of seconds > 0"):
            # an unreachable scheduler: the check comes before any connection
            run_challenge(layers, x, -0.3, client="tcp://127.0.0.1:1", step_timeout=bad)
        with pytest.raises(ValueError, match="step_timeout must be a number of seconds > 0"):
            run_challenge_model_parallel(
                layers, x, -0.3, client="tcp://127.0.0.1:1", step_timeout=bad
            )
    assert step.keys == []


@pytest.mark.slow
def test_a_lost_pinned_worker_is_an_error_at_once():
    """A batch pinned to a worker (as on GPUs) can run nowhere else: the worker killed under it
    is a WorkerLostError within a poll, not a wait until the step timeout (or for ever)."""
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        fast, victim = sorted(scheduler_workers(client))
        pid = client.run(os.getpid, workers=[victim])[victim]
        step = KeyedStep(delay={victim: 60.0})
        rows = sp.csr_matrix(np.ones((6, 2)))
        killed: list[float] = []

        def kill() -> None:
            killed.append(time.monotonic())
            os.kill(pid, signal.SIGKILL)

        killer = threading.Timer(1.0, kill)
        killer.start()
        try:
            with pytest.raises(
                WorkerLostError,
                match=rf"^lost worker {re.escape(victim)}: batch 2 of 6 was pinned there$",
            ):
                run_batches(
                    client, rows, 1, step, [lambda: (1.0, 0.0)],
                    per_worker_slots([fast, victim], per_worker=1), step_timeout=60,
                    progress=False,
                )  # fmt: skip
            assert time.monotonic() - killed[0] < HANG_GUARD  # below step_timeout: a hang guard
        finally:
            killer.cancel()
        _keys_leave(client, step.keys)


class _StopOnWindow(WorkerPlugin):
    """On every worker: the first worker a window of the challenge's weights reaches (a key
    named ``PackedLayers-...``, scattered there) creates the file ``marker``; a worker stops
    (SIGSTOP) its own process as the window reaches it, once, if it is that first worker
    (``moment="scattered"``) or a later one (``"copied"``, the copy of a broadcast)."""

    name = "dasknn-test-stop-on-window"

    def __init__(self, marker: str, moment: str):
        self.marker = marker
        self.moment = moment
        self.armed = True

    def transition(self, key, start, finish, **kwargs) -> None:
        if self.armed and finish == "memory" and str(key).startswith("PackedLayers-"):
            self.armed = False
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
                first = True
            except FileExistsError:
                first = False
            if first == (self.moment == "scattered"):
                os.kill(os.getpid(), signal.SIGSTOP)


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["scattered", "copied"])
def test_a_window_given_up_at_a_stopped_worker_leaves_nothing_behind(tmp_path, moment):
    """A worker stops as the first window of weights reaches it, scattered there or copied
    there by the broadcast: the window's placement is given up after ``step_timeout``; once the
    worker goes on, the scheduler completes a scatter given up and registers the window's key
    for the client, which releases it then, and a late copy is dropped: no window is left on the
    scheduler or a worker."""
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        layers, x = radixnet(64, 2), sp.csr_matrix(np.ones((8, 64)))
        run_challenge(layers, x, -0.3, client=client, progress=False)  # the workers compile
        pids = client.run(os.getpid)
        client.register_plugin(_StopOnWindow(str(tmp_path / "marker"), moment))
        try:
            start = time.monotonic()
            with pytest.raises(
                StepTimeoutError,
                match=r"^window 1 of the weights did not reach the workers within 2 s ",
            ):
                run_challenge(layers, x, -0.3, client=client, progress=False, step_timeout=2)
            assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing
        finally:
            for pid in pids.values():
                os.kill(pid, signal.SIGCONT)
        # the workers answer once the stopped one went on (the window's scatter, or its copy,
        # handled); the scheduler registers a scattered window then
        client.run(os.getpid)
        time.sleep(1)  # lets a late window land: one that may never come has no condition to poll
        windows = "PackedLayers-"
        wait_until_empty(lambda: keys_on_scheduler(client, windows), 10, "a window stayed")
        wait_until_empty(lambda: keys_on_workers(client, windows), 10, "a window left on a worker")


@pytest.mark.slow
def test_cli_stops_on_a_stopped_worker_in_one_line_and_writes_nothing(dask_client, tmp_path):
    """``dasknn challenge --step-timeout 2`` on a cluster with a stopped worker, in a process of
    its own as a user runs it: exit code 2, one line naming the worker, no output file."""
    net = tmp_path / "net"
    net.mkdir()
    for k, w in enumerate(radixnet(64, 2), start=1):
        write_sparse_tsv(net / f"n64-l{k}.tsv", w)
    write_sparse_tsv(tmp_path / "inputs.tsv", sp.csr_matrix(np.ones((8, 64))))
    out, report = tmp_path / "cats.tsv", tmp_path / "run.json"
    victim = sorted(scheduler_workers(dask_client))[1]
    argv = [
        "challenge", "--network", str(net), "--bias", "-0.3", "--inputs",
        str(tmp_path / "inputs.tsv"), "--categories", str(out), "--json", str(report),
        "--scheduler", dask_client.scheduler.address, "--step-timeout", "2", "--quiet",
    ]  # fmt: skip
    with stopped(dask_client, victim):
        done = subprocess.run(
            [sys.executable, "-m", "dasknn", *argv], capture_output=True, text=True, timeout=60
        )
    err = done.stderr
    assert done.returncode == 2, err
    lines = [line for line in err.splitlines() if line]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("dasknn challenge: error: "), err
    assert "within 2 s (step_timeout)" in lines[0] and victim in lines[0], err
    assert not out.exists() and not report.exists()
    assert not list(tmp_path.glob(".cats.tsv*")) and not list(tmp_path.glob(".run.json*"))


@pytest.mark.parametrize("bad", ["0", "-1", "inf", "nan"])
def test_cli_refuses_a_bad_step_timeout(tmp_path, capsys, bad):
    out = tmp_path / "cats.tsv"
    argv = ["challenge", "--network", "radixnet:64:2", "--inputs", str(tmp_path / "none.tsv"),
            "--categories", str(out), "--step-timeout", bad]  # fmt: skip
    assert main(argv) == 2
    assert "--step-timeout must be a finite number of seconds > 0" in capsys.readouterr().err
    assert not out.exists()
