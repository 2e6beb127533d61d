"""fastcopy.shm.Channel under corrupted headers, in one process: the shared header changed after
both ends used it (cached indices), and each check of a message header (the first message starts
the ring). Each corruption is refused with ChannelCorrupted, never a crash or a read out of bounds."""

from __future__ import annotations

import mmap
import os
import sys
import threading
import time

import numpy as np
import pytest

from _child import leftovers_fixture, name_maker
from _shm_layout import CHANNEL, MESSAGE, at, channel_header, off, poke
from _fixtures import pair  # noqa: F401  (a fixture)

from fastcopy import _core
from fastcopy.shm import Channel, ChannelCorrupted, ChannelError

pytestmark = pytest.mark.sanitize

PREFIX = f"fctest-{os.getpid()}-"


no_leftover_segments = leftovers_fixture(PREFIX, fail=True)
new_name = name_maker(PREFIX)


DTYPES = [np.uint8, np.int16, ">i4", np.float32, "<f8", np.complex128, np.bool_, "M8[ns]", "S5", "U3",
          np.dtype([("a", "<i4"), ("b", ">f8", (2,))]), np.dtype([("x", "u1"), ("y", "<u4")], align=True)]
SHAPES = [(), (0,), (1,), (7,), (3, 4), (2, 0, 3), (2, 3, 5)]


# ---- header corruption after both ends have sent and received (cached indices in use) -------

HEAD, TAIL = off(CHANNEL, "head"), off(CHANNEL, "tail")


def open_segment(name):
    fd = os.open("/dev/shm/" + name, os.O_RDWR)
    try:
        return mmap.mmap(fd, 0)
    finally:
        os.close(fd)


def u64(m, off):
    return int.from_bytes(m[off:off + 8], sys.byteorder)


def set_u64(m, off, value):
    _core.shm_store_release_u64(m, off, value % 2**64)


def set_u32(m, off, value):
    _core.shm_store_release_u32(m, off, value % 2**32)


def expect_corrupt(fn, match):
    """fn() raises ChannelCorrupted naming `match`; the end stays unusable (ChannelCorrupted again)."""
    with pytest.raises(ChannelCorrupted, match=match):
        fn()
    with pytest.raises(ChannelCorrupted, match="broken"):
        fn()


@pytest.fixture
def used_pair(pair):
    """A pair after one message went through: both ends have claimed their role and cache indices."""
    tx, rx = pair
    tx.send(np.arange(10))
    assert np.array_equal(rx.recv(timeout=5), np.arange(10))
    m = open_segment(tx.name)
    yield tx, rx, m
    m.close()


@pytest.mark.parametrize("value", [2**60, "behind_tail", "beyond_capacity"])
def test_head_corrupted_after_first_recv(used_pair, value):
    tx, rx, m = used_pair
    tx.send(np.arange(5))  # a valid message is pending: a head that is not checked would deliver it
    tail = u64(m, TAIL)
    head = {2**60: 2**60, "behind_tail": tail - 64, "beyond_capacity": tail + (1 << 16) + 64}[value]
    set_u64(m, HEAD, head)
    expect_corrupt(lambda: rx.recv(timeout=0), "head index")


def test_head_moved_under_the_producer(used_pair):
    tx, rx, m = used_pair
    set_u64(m, HEAD, u64(m, HEAD) + 64)  # only the producer writes head
    expect_corrupt(lambda: tx.send(b"x", timeout=0), "head index changed")


def test_tail_moved_under_the_consumer(used_pair):
    tx, rx, m = used_pair
    tx.send(np.arange(5))
    set_u64(m, TAIL, u64(m, TAIL) - 64)  # only the consumer writes tail
    expect_corrupt(lambda: rx.recv(timeout=0), "tail index changed")


@pytest.mark.parametrize("how", ["beyond_head", "backwards"])
def test_tail_corrupted_after_first_send(used_pair, how):
    tx, rx, m = used_pair
    a = np.zeros(20000, np.uint8)
    with pytest.raises(TimeoutError):  # fills the ring; the last send read the real tail
        for _ in range(10):
            tx.send(a, timeout=0)
    tail = u64(m, TAIL)
    set_u64(m, TAIL, 2**60 if how == "beyond_head" else tail - 64)
    expect_corrupt(lambda: tx.send(a, timeout=0), "tail index")


