"""Messages posted from a task on one worker straight to a task on another, without the scheduler.

A :class:`Postbox` is a Dask actor (documented API: its method calls go from worker to worker, no
scheduler in between), one per worker and model, made on the worker it serves. Its :meth:`post
<Postbox.post>` leaves a message in the ``deliver(key, value)`` of the model's worker plugin
there, and its transfer report with the plugin's ``hold_receipt(key, sender, nbytes)``, for the
worker's task to report with the others to the communication monitor in one event
(:meth:`Mailbox.take_receipts`, :func:`dasknn.runtime.measure.report_transfers`), so posted
bytes are counted as Dask's own transfers are. A :class:`Mailbox` holds the messages a
worker received until its task takes them, waiting for one not yet arrived; a failure of the
sending side is posted as well and ends that wait with the sender's error, and clearing the
mailbox (the steps in flight were dropped) ends it with ``RuntimeError``. While the message has
not arrived, the waiting task runs the jobs it queued there (the weight updates of a
model-parallel step, :meth:`Mailbox.queue_idle`).

:meth:`Postbox.post_packed` takes the message's key and sender packed into one ``bytes``
(:func:`pack_envelope`): Dask serializes each argument of an actor call, a key tuple element by
element (one pickle and one frame each), and sends ``bytes`` as they are.
"""

from __future__ import annotations

import logging
import pickle
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial

from distributed import get_worker
from distributed.comm import get_address_host, parse_address

from dasknn.runtime.wire import WireAddress, link_to, server_on

__all__ = [
    "MESSAGE_TIMEOUT",
    "POST_POLL_SECONDS",
    "Mailbox",
    "Postbox",
    "FAILURE_POST_TIMEOUT",
    "StepFailed",
    "WIRE_CACHE_SIZE",
    "open_envelope",
    "pack_envelope",
    "post_failure",
    "poster",
]

#: Seconds a task waits for a message posted by another worker before it fails.
MESSAGE_TIMEOUT = 600.0

#: Seconds between two checks, while a post is not yet delivered, that the mailbox was not
#: cleared (:meth:`Mailbox.wait_posted`).
POST_POLL_SECONDS = 0.25
#: Seconds a failing task waits for each other worker to be told (:func:`post_failure`).
FAILURE_POST_TIMEOUT = 10.0
#: Postboxes whose wire address a process keeps (:func:`poster`).
WIRE_CACHE_SIZE = 4096

logger = logging.getLogger(__name__)

_wires: dict = {}  # postbox key -> WireAddress or None, in the order asked
_wires_lock = threading.Lock()


def pack_envelope(key, sender: str) -> bytes:
    """A message's key and the address of the worker that sends it, packed for
    :meth:`Postbox.post_packed` (one pickle)."""
    return pickle.dumps((key, sender), protocol=pickle.HIGHEST_PROTOCOL)


def open_envelope(envelope: bytes) -> tuple:
    """``(key, sender)`` packed by :func:`pack_envelope`."""
    return pickle.loads(envelope)


class Postbox:
    """Dask actor: receives the messages other workers post for the plugin ``plugin_name``.

    Parameters
    ----------
    plugin_name : str
        The worker plugin the messages go to, as it is when the postbox is made (a message for
        an earlier plugin of that name never reaches a later one); it has ``deliver(key, value)``
        and ``hold_receipt(key, sender, nbytes)``.
    """

    def __init__(self, plugin_name: str) -> None:
        worker = get_worker()  # made by a task on the worker it serves
        self.state = worker.plugins[plugin_name]
        self._wire = _wire_for(self, worker.address)

    def wire(self) -> WireAddress | None:
        """Where :mod:`dasknn.runtime.wire` sends this postbox's messages; ``None`` on a
        cluster whose scheme is not ``tcp://`` (the messages then come through :meth:`post`)."""
        return self._wire

    def leave(self, key, sender: str, value) -> None:
        """Leave the message ``key`` from the worker at ``sender`` with the plugin, and hold the
        report of its bytes (``value.nbytes``; none for a :class:`StepFailed`) there first, so
        a task that took the message finds its report held (any thread)."""
        if not isinstance(value, StepFailed):
            self.state.hold_receipt(key, sender, value.nbytes)
        self.state.deliver(key, value)

    async def post(self, key, sender: str, value) -> None:
        """:meth:`leave` the message, on the worker's event loop."""
        self.leave(key, sender, value)

    async def post_packed(self, envelope: bytes, value) -> None:
        """:meth:`post` of the message whose key and sender ``envelope`` holds
        (:func:`pack_envelope`)."""
        key, sender = open_envelope(envelope)
        await self.post(key, sender, value)


