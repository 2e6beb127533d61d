"""fastcopy.net.Subscriber's queue (Zenoh's own channel) in one Zenoh session: payloads put in a
fixed order by a plain publisher of the same session, delivered at once, then received. Drop
mode keeps the newest payloads, counts every loss exactly, and never delivers a torn message;
block mode holds the publisher back and still closes; the wake-ups a waiting receive puts to
its session are never taken for messages."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from _net import needs_zenoh

pytestmark = [pytest.mark.net, needs_zenoh]

KEY = "fastcopy/test/queue"


@pytest.fixture
def session():
    import fastcopy.net as net

    s = net.open_session()
    yield s
    s.close()


def _raw(session):
    zenoh = __import__("zenoh")
    return session.declare_publisher(KEY, congestion_control=zenoh.CongestionControl.BLOCK)


def _put_all(raw, payloads) -> None:
    """Puts the payloads in order from another thread: a drop-mode channel takes them all at
    once, never holding the publisher back (bounded: 10 s)."""
    putter = threading.Thread(target=lambda: [raw.put(buf) for buf in payloads], daemon=True)
    putter.start()
    putter.join(10)
    assert not putter.is_alive(), "the subscriber's channel held the publisher back"


def _drain(sub):
    """(values of the messages received, messages counted lost)."""
    from fastcopy.shm import MessagesLost

    got, lost = [], 0
    while True:
        try:
            arr = sub.recv(timeout=0)
        except MessagesLost as exc:
            lost += exc.count
            continue
        except TimeoutError:
            return got, lost
        assert (arr == arr.flat[0]).all(), "torn message"
        got.append(int(arr.flat[0]))


def _started(session, raw, capacity: int):
    """A drop-mode subscriber that has received publisher 7's message 0 (its count starts there)."""
    from fastcopy.net import Subscriber
    from fastcopy.net._wire import encode_parts

    sub = Subscriber(KEY, session, capacity=capacity, overflow="drop")
    _put_all(raw, encode_parts(np.full(4, 0, np.int32), 0, 7))
    assert sub.recv(timeout=5).tolist() == [0] * 4
    return sub


@pytest.mark.parametrize("capacity", [4, 5, 8, 9])
def test_drop_mode_keeps_the_newest_payloads_and_counts_every_loss(session, capacity):
    """Messages of a head and three pieces, 20 of them, none read: the channel keeps the newest
    `capacity` payloads, so the newest message arrives whole (a capacity of at least its four
    payloads), earlier ones whole or not at all; received + lost == 20."""
    from fastcopy.net._wire import encode_parts

    raw = _raw(session)
    sub = _started(session, raw, capacity)
    n = 20
    parts = [list(encode_parts(np.full(400, k, np.int32), k, 7, 400)) for k in range(1, n + 1)]
    assert {len(p) for p in parts} == {4}
    _put_all(raw, [buf for p in parts for buf in p])
    got, lost = _drain(sub)
    assert got[-1] == n and got == sorted(got)
    assert len(got) == capacity // 4
    assert len(got) + lost == n and sub.lost == lost and sub.rejected == 0
    sub.close()
    raw.undeclare()


def test_drop_mode_a_begun_message_whose_pieces_were_dropped_is_counted_lost(session):
    """recv has taken a message's head and waits for its pieces; the channel then drops them
    for a newer message: the begun message is counted lost, the newer one arrives whole."""
    from fastcopy.net._wire import encode_parts

    raw = _raw(session)
    sub = _started(session, raw, 3)
    first = list(encode_parts(np.full(300, 1, np.int32), 1, 7, 400))   # head + 2 pieces
    second = list(encode_parts(np.full(300, 2, np.int32), 2, 7, 400))
    _put_all(raw, first[:1])
    with pytest.raises(TimeoutError):
        sub.recv(timeout=0)           # takes the head, waits for its pieces
    _put_all(raw, first[1:] + second)  # five payloads into a channel of three
    got, lost = _drain(sub)
    assert got == [2] and lost == 1 and sub.rejected == 0
    sub.close()
    raw.undeclare()


def test_block_mode_holds_the_publisher_back_and_close_does_not_wait_for_room(session):
    """A full channel in block mode holds the next put back until a receive takes a payload;
    close() with the channel full returns at once and releases the held put."""
    from fastcopy.net import Publisher, Subscriber

    sub = Subscriber(KEY, session, capacity=2)
    pub = Publisher(KEY, session)
    sent = []

    def publish():
        for k in range(4):
            pub.send(np.full(8, k, np.int16))
            sent.append(k)

    def sent_reaches(n: int) -> bool:
        deadline = time.monotonic() + 10
        while len(sent) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return len(sent) >= n

    writer = threading.Thread(target=publish, daemon=True)
    writer.start()
    assert sent_reaches(2)
    time.sleep(0.3)
    assert sent == [0, 1]                          # the third put waits for room
    assert sub.recv(timeout=5).tolist() == [0] * 8
    assert sent_reaches(3)
    time.sleep(0.3)
    assert sent == [0, 1, 2]
    closer = threading.Thread(target=sub.close, daemon=True)
    closer.start()
    closer.join(2)
    assert not closer.is_alive(), "close() waits for room in the full channel"
    writer.join(10)
    assert not writer.is_alive() and sent == [0, 1, 2, 3]
    pub.close()


