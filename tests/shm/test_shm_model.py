"""A Channel against a model: random sequences of every call of both ends in one process.

Hypothesis drives a producer end and a consumer end of one 64 KiB channel through random
mixes of ``send`` (messages that fit, and messages larger than the ring, which no one receives
at the same time here, so they time out half way and are cut, or time out with nothing sent),
``loan`` with ``publish``, ``discard``, an exception in the ``with`` block or the loan dropped,
``recv``, ``recv(out=)``, ``recv_view`` (views kept a while and released in any order),
``peek``. The model is a FIFO of the messages whose call returned; the channel must hand them
out whole, in order, with dtype and shape, and nothing else: a call that raised
``TimeoutError`` or ``ChannelError`` delivered nothing. Every view must keep its bytes until it
is released, however the ring wraps, pads, cuts and reuses memory meanwhile.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Deque, List, Tuple

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from _models import MODEL_SETTINGS, LoanEnding, message, same
from fastcopy.shm import Channel, ChannelError

pytestmark = pytest.mark.sanitize

CAPACITY = 1 << 16
# Sizes that fit the ring with room for several (up to a third, always in one piece of it; the
# large ones fill the ring within a few steps, so that messages meet its end and wrap), and
# sizes larger than the ring.
SMALL = st.one_of(st.integers(0, 512), st.integers(CAPACITY // 8, CAPACITY // 3))
LARGE = st.integers(min_value=CAPACITY + 4096, max_value=3 * CAPACITY)


class ChannelModel(LoanEnding, RuleBasedStateMachine):
    capacity = CAPACITY

    def __init__(self) -> None:
        super().__init__()
        self.tx = Channel.create(capacity=self.capacity)
        self.rx = Channel.attach(self.tx.name)
        self.producer = self.tx
        self.expected: Deque[np.ndarray] = deque()  # sent (call returned), not received yet
        self.views: List[Tuple[np.ndarray, bytes]] = []  # held views and the bytes they showed
        self.loaned: Any = None  # the outstanding loan and what was written into it
        self.loaned_data: Any = None

    def delivered(self, msg: np.ndarray) -> None:
        self.expected.append(msg)

    @initialize()
    def start(self) -> None:
        assert self.rx.peek(timeout=0) is None

    # ---- producer ------------------------------------------------------------------------------
    @precondition(lambda self: self.loaned is None)
    @rule(data=st.data(), nbytes=SMALL)
    def send(self, data: Any, nbytes: int) -> None:
        msg = message(data, nbytes)
        try:
            self.tx.send(msg, timeout=0)
        except TimeoutError:
            return  # no room (views held, messages unread): nothing sent
        self.expected.append(msg)

    @precondition(lambda self: self.loaned is None)
    @rule(data=st.data(), nbytes=LARGE)
    def send_larger_than_the_ring(self, data: Any, nbytes: int) -> None:
        # No one receives while this waits for room, so it always times out: cut half way
        # (the consumer skips the part written) or with nothing sent.
        with pytest.raises(TimeoutError):
            self.tx.send(message(data, nbytes), timeout=0.002)

    @precondition(lambda self: self.loaned is None)
    @rule(data=st.data(), nbytes=SMALL)
    def loan(self, data: Any, nbytes: int) -> None:
        msg = message(data, nbytes)
        try:
            arr = self.tx.loan(msg.shape, msg.dtype, timeout=0)
        except TimeoutError:
            return
        assert arr.shape == msg.shape and arr.dtype == msg.dtype and arr.flags.writeable
        arr[...] = msg
        self.loaned, self.loaned_data = arr, msg

    @precondition(lambda self: self.loaned is None)
    @rule(data=st.data(), nbytes=SMALL, how=st.sampled_from(["leave", "publish inside", "raise"]))
    def loan_in_a_with_block(self, data: Any, nbytes: int, how: str) -> None:
        # Leaving the block publishes; an exception in it discards; a publish inside it is the
        # only one.
        msg = message(data, nbytes)
        try:
            with self.tx.loan(msg.shape, msg.dtype, timeout=0) as arr:
                arr[...] = msg
                if how == "publish inside":
                    self.tx.publish(arr)
                elif how == "raise":
                    raise KeyError("the producer failed")
        except TimeoutError:
            return
        except KeyError:
            return
        self.expected.append(msg)

    @precondition(lambda self: self.loaned is not None)
    @rule(data=st.data())
    def send_while_a_loan_is_outstanding(self, data: Any) -> None:
        with pytest.raises(ChannelError):
            self.tx.send(message(data, 64), timeout=0)

    # ---- consumer ------------------------------------------------------------------------------
    @rule(into=st.sampled_from(["new", "out"]))
    def recv(self, into: str) -> None:
        if not self.expected:
            with pytest.raises(TimeoutError):
                self.rx.recv(timeout=0)
            return
        want = self.expected.popleft()
        if into == "out":
            out = np.empty(want.shape, want.dtype)
            out.reshape(-1).view(np.uint8)[:] = 0xAB  # every byte must be overwritten
            got = self.rx.recv(out=out, timeout=0)
            assert got is out
        else:
            got = self.rx.recv(timeout=0)
        assert same(got, want)

    @precondition(lambda self: len(self.views) < 6)
    @rule()
    def recv_view(self) -> None:
        if not self.expected:
            with pytest.raises(TimeoutError):
                self.rx.recv_view(timeout=0)
            return
        want = self.expected.popleft()
        view = self.rx.recv_view(timeout=0)
        assert same(view, want) and not view.flags.writeable
        self.views.append((view, want.tobytes()))

    @precondition(lambda self: bool(self.views))
    @rule(data=st.data())
    def release_a_view(self, data: Any) -> None:
        i = data.draw(st.integers(0, len(self.views) - 1))
        view, seen = self.views.pop(i)
        assert view.tobytes() == seen  # unchanged while held
        del view

    @rule()
    def peek(self) -> None:
        got = self.rx.peek(timeout=0)
        if not self.expected:
            assert got is None
        else:
            assert got is not None
            dtype, shape = got
            assert np.dtype(dtype) == self.expected[0].dtype and tuple(shape) == self.expected[0].shape

    # ---- always --------------------------------------------------------------------------------
    @invariant()
    def views_keep_their_bytes(self) -> None:
        for view, seen in self.views:
            assert view.tobytes() == seen
        assert self.rx.held_views == len(self.views)

    def teardown(self) -> None:
        self.views.clear()
        self.loaned = None
        try:
            while self.expected:  # every message still in the channel comes out, in order
                assert same(self.rx.recv(timeout=0), self.expected.popleft())
            with pytest.raises(TimeoutError):
                self.rx.recv(timeout=0)
        finally:
            self.rx.close()
            self.tx.close()
            self.tx.unlink()


class ChannelModelOddQuarter(ChannelModel):
    """A ring whose quarter (the streamed chunk) is not a multiple of 64 bytes."""
    capacity = CAPACITY + 64


ChannelModel.TestCase.settings = MODEL_SETTINGS
ChannelModelOddQuarter.TestCase.settings = MODEL_SETTINGS
test_channel_against_a_fifo_model = ChannelModel.TestCase
test_channel_with_an_odd_quarter_against_a_fifo_model = ChannelModelOddQuarter.TestCase