def _wire_for(postbox: Postbox, address: str) -> WireAddress | None:
    """The wire address of ``postbox`` on the worker at ``address``: ``None`` where the scheme
    is not ``tcp://`` or no socket can listen on the address's host (a contact address that is
    not the worker's own, behind a NAT): its messages then come through the actor."""
    scheme, _ = parse_address(address)
    if scheme != "tcp":
        return None
    try:
        return server_on(get_address_host(address)).register(postbox)
    except OSError as error:
        logger.info("posting to the worker at %s through its actor: %s", address, error)
        return None


def poster(box) -> Callable:
    """How this process posts to the :class:`Postbox` actor ``box``: ``post(key, sender,
    value)`` returning a future that is done once the message is on its way
    (:mod:`dasknn.runtime.wire`), or once the actor took it where the postbox has no wire.

    The postbox's wire address is asked once a process and postbox key (Dask never gives a
    key to two actors; the cache keeps the last :data:`WIRE_CACHE_SIZE` keys asked)."""
    key = box.key
    with _wires_lock:
        known = key in _wires
        wire = _wires.get(key)
    if not known:
        wire = box.wire().result()
        with _wires_lock:
            if len(_wires) >= WIRE_CACHE_SIZE:
                del _wires[next(iter(_wires))]
            _wires[key] = wire
    if wire is None:
        return partial(_post_by_actor, box.post_packed)
    return partial(_post_on_wire, wire)


def _post_by_actor(post_packed, key, sender: str, value):
    return post_packed(pack_envelope(key, sender), value)


def _post_on_wire(wire: WireAddress, key, sender: str, value) -> Future:
    return link_to(wire).send(wire.route, key, sender, value)


