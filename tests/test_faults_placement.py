"""A worker killed or stopped while a distributed model is being placed (its constructor): a quick
error naming the worker, instead of Dask's 30 s connect timeout or a wait until Dask removes the
worker, and nothing of the model left."""

from __future__ import annotations

import os
import re
import signal
import time

import numpy as np
import pytest
import scipy.sparse as sp
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin
from plugin_checks import key_cache_bound_count
from polling import HANG_GUARD
from stopped_workers import keys_on_workers, stopped, wait_until_empty

from dasknn.exceptions import ModelFailedError, StepTimeoutError, WorkerLostError
from dasknn.model import SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.model_parallel._exchange import postbox_key
from dasknn.runtime.cluster import scheduler_workers
from dasknn.runtime.keys import message_phase


def _model() -> SparseMLP:
    rng = np.random.default_rng(0)
    sizes = [16, 24, 6]
    weights = []
    for k in range(2):
        w = sp.random(sizes[k], sizes[k + 1], density=0.4, format="csr", random_state=rng)
        weights.append(w)
    return SparseMLP(weights, [np.zeros(n) for n in sizes[1:]], activation="sigmoid")


class _KillWorkerWhenKeysArrive(WorkerPlugin):
    """On the worker ``here``: kills (SIGKILL) the worker process ``pid`` the moment the first
    key of a model named ``prefix...`` arrives: a batch of chunks (``dasknn-chunks-``, the
    network half handed over) or a layer plan (``dasknn-plan-``, the chunks installed); the
    next call of the placement must reach the killed worker."""

    name = "dasknn-test-kill-during-placement"

    def __init__(self, here: str, pid: int, prefix: str):
        self.here_address = here
        self.pid = pid
        self.prefix = prefix
        self.here = self.killed = False

    def setup(self, worker) -> None:
        self.here = worker.address == self.here_address

    def transition(self, key, start, finish, **kwargs) -> None:
        name = str(key[0]) if isinstance(key, tuple) else str(key)
        if self.here and name.startswith(self.prefix) and not self.killed:
            self.killed = True
            os.kill(self.pid, signal.SIGKILL)


def _model_plugins(client) -> list[str]:
    names = client.run(lambda dask_worker: list(dask_worker.plugins))
    return [n for ns in names.values() for n in ns if n.startswith(("dasknn-model-", "dasknn-key"))]


def _model_keys(dask_scheduler) -> list[str]:
    return [str(key) for key in dask_scheduler.tasks if "dasknn-" in str(key)]


def _model_keys_in_data(dask_worker) -> list[str]:
    return [str(key) for key in dask_worker.data if "dasknn-" in str(key)]


def _forgotten_keys_in_data(client, kept: str) -> list[str]:
    """The keys of models in the workers' data that the scheduler does not know (one entry a
    copy), but for ``kept``: the proxies of a killed worker's postbox, which Dask keeps in the
    data of the workers that used it (docs/reliability.md, "Known gaps")."""
    held = client.run(_model_keys_in_data)
    known = {*client.run_on_scheduler(_model_keys), kept}
    return [key for keys in held.values() for key in keys if key not in known]


@pytest.mark.slow
@pytest.mark.parametrize("prefix", ["dasknn-chunks-", "dasknn-plan-"])
def test_worker_killed_while_the_model_is_placed_is_a_quick_error_naming_it(prefix):
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        pids = client.run(os.getpid)
        first, victim = sorted(pids)  # parts 0 and 1 go to the workers in address order
        plugin = _KillWorkerWhenKeysArrive(first, pids[victim], prefix)
        client.register_plugin(plugin)
        model = _model()
        parts = [np.arange(n) % 2 for n in model.layer_sizes]
        start = time.monotonic()
        with pytest.raises(
            WorkerLostError,
            match=f"worker\\(s\\) {victim} \\(part 1\\) of the model left the cluster "
            "while the model was placed",
        ):
            DistributedSparseMLP(model, client, partition=parts, step_timeout=60)
        assert time.monotonic() - start < HANG_GUARD  # below Dask's 30 s connect timeout
        killed = client.run(lambda dask_worker: dask_worker.plugins[plugin.name].killed)
        assert killed[first]
        wait_until_empty(
            lambda: [
                *client.run_on_scheduler(_model_keys), *_model_plugins(client),
                *keys_on_workers(client, "dasknn-"),
            ],
            30,
            "the failed model left keys, data or plugins",
        )  # fmt: skip


