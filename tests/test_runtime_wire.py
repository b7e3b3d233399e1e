"""Posted messages over the workers' own sockets (:mod:`dasknn.runtime.wire`): values arrive
equal and writable, in order, on one connection; a connection without the server's secret is
closed before anything is unpickled; a message for an unknown or collected receiver is dropped
and the link goes on; a link that cannot connect fails its messages with an error naming the
address and is made anew; a value that cannot be pickled fails alone; a reader's buffer is
reused only once the arrays read into it are gone. On a real ``tcp://``
cluster a postbox answers its wire address and a post crosses it; an ``inproc://`` cluster posts
through the actor."""

from __future__ import annotations

import gc
import pickle
import socket
import threading

import numpy as np
import pytest
from distributed import WorkerPlugin
from polling import HANG_GUARD, wait_until

from dasknn.runtime.postbox import Mailbox, Postbox, StepFailed, poster
from dasknn.runtime.wire import (
    POOLED_MIN_BYTES,
    ReceiveBuffers,
    WireAddress,
    WireServer,
    link_to,
    server_on,
)


class _Inbox:
    """A receiver that keeps what arrives, in order."""

    def __init__(self) -> None:
        self.got: list[tuple] = []
        self.arrived = threading.Event()

    def leave(self, key, sender, value) -> None:
        self.got.append((key, sender, value))
        self.arrived.set()


def _arrived(inbox: _Inbox, count: int) -> list[tuple]:
    wait_until(lambda: len(inbox.got) >= count, HANG_GUARD, f"{count} messages")
    return inbox.got


def _closed_by_peer(connection: socket.socket) -> bool:
    """Whether the other end closed ``connection`` (an end of stream, or a reset when what
    was sent to it was never read)."""
    try:
        return connection.recv(1) == b""
    except ConnectionResetError:
        return True


def test_values_arrive_equal_writable_and_in_order_on_one_link():
    server = server_on("127.0.0.1")
    inbox = _Inbox()
    address = server.register(inbox)
    big = np.random.default_rng(0).standard_normal((300, 500)).astype(np.float32)
    values = [
        big,
        np.asfortranarray(big[:7, :9]),
        big[::3, ::2],  # not contiguous: pickled in band
        {"rows": np.arange(5, dtype=np.int64), "grad": big[:2]},
        (np.zeros(0), "text", 3),
        StepFailed(ValueError("worker 1 failed")),
    ]
    futures = [
        link_to(address).send(address.route, ("m", i), "tcp://sender:1", v)
        for i, v in enumerate(values)
    ]
    for future in futures:
        assert future.result(timeout=HANG_GUARD) is None
    got = _arrived(inbox, len(values))
    assert [key for key, _, _ in got] == [("m", i) for i in range(len(values))]
    assert {sender for _, sender, _ in got} == {"tcp://sender:1"}
    np.testing.assert_array_equal(got[0][2], big)
    assert got[0][2].flags.writeable and got[0][2].dtype == np.float32
    np.testing.assert_array_equal(got[1][2], big[:7, :9])
    np.testing.assert_array_equal(got[2][2], big[::3, ::2])
    np.testing.assert_array_equal(got[3][2]["rows"], np.arange(5))
    np.testing.assert_array_equal(got[3][2]["grad"], big[:2])
    assert got[4][2][1:] == ("text", 3) and got[4][2][0].shape == (0,)
    assert isinstance(got[5][2], StepFailed) and "worker 1 failed" in str(got[5][2].error)


def test_a_connection_without_the_secret_is_closed_before_anything_is_unpickled():
    server = WireServer("127.0.0.1")
    inbox = _Inbox()
    address = server.register(inbox)
    intruder = socket.create_connection((address.host, address.port), timeout=HANG_GUARD)
    with intruder:
        intruder.sendall(b"\0" * 16)  # not the secret
        intruder.sendall(b"anything at all")
        assert _closed_by_peer(intruder)
    forged = WireAddress(address.host, address.port, b"\1" * 16, address.route)
    future = link_to(forged).send(forged.route, "k", "s", np.zeros(3))
    # handed to the kernel before the server closed the connection, or refused by then
    wait_until(future.done, HANG_GUARD, "the forged message handed over or refused")
    good = link_to(address).send(address.route, "after", "s", np.ones(2))
    good.result(timeout=HANG_GUARD)
    assert [key for key, _, _ in _arrived(inbox, 1)] == ["after"]


def test_a_message_for_an_unknown_or_collected_receiver_is_dropped_and_the_link_goes_on():
    server = WireServer("127.0.0.1")
    kept, gone = _Inbox(), _Inbox()
    address, lost = server.register(kept), server.register(gone)
    del gone
    gc.collect()
    link = link_to(address)
    unknown = address._replace(route=b"\7" * 16)
    for route, key in [(unknown.route, "unknown"), (lost.route, "lost"), (address.route, "kept")]:
        link.send(route, key, "s", np.arange(4.0)).result(timeout=HANG_GUARD)
    assert [key for key, _, _ in _arrived(kept, 1)] == ["kept"]
    assert not link.broken and link_to(address) is link