class StepFailed:
    """What a worker posts instead of a message it cannot send: the error that stopped it."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def post_failure(notices, sender: str, error: BaseException, where: str) -> None:
    """Post ``error`` as a :class:`StepFailed` to each ``(postbox, key)`` of ``notices``, so the
    waits of those workers for this one's messages raise it too, waiting at most
    :data:`FAILURE_POST_TIMEOUT` for each (a worker that is gone has nothing waiting). An error
    that cannot be pickled travels as a ``RuntimeError`` naming ``where`` it happened and it."""
    try:
        pickle.dumps(error)
    except Exception:  # noqa: BLE001 - any pickling failure: send what can travel
        error = RuntimeError(f"{where}: {error!r}")
    posted = [box.post(key, sender, StepFailed(error)) for box, key in notices]
    for notice in posted:
        try:
            notice.result(timeout=FAILURE_POST_TIMEOUT)
        except Exception:  # noqa: BLE001 - the worker is gone: nothing waits there
            pass


class Mailbox:
    """Messages received on a worker, by key, until a task takes them (thread-safe).

    A task thread may leave jobs (:meth:`queue_idle`) that its :meth:`take` runs while the
    message it takes has not arrived. :meth:`clear` forgets the messages and jobs and ends the
    waits under way with ``RuntimeError`` (the steps they belong to were dropped);
    :meth:`close` does as well and ends every later wait at once (the model was removed).
    """

    def __init__(self) -> None:
        self._messages: dict = {}
        self._arrived = threading.Condition()
        self._clears = 0  # calls of clear, which end the waits begun before them
        self._closed = False  # close: every wait, now or later, ends
        self._idle_jobs: deque = deque()
        self._receipts: list[tuple] = []

    def deliver(self, key, value) -> None:
        """Leave the message ``key`` (from any thread or the event loop)."""
        with self._arrived:
            self._messages[key] = value
            self._arrived.notify_all()

    def hold_receipt(self, key, sender: str, nbytes: int) -> None:
        """Keep the report that the message ``key`` (``nbytes`` bytes) came from the worker at
        ``sender``, for :meth:`take_receipts` (from any thread or the event loop)."""
        with self._arrived:
            self._receipts.append((key, sender, int(nbytes)))

    def take_receipts(self) -> list[tuple]:
        """Remove and return the ``(key, sender, nbytes)`` kept by :meth:`hold_receipt`, in the
        order they came (:meth:`clear` keeps them: those bytes were moved)."""
        with self._arrived:
            receipts, self._receipts = self._receipts, []
        return receipts

    @property
    def clears(self) -> int:
        """How many times :meth:`clear` was called so far (the ``since`` of a wait)."""
        with self._arrived:
            return self._clears

    def take(self, key, failed=None, timeout: float = MESSAGE_TIMEOUT, since: int | None = None):
        """Remove and return the message ``key``, waiting up to ``timeout`` seconds for it
        (``TimeoutError`` naming the key after that). ``failed`` is the key under which a
        :class:`StepFailed` of the sender may arrive instead: its error is raised.
        ``RuntimeError`` if :meth:`clear` is called meanwhile, or was called since
        :attr:`clears` was ``since``.

        While the message has not arrived, the jobs of :meth:`queue_idle` run first, one at a
        time, in the order they were queued; the wait starts when none is left.
        """
        with self._arrived:
            clears = self._clears if since is None else since

        def ready():
            return (
                self._closed
                or self._clears != clears
                or key in self._messages
                or (failed is not None and failed in self._messages)
            )

        while True:
            with self._arrived:
                if ready() or not self._idle_jobs:
                    arrived = self._arrived.wait_for(ready, timeout)
                    if self._closed:
                        raise RuntimeError(f"the model was closed while waiting for {key}")
                    if self._clears != clears:
                        raise RuntimeError(
                            f"the steps in flight were dropped while waiting for {key}"
                        )
                    if not arrived:
                        raise TimeoutError(f"no message {key} arrived within {timeout:g} s")
                    if key not in self._messages:
                        raise self._messages[failed].error
                    return self._messages.pop(key)
                func, args = self._idle_jobs.popleft()
            func(*args)

    def queue_idle(self, func, *args) -> None:
        """Queue ``func(*args)`` for the calling task thread: it runs while a message that thread
        takes has not arrived (:meth:`take`), or at the latest in :meth:`run_idle`."""
        with self._arrived:
            self._idle_jobs.append((func, args))

    def run_idle(self) -> None:
        """Run every job :meth:`queue_idle` left, in the order they were queued."""
        while True:
            with self._arrived:
                if not self._idle_jobs:
                    return
                func, args = self._idle_jobs.popleft()
            func(*args)

    def wait_posted(self, posts, poll: float = POST_POLL_SECONDS, since: int | None = None) -> None:
        """Wait until every post (the futures of :meth:`Postbox.post` calls) is delivered,
        re-raising a failed post's error; ``RuntimeError`` if :meth:`clear` is called meanwhile,
        or was called since :attr:`clears` was ``since`` (checked every ``poll`` seconds: a post
        to a worker that has left waits for it to come back, which it may never do)."""
        with self._arrived:
            clears = self._clears if since is None else since
        for post in posts:
            while True:
                try:
                    post.result(timeout=poll)
                    break
                except TimeoutError:
                    with self._arrived:
                        if self._closed or self._clears != clears:
                            raise RuntimeError(
                                "the steps in flight were dropped while a post was under way"
                            ) from None

    def drop(self, keep) -> int:
        """Forget every message whose key ``keep(key)`` is false (those of ended steps); returns
        how many."""
        with self._arrived:
            gone = [key for key in self._messages if not keep(key)]
            for key in gone:
                del self._messages[key]
        return len(gone)

    def clear(self) -> None:
        """Forget every message and queued job, and end the waits of :meth:`take` and
        :meth:`wait_posted` under way with ``RuntimeError``."""
        with self._arrived:
            self._messages.clear()
            self._idle_jobs.clear()
            self._clears += 1
            self._arrived.notify_all()

    def close(self) -> None:
        """:meth:`clear`, and end every wait of :meth:`take` and :meth:`wait_posted` from now
        on with ``RuntimeError`` (the model was removed from the worker: no message will come,
        and a task that began before the removal must not wait for one)."""
        with self._arrived:
            self._closed = True
        self.clear()

    def __len__(self) -> int:
        with self._arrived:
            return len(self._messages)
