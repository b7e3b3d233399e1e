"""The mailbox of posted messages (:mod:`dasknn.runtime.postbox`): a task waits for a message
that another thread delivers, a sender's failure ends the wait with the sender's error, and a
message that never comes is a ``TimeoutError`` naming it."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dasknn.runtime.postbox import Mailbox, StepFailed


def test_take_waits_for_a_message_delivered_by_another_thread():
    box = Mailbox()
    value = np.arange(6.0)
    timer = threading.Timer(0.05, box.deliver, args=(("m", 1), value))
    timer.start()
    started = time.perf_counter()
    got = box.take(("m", 1), failed=("failed", 1), timeout=5)
    assert got is value and time.perf_counter() - started >= 0.04
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