def test_a_link_that_cannot_connect_fails_its_messages_naming_the_address_and_is_made_anew():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens there once closed
    address = WireAddress("127.0.0.1", port, b"\0" * 16, b"\0" * 16)
    link = link_to(address)
    first = link.send(address.route, "a", "s", np.zeros(1))
    with pytest.raises(OSError, match=f"cannot connect to 127.0.0.1:{port} to post"):
        first.result(timeout=HANG_GUARD)
    wait_until(lambda: link.broken, HANG_GUARD, "the link marked broken")
    later = link.send(address.route, "b", "s", np.zeros(1))  # after the failure: fails at once
    with pytest.raises(OSError, match=f"127.0.0.1:{port}"):
        later.result(timeout=HANG_GUARD)
    assert link_to(address) is not link


def test_a_value_that_cannot_be_pickled_fails_alone():
    inbox = _Inbox()
    address = server_on("127.0.0.1").register(inbox)
    link = link_to(address)
    bad = link.send(address.route, "bad", "s", lambda: None)
    with pytest.raises(Exception, match="pickle"):
        bad.result(timeout=HANG_GUARD)
    link.send(address.route, "good", "s", np.ones(3)).result(timeout=HANG_GUARD)
    assert [key for key, _, _ in _arrived(inbox, 1)] == ["good"]
    assert not link.broken


class _Plugin(WorkerPlugin):
    """The part of a model's worker plugin a postbox delivers to."""

    name = "dasknn-test-wire"

    def setup(self, worker) -> None:
        self.mailbox = Mailbox()

    def deliver(self, key, value) -> None:
        self.mailbox.deliver(key, value)

    def hold_receipt(self, key, sender, nbytes) -> None:
        self.mailbox.hold_receipt(key, sender, nbytes)


def _post_from_worker(box, key, value):
    """Task: post ``value`` to ``box`` from this worker and wait until it is sent."""
    from distributed import get_worker

    poster(box)(key, get_worker().address, value).result(timeout=HANG_GUARD)


def _take(key):
    """Task: take ``key`` from this worker's test plugin with its receipts."""
    from distributed import get_worker

    mailbox = get_worker().plugins[_Plugin.name].mailbox
    return mailbox.take(key, timeout=HANG_GUARD), mailbox.take_receipts()


def _posts_between_workers(client) -> tuple:
    client.register_plugin(_Plugin(), name=_Plugin.name)
    try:
        first, second = sorted(client.scheduler_info()["workers"])
        box = client.submit(Postbox, _Plugin.name, workers=[second], actor=True).result()
        value = np.arange(1000, dtype=np.float32)
        client.submit(_post_from_worker, box, ("k", 1), value, workers=[first], pure=False).result()
        got, receipts = client.submit(_take, ("k", 1), workers=[second], pure=False).result()
        np.testing.assert_array_equal(got, value)
        assert receipts == [(("k", 1), first, value.nbytes)]
        return box.wire().result()
    finally:
        client.unregister_worker_plugin(_Plugin.name)


def test_a_postbox_on_a_tcp_cluster_answers_its_wire_and_a_post_crosses_it(dask_client):
    wire = _posts_between_workers(dask_client)
    assert isinstance(wire, WireAddress) and wire.host == "127.0.0.1"


def test_an_inproc_cluster_posts_through_the_actor():
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        assert cluster.scheduler_address.startswith("inproc://")
        assert _posts_between_workers(client) is None


def test_a_postbox_listens_on_tcp_hosts_it_owns_and_else_goes_through_its_actor():
    from dasknn.runtime.postbox import _wire_for

    inbox = _Inbox()
    wire = _wire_for(inbox, "tcp://127.0.0.1:8786")
    assert isinstance(wire, WireAddress) and wire.host == "127.0.0.1"
    assert _wire_for(inbox, "tls://127.0.0.1:8786") is None  # Dask's comm keeps the encryption
    assert _wire_for(inbox, "inproc://127.0.0.1/1/2") is None
    # a contact address that is not this host's (a worker behind a NAT): no socket can listen
    assert _wire_for(inbox, "tcp://203.0.113.7:8786") is None


def test_a_receive_buffer_is_reused_only_once_the_arrays_over_it_are_gone():
    pool = ReceiveBuffers(limit=4 * 2**20)
    value = np.arange(100_000, dtype=np.float64)
    buffers: list = []
    head = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    raw = np.frombuffer(buffers[0].raw(), dtype=np.uint8)
    first = pool.take(raw.nbytes)
    first[:] = raw
    received = pickle.loads(head, buffers=[first])
    del first
    held = pool.take(raw.nbytes)  # the message's array still refers to the first buffer
    assert not np.shares_memory(held, received)
    np.testing.assert_array_equal(received, value)
    del held, received
    again = pool.take(raw.nbytes)
    assert pool.nbytes == 2 * 2**20 and again.nbytes == raw.nbytes  # no third buffer
    small = pool.take(POOLED_MIN_BYTES - 1)  # below the pooled sizes: memory of its own
    assert small.nbytes == POOLED_MIN_BYTES - 1 and pool.nbytes == 2 * 2**20
    beyond = [pool.take(2**20) for _ in range(4)]  # held: the pool stops at its limit
    assert pool.nbytes <= pool.limit and all(b.nbytes == 2**20 for b in beyond)
