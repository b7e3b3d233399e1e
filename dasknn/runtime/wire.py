"""Posted messages carried over sockets of their own between the workers of a ``tcp://`` cluster.

A worker's :class:`~dasknn.runtime.postbox.Postbox` on a ``tcp://`` address registers with its
process's :class:`WireServer` (one listening socket on the worker's host, any free port, started
by the first postbox) and answers :meth:`~dasknn.runtime.postbox.Postbox.wire` with a
:class:`WireAddress`. A sender sends each message on one :class:`WireLink` to that server (one
connection and one thread per server and process, made by the first message): the key, the
sender's address and the value pickled with protocol 5, the value's buffers (a numpy array's
memory) written to the socket as they are, without a copy, while the sending task goes on. The
server's thread for the connection reads them into buffers it reuses once the message's arrays
are gone (:class:`ReceiveBuffers`) and leaves the message with the postbox
(:meth:`~dasknn.runtime.postbox.Postbox.leave`), as a Dask actor call would.

Against an actor call, a message costs the worker's event loop nothing: no framing of Dask's
protocol, no reply, no wake-up; the bytes move in threads that release the GIL while the kernel
copies them, as the collective libraries' threads do.

Trust: a connection first presents the server's secret (16 random bytes, handed out only in
the :class:`WireAddress`, which travels through Dask's own comm); a connection that does not is
closed before anything it sent is unpickled. Clusters with other schemes (``tls://`` above all,
whose encryption this transport does not give), and a worker whose contact address is not a host
of its own (behind a NAT), post through the actors.

Errors: a message that cannot be sent (the receiver's process is gone, the connection broke)
fails its future with the ``OSError`` naming the address, and so does every message queued
behind it; the next message to that server connects anew. A message for a postbox that no
longer exists (its model was closed) is read and dropped, as Dask drops a call to a released
actor.
"""

from __future__ import annotations

import hmac
import pickle
import queue
import secrets
import socket
import struct
import sys
import threading
import weakref
from concurrent.futures import Future
from typing import NamedTuple, Protocol

import numpy as np

__all__ = [
    "CONNECT_TIMEOUT",
    "POOLED_MIN_BYTES",
    "RECEIVE_POOL_BYTES",
    "ReceiveBuffers",
    "WireAddress",
    "WireLink",
    "WireServer",
    "link_to",
    "server_on",
]

#: Seconds a link waits for the receiving server to accept its connection.
CONNECT_TIMEOUT = 30.0
#: Bytes of reusable receive buffers a connection's reader keeps (:class:`ReceiveBuffers`).
RECEIVE_POOL_BYTES = 64 * 2**20
#: Buffers smaller than this are allocated for each message (glibc's heap reuses them).
POOLED_MIN_BYTES = 4 * 2**10

_SECRET_BYTES = 16
_ROUTE_BYTES = 16
# route, length of the pickled head, number of out-of-band buffers
_FRAME = struct.Struct(f"!{_ROUTE_BYTES}sQI")


class WireAddress(NamedTuple):
    """Where a postbox's messages go: the server's ``host`` and ``port``, the ``secret`` a
    connection presents first, and the postbox's ``route`` on that server."""

    host: str
    port: int
    secret: bytes
    route: bytes


class Receiver(Protocol):
    """What a :class:`WireServer` delivers to (a postbox)."""

    def leave(self, key, sender: str, value) -> None:
        """Take the message ``key`` from the worker at ``sender`` (any thread)."""


class WireServer:
    """One listening socket on ``host`` (any free port) and a thread per connection that
    delivers each message to the receiver registered under its route.

    Receivers are held weakly: a message whose receiver was collected is dropped.
    """

    def __init__(self, host: str) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.create_server((host, 0), family=family, backlog=128)
        self.host = host
        self.port: int = self._socket.getsockname()[1]
        self._secret = secrets.token_bytes(_SECRET_BYTES)
        self._routes: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name=f"dasknn-wire-{self.port}", daemon=True).start()

    def register(self, receiver: Receiver) -> WireAddress:
        """Deliver the messages sent to the returned address to ``receiver`` (held weakly)."""
        route = secrets.token_bytes(_ROUTE_BYTES)
        with self._lock:
            self._routes[route] = receiver
        return WireAddress(self.host, self.port, self._secret, route)

    def _accept(self) -> None:
        while True:
            connection, _ = self._socket.accept()
            threading.Thread(
                target=self._serve, args=(connection,), name="dasknn-wire-read", daemon=True
            ).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            try:
                if not hmac.compare_digest(_read(connection, _SECRET_BYTES), self._secret):
                    return
                pool = ReceiveBuffers()
                while True:
                    self._deliver(connection, pool)
            except (OSError, EOFError):
                return  # the sender closed or broke the connection: nothing more comes

    def _deliver(self, connection: socket.socket, pool: ReceiveBuffers) -> None:
        route, head_length, count = _FRAME.unpack(_read(connection, _FRAME.size))
        lengths = struct.unpack(f"!{count}Q", _read(connection, 8 * count)) if count else ()
        head = _read(connection, head_length)
        buffers = []
        for length in lengths:
            buffer = pool.take(length)
            _read_into(connection, memoryview(buffer))
            buffers.append(buffer)
        with self._lock:
            receiver = self._routes.get(route)
        if receiver is not None:
            key, sender, value = pickle.loads(head, buffers=buffers)
            receiver.leave(key, sender, value)


