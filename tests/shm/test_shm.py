"""fastcopy.shm.Channel within one process: round trips, out= validation, splitting of
messages larger than the ring, timeouts, closing, names, primitives. Process tests (real
producer and consumer, killed peers, corrupt segments) are in test_shm_process.py."""

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
from fastcopy.shm import Channel, ChannelClosed, ChannelCorrupted, ChannelError, PeerDied

pytestmark = pytest.mark.sanitize

PREFIX = f"fctest-{os.getpid()}-"


no_leftover_segments = leftovers_fixture(PREFIX, fail=True)
new_name = name_maker(PREFIX)


DTYPES = [np.uint8, np.int16, ">i4", np.float32, "<f8", np.complex128, np.bool_, "M8[ns]", "S5", "U3",
          np.dtype([("a", "<i4"), ("b", ">f8", (2,))]), np.dtype([("x", "u1"), ("y", "<u4")], align=True)]
SHAPES = [(), (0,), (1,), (7,), (3, 4), (2, 0, 3), (2, 3, 5)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_roundtrip_dtype_shape(pair, dtype, shape):
    tx, rx = pair
    dtype = np.dtype(dtype)
    raw = np.random.default_rng(1).integers(0, 256, int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    a = raw.view(dtype).reshape(shape) if dtype.itemsize else np.zeros(shape, dtype)
    tx.send(a)
    b = rx.recv(timeout=5)
    assert b.dtype == dtype and b.shape == a.shape
    assert b.dtype.isalignedstruct == dtype.isalignedstruct  # == ignores the align flag
    assert b.tobytes() == a.tobytes()
    tx.send(a)
    out = np.empty(shape, dtype)
    assert rx.recv(out=out, timeout=5) is out
    assert out.tobytes() == a.tobytes()


def test_buffers_come_back_as_uint8(pair):
    tx, rx = pair
    for obj in (b"hello", bytearray(b"xyz"), memoryview(b"abcdef")[1:4], b""):
        tx.send(obj)
        got = rx.recv(timeout=5)
        assert got.dtype == np.uint8 and got.ndim == 1
        assert got.tobytes() == bytes(obj)
    tx.send(b"into a bytearray")
    buf = bytearray(16)
    assert rx.recv(out=buf) is buf and bytes(buf) == b"into a bytearray"


def test_noncontiguous_and_scalars(pair):
    tx, rx = pair
    a = np.arange(24.0).reshape(4, 6)
    for obj in (a[:, ::2], a.T, a[::-1], np.float32(2.5), np.int64(-3)):
        tx.send(obj)
        got = rx.recv(timeout=5)
        expect = np.asarray(obj)
        assert got.dtype == expect.dtype and got.shape == expect.shape and np.array_equal(got, expect)


def test_object_arrays_refused(pair):
    tx, _ = pair
    with pytest.raises(TypeError, match="object"):
        tx.send(np.array([object()]))
    with pytest.raises(TypeError, match="buffer"):
        tx.send(12345)


def test_out_validation_keeps_message(pair):
    tx, rx = pair
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    tx.send(a)
    with pytest.raises(ValueError, match="shape"):
        rx.recv(out=np.empty((4, 3), np.int32))
    with pytest.raises(ValueError, match="dtype"):
        rx.recv(out=np.empty((3, 4), np.int64))
    with pytest.raises(ValueError, match="48"):
        rx.recv(out=bytearray(47))
    with pytest.raises(ValueError, match="read-only"):
        ro = np.empty((3, 4), np.int32)
        ro.flags.writeable = False
        rx.recv(out=ro)
    with pytest.raises(ValueError, match="contiguous"):
        rx.recv(out=np.empty((4, 3), np.int32).T)
    with pytest.raises(TypeError):
        rx.recv(out=b"x" * 48)  # read-only buffer
    assert rx.peek(timeout=0)[1] == (3, 4)
    out = np.empty((3, 4), np.int32)
    rx.recv(out=out)
    assert np.array_equal(out, a)


@pytest.mark.parametrize("size", [(1 << 16) - 64, 1 << 16, 3 << 16, (5 << 20) + 13])
def test_messages_larger_than_ring_are_split(size):
    with Channel.create(new_name(), capacity=1 << 16) as tx, Channel.attach(tx.name) as rx:
        a = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
        t = threading.Thread(target=tx.send, args=(a,), kwargs={"timeout": 30})
        t.start()
        b = rx.recv(timeout=30)
        t.join()
        assert np.array_equal(a, b)
        t = threading.Thread(target=tx.send, args=(a,), kwargs={"timeout": 30})
        t.start()
        out = np.empty_like(a)
        rx.recv(out=out, timeout=30)
        t.join()
        assert np.array_equal(a, out)


def test_many_messages_wrap_around(pair):
    tx, rx = pair
    rng = np.random.default_rng(7)
    for i in range(3000):
        a = rng.integers(0, 256, int(rng.integers(0, 5000)), dtype=np.uint8)
        tx.send(a)
        assert np.array_equal(rx.recv(timeout=5), a)


def test_recv_timeout_on_empty(pair):
    _, rx = pair
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        rx.recv(timeout=0.1)
    # Never early; the upper bound only proves the wait ends (generous: a loaded 2-CPU machine).
    assert 0.09 <= time.monotonic() - t0 < 30
    with pytest.raises(TimeoutError):
        rx.recv(timeout=0)


def test_send_timeout_on_full_ring(pair):
    tx, rx = pair
    a = np.zeros(20000, np.uint8)
    sent = 0
    with pytest.raises(TimeoutError):
        for _ in range(100):
            tx.send(a, timeout=0.1)
            sent += 1
    assert sent == 3  # 64 KiB ring, 20 KiB + header per message
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        tx.send(a, timeout=0.1)
    assert 0.09 <= time.monotonic() - t0 < 30  # never early; the upper bound only proves it ends
    for _ in range(sent):  # the timed-out sends left nothing behind
        assert rx.recv(timeout=0).shape == (20000,)
    with pytest.raises(TimeoutError):
        rx.recv(timeout=0)


def test_negative_timeout_rejected(pair):
    tx, _ = pair
    with pytest.raises(ValueError):
        tx.send(b"x", timeout=-1)


def test_roles_are_one_way(pair):
    tx, rx = pair
    tx.send(b"x")
    with pytest.raises(ChannelError, match="one way"):
        tx.recv(timeout=0)
    rx.recv()
    with pytest.raises(ChannelError, match="one way"):
        rx.send(b"y")


def test_close_semantics(pair):
    tx, rx = pair
    tx.send(b"last")
    tx.close()
    with pytest.raises(ValueError, match="closed"):
        tx.send(b"x")
    assert rx.recv(timeout=1).tobytes() == b"last"  # queued messages are still delivered
    with pytest.raises(ChannelClosed):
        rx.recv(timeout=1)


def test_iteration_until_closed():
    with Channel.create(new_name(), capacity=1 << 16) as tx, Channel.attach(tx.name) as rx:
        for i in range(5):
            tx.send(np.array([i]))
        tx.close()
        assert [int(m[0]) for m in rx] == [0, 1, 2, 3, 4]


def test_consumer_closed_fails_send(pair):
    tx, rx = pair
    with pytest.raises(TimeoutError):
        rx.recv(timeout=0)  # claims the consumer role
    rx.close()
    with pytest.raises(ChannelClosed):
        tx.send(b"x")


def test_names_create_attach_unlink():
    ch = Channel.create()
    assert ch.name.startswith(f"fastcopy-{os.getpid()}-")
    assert os.path.exists("/dev/shm/" + ch.name)
    with pytest.raises(FileExistsError):
        Channel.create(ch.name)
    assert ch.unlink() is True and ch.unlink() is False
    assert not os.path.exists("/dev/shm/" + ch.name)
    ch.close()
    ch.close()  # idempotent
    with pytest.raises(FileNotFoundError):
        Channel.attach(ch.name)
    with pytest.raises(ChannelError, match="name"):
        Channel.create("a/b")
    with pytest.raises(ChannelError, match="capacity"):
        Channel.create(new_name(), capacity=1000)


def test_context_manager_unlinks_only_for_creator():
    with Channel.create(new_name(), capacity=1 << 16) as tx:
        with Channel.attach(tx.name) as rx:
            tx.send(b"x")
            rx.recv()
        assert os.path.exists("/dev/shm/" + tx.name)
    assert not os.path.exists("/dev/shm/" + tx.name)
    assert tx.closed


def test_concurrent_use_from_two_threads_is_refused(pair):
    """No sleeps: the main thread polls until it meets the other thread inside recv, then
    sends the message that thread waits for."""
    tx, rx = pair
    results = []

    def blocked_recv():
        while True:
            try:
                results.append(rx.recv(timeout=60))
                return
            except ChannelError as e:  # the main thread's probe held the end at that moment
                if "two threads" not in str(e):
                    results.append(e)
                    return
            except Exception as e:  # noqa: BLE001
                results.append(e)
                return

    t = threading.Thread(target=blocked_recv)
    t.start()
    refused = None
    deadline = time.monotonic() + 60
    while refused is None and time.monotonic() < deadline:
        try:
            rx.recv(timeout=0)
        except TimeoutError:
            time.sleep(0.001)  # the thread is not inside recv yet
        except ChannelError as e:
            refused = e
    assert refused is not None and "two threads" in str(refused)
    with pytest.raises(ChannelError):
        rx.close()  # refused while the thread is inside
    tx.send(b"wake")
    t.join()
    assert len(results) == 1 and bytes(results[0]) == b"wake", results


def test_gil_released_while_waiting(pair):
    """Without time limits: the thread blocked in recv (no timeout) can only get its message
    if the main thread runs Python code meanwhile, i.e. if recv released the GIL."""
    tx, rx = pair
    got = []
    t = threading.Thread(target=lambda: got.append(rx.recv(timeout=60)))
    t.start()
    while not rx.role:  # wait until the thread has claimed the consumer role (inside recv)
        time.sleep(0.001)
    counter = sum(range(100000))  # Python bytecode: needs the GIL
    tx.send(np.array([counter]))
    t.join()
    assert got and int(got[0][0]) == counter


def test_attach_validates_segment():
    name = new_name()
    path = "/dev/shm/" + name
    try:
        with open(path, "wb") as f:  # too small
            f.write(b"\0" * 100)
        with pytest.raises(ChannelCorrupted, match="size"):
            Channel.attach(name)
        with open(path, "wb") as f:  # right size, zero header
            f.truncate(CHANNEL["header_bytes"] + (1 << 16))
        with pytest.raises(ChannelCorrupted, match="magic"):
            Channel.attach(name)
    finally:
        os.unlink(path)


def test_corrupt_header_in_process():
    """Same-process version of the corruption checks (the subprocess versions prove no crash)."""
    with Channel.create(new_name(), capacity=1 << 16) as tx, Channel.attach(tx.name) as rx:
        tx.send(np.arange(10))
        fd = os.open("/dev/shm/" + tx.name, os.O_RDWR)
        m = mmap.mmap(fd, 0)
        os.close(fd)
        try:
            _core.shm_store_release_u64(m, off(CHANNEL, "head"), 1 << 60)  # head far beyond the capacity
            with pytest.raises(ChannelCorrupted, match="head"):
                rx.recv(timeout=1)
            with pytest.raises(ChannelError, match="broken"):  # stays unusable
                rx.recv(timeout=1)
        finally:
            m.close()


def test_primitives():
    buf = bytearray(64)
    _core.shm_store_release_u64(buf, 8, 2**64 - 1)
    assert _core.shm_load_acquire_u64(buf, 8) == 2**64 - 1
    _core.shm_store_release_u32(buf, 4, 7)
    assert _core.shm_load_acquire_u32(buf, 4) == 7
    with pytest.raises(IndexError):
        _core.shm_load_acquire_u64(buf, 64)
    with pytest.raises(ValueError):
        _core.shm_load_acquire_u64(buf, 4)
    t0 = time.monotonic()
    assert _core.shm_futex_wait(buf, 4, 7, 0.05) is False  # timed out
    assert time.monotonic() - t0 >= 0.04
    assert _core.shm_futex_wait(buf, 4, 8, 1.0) is True  # value differs: returns at once
    assert _core.shm_futex_wake(buf, 4, 1) == 0
    assert _core.shm_process_alive(os.getpid())
    assert _core.shm_process_alive(os.getpid(), 1) is False  # wrong start time: pid reused
    assert _core.shm_process_alive(2**22 + 12345) is False


def test_exception_hierarchy():
    assert issubclass(ChannelCorrupted, ChannelError)
    assert issubclass(PeerDied, ChannelError)
    assert issubclass(ChannelClosed, ChannelError)
    assert issubclass(ChannelError, RuntimeError)


def test_signal_interrupts_blocking_recv(pair):
    """A Python signal handler that raises ends a blocked recv (e.g. Ctrl-C)."""
    import signal

    tx, rx = pair

    class Alarm(Exception):
        pass

    def handler(signum, frame):
        raise Alarm()

    old = signal.signal(signal.SIGALRM, handler)
    # If the signal were not handled, recv would block for good: after 60 s a message ends it
    # (and then pytest.raises fails) instead of hanging the suite.
    watchdog = threading.Timer(60, lambda: tx.send(b"watchdog"))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        watchdog.start()
        with pytest.raises(Alarm):
            rx.recv()  # no timeout
    finally:
        watchdog.cancel()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    with pytest.raises(TimeoutError):  # the channel is still usable
        rx.recv(timeout=0)


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