def _dasknn_plugins(client) -> list[str]:
    """The names of dasknn's plugins on the workers and the scheduler (worker plugins it hands
    to new workers, and its own plugins)."""

    def on_scheduler(dask_scheduler) -> list[str]:
        return [*dask_scheduler.worker_plugins, *dask_scheduler.plugins]

    on_workers = client.run(lambda dask_worker: list(dask_worker.plugins))
    names = [n for ns in on_workers.values() for n in ns] + client.run_on_scheduler(on_scheduler)
    return sorted(n for n in names if n.startswith("dasknn-"))


@pytest.mark.slow
def test_a_worker_stopped_before_the_constructor_is_named_and_nothing_is_left():
    """A part worker stopped (SIGSTOP) before the model is placed: the constructor ends after
    ``step_timeout`` in a StepTimeoutError naming it and its part, where its registrations used
    to wait until Dask removed the worker (worker-ttl, 5 minutes); once the worker goes on, no
    plugin of the model nor key-cache bound is left on it, the other worker or the scheduler."""
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        # a model placed and closed first: the workers import and compile the model's code
        # outside the 2 s step_timeout, and show that a closed model leaves nothing
        model = _model()
        parts = [np.arange(n) % 2 for n in model.layer_sizes]
        placed = DistributedSparseMLP(model, client, partition=parts, reuse_memory=True)
        assert key_cache_bound_count(client, placed.token) == 3  # the scheduler, two workers
        placed.close()
        assert _dasknn_plugins(client) == []
        victim = sorted(scheduler_workers(client))[1]  # part 1
        named = (
            r"^the workers did not take the model while it was placed within 2 s "
            rf"\(step_timeout\): (.*; )?worker {re.escape(victim)} \(part 1\) "
        )
        with stopped(client, victim):
            start = time.monotonic()
            with pytest.raises(StepTimeoutError, match=named):
                DistributedSparseMLP(
                    model, client, partition=parts, reuse_memory=True, step_timeout=2
                )
            took = time.monotonic() - start
        assert took < HANG_GUARD, took  # a hang guard, not a timing
        wait_until_empty(lambda: _dasknn_plugins(client), 10, "a plugin of the model stayed")


def _placed_again(key) -> str | None:
    """``"plans"`` for a layer plan's key, ``"postboxes"`` for a postbox's, of a placement after
    the first (generation 1 on); ``None`` for any other key."""
    name = str(key[0]) if isinstance(key, tuple) else str(key)
    placed = re.fullmatch(r"dasknn-(plan|postbox)-[\w-]+?-g(\d+)(-\d+)?", name)
    if placed is None or placed[2] == "0":
        return None
    return {"plan": "plans", "postbox": "postboxes"}[placed[1]]