class ReceiveBuffers:
    """The memory one connection's reader reads messages into, reused from message to message.

    A buffer is handed out again once nothing refers to it any more (the arrays of the message
    read into it are gone: CPython's reference count, read under the GIL by the one reader
    thread that owns the pool), so a worker in steady state receives its messages into the
    same pages whatever the process's malloc settings. Buffers are powers of two from
    :data:`POOLED_MIN_BYTES`; the pool keeps at most ``limit`` bytes of them (default
    :data:`RECEIVE_POOL_BYTES`) for the life of the connection, and a message that finds none
    free beyond that gets memory of its own.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = RECEIVE_POOL_BYTES if limit is None else int(limit)
        self._buffers: list[np.ndarray] = []
        self.nbytes = 0

    def take(self, length: int) -> np.ndarray:
        """An uninitialized ``uint8`` array of ``length`` bytes, on a free pooled buffer when
        one fits (the smallest that does)."""
        if length < POOLED_MIN_BYTES:
            return np.empty(length, dtype=np.uint8)
        best = None
        for buffer in self._buffers:
            # references: the list, this loop's name, getrefcount's argument
            if buffer.nbytes >= length and sys.getrefcount(buffer) == 3:
                if best is None or buffer.nbytes < best.nbytes:
                    best = buffer
        if best is None:
            best = np.empty(1 << (length - 1).bit_length(), dtype=np.uint8)
            if self.nbytes + best.nbytes > self.limit:
                return best[:length]
            self._buffers.append(best)
            self.nbytes += best.nbytes
        return best[:length]


class WireLink:
    """One connection to one :class:`WireServer` and the thread that sends on it, in the order
    :meth:`send` was called."""

    def __init__(self, host: str, port: int, secret: bytes) -> None:
        self.host, self.port, self._secret = host, port, secret
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        threading.Thread(
            target=self._run, name=f"dasknn-wire-to-{host}:{port}", daemon=True
        ).start()

    def send(self, route: bytes, key, sender: str, value) -> Future:
        """Send ``(key, sender, value)`` to the receiver at ``route``; the future is done when
        every byte was handed to the kernel (``value`` may then change), or fails with the
        error that stopped it."""
        future: Future = Future()
        with self._lock:
            if self._error is None:
                self._queue.put((route, (key, sender, value), future))
                return future
        future.set_exception(self._error)
        return future

    @property
    def broken(self) -> bool:
        """Whether a failure ended the link (its messages fail; :func:`link_to` makes anew)."""
        with self._lock:
            return self._error is not None

    def _run(self) -> None:
        try:
            connection = socket.create_connection((self.host, self.port), CONNECT_TIMEOUT)
            connection.settimeout(None)
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            connection.sendall(self._secret)
        except OSError as error:
            self._fail(OSError(f"cannot connect to {self.host}:{self.port} to post: {error}"))
            return
        with connection:
            while True:
                route, message, future = self._queue.get()
                try:
                    _send(connection, route, message)
                except OSError as error:
                    future.set_exception(
                        OSError(f"posting to {self.host}:{self.port} failed: {error}")
                    )
                    self._fail(future.exception())
                    return
                except Exception as error:  # noqa: BLE001 - a value that cannot be pickled
                    future.set_exception(error)
                    continue
                future.set_result(None)

    def _fail(self, error: BaseException) -> None:
        """Mark the link broken and fail every message queued on it with ``error``."""
        with self._lock:
            self._error = error
        while True:
            try:
                _, _, future = self._queue.get_nowait()
            except queue.Empty:
                return
            future.set_exception(error)


_servers: dict[str, WireServer] = {}
_links: dict[tuple[str, int, bytes], WireLink] = {}
_registry_lock = threading.Lock()


def server_on(host: str) -> WireServer:
    """This process's server on ``host``, started by the first call."""
    with _registry_lock:
        server = _servers.get(host)
        if server is None:
            server = _servers[host] = WireServer(host)
        return server


def link_to(address: WireAddress) -> WireLink:
    """This process's link to the server of ``address``, made anew when the last one broke."""
    where = (address.host, address.port, address.secret)
    with _registry_lock:
        link = _links.get(where)
        if link is None or link.broken:
            link = _links[where] = WireLink(*where)
        return link


def _send(connection: socket.socket, route: bytes, message: tuple) -> None:
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    views = [buffer.raw() for buffer in buffers]
    lengths = [view.nbytes for view in views]
    prefix = _FRAME.pack(route, len(head), len(views))
    if views:
        prefix += struct.pack(f"!{len(views)}Q", *lengths)
    connection.sendall(prefix + head)
    for view in views:
        connection.sendall(view)


def _read(connection: socket.socket, size: int) -> bytes:
    data = bytearray(size)
    _read_into(connection, memoryview(data))
    return bytes(data)


def _read_into(connection: socket.socket, view: memoryview) -> None:
    while view.nbytes:
        received = connection.recv_into(view)
        if received == 0:
            raise EOFError("the connection closed")
        view = view[received:]