@pytest.mark.parametrize("field,value", [
    ("magic", 0x1234), ("version", 99), ("header_bytes", 8192), ("capacity", 1 << 17),
])
def test_shared_header_changed_after_first_use(used_pair, field, value):
    tx, rx, m = used_pair
    tx.send(np.arange(3))
    offset, size = CHANNEL["fields"][field]
    (set_u64 if size == 8 else set_u32)(m, offset, value)
    expect_corrupt(lambda: rx.recv(timeout=0), "magic, version or capacity")
    expect_corrupt(lambda: tx.send(b"x", timeout=0), "magic, version or capacity")


def test_tail_not_at_message_boundary(used_pair):
    tx, rx, m = used_pair
    tx.send(np.arange(3))
    # Consumer and producer both cached tail; move it by 8 for a fresh consumer end.
    rx.close()
    set_u64(m, TAIL, u64(m, TAIL) + 8)
    rx2 = Channel.attach(tx.name)
    try:
        expect_corrupt(lambda: rx2.recv(timeout=0), "message boundary")
    finally:
        rx2.close()


@pytest.mark.parametrize("field,value,cap_delta", [
    ("magic", ("magic", 0x1234), 0),
    ("version", ("version", 99), 0),
    ("header_bytes", ("header_bytes", 8192), 0),
    ("capacity", ("capacity", (1 << 16) + 64), 0),
    ("capacity_unaligned", ("capacity", (1 << 16) + 8), 8),
])
def test_attach_checks_each_field(field, value, cap_delta):
    name = new_name()
    path = "/dev/shm/" + name
    try:
        with open(path, "wb") as f:
            f.truncate(CHANNEL["header_bytes"] + (1 << 16) + cap_delta)
        with open(path, "r+b") as f:
            header = channel_header((1 << 16) + cap_delta)
            poke(header, CHANNEL, *value)
            f.write(header)
        with pytest.raises(ChannelCorrupted, match=field.split("_")[0].replace("header", "header size")):
            Channel.attach(name)
    finally:
        os.unlink(path)


def test_attach_accepts_a_valid_handmade_segment():
    """The handmade header of test_attach_checks_each_field is otherwise valid (so each case
    fails on its own field)."""
    name = new_name()
    path = "/dev/shm/" + name
    try:
        with open(path, "wb") as f:
            f.truncate(CHANNEL["header_bytes"] + (1 << 16))
        with open(path, "r+b") as f:
            f.write(channel_header(1 << 16))
        ch = Channel.attach(name)
        assert ch.capacity == 1 << 16
        ch.close()
    finally:
        os.unlink(path)


# ---- each check of a message header, in process (the first message starts the ring) ----------

MSG = CHANNEL["header_bytes"]
SHAPE = MESSAGE["bytes"]      # the shape (ndim 1 here), then the dtype text
DTYPE = SHAPE + 8


def _header_len(ndim: int, dtype_len: int) -> int:
    align = MESSAGE["align"]
    return (MESSAGE["bytes"] + 8 * ndim + dtype_len + align - 1) // align * align


@pytest.mark.parametrize("what,patch,match", [
    ("magic", [("magic", 0x12345678)], "bad message magic"),
    ("sequence", [("seq", 5)], "message number 5 where 0"),
    ("ndim", [("ndim", 65), ("header_len", _header_len(65, 3))], "ndim 65"),
    ("dtype_len_zero", [("dtype_len", 0)], "dtype length 0"),
    ("dtype_len_huge", [("dtype_len", 1025), ("header_len", _header_len(1, 1025))], "dtype length 1025"),
    ("header_len", [("header_len", 128)], "header length 128"),
    ("payload_len", [("payload_len", 1 << 47)], "corrupt: payload length"),
    ("header_beyond_published", [("dtype_len", 200), ("header_len", 256)], "more than the bytes published"),
    ("shape_overflow", [(SHAPE, "=Q", 1 << 63)], "shape overflows"),
    ("dtype_not_printable", [(DTYPE, "=B", 0x01)], "printable"),
])
def test_message_header_checks(pair, what, patch, match):
    import struct

    tx, rx = pair
    tx.send(np.arange(10, dtype="<f8"))  # header, shape (8 B) and dtype '<f8': one 64 B block; payload 80 B
    m = open_segment(tx.name)
    try:
        for change in patch:  # (a message header field, value) or (offset, format, value) after it
            offset, fmt, value = (*at(MESSAGE, change[0]), change[1]) if len(change) == 2 else change
            struct.pack_into(fmt, m, MSG + offset, value)
        expect_corrupt(lambda: rx.recv(timeout=0), match)
    finally:
        m.close()