class _KillOnStepStopOnPlacingAgain(WorkerPlugin):
    """On the worker ``killed``: kills (SIGKILL) its own process the moment a task of step
    ``step`` or later starts executing, so the step fails with a lost worker and ``fit`` recovers
    from its checkpoint. The worker ``stopped`` is stopped (SIGSTOP) so that the recovery's
    placement cannot finish, at the ``moment`` it waits for that worker: ``"state"``, by the
    killed worker just before it kills itself (the recovery's first call, registering
    ``ModelState`` again, waits for it); ``"plans"`` or ``"postboxes"``, by itself the moment a
    layer plan or its postbox of a later placement than the first (generation 1 on) arrives."""

    name = "dasknn-test-kill-on-step-stop-on-placing-again"

    def __init__(self, killed: str, stopped: str, stopped_pid: int, step: int, moment: str):
        self.killed_address = killed
        self.stopped_address = stopped
        self.stopped_pid = stopped_pid
        self.step = step
        self.moment = moment
        self.address = ""

    def setup(self, worker) -> None:
        self.address = worker.address

    def transition(self, key, start, finish, **kwargs) -> None:
        if self.address == self.killed_address and finish == "executing":
            if message_phase(key) is not None and key[1] >= self.step:
                if self.moment == "state":
                    os.kill(self.stopped_pid, signal.SIGSTOP)
                os.kill(os.getpid(), signal.SIGKILL)
        if self.address == self.stopped_address and _placed_again(key) == self.moment:
            self.address = ""  # once
            os.kill(os.getpid(), signal.SIGSTOP)


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["state", "plans", "postboxes"])
def test_a_worker_stopped_while_the_recovery_places_a_checkpoint_again_is_named(tmp_path, moment):
    """``fit(checkpoint=...)``: a part worker killed (SIGKILL) in a step starts the recovery,
    and another one stopped (SIGSTOP) keeps its placement from finishing, whether it stops
    before ``ModelState`` is registered again, as the layer plans arrive or as its postbox
    starts: ``fit`` ends after ``step_timeout`` in a StepTimeoutError naming the stopped worker,
    the client keeps its connection and its user's futures, and once the worker goes on nothing
    of the model is left after ``close()`` (but the proxies of the killed worker's postbox that
    Dask keeps in the other workers' data, docs/reliability.md "Known gaps"), while the error
    (and the failed call's frames) is still held."""
    with LocalCluster(
        n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        model = _model()
        parts = [np.arange(n) % 3 for n in model.layer_sizes]
        rng = np.random.default_rng(1)
        x, y = rng.uniform(size=(96, 16)), rng.uniform(size=(96, 6))
        # the workers import the model's code outside the 3 s step_timeout
        DistributedSparseMLP(model, client, partition=parts).close()
        dist = DistributedSparseMLP(model, client, partition=parts, step_timeout=3)
        try:
            dist.fit(x[:8], y[:8], batch_size=8, lr=0.0)  # step 1: the workers compile
            pids = client.run(os.getpid)
            _, stopped_worker, victim = sorted(pids)  # parts 1 and 2
            client.register_plugin(
                _KillOnStepStopOnPlacingAgain(
                    victim, stopped_worker, pids[stopped_worker], step=4, moment=moment
                )
            )
            named = (
                r"^the workers did not take the model while it was placed within 3 s "
                rf"\(step_timeout\): (.*; )?worker {re.escape(stopped_worker)} "
            )
            kept = client.submit(int, 7, key="kept-by-the-user")  # a future of the client's user
            try:
                start = time.monotonic()
                with pytest.raises(StepTimeoutError, match=named) as raised:
                    dist.fit(x, y, batch_size=8, epochs=3, lr=0.1, checkpoint=tmp_path)
                took = time.monotonic() - start
                # the failed step's clean-up kept the client's connection, and its futures
                assert kept.result(timeout=5) == 7
                with pytest.raises(ModelFailedError, match="unusable"):
                    dist.gather()
                dist.close()
            finally:
                os.kill(pids[stopped_worker], signal.SIGCONT)
        finally:
            dist.close()
            client.unregister_worker_plugin(_KillOnStepStopOnPlacingAgain.name)
        # the loss, the failed step's clean-up and the placement each wait at most 3 s (the
        # step_timeout): a hang guard, not a timing
        assert took < 3 * 3 + HANG_GUARD, took
        assert victim not in scheduler_workers(client)
        lost_postbox = postbox_key(dist.token, 0, 2)  # the victim's, third of the sorted workers
        wait_until_empty(
            lambda: _forgotten_keys_in_data(client, lost_postbox),
            10,
            "a key the scheduler forgot stayed in a worker's data",
        )
        wait_until_empty(lambda: _dasknn_plugins(client), 10, "a plugin of the model stayed")
        # with [plans], the scheduler completes the plans' scatter the client gave up once the
        # stopped worker goes on and registers their keys for the client, which releases them
        # then (scatter_released_if_given_up); the error is still held (as an interactive session
        # holds the last one), and its traceback the fit call's frames with their futures: the
        # call released its data when it ended
        wait_until_empty(
            lambda: client.run_on_scheduler(_model_keys), 10, "a key of the model stayed"
        )
        wait_until_empty(
            lambda: keys_on_workers(client, "('dasknn-plan-"), 10, "a plan stayed on a worker"
        )
        assert raised.value.__traceback__ is not None  # held until here
