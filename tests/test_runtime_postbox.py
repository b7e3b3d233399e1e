"""The mailbox of posted messages (:mod:`dasknn.runtime.postbox`): a task waits for a message
that another thread delivers, a sender's failure ends the wait with the sender's error, and a
message that never comes is a ``TimeoutError`` naming it; jobs queued by the task thread run
while its message is missing, and clearing the mailbox ends the waits under way (or, given the
count of clears they start from, the waits begun after it); closing it ends those and every
later wait. The transfer reports held for the
task are taken once, in order, and a clear keeps them; an envelope gives back the key and the
sender it packed."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import numpy as np
import pytest
from polling import HANG_GUARD

from dasknn.runtime.postbox import Mailbox, StepFailed, open_envelope, pack_envelope


def test_take_waits_for_a_message_delivered_by_another_thread():
    box = Mailbox()
    value = np.arange(6.0)
    timer = threading.Timer(0.05, box.deliver, args=(("m", 1), value))
    timer.start()
    got = box.take(("m", 1), failed=("failed", 1), timeout=30)
    assert got is value  # only the timer's thread delivers it
    assert len(box) == 0
    timer.join()


def test_a_posted_failure_ends_the_wait_with_the_sender_s_error_until_dropped():
    box = Mailbox()
    box.deliver(("failed", 2), StepFailed(FloatingPointError("step 2: the loss is nan")))
    for _ in range(2):  # every later wait of the step raises it too
        with pytest.raises(FloatingPointError, match="step 2: the loss is nan"):
            box.take(("m", 2), failed=("failed", 2), timeout=5)
    box.deliver(("m", 3), np.zeros(2))
    assert box.drop(lambda key: key[1] >= 3) == 1
    assert len(box) == 1 and box.take(("m", 3), failed=("failed", 3)).shape == (2,)


def test_a_message_that_never_comes_is_a_timeout_naming_it():
    box = Mailbox()
    box.deliver(("m", 4), np.zeros(1))
    with pytest.raises(TimeoutError, match=r"no message \('m', 5\) arrived within 0.05 s"):
        box.take(("m", 5), failed=("failed", 5), timeout=0.05)


def test_queued_jobs_run_while_the_message_is_missing_until_a_failure_arrives():
    box = Mailbox()
    ran: list[str] = []
    box.queue_idle(ran.append, "first")
    box.queue_idle(box.deliver, ("failed", 6), StepFailed(ValueError("stage 1 failed")))
    box.queue_idle(ran.append, "left")
    with pytest.raises(ValueError, match="stage 1 failed"):
        box.take(("m", 6), failed=("failed", 6), timeout=5)
    assert ran == ["first"]  # the failure ended the idle work: the last job stays queued
    box.run_idle()
    assert ran == ["first", "left"]


class _AskedFuture(Future):
    """A future that sets ``asked`` when its result is first waited for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = threading.Event()

    def result(self, timeout=None):
        self.asked.set()
        return super().result(timeout)


def test_clear_ends_the_waits_under_way_and_forgets_messages_and_jobs():
    box = Mailbox()
    box.deliver(("m", 7), np.zeros(1))
    box.queue_idle(pytest.fail, "a job queued before clear ran")
    box.clear()
    assert len(box) == 0
    box.run_idle()  # the job queued before clear is gone
    errors: list[BaseException] = []

    def wait(call):
        try:
            call()
        except BaseException as error:  # the waits end in their own threads
            errors.append(error)

    taking = threading.Event()  # set by a job the take runs once it counts its clears
    box.queue_idle(taking.set)
    pending = _AskedFuture()  # a post that is never delivered
    waits = [
        threading.Thread(target=wait, args=(lambda: box.take(("m", 8), timeout=30),)),
        threading.Thread(target=wait, args=(lambda: box.wait_posted([pending], poll=0.02),)),
    ]
    for thread in waits:
        thread.start()
    assert taking.wait(HANG_GUARD) and pending.asked.wait(HANG_GUARD)  # both waits under way
    box.clear()
    for thread in waits:
        thread.join(HANG_GUARD)
    assert sorted(str(error) for error in errors) == [
        "the steps in flight were dropped while a post was under way",
        "the steps in flight were dropped while waiting for ('m', 8)",
    ]
    assert all(isinstance(error, RuntimeError) for error in errors)
    done = Future()
    done.set_result(None)
    box.wait_posted([done])  # a later wait is not ended by the earlier clear
    box.deliver(("m", 9), np.ones(1))
    assert box.take(("m", 9), timeout=5).tolist() == [1.0]


def test_a_clear_since_a_waits_start_count_ends_it_even_before_it_began():
    box = Mailbox()
    since = box.clears
    box.clear()  # the step was dropped before its task reached the waits
    assert box.clears == since + 1
    box.deliver(("m", 10), np.ones(1))
    # ended at once, not after the 30 s timeout (a TimeoutError) nor never (the pending post)
    with pytest.raises(RuntimeError, match=r"dropped while waiting for \('m', 11\)"):
        box.take(("m", 11), timeout=30, since=since)
    with pytest.raises(RuntimeError, match="dropped while a post was under way"):
        box.wait_posted([Future()], poll=0.02, since=since)
    later = box.clears  # a wait counted from after the clear is not ended by it
    assert box.take(("m", 10), timeout=5, since=later).tolist() == [1.0]


def test_held_receipts_are_taken_once_in_order_and_survive_a_clear():
    box = Mailbox()
    box.hold_receipt(("m", 1), "tcp://a", 48)
    worker = threading.Thread(target=box.hold_receipt, args=(("m", 2), "tcp://b", np.int64(8)))
    worker.start()
    worker.join()
    box.clear()  # the bytes were moved: their reports stay
    receipts = box.take_receipts()
    assert receipts == [(("m", 1), "tcp://a", 48), (("m", 2), "tcp://b", 8)]
    assert all(type(nbytes) is int for _, _, nbytes in receipts)  # msgpack-able
    assert box.take_receipts() == []


def test_an_envelope_gives_back_the_key_and_the_sender_it_packed():
    key = ("dp-token", np.int64(3), "sparse", "push", 1, 2, -1)
    envelope = pack_envelope(key, "tcp://127.0.0.1:4321")
    assert type(envelope) is bytes  # sent by Dask as it is, one frame
    opened, sender = open_envelope(envelope)
    assert opened == key and hash(opened) == hash(key) and sender == "tcp://127.0.0.1:4321"
    assert [type(part) for part in opened] == [type(part) for part in key]


def test_closing_ends_the_waits_under_way_and_every_later_one():
    box = Mailbox()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            box.take(("m", 9), failed=("failed", 9), timeout=HANG_GUARD)
        except RuntimeError as error:
            errors.append(error)

    taking = threading.Event()  # set by a job the take runs once it counts its clears
    box.queue_idle(taking.set)
    waiting = threading.Thread(target=wait)
    waiting.start()
    assert taking.wait(HANG_GUARD)
    box.close()
    waiting.join(HANG_GUARD)
    assert not waiting.is_alive() and "closed while waiting for ('m', 9)" in str(errors[0])
    since = box.clears  # a task that took its count after the close waits no more
    with pytest.raises(RuntimeError, match=r"closed while waiting for \('m', 10\)"):
        box.take(("m", 10), failed=("failed", 10), timeout=HANG_GUARD, since=since)
    never: Future = Future()
    with pytest.raises(RuntimeError, match="dropped while a post was under way"):
        box.wait_posted([never], poll=0.01, since=since)