@pytest.mark.parametrize("side", ["producer", "consumer"])
def test_indices_checked_when_an_end_claims_its_role(pair, side):
    tx, rx = pair
    m = open_segment(tx.name)
    try:
        if side == "producer":
            set_u64(m, TAIL, 1 << 50)  # a tail beyond the head: a producer would see room that is not there
            expect_corrupt(lambda: tx.send(b"x", timeout=0), "apart")
        else:
            set_u64(m, HEAD, 1 << 60)
            expect_corrupt(lambda: rx.recv(timeout=0), "apart")
    finally:
        m.close()


def test_names_with_a_leading_slash():
    """The POSIX spelling '/name' names the same channel as 'name' (create and attach)."""
    name = new_name()
    with Channel.create("/" + name, capacity=1 << 16) as tx:
        assert tx.name == name
        with Channel.attach("/" + name) as rx:
            tx.send(b"slash")
            assert rx.recv(timeout=5).tobytes() == b"slash"


STREAMED = 1 << 20  # 16 capacities of the 64 KiB test ring: streamed in chunks
CUT_AT, CUT_ACK = off(CHANNEL, "cut_at"), off(CHANNEL, "cut_ack")  # the producer's last cut, the consumer's acknowledgement


@pytest.mark.parametrize("capacity", [1 << 16, (1 << 16) + 64])
def test_a_send_that_times_out_half_way_cuts_its_message_and_the_channel_goes_on(capacity):
    """A streamed send that times out in the middle raises TimeoutError, and the consumer skips
    what was written of that message: no torn message, no wait for the rest, and the next
    messages (numbered on from the cut one) arrive whole. Three rounds, so that each cut waits
    for the consumer to have skipped the one before. A ring of 64 KiB + 64 bytes has a quarter
    (16400) that is not a multiple of 64: chunks must still end on 64-byte boundaries."""
    name = new_name()
    with Channel.create(name, capacity=capacity) as tx, Channel.attach(name) as rx:
        for round_ in range(3):
            with pytest.raises(TimeoutError, match="in the middle of a message.*nothing of it is received"):
                tx.send(np.full(STREAMED, 7, np.uint8), timeout=0.2)  # nobody reads: the ring fills
            assert capacity // 2 <= rx.pending_bytes <= capacity  # part of it was written
            # The consumer skips the cut message, then waits for the next one in vain.
            with pytest.raises(TimeoutError, match="no message arrived"):
                rx.recv(timeout=0.2)
            assert rx.cut_messages == round_ + 1
            assert rx.pending_bytes == 0
            tx.send(np.arange(5 + round_))
            assert np.array_equal(rx.recv(timeout=5), np.arange(5 + round_))
            whole = np.random.default_rng(round_).integers(0, 256, STREAMED + 4096 * round_, dtype=np.uint8)
            sender = threading.Thread(target=tx.send, args=(whole,))
            sender.start()
            got = rx.recv(timeout=30)
            sender.join()
            assert np.array_equal(got, whole)
        tx.unlink()


def test_a_send_interrupted_half_way_cuts_its_message():
    """Ctrl-C (here a SIGALRM handler that raises) in the middle of a streamed send: the
    exception propagates, the consumer skips the part written, and the channel goes on."""
    import signal

    class Alarm(Exception):
        pass

    def handler(signum, frame):
        raise Alarm()

    name = new_name()
    with Channel.create(name, capacity=1 << 16) as tx, Channel.attach(name) as rx:
        old = signal.signal(signal.SIGALRM, handler)
        # If the signal did not end the send, it would block for good: a reader that starts
        # after 60 s lets it finish (and pytest.raises fails) instead of hanging the suite.
        watchdog = threading.Timer(60, lambda: rx.recv())
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            watchdog.start()
            with pytest.raises(Alarm):
                tx.send(np.ones(STREAMED, np.uint8))  # no timeout, nobody reads
        finally:
            watchdog.cancel()
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        with pytest.raises(TimeoutError, match="no message arrived"):  # skips the cut message
            rx.recv(timeout=0.2)
        assert rx.cut_messages == 1
        tx.send(b"after")
        assert rx.recv(timeout=5).tobytes() == b"after"
        tx.unlink()


