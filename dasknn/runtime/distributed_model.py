"""The base of every distributed model: its cluster, its worker plugin, its life and its errors.

:class:`DistributedModel` owns what the four distributed models share. The constructor's
``client`` (``None`` for a new local cluster on 127.0.0.1, a scheduler address, a ``Cluster``,
a ``Client`` or a :class:`~dasknn.runtime.jobqueue.JobqueueSpec`) is opened by
:meth:`DistributedModel._connect`, the ``workers`` checked by :meth:`DistributedModel._use_workers`
and ``step_timeout`` by :func:`~dasknn.runtime.step_timeout.check_step_timeout`. After
:meth:`~DistributedModel.close` (or a ``with`` block) every call is a
:class:`~dasknn.exceptions.ModelClosedError`; after a step that failed part-way a
:class:`~dasknn.exceptions.ModelFailedError` saying why. Errors that name workers give each one's
role in the model (:meth:`DistributedModel._worker_roles`).

The transfer monitor is held for the model (:mod:`dasknn.runtime.shared_plugins`), the bound on
Dask's key cache (:mod:`dasknn.runtime.key_cache`) installed and the plugin registered before the
model's values are placed; if placing them fails the model is closed again (the plugin and
everything it holds removed), and a ``with`` block closes the model at its end. Placing the
model, registrations included, waits for the workers at most ``step_timeout`` in all
(:meth:`DistributedModel._placing`): a worker that does not answer (stopped) is a
:class:`~dasknn.exceptions.StepTimeoutError` naming it, one that leaves the cluster
a :class:`~dasknn.exceptions.WorkerLostError` where the subclass watches its workers.
Closing removes the plugin, the bound and the model's hold on the monitor, which leaves with its
last holder, waiting for the workers at most ``step_timeout`` in all (:func:`unregister_within`).
A model dropped without :meth:`~DistributedModel.close` is released alike, from a background
thread, when the garbage collector takes it (not at interpreter exit).

A worker of the model that Dask is asked to retire (``Client.retire_workers``, an adaptive
cluster scaling down) is handed over between two steps (:meth:`DistributedModel._hand_over`):
every worker of the model holds an actor, which Dask refuses to retire, and the model counts the
requests (:meth:`DistributedModel._watch_retirements`), reads its last whole step, lets the
worker go and places the record on the workers that remain, as a checkpoint is restored.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, Self

import dask

from dasknn.exceptions import ModelClosedError, ModelFailedError, StepTimeoutError, WorkerLostError
from dasknn.runtime.cluster import open_client, scheduler_workers
from dasknn.runtime.comm_report import CommReport
from dasknn.runtime.faults import (
    POLL_SECONDS,
    install_retirement_watch,
    release_retirement_watch,
    retirement_requests,
    retiring_workers,
    running_workers,
    with_memory_room,
)
from dasknn.runtime.key_cache import (
    install_key_cache_bound,
    key_cache_plugin_name,
    remove_key_cache_bound,
)
from dasknn.runtime.keys import new_token, postbox_key
from dasknn.runtime.measure import install_comm_monitor, release_comm_monitor, reset_transfers
from dasknn.runtime.plugin_removal import remove_worker_plugin
from dasknn.runtime.postbox import Postbox
from dasknn.runtime.step_timeout import (
    answering_workers,
    check_step_timeout,
    step_timeout_error,
)
from dasknn.runtime.waiting import (
    GATHER_LOSS_GRACE_SECONDS,
    finished,
    in_thread,
    run_naming_loss,
    watch_workers,
)
from dasknn.runtime.worker_memory import PLUGIN_NAME as REUSE_MEMORY_PLUGIN
from dasknn.runtime.worker_memory import ReuseFreedMemory

__all__ = [
    "PLACEMENT_LOST",
    "PLACEMENT_POLL_SECONDS",
    "PLACEMENT_WHAT",
    "DistributedModel",
    "unregister_within",
]

logger = logging.getLogger(__name__)

#: Seconds between two checks of the workers while a model is placed.
PLACEMENT_POLL_SECONDS = 0.25
#: What did not happen, said by the :class:`StepTimeoutError` of a placement.
PLACEMENT_WHAT = "the workers did not take the model while it was placed"
#: What a worker lost while the model is placed takes with it (the end of the error).
PLACEMENT_LOST = "the model could not be placed"


class DistributedModel:
    """Base of a distributed model that owns one worker plugin per worker.

    A subclass calls :meth:`_connect` (or :meth:`_connecting`) first in its constructor
    (client, token, step timeout, fitted attributes), then :meth:`_register` with its plugin and
    the function that places its values; it implements :meth:`comm_report`, :meth:`gather`,
    :meth:`_worker_roles` (every worker's role: the errors and the watched waits name them)
    and, to be loaded, sets ``_estimator_class`` and implements ``_record``/``_restore``
    (:class:`~dasknn.model.checkpoint.Checkpointed`); it may extend :meth:`_before_close` and
    :meth:`_failed_advice`, and set :attr:`_poll_seconds`, :attr:`_loss_errors` and
    :attr:`_lost_outcome`. To hand a retiring worker over it calls :meth:`_watch_retirements`
    before :meth:`_register`, places an actor on every worker (its postboxes, or
    :meth:`_start_anchors`), calls :meth:`_hand_over_retiring` (or :meth:`_retiring` and
    :meth:`_hand_over`) between two steps, and sets :attr:`_needs_spares` where its
    ``_restore`` keeps the number of workers.
    """

    client: Any
    token: str
    plugin_name: str
    step_timeout: float
    _open: bool = False
    _failed: str | None = None  # why the model is unusable after a step failed part-way
    _opened: ExitStack | None = None  # what _connect opened for the model (closed with it)
    _placed_by: float  # time.monotonic() by which the placement must be done
    _finalizer: weakref.finalize | None = None  # releases a model dropped without close()
    _watching_retirements = False  # whether the model holds the retirement watch

    def _connect(self, client, step_timeout: float) -> None:
        """Open ``client`` (see the module's docstring; what is opened here is closed with the
        model), check ``step_timeout`` and draw the model's token."""
        self.step_timeout = check_step_timeout(step_timeout)
        self._own_cluster = client is None  # a local cluster of the model's own
        self._opened = ExitStack()
        self.client = open_client(self._opened, client)
        self.token = new_token()
        self._plugins: list[str] = []  # the worker plugins registered besides the model's own
        self._postboxes: list | dict = []  # the model's postbox actors, released on close
        self._generation = 0  # placements anew (_place_anew), part of the postboxes' keys
        self._anchors: list = []  # actors that keep Dask from retiring a worker of the model
        self._retirements: dict[str, int] = {}  # retirement requests seen (_watch_retirements)
        self._next_retire_check = 0.0  # when a step looks next for workers being retired
        self._leaving: set[str] = set()  # workers asked to leave while the model was placed
        self.optimizer_ = None  # the optimizer of the last training step
        self.n_steps_ = 0
        self.loss_curve_: list[float] = []
        self.batch_loss_curve_: list[float] = []

    @contextmanager
    def _connecting(self, client, step_timeout: float) -> Iterator[None]:
        """:meth:`_connect`, then the block; if the block raises, what was opened is closed."""
        self._connect(client, step_timeout)
        try:
            yield
        except BaseException:
            self.close()
            raise

    def _use_workers(self, workers: Sequence[str] | None) -> list[str]:
        """The workers the model runs on: ``workers`` (checked: known to the scheduler, no
        repeats) or, when ``None``, every worker of the cluster, sorted.

        Raises
        ------
        ValueError
            Naming the addresses that are not workers of the cluster, or repeated, or when the
            cluster has no worker.
        """
        known = sorted(scheduler_workers(self.client))
        if workers is None:
            if not known:
                raise ValueError("the cluster has no worker")
            return known
        chosen = list(workers)
        unknown = [w for w in chosen if w not in known]
        if unknown:
            raise ValueError(f"not workers of this cluster: {unknown}")
        if len(set(chosen)) != len(chosen) or not chosen:
            raise ValueError(f"workers must be distinct addresses, at least one: {chosen}")
        return chosen

    def _register(self, plugin, place: Callable[[], None]) -> None:
        """Install the transfer monitor and the key-cache bound, register ``plugin`` on every
        worker under its name (the model's ``plugin_name``), then call ``place()``, all within
        ``step_timeout``
        (``place`` makes its calls to the workers through :meth:`_placing`); if one of them
        fails, what was installed is removed again, waiting for the workers at most
        ``step_timeout`` (:meth:`close`, or :func:`unregister_within` before the plugin)."""
        self.plugin_name = plugin.name
        self._start_placement()
        # What to remove if a step fails: an installation that did not finish is on the
        # scheduler already, so each is counted from the moment it is asked for.
        key_cache_bound = False
        plugins: list[str] = []
        try:
            self._placing(lambda: install_comm_monitor(self.client, self.token))
            key_cache_bound = True
            self._placing(lambda: install_key_cache_bound(self.client, self.token))
            plugins.append(self.plugin_name)
            self._placing(lambda: self.client.register_plugin(plugin, name=self.plugin_name))
        except BaseException:
            try:
                unregister_within(
                    self.client, self.token, plugins, self.step_timeout, key_cache_bound
                )
                self._stop_watching_retirements()
            except Exception:  # noqa: BLE001 - the placement's error is the one to raise
                pass
            raise
        self._open = True
        self._finalizer = weakref.finalize(
            self, _release_dropped, self.client, self.token, self.plugin_name, self.step_timeout,
            self._opened,
        )  # fmt: skip
        self._finalizer.atexit = False
        try:
            place()
        except BaseException:
            self.close()
            raise

    def _place_anew(self, plugin, place: Callable[[], None]) -> None:
        """Start a placement, register ``plugin`` (unless ``None``; then also a new generation
        and no postbox) in the place of the model's own on every worker (which ends what the old
        one still waited for) and call ``place()``, within
        ``step_timeout``; the model is usable again afterwards, unusable (:attr:`_failed`) if
        this fails."""
        if plugin is not None:
            self._generation += 1
            self._postboxes = type(self._postboxes)()
            self._anchors = []
        self._start_placement()
        try:
            if plugin is not None:
                self._placing(lambda: self.client.register_plugin(plugin, name=self.plugin_name))
            place()
        except Exception as error:
            self._failed = str(error)
            raise
        self._failed = None

    def _start_placement(self) -> None:
        """Start a placement: the :meth:`_placing` calls that follow take at most
        ``step_timeout`` from now, all together (:meth:`_register` starts the constructor's;
        a model that places its values again later starts one of its own)."""
        self._placed_by = time.monotonic() + self.step_timeout

    def _placing(self, call: Callable[[], Any]) -> Any:
        """``call()``, a synchronous client call that places the model, within what is left of
        ``step_timeout`` since the placement started (:meth:`_start_placement`), checking the
        workers every :data:`PLACEMENT_POLL_SECONDS` (:meth:`_lost_while_placed`).

        Raises
        ------
        WorkerLostError
            What :meth:`_lost_while_placed` returned, also when the call failed with a
            connection error and the loss is seen within
            :data:`~dasknn.runtime.waiting.GATHER_LOSS_GRACE_SECONDS`.
        StepTimeoutError
            If the call did not finish in time (it is left to finish on its own), naming the
            workers that do not answer with their state (:meth:`_placement_timed_out`).
        Exception
            The call's own error.
        """
        try:
            return run_naming_loss(
                self.client,
                in_thread(call),
                self._placement_left(),
                self._lost_while_placed,
                PLACEMENT_POLL_SECONDS,
                GATHER_LOSS_GRACE_SECONDS,
                OSError,
            )
        except TimeoutError:
            raise self._placement_timed_out() from None

    def _install_on(self, worker: str, function, **kwargs) -> None:
        """``Client.run(function, token=..., **kwargs)`` on ``worker`` within the placement's
        time (:meth:`_placing`)."""
        self._placing(
            lambda: self.client.run(function, token=self.token, workers=[worker], **kwargs)
        )

    def _add_plugin(self, plugin, kind: str) -> None:
        """Register the worker ``plugin`` under ``f"{kind}-{token}"`` (again, when the model is
        placed again) within the placement's time (:meth:`_placing`); :meth:`close` removes it
        before the model's own, also when the registration failed."""
        name = f"{kind}-{self.token}"
        if name not in self._plugins:
            self._plugins.append(name)
        self._placing(lambda: self.client.register_plugin(plugin, name=name))

    def _reuse_freed_memory(self) -> None:
        """Hold the workers' malloc setting while the model is placed
        (:class:`~dasknn.runtime.worker_memory.ReuseFreedMemory`, one holder; ``close()``
        removes it, and the last holder on a worker restores its thresholds)."""
        self._add_plugin(ReuseFreedMemory(), REUSE_MEMORY_PLUGIN)

    def _start_postboxes(self, workers: dict, **annotations) -> list:
        """Start a :class:`~dasknn.runtime.postbox.Postbox` actor of the model's plugin under
        every key of ``workers`` (``{key: address}``) on its worker, within the placement's
        time (:meth:`_placing`; the actors are cancelled if that fails), the submissions
        annotated with ``annotations``; returns their futures, in order."""
        with dask.annotate(**annotations):
            boxes = [
                self.client.submit(
                    Postbox, self.plugin_name, key=key, workers=[address],
                    allow_other_workers=False, actor=True,
                )  # fmt: skip
                for key, address in workers.items()
            ]
        with self._cancelled_if_failed(boxes):
            self._placing(lambda: self.client.gather(boxes))
        return boxes

    def _start_anchors(self, workers: Sequence[str]) -> None:
        """Start an actor of the model's plugin (a :class:`~dasknn.runtime.postbox.Postbox`
        that receives nothing) on each of ``workers`` within the placement's time: Dask refuses
        to retire a worker holding an actor, so the model hands its values over first
        (:meth:`_hand_over`). A mode whose postboxes are on every worker needs none."""
        keys = {
            postbox_key("anchor", self.token, index, self._generation): address
            for index, address in enumerate(workers)
        }
        self._anchors = self._start_postboxes(keys)

    def _replace_lost(self, workers: Sequence[str]) -> list[str]:
        """``workers`` with each one that is no longer running or is leaving (handed over)
        replaced by a running worker of the cluster that is not among them and has the memory
        for its values (:func:`with_memory_room`, the most room first), waiting (polls of
        0.1 s) at most ``step_timeout`` for enough of them (as when a nanny restarts a worker).

        Raises
        ------
        WorkerLostError
            If too few such workers run by then.
        """
        deadline = time.monotonic() + self.step_timeout
        while True:
            running = running_workers(self.client, sorted(self._leaving))
            lost = [i for i, w in enumerate(workers) if w not in running]
            spare = with_memory_room(
                self.client, [w for w in running if w not in workers], [workers[i] for i in lost]
            )
            if len(spare) >= len(lost):
                break
            if time.monotonic() > deadline:
                raise WorkerLostError(
                    f"this {type(self).__name__} needs {len(workers)} workers to go on from its "
                    f"checkpoint; {len(workers) - len(lost) + len(spare)} are running with the "
                    "memory for its values"
                )
            time.sleep(0.1)
        replaced = list(workers)
        for i, worker in zip(lost, spare, strict=False):
            replaced[i] = worker
        return replaced

    @contextmanager
    def _cancelled_if_failed(self, futures: list) -> Iterator[None]:
        """Cancel the ``futures`` a placement submitted (those in the list when it fails) if the
        block raises: a call that did not finish is left to finish in its thread
        (:meth:`_placing`), and a gather left there would hold them, and their keys on the
        scheduler, for ever when their worker is lost."""
        try:
            yield
        except BaseException:
            self.client.cancel(futures)
            raise

    def _placement_left(self) -> float:
        """Seconds left of ``step_timeout`` since the placement began (0 once it is over)."""
        return max(self._placed_by - time.monotonic(), 0.0)

    def _placement_timed_out(self) -> StepTimeoutError:
        """The :class:`StepTimeoutError` of a placement that did not finish in time, naming the
        workers that do not answer, or all the cluster's workers when each one answers (a
        registration waits for every worker), with their roles and state
        (:meth:`_timeout_error`)."""
        workers = sorted(scheduler_workers(self.client))
        silent = sorted(set(workers) - set(answering_workers(self.client, workers)))
        return self._timeout_error(PLACEMENT_WHAT, silent or workers)

    def _lost_while_placed(self) -> WorkerLostError | None:
        """The error for a worker the model is being placed on that left the cluster, or
        ``None``: by default :meth:`_lost_watch` of the workers :meth:`_worker_roles` names
        (none when it returns ``None``)."""
        if self._worker_roles() is None:
            return None
        return self._lost_watch(outcome=PLACEMENT_LOST)()

    def _worker_roles(self) -> dict[str, str] | None:
        """``{address: what the worker is to the model}`` of every worker of the model, for the
        errors that name workers, or ``None`` (workers named by address and state only)."""
        return None

    # ------------------------------------------------------------------ watched waits
    #: Seconds between two looks at the workers while the model waits for them.
    _poll_seconds = 1.0
    #: A call's errors after which a lost worker is looked for during
    #: :data:`~dasknn.runtime.waiting.GATHER_LOSS_GRACE_SECONDS` (after others: once).
    _loss_errors: tuple[type[BaseException], ...] = ()
    #: What a worker lost during a step takes with it (the end of :meth:`_lost_watch`'s error).
    _lost_outcome = "the model's values there are gone"

    def _lost_watch(
        self, workers: Iterable[str] | None = None, outcome: str | None = None
    ) -> Callable[[], WorkerLostError | None]:
        """The ``lost_error`` of :func:`~dasknn.runtime.waiting.run_naming_loss` for
        ``workers`` (default: those of :meth:`_worker_roles`): a :class:`WorkerLostError`
        ``"lost worker A: it held ROLE; OUTCOME"`` naming each one that left the cluster with
        its role, and ``outcome`` (default :attr:`_lost_outcome`), or ``None``."""

        def held(lost: list[str]) -> str:
            roles = self._worker_roles() or {}
            named = "; ".join(
                f"{'it' if len(lost) == 1 else w} held {roles.get(w, 'part of the model')}"
                for w in lost
            )
            return f"{named}; {outcome or self._lost_outcome}"

        if workers is None:
            workers = list(self._worker_roles() or ())
        return watch_workers(self.client, workers, held)

    def _check_workers(self, workers: Iterable[str] | None = None, outcome: str | None = None):
        """Raise the :class:`WorkerLostError` of :meth:`_lost_watch` if a worker left."""
        error = self._lost_watch(workers, outcome)()
        if error is not None:
            raise error

    def _naming_loss(
        self, coroutine, workers, outcome: str | None, seconds: float | None, graced=None
    ) -> Any:
        """:func:`~dasknn.runtime.waiting.run_naming_loss` of ``coroutine`` within ``seconds``
        (default ``step_timeout``), watching ``workers`` (:meth:`_lost_watch`) every
        :attr:`_poll_seconds`, with a grace after the errors ``graced`` (default
        :attr:`_loss_errors`)."""
        return run_naming_loss(
            self.client,
            coroutine,
            self.step_timeout if seconds is None else seconds,
            self._lost_watch(workers, outcome),
            self._poll_seconds,
            GATHER_LOSS_GRACE_SECONDS,
            self._loss_errors if graced is None else graced,
        )

    def _watched(
        self, coroutine, workers: Sequence[str], what: str, outcome: str | None = None,
        seconds: float | None = None, graced=None,
    ) -> Any:  # fmt: skip
        """The result of ``coroutine`` (a client call made with ``asynchronous=True``) within
        ``seconds`` (default ``step_timeout``), looking at ``workers`` every
        :attr:`_poll_seconds` (``graced``: as for :meth:`_naming_loss`).

        Raises
        ------
        WorkerLostError
            Naming those of ``workers`` that left and ``outcome`` (:meth:`_lost_watch`), also
            when the call failed because of the loss.
        StepTimeoutError
            Naming ``workers`` after the time (``what`` did not happen).
        Exception
            The call's own error.
        """
        try:
            return self._naming_loss(coroutine, workers, outcome, seconds, graced)
        except TimeoutError:
            raise self._timeout_error(what, workers) from None

    def _copies_made(
        self, copies: Sequence, workers: Sequence[str], what: str, outcome: str | None = None
    ) -> None:
        """Wait until the tasks ``copies``, each pinned to one of ``workers``, have finished,
        their results left on the workers (nothing moves to the client), as :meth:`_watched`
        does: how a ``to_dask()`` snapshot is taken when it is called, so that no step or
        ``close()`` after the call reaches its chunks.

        Raises
        ------
        WorkerLostError, StepTimeoutError
            As :meth:`_watched`; the copies are cancelled (a copy pinned to a lost worker
            would wait for ever).
        Exception
            A copy's own error.
        """
        try:
            self._watched(finished(copies), workers, what, outcome)
        except BaseException:
            self.client.cancel(list(copies))
            raise
        for copy in copies:
            if copy.status != "finished":
                copy.result()

    def _run_on(
        self, function, workers: Sequence[str], what: str, outcome: str | None = None, **kwargs
    ) -> dict:
        """``Client.run(function, **kwargs)`` on ``workers``, :meth:`_watched`."""
        workers = list(workers)
        running = self.client.run(function, workers=workers, asynchronous=True, **kwargs)
        return self._watched(running, workers, what, outcome)

    def _gather_graph(
        self, tasks: dict, outputs: list, what: str, placement=None, priority=None,
        seconds: float | None = None, outcome: str | None = None,
    ) -> list:  # fmt: skip
        """Submit the graph ``tasks``, each task on the worker ``placement(key)[0]`` (default
        the model's ``_placement``) with ``priority`` if given, and gather ``outputs`` as
        :meth:`_watched` does over the model's workers; after the time the
        :class:`StepTimeoutError` names the workers of the unfinished outputs. The futures are
        released before this returns or raises (an error's traceback holds this frame)."""
        return self._gather_graphs(
            [lambda _: (tasks, outputs)], what, placement, priority, seconds, outcome
        )

    def _gather_graphs(
        self, graphs: Iterable[Callable], what: str, placement=None, priority=None,
        seconds: float | None = None, outcome: str | None = None,
    ) -> list:  # fmt: skip
        """:meth:`_gather_graph` of several graphs submitted one after the other without
        waiting between them: ``graphs`` yields functions of the previous graph's output futures
        (``None`` for the first) that return the next ``(tasks, outputs)``, each called once the
        one before was submitted (so the client makes a graph while the workers run the ones
        before). Returns the outputs of every graph, in order."""
        placement = placement or self._placement
        annotations = {"workers": placement, "allow_other_workers": False}
        if priority is not None:
            annotations["priority"] = priority
        futures: list = []
        try:
            previous = None
            for make in graphs:
                tasks, outputs = make(previous)
                with dask.annotate(**annotations):
                    previous = self.client.get(tasks, outputs, sync=False)
                futures += previous
        except BaseException:
            for future in futures:
                future.release()
            raise
        workers = list(self._worker_roles() or ())
        try:
            gathering = self.client.gather(futures, asynchronous=True)
            return self._naming_loss(gathering, workers, outcome, seconds)
        except TimeoutError:
            busy = sorted({placement(f.key)[0] for f in futures if not f.done()})
            raise self._timeout_error(what, busy or workers) from None
        finally:
            for future in futures:
                future.release()

    def _run_on_answering(self, function, workers: Iterable[str], **kwargs) -> None:
        """``Client.run(function, token=..., **kwargs)`` on those of ``workers`` that answer
        (a stopped one never does), its errors ignored: ends a failed step's waits there."""
        answering = answering_workers(self.client, workers)
        try:
            if answering:
                self.client.run(
                    function, token=self.token, workers=answering, on_error="ignore", **kwargs
                )
        except Exception:  # noqa: BLE001, S110 - the failed step's error is the one to report
            pass

    def _unregister(self, plugins: Sequence[str] = ()) -> None:
        """Remove the worker ``plugins`` (others the model registered), the plugin (with the
        state it owns), the key-cache bound and the model's hold on the transfer monitor, waiting
        for the workers at most ``step_timeout`` seconds in all (:func:`unregister_within`)."""
        unregister_within(self.client, self.token, [*plugins, self.plugin_name], self.step_timeout)

    # ------------------------------------------------------------------ retirement
    def _watch_retirements(self) -> None:
        """Count the cluster's retirement requests from now on (the scheduler plugin
        :class:`~dasknn.runtime.faults.RetirementRequests`, held for the model until
        :meth:`close`), so that :meth:`_retiring` sees the workers Dask is asked to retire.
        Called by the constructor before :meth:`_register`."""
        self._watching_retirements = True  # released by close, also if not installed
        install_retirement_watch(self.client, self.token)
        self._retirements = retirement_requests(self.client)

    def _stop_watching_retirements(self) -> None:
        """Drop the model's hold on the retirement watch, if it holds it."""
        if self._watching_retirements:
            self._watching_retirements = False
            release_retirement_watch(self.client, self.token)

    def _model_workers(self) -> list[str]:
        """The workers holding part of the model (those :meth:`_worker_roles` names), sorted."""
        return sorted(self._worker_roles() or ())

    def _retiring(self) -> list[str]:
        """The model's workers being retired, sorted (looked at every
        :data:`~dasknn.runtime.faults.POLL_SECONDS` at most; ``[]`` in between)."""
        if not self._watching_retirements or time.monotonic() < self._next_retire_check:
            return []
        self._next_retire_check = time.monotonic() + POLL_SECONDS
        return retiring_workers(self.client, self._model_workers(), self._retirements)

    def _spares(self, leaving: Sequence[str]) -> list[str]:
        """The running workers that hold nothing of the model, are not ``leaving`` and have
        the memory to take the values of one of them (:func:`with_memory_room`)."""
        taken = {*leaving, *self._leaving, *self._model_workers()}
        free = [w for w in running_workers(self.client) if w not in taken]
        return with_memory_room(self.client, free, leaving)

    #: Whether the model needs a spare worker (:meth:`_spares`) for each worker it lets go to
    #: keep its layout: its number of workers is fixed (one a stage or shard), or its
    #: ``_restore`` replaces them. Without enough spares it is laid out anew on the workers
    #: that stay (:meth:`_rebalancing`) where its layout allows that.
    _needs_spares = False

    def _hand_over_retiring(self) -> bool:
        """:meth:`_hand_over` the model's workers being retired (:meth:`_retiring`), between
        two steps; whether the model moved."""
        leaving = self._retiring()
        return bool(leaving) and self._hand_over(leaving)

    def _hand_over(self, leaving: list[str]) -> bool:
        """Move the values of the workers ``leaving`` (being retired) to other workers, then
        let them go: the model of the last whole step is read from its workers
        (``_record``), the actors that kept Dask from retiring ``leaving`` are released,
        ``leaving`` is retired (:meth:`_let_go`, within ``step_timeout``) and the record placed
        again, as a checkpoint is restored (``_restore``); returns ``True``.

        A model that needs spares (:attr:`_needs_spares`) and finds too few is laid out on its
        workers that stay (:meth:`_layout_without`, its traffic counts started again); where
        that cannot be, it keeps ``leaving``, the requests counted as seen (Dask refuses the
        retirement), logs a warning naming them and why (logger
        ``dasknn.runtime.distributed_model``) and returns ``False``. Costs one read and one
        placement of the model."""
        relayout = None
        if self._needs_spares and len(self._spares(leaving)) < len(leaving):
            relayout, refusal = self._layout_without(leaving)
            if relayout is None:
                now = retirement_requests(self.client)
                self._retirements.update({w: now.get(w, 0) for w in leaving})
                logger.warning(
                    "%s keeps the workers %s that Dask was asked to retire (it refuses): no "
                    "spare worker with the memory to take their values over runs and %s; start "
                    "a worker, then ask again to retire them",
                    type(self).__name__, leaving, refusal,
                )  # fmt: skip
                return False
        record = self._record()
        self._leaving.update(leaving)
        self._let_go(leaving)
        if relayout is not None:
            relayout()
        self._restore(record)
        if relayout is not None:
            self.reset_comm()  # the traffic of the new layout, measured beside its prediction
        return True

    def _layout_without(self, leaving: Sequence[str]) -> tuple[Callable[[], None] | None, str]:
        """What lays the model out on its workers that stay once ``leaving`` go
        (:meth:`_rebalancing`), and ``""``; or ``None`` and why not: none stays, one of them
        lacks the memory for a leaving worker's values (:func:`with_memory_room`), or the
        layout needs more workers."""
        staying = [w for w in self._model_workers() if w not in leaving]
        if not staying:
            return None, "no worker of the model stays"
        if len(with_memory_room(self.client, staying, leaving)) < len(staying):
            return None, "the workers that stay lack the memory for their values"
        try:
            return self._rebalancing(staying), ""
        except ValueError as error:
            return None, str(error)

    def _let_go(self, leaving: Sequence[str], futures=()) -> None:
        """Cancel ``futures`` (a failed step), then (separately: else the scheduler drops the
        client) the postboxes and anchors, which block retirement, call
        :meth:`_anchors_released`, and retire ``leaving`` again every
        :data:`~dasknn.runtime.faults.POLL_SECONDS` until they are gone or ``step_timeout``
        has passed. See docs/reliability.md."""
        deadline = time.monotonic() + self.step_timeout
        if futures:
            self.client.cancel(list(futures))
        boxes = self._postboxes.values() if isinstance(self._postboxes, dict) else self._postboxes
        self.client.cancel([*boxes, *self._anchors])
        self._postboxes = type(self._postboxes)()
        self._anchors = []
        self._anchors_released()
        while True:
            staying = [w for w in running_workers(self.client) if w in leaving]
            if not staying or time.monotonic() > deadline:
                return
            self.client.retire_workers(staying)
            time.sleep(POLL_SECONDS)

    def _anchors_released(self) -> None:
        """Called by :meth:`_let_go` once the postboxes are released: drop what used them."""

    # ------------------------------------------------------------------ life
    def _check_open(self) -> None:
        """Raise :class:`ModelClosedError` after :meth:`close`, :class:`ModelFailedError`
        after a step that failed part-way (:attr:`_failed` says why)."""
        if not self._open:
            raise ModelClosedError(f"this {type(self).__name__} is closed")
        if self._failed is not None:
            raise ModelFailedError(
                f"this {type(self).__name__} is unusable after a failed step ({self._failed}); "
                f"{self._failed_advice()}"
            )

    def _interrupted(self) -> None:
        """A training call was interrupted (``KeyboardInterrupt``) with steps possibly under
        way on the workers: the model refuses further use (:class:`ModelFailedError`), since its
        workers' values may mix two steps."""
        if self._failed is None:
            self._failed = "a fit call was interrupted while steps were under way"

    def _failed_advice(self) -> str:
        """What a user can do after a step failed part-way (the end of
        :class:`ModelFailedError`'s message)."""
        return (
            "its values may mix two steps: fit(..., resume=CHECKPOINT) restores a checkpoint, "
            "or close it and start again from a saved copy"
        )

    def _before_close(self) -> None:
        """Release what the model holds besides its plugin (called once by :meth:`close`
        before the plugins are removed): by default its postbox and anchor actors."""
        self._postboxes.clear()
        self._anchors = []

    def _extra_plugins(self) -> Sequence[str]:
        """The worker plugins the model registered besides its own (:meth:`_add_plugin`),
        removed first, the last registered first."""
        return self._plugins[::-1]

    def close(self) -> None:
        """Remove the model's worker plugins (with the state they own), its transfer records, its
        hold on the retirement watch and what it opened (a local cluster, a client), waiting for
        the workers at most ``step_timeout`` seconds (a stopped one has them removed by the
        scheduler when it goes on); closing twice does nothing."""
        if self._finalizer is not None:
            self._finalizer.detach()
        try:
            if self._open:
                self._open = False
                try:
                    self._before_close()
                finally:
                    self._unregister(self._extra_plugins())
        finally:
            try:
                self._stop_watching_retirements()
            finally:
                if self._opened is not None:
                    opened, self._opened = self._opened, None
                    opened.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ------------------------------------------------------------------ elasticity
    def rebalance(self, workers: Sequence[str] | None = None) -> Self:
        """Place the model anew on ``workers`` (workers that joined the cluster, say), with
        the values, optimizer state and step count of its last whole step: training goes on
        from there as it would have where the model was, to the same values.

        The model is laid out on ``workers`` as its constructor lays it out on its
        ``workers``, its layout kept (model-parallel: its partition, part ``m`` on
        ``workers[m % W]``; data-parallel: a replica on every worker, its shard count; pipeline:
        ``stages * replicas`` of them; sampled: one shard a worker, on the first of them). A
        model whose layout needs fewer workers than given uses the first ones, in the order
        given.

        Parameters
        ----------
        workers : sequence of str, optional
            Addresses of running workers of the model's cluster; ``None`` (the default): every
            running worker of the cluster, sorted.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Before anything is read or placed: for an empty ``workers``, an address that is not
            a running worker of the cluster, a repeated one, or fewer workers than the model's
            layout needs.
        ModelClosedError, ModelFailedError
            After :meth:`close`, or after a step that failed part-way, as every call.
        WorkerLostError, StepTimeoutError
            If a worker leaves, or does not answer within ``step_timeout``, while the model is
            read or placed; a placement that failed leaves the model unusable
            (:class:`ModelFailedError`) until a checkpoint is restored.

        Notes
        -----
        Costs one read of the model from its workers (as a checkpoint reads it) and one
        placement of the model on ``workers`` (as a restored checkpoint is placed). The traffic
        counts start again (:meth:`reset_comm`): :meth:`comm_report` then sets the new
        placement's traffic beside its prediction.
        """
        self._check_open()
        if isinstance(workers, str):
            raise ValueError(f"workers must be a list of worker addresses, got {workers!r}")
        running = running_workers(self.client)
        if workers is None:
            chosen = running
            if not chosen:
                raise ValueError("the cluster has no running worker to place the model on")
        else:
            chosen = list(workers)
            if not chosen:
                raise ValueError("rebalance needs at least one worker, got none")
            unknown = [w for w in chosen if w not in running]
            if unknown:
                raise ValueError(f"not running workers of this cluster: {unknown}")
            if len(set(chosen)) != len(chosen):
                raise ValueError(f"workers must be distinct addresses: {chosen}")
        take = self._rebalancing(chosen)
        record = self._record()
        take()
        self._restore(record)
        self.reset_comm()  # the traffic of the new placement, measured beside its prediction
        return self

    def _rebalancing(self, workers: list[str]) -> Callable[[], None]:
        """Check that the model can be laid out on ``workers`` (:meth:`rebalance`), raising
        ``ValueError`` if not, and return what makes them the workers the next ``_restore``
        places the model on (called once the model has been read)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ reports
    def comm_report(self) -> CommReport:
        """Measured beside predicted traffic since the model started or :meth:`reset_comm`."""
        raise NotImplementedError

    def reset_comm(self) -> None:
        """Forget the traffic measured so far (:meth:`comm_report` counts from here)."""
        self._check_open()
        reset_transfers(self.client, self.token)

    # ------------------------------------------------------------------ files
    #: The one-process estimator whose files :meth:`load` reads (with its ``load``).
    _estimator_class: type

    @classmethod
    def load(cls, path, client=None, **options) -> Self:
        """A distributed model of the file ``path`` (written by ``save``, by the one-process
        estimator's ``save`` or as a checkpoint) on ``client``, with the constructor's keywords
        ``options``: its values and optimizer state, so that training goes on as the saved
        model would.

        Raises
        ------
        FileNotFoundError, ValueError
            As the one-process estimator's ``load``, before anything is placed; the
            constructor's errors (what was placed is removed again).
        """
        estimator = cls._estimator_class.load(path)
        dist = cls(estimator, client, **cls._load_options(path, options))
        try:
            dist._take_state(estimator)
        except BaseException:
            dist.close()
            raise
        return dist

    @classmethod
    def _load_options(cls, path, options: dict) -> dict:
        """The constructor's keywords for the model stored at ``path`` (``options``)."""
        return options

    def _take_state(self, estimator) -> None:
        """Take the optimizer state of ``estimator``, whose values the constructor placed
        (``_restore`` of its record, when it has an optimizer)."""
        record = estimator._record()
        if record.optimizer is not None:
            self._restore(record)

    def _timeout_error(self, what: str, workers: Sequence[str]) -> StepTimeoutError:
        """The :class:`StepTimeoutError` of ``what`` that did not happen within
        ``step_timeout``, naming ``workers`` with their roles (:meth:`_worker_roles`) and
        state."""
        return step_timeout_error(
            self.client, what, self.step_timeout, workers, self._worker_roles()
        )


def unregister_within(
    client, token: str, plugins: Sequence[str], seconds: float, key_cache_bound: bool = True
) -> None:
    """Remove a model's worker ``plugins`` (in order), its key-cache bound (``key_cache_bound``)
    and its hold on the transfer monitor (the monitor goes with its last holder), waiting for
    the workers at most ``seconds`` in all.

    A worker that does not answer (stopped) is left to the scheduler, which removes them there
    when it goes on, or drops them with the worker (:func:`~dasknn.runtime.waiting.call_at_most`);
    a lost worker the scheduler still lists fails no removal
    (:func:`~dasknn.runtime.plugin_removal.remove_worker_plugin`). The bound and the hold are
    removed also when a plugin's removal failed.
    """
    deadline = time.monotonic() + seconds

    def left() -> float:
        return max(deadline - time.monotonic(), 0.0)

    try:
        for name in plugins:
            remove_worker_plugin(client, name, left())
    finally:
        try:
            if key_cache_bound:
                remove_key_cache_bound(client, token, left())
        finally:
            release_comm_monitor(client, token, left())


def _plugins_of(dask_scheduler, token: str) -> list[str]:
    """The worker plugins of model ``token`` registered on the scheduler."""
    return [name for name in dask_scheduler.worker_plugins if token in name]


def _release_dropped(
    client, token: str, plugin_name: str, seconds: float, opened: ExitStack | None
) -> None:
    """Finalizer of a model dropped without ``close()``: remove its worker plugins (its own last),
    key-cache bound and holds on the transfer monitor and the retirement watch, then close what
    it opened, in a daemon
    thread (the garbage collector may run on the client's event loop, which the calls need)."""

    def release() -> None:
        try:
            if client.status == "running":
                names = client.run_on_scheduler(_plugins_of, token=token)
                names = [n for n in names if n not in (plugin_name, key_cache_plugin_name(token))]
                try:
                    unregister_within(client, token, [*names, plugin_name], seconds)
                finally:
                    release_retirement_watch(client, token)
        except Exception:  # noqa: BLE001, S110 - nothing to report to: the model is gone
            pass
        finally:
            if opened is not None:
                opened.close()

    threading.Thread(target=release, name=f"dasknn-release-{token}", daemon=True).start()
