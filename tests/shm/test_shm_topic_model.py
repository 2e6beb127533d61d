"""A Topic against a model: random sequences of every call of the publisher and its subscribers.

Hypothesis drives one publisher and up to three subscribers of one topic, in one process,
through random mixes of ``send`` (messages that fit, and messages larger than a slot, which are
refused), ``loan`` ended by ``publish``, ``discard``, dropping it or a ``with`` block (left,
published inside, or left by an exception), subscribers that join late (with the topic's
``history``), ``recv``, ``recv(out=)`` (also into an ``out`` of the wrong size, which is
refused and leaves the message in the topic), ``recv_view`` (views kept a while and released in
any order, also after their subscriber closed), and subscribers that close. The model is the
list of published messages, one cursor per subscriber, and the views held; from them it
predicts every outcome:

* a send or loan waits (here: ``TimeoutError`` at once, nothing sent) exactly when the slot it
  needs holds a message that an open subscriber has not read (``overflow="block"``) or that a
  view holds (both modes);
* a late joiner starts with the last ``history`` messages, never with one whose slot may be
  being rewritten;
* in ``overflow="drop"`` a subscriber that fell behind gets ``MessagesLost`` with exactly the
  count of messages overwritten (also the one whose slot a pending or discarded loan took), and
  then the oldest message still intact; every message is received or counted exactly once;
* every view keeps its bytes until it is released; ``published``, ``subscribers``,
  ``position``, ``lost``, ``held_views`` and ``held_bytes`` match;
* after the publisher closes, each subscriber gets what is left, then ``ChannelClosed``.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np
import pytest
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from _models import MODEL_SETTINGS, LoanEnding, message, same
from fastcopy.shm import ChannelClosed, ChannelError, MessagesLost, Topic

pytestmark = pytest.mark.sanitize

SLOT_BYTES = 4096
SIZES = st.one_of(st.integers(0, 256), st.integers(SLOT_BYTES // 2, SLOT_BYTES))
MAX_VIEWS = 6


class SubscriberModel:
    """One open subscriber: the object, the next message it reads, what it lost, its views."""

    def __init__(self, sub: Any, cursor: int) -> None:
        self.sub = sub
        self.cursor = cursor
        self.lost = 0
        self.views: List[Tuple[np.ndarray, bytes, int]] = []  # view, its bytes, message number


class TopicModel(LoanEnding, RuleBasedStateMachine):
    slots = 4
    history = 2
    overflow = "block"
    max_subscribers = 3

    def __init__(self) -> None:
        super().__init__()
        self.pub = Topic.create(slot_bytes=SLOT_BYTES, slots=self.slots, history=self.history,
                                overflow=self.overflow, max_subscribers=self.max_subscribers)
        self.producer = self.pub
        self.sent: List[np.ndarray] = []  # message k is sent[k]
        # The publisher marks the slot of the next message when a loan takes it, and the mark
        # stays when the loan is discarded: the message that slot held is given up.
        self.next_slot_taken = False
        self.subs: List[SubscriberModel] = []
        # Subscribers closed while they held views: their views still pin slots (and keep the
        # subscriber's record until the last one is released).
        self.closed_with_views: List[List[Tuple[np.ndarray, bytes, int]]] = []
        self.loaned: Any = None
        self.loaned_data: Any = None
        self.tearing_down = False

    @initialize()
    def first_subscriber(self) -> None:
        self.subscribe()

    def note_event(self, what: str) -> None:
        """Counts `what` for --hypothesis-show-statistics; not in teardown, where Hypothesis
        6.67 (Debian's, under qemu) has closed the example and fails on it."""
        if not self.tearing_down:
            event(what)

    # ---- what the model predicts ---------------------------------------------------------------
    def all_views(self) -> List[Tuple[np.ndarray, bytes, int]]:
        views = [v for s in self.subs for v in s.views]
        for group in self.closed_with_views:
            views.extend(group)
        return views

    def slot_is_free(self) -> bool:
        """Whether the publisher may write message `head` now (else it waits)."""
        k = len(self.sent)
        if k < self.slots:
            return True
        old = k - self.slots  # the message in that slot
        if any(number <= old for _, _, number in self.all_views()):
            return False
        return self.overflow == "drop" or all(s.cursor > old for s in self.subs)

    def overwritten(self, cursor: int) -> bool:
        head = len(self.sent)
        return cursor + self.slots < head or (self.next_slot_taken and cursor + self.slots == head)

    def records_in_use(self) -> int:
        return len(self.subs) + len(self.closed_with_views)

    # ---- publisher -----------------------------------------------------------------------------
    def delivered(self, msg: np.ndarray) -> None:
        self.sent.append(msg)
        self.next_slot_taken = False

    @precondition(lambda self: self.loaned is None)
    @rule(data=st.data(), nbytes=SIZES)
    def send(self, data: Any, nbytes: int) -> None:
        msg = message(data, nbytes)
        if not self.slot_is_free():
            self.note_event("a send waits for its slot")
            with pytest.raises(TimeoutError):
                self.pub.send(msg, timeout=0)
            return
        self.pub.send(msg, timeout=0)
        self.delivered(msg)

    @rule(data=st.data(), nbytes=st.integers(SLOT_BYTES + 16, 2 * SLOT_BYTES))
    def send_larger_than_a_slot(self, data: Any, nbytes: int) -> None:
        msg = message(data, nbytes)  # a whole number of items: still more than SLOT_BYTES
        with pytest.raises(ValueError, match="slot_bytes"):
            self.pub.send(msg, timeout=0)

    @precondition(lambda self: self.loaned is None)
    @rule(data=st.data(), nbytes=SIZES)
    def loan(self, data: Any, nbytes: int) -> None:
        msg = message(data, nbytes)
        if not self.slot_is_free():
            with pytest.raises(TimeoutError):
                self.pub.loan(msg.shape, msg.dtype, timeout=0)
            return
        arr = self.pub.loan(msg.shape, msg.dtype, timeout=0)
        self.next_slot_taken = True
        assert arr.shape == msg.shape and arr.dtype == msg.dtype and arr.flags.writeable
        arr[...] = msg
        self.loaned, self.loaned_data = arr, msg

    @precondition(lambda self: self.loaned is None)
    @rule(data=st.data(), nbytes=SIZES, how=st.sampled_from(["leave", "publish inside", "raise"]))
    def loan_in_a_with_block(self, data: Any, nbytes: int, how: str) -> None:
        msg = message(data, nbytes)
        if not self.slot_is_free():
            with pytest.raises(TimeoutError):
                self.pub.loan(msg.shape, msg.dtype, timeout=0)
            return
        try:
            with self.pub.loan(msg.shape, msg.dtype, timeout=0) as arr:
                self.next_slot_taken = True
                arr[...] = msg
                if how == "publish inside":
                    self.pub.publish(arr)
                elif how == "raise":
                    raise KeyError("the publisher failed")
        except KeyError:
            return
        self.delivered(msg)

    @precondition(lambda self: self.loaned is not None)
    @rule(data=st.data())
    def send_or_loan_while_a_loan_is_outstanding(self, data: Any) -> None:
        with pytest.raises(ChannelError, match="outstanding"):
            self.pub.send(message(data, 64), timeout=0)
        with pytest.raises(ChannelError, match="outstanding"):
            self.pub.loan(8, timeout=0)

    # ---- subscribers ---------------------------------------------------------------------------
    @rule()
    def subscribe(self) -> None:
        if self.records_in_use() >= self.max_subscribers:
            self.note_event("a subscriber is refused: every record is in use")
            with pytest.raises(ChannelError, match="subscribers"):
                Topic.subscribe(self.pub.name)
            return
        head = len(self.sent)
        start = max(head - self.history, head - (self.slots - 1), 0)
        if start < head:
            self.note_event("a late joiner starts with history")
        sub = Topic.subscribe(self.pub.name)
        assert sub.position == start and sub.lost == 0
        self.subs.append(SubscriberModel(sub, start))

    def receive(self, s: SubscriberModel, how: str) -> Tuple[Optional[np.ndarray], int]:
        """Receives with `how` where the model expects a message; returns it (or None for a
        timeout or a loss, both checked) and the number it should be."""
        c = s.cursor
        if c == len(self.sent):
            with pytest.raises(TimeoutError):
                self.call(s, how, None)
            return None, c
        if self.overflow == "drop" and self.overwritten(c):
            skip = max(c + 1, len(self.sent) - self.slots) - c
            with pytest.raises(MessagesLost) as lost:
                self.call(s, how, self.sent[c])
            assert lost.value.count == skip
            self.note_event(f"MessagesLost({min(skip, 3)}{'+' if skip > 3 else ''})")
            if c + self.slots == len(self.sent):
                self.note_event("MessagesLost: the slot was taken by a loan (pending or discarded)")
            s.cursor += skip
            s.lost += skip
            return None, c
        got = self.call(s, how, self.sent[c])
        s.cursor += 1
        return got, c

    @staticmethod
    def call(s: SubscriberModel, how: str, want: Optional[np.ndarray]) -> np.ndarray:
        if how == "view":
            return s.sub.recv_view(timeout=0)
        if how == "out":
            shape, dtype = (want.shape, want.dtype) if want is not None else ((1,), np.uint8)
            out = np.empty(shape, dtype)
            out.reshape(-1).view(np.uint8)[:] = 0xAB  # every byte must be overwritten
            got = s.sub.recv(out=out, timeout=0)
            assert got is out
            return got
        return s.sub.recv(timeout=0)

    @precondition(lambda self: bool(self.subs))
    @rule(data=st.data(), how=st.sampled_from(["new", "out"]))
    def recv(self, data: Any, how: str) -> None:
        s = self.subs[data.draw(st.integers(0, len(self.subs) - 1))]
        got, number = self.receive(s, how)
        if got is not None:
            assert same(got, self.sent[number])

    @precondition(lambda self: bool(self.subs))
    @rule(data=st.data())
    def recv_into_an_out_of_the_wrong_size(self, data: Any) -> None:
        # Refused with ValueError, `out` untouched, and the message stays for the next recv
        # (unless it was lost or there is none: then as any recv).
        s = self.subs[data.draw(st.integers(0, len(self.subs) - 1))]
        c = s.cursor
        if c == len(self.sent) or (self.overflow == "drop" and self.overwritten(c)):
            self.receive(s, "out")
            return
        out = np.full(self.sent[c].nbytes + 8, 0xCD, np.uint8)
        with pytest.raises(ValueError, match="stays in the topic"):
            s.sub.recv(out=out, timeout=0)
        assert (out == 0xCD).all() and s.sub.position == c

    @precondition(lambda self: bool(self.subs) and len(self.all_views()) < MAX_VIEWS)
    @rule(data=st.data())
    def recv_view(self, data: Any) -> None:
        s = self.subs[data.draw(st.integers(0, len(self.subs) - 1))]
        view, number = self.receive(s, "view")
        if view is not None:
            assert same(view, self.sent[number]) and not view.flags.writeable
            s.views.append((view, self.sent[number].tobytes(), number))

    @precondition(lambda self: bool(self.all_views()))
    @rule(data=st.data())
    def release_a_view(self, data: Any) -> None:
        # Indices are drawn, never the views: Hypothesis's printer may keep what it draws (it
        # did under qemu-aarch64, with Debian's Hypothesis), and a view it keeps stays pinned.
        groups = [s.views for s in self.subs if s.views] + self.closed_with_views
        group = groups[data.draw(st.integers(0, len(groups) - 1))]
        view, seen, _ = group.pop(data.draw(st.integers(0, len(group) - 1)))
        assert view.tobytes() == seen  # unchanged while held
        del view
        # A closed subscriber's record is free once its last view is gone.
        self.closed_with_views = [g for g in self.closed_with_views if g]

    @precondition(lambda self: bool(self.subs))
    @rule(data=st.data())
    def close_a_subscriber(self, data: Any) -> None:
        s = self.subs.pop(data.draw(st.integers(0, len(self.subs) - 1)))
        s.sub.close()
        if s.views:
            self.note_event("views outlive their subscriber")
            self.closed_with_views.append(s.views)
        with pytest.raises(ValueError):
            s.sub.recv(timeout=0)

    # ---- always --------------------------------------------------------------------------------
    @invariant()
    def counters_and_views_match(self) -> None:
        assert self.pub.published == len(self.sent)
        assert self.pub.subscribers == len(self.subs)
        for s in self.subs:
            assert s.sub.position == s.cursor and s.sub.lost == s.lost
            assert s.sub.held_views == len(s.views)
            assert s.sub.held_bytes == sum(self.sent[n].nbytes for _, _, n in s.views)
        for view, seen, _ in self.all_views():
            assert view.tobytes() == seen

    def teardown(self) -> None:
        self.tearing_down = True
        self.loaned = None
        try:
            self.pub.close()
            for s in self.subs:  # each gets what is left (or counts it lost), then ChannelClosed
                while s.cursor < len(self.sent):
                    got, number = self.receive(s, "new")
                    if got is not None:
                        assert same(got, self.sent[number])
                with pytest.raises(ChannelClosed):
                    s.sub.recv(timeout=0)
        finally:
            for s in self.subs:
                s.views.clear()
                s.sub.close()
            self.closed_with_views.clear()
            self.pub.unlink()


class TopicModelDrop(TopicModel):
    """overflow="drop", three slots and the deepest history they allow: subscribers fall behind soon."""
    overflow = "drop"
    slots = 3
    history = 2


class TopicModelBlockNoHistory(TopicModel):
    """overflow="block" with two slots and no history: late joiners start at the next message."""
    slots = 2
    history = 0


for _model in (TopicModel, TopicModelDrop, TopicModelBlockNoHistory):
    _model.TestCase.settings = MODEL_SETTINGS
test_topic_against_a_model = TopicModel.TestCase
test_topic_in_drop_mode_against_a_model = TopicModelDrop.TestCase
test_topic_with_two_slots_and_no_history_against_a_model = TopicModelBlockNoHistory.TestCase