def test_wake_ups_of_a_waiting_receive_are_not_messages_for_another_subscriber(session):
    """Two subscribers of one key in one session: one waits (its wake-ups go to the session),
    the other reads only the real messages, rejecting nothing; each gets every message."""
    from fastcopy.net import Publisher, Subscriber

    waiting = Subscriber(KEY, session)
    other = Subscriber(KEY, session)
    waiting.WAKE_EVERY = other.WAKE_EVERY = 0.02
    with pytest.raises(TimeoutError):
        waiting.recv(timeout=0.3)                  # about 15 wake-ups
    pub = Publisher(KEY, session)
    pub.send(np.arange(3))
    assert other.recv(timeout=5).tolist() == [0, 1, 2]
    assert waiting.recv(timeout=5).tolist() == [0, 1, 2]
    with pytest.raises(TimeoutError):
        other.recv(timeout=0.1)
    assert other.rejected == waiting.rejected == 0 and other.received == waiting.received == 1
    for s in (waiting, other, pub):
        s.close()


def test_a_timeout_shorter_than_the_set_wake_up_ends_on_time(session):
    """A wait without a timeout sets the next wake-up WAKE_EVERY away (5 s here) and ends with a
    message; a recv(timeout=0.2) right after times out after 0.2 s, not at that wake-up."""
    from fastcopy.net import Publisher, Subscriber

    sub = Subscriber(KEY, session)
    sub.WAKE_EVERY = 5.0
    pub = Publisher(KEY, session)
    threading.Timer(0.2, lambda: pub.send(np.arange(2))).start()
    assert sub.recv().tolist() == [0, 1]
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        sub.recv(timeout=0.2)
    assert 0.2 <= time.monotonic() - t0 < 2
    sub.close()
    pub.close()


def test_close_returns_after_the_wake_up_thread_has_ended(session):
    """close() waits for a wake-up that is running (its put may be inside Zenoh): a thread that
    takes the GIL back from Zenoh's code while the interpreter finalizes aborts the process.
    The wake-up here is held for 0.3 s once it has started."""
    import fastcopy.net as net

    sub = net.Subscriber(KEY, session)
    with pytest.raises(TimeoutError):
        sub.recv(timeout=0.05)  # starts the alarm thread
    alarm = sub._alarm
    assert alarm is not None
    started = threading.Event()
    real_wake = alarm._wake

    def slow_wake():
        started.set()
        time.sleep(0.3)
        real_wake()

    alarm._wake = slow_wake
    alarm.set(time.monotonic())
    assert started.wait(5), "the alarm did not fire"
    t0 = time.monotonic()
    sub.close()
    assert not alarm._thread.is_alive(), "close() returned while its wake-up thread still ran"
    assert time.monotonic() - t0 >= 0.2  # it waited for the wake-up


def test_every_kind_of_payload_after_whole_messages_reads_as_the_waiting_path_reads_it(session):
    """Whole messages of a known publisher and dtype are read in one step; each other kind of
    payload queued among them (a new publisher, a new dtype, a message in pieces, a gap, a
    corrupt payload, a stale wake-up) is read, checked and counted as the waiting path does, in
    order, with nothing skipped."""
    from fastcopy.net import _WAKE_MARK, Subscriber, WireError
    from fastcopy.net._wire import encode_parts
    from fastcopy.shm import MessagesLost

    sub = Subscriber(KEY, session, capacity=64)
    raw = _raw(session)
    i4 = lambda k: np.full(4, k, np.int32)  # noqa: E731
    payloads = [
        *encode_parts(i4(0), 0, 7),                       # publisher 7's first message
        *encode_parts(i4(1), 1, 7),                       # whole, known: one step
        *encode_parts(np.full(3, 2, ">u2"), 2, 7),        # a dtype this process has not read yet
        *encode_parts(np.full(300, 3, np.int32), 3, 7, 400),  # a head and two pieces
        *encode_parts(i4(5), 5, 7),                       # message 4 lost
        b"not a fastcopy.net payload",
        *encode_parts(i4(6), 0, 8),                       # another publisher's first message
        *encode_parts(i4(7), 6, 7),
    ]
    _put_all(raw, payloads)
    session.put(KEY, b"", attachment=_WAKE_MARK)  # a wake-up left in the queue: skipped
    _put_all(raw, encode_parts(i4(8), 7, 7))
    got = []
    for _ in range(10):
        try:
            arr = sub.recv_view(timeout=5)
        except MessagesLost as exc:
            got.append(("lost", exc.count))
            continue
        except WireError:
            got.append(("rejected",))
            continue
        got.append((arr.dtype.str, int(arr.flat[0]), arr.size))
    assert got == [("<i4", 0, 4), ("<i4", 1, 4), (">u2", 2, 3), ("<i4", 3, 300), ("lost", 1), ("<i4", 5, 4),
                   ("rejected",), ("<i4", 6, 4), ("<i4", 7, 4), ("<i4", 8, 4)]
    with pytest.raises(TimeoutError):
        sub.recv(timeout=0.1)
    assert (sub.received, sub.lost, sub.rejected) == (8, 1, 1)
    sub.close()
    raw.undeclare()