@pytest.fixture
def cut_pair():
    """A 64 KiB channel whose producer cut a streamed message nobody read: (tx, rx, the mapped
    segment, the head, which is the cut)."""
    name = new_name()
    with Channel.create(name, capacity=1 << 16) as tx, Channel.attach(name) as rx:
        with pytest.raises(TimeoutError, match="in the middle"):
            tx.send(np.ones(STREAMED, np.uint8), timeout=0.2)
        m = open_segment(name)
        try:
            head = u64(m, HEAD)
            assert u64(m, CUT_AT) == head == 1 << 16
            yield tx, rx, m, head
        finally:
            m.close()
            os.unlink("/dev/shm/" + name)


def test_a_second_streamed_send_waits_until_the_consumer_skipped_the_last_cut(cut_pair):
    """One cut in flight: a consumer still inside the first cut message would take a second
    cut for its own and skip the messages between the two. So after a cut, a streamed send
    waits for the consumer's acknowledgement and times out having sent nothing, even when the
    ring has room (here: room made by moving the tail word by hand, without an acknowledgement),
    and so does a producer end that takes over after the first closed."""
    tx, rx, m, head = cut_pair
    set_u64(m, TAIL, head)  # all room free, no acknowledgement
    with pytest.raises(TimeoutError, match="the ring is full"):  # nothing sent
        tx.send(np.ones(STREAMED, np.uint8), timeout=0.2)
    assert u64(m, HEAD) == head
    tx.close()  # a new producer end (another process, or here this one) inherits the cut
    with Channel.attach(tx.name) as tx2:
        with pytest.raises(TimeoutError, match="the ring is full"):
            tx2.send(np.ones(STREAMED, np.uint8), timeout=0.2)
        assert u64(m, HEAD) == head
        tx2.send(b"small")  # a message that fits cannot be cut: it goes
        assert u64(m, HEAD) > head


@pytest.mark.parametrize("where", ["not at a message boundary", "past the head"])
def test_a_hostile_cut_position_is_refused(cut_pair, where):
    """The cut position comes from the other process: the consumer moves there only when it
    lies on a 64-byte boundary between where it reads and the published head."""
    tx, rx, m, head = cut_pair
    set_u64(m, CUT_AT, head - 32 if where == "not at a message boundary" else head + 64)
    expect_corrupt(lambda: rx.recv(timeout=1), "cut position")
    assert u64(m, CUT_ACK) == 0


def test_a_send_given_up_for_good_half_way_is_reported_to_the_consumer():
    """A streamed send that fails half way for another reason than a timeout or a signal (here
    its own head index changed under it: ChannelCorrupted) cannot cut the message: it records
    in the header that it gave the message up, so the consumer gets a ChannelError naming that
    instead of waiting for the rest."""
    name = new_name()
    with Channel.create(name, capacity=1 << 16) as tx, Channel.attach(name) as rx:
        errors = []

        def send():
            try:
                tx.send(np.ones(STREAMED, np.uint8), timeout=30)
            except ChannelError as e:
                errors.append(e)

        sender = threading.Thread(target=send)
        sender.start()
        m = open_segment(name)
        try:
            deadline = time.monotonic() + 10
            while u64(m, HEAD) < 1 << 16 and time.monotonic() < deadline:  # the ring is full
                time.sleep(0.001)
            set_u64(m, HEAD, u64(m, HEAD) - 64)  # still a valid head for the consumer
            sender.join(10)
            assert len(errors) == 1 and isinstance(errors[0], ChannelCorrupted), errors
            with pytest.raises(ChannelError, match="producer gave up a message half-sent"):
                rx.recv(timeout=5)
        finally:
            m.close()
        tx.unlink()
