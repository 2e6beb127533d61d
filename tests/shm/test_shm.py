"""fastcopy.shm.Channel within one process: round trips, out= validation, splitting of
messages larger than the ring, timeouts, closing, names, primitives. Process tests (real
producer and consumer, killed peers, corrupt segments) are in test_shm_process.py."""

from __future__ import annotations

import mmap
import os
import threading
import time

import numpy as np
import pytest

from _child import leftovers_fixture, name_maker
from _shm_layout import CHANNEL, off
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
    # If the signal were not handled, recv would block for good: after 5 s a message ends it
    # (and then pytest.raises fails) instead of hanging the suite. The handler runs within
    # milliseconds of the alarm at 0.2 s.
    watchdog = threading.Timer(5, lambda: tx.send(b"watchdog"))
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
