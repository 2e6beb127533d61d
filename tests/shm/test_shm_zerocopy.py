"""Zero copy on a Channel: loaned arrays (``loan``/``publish``) and read-only views (``recv_view``).

Lifetime (slices keep the slot, ``del`` frees it), read-only enforcement, abandoned loans,
hostile headers under views and peer death while a view is held. Crash-prone cases run in a
subprocess and assert its exit status.
"""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from _child import SIGINT_HANDLER, SIGINT_IGNORED, SRC, run_script
from _shm_layout import CHANNEL, PAGE, peek, poke
from conftest import no_subprocess

import fastcopy
from fastcopy import _core
from fastcopy.shm import Channel, ChannelClosed, ChannelError, LoanedArray

pytestmark = pytest.mark.sanitize

# Children import the same fastcopy as this process (CI installs it; src/ has no _core there).
PREFIX = f"fastcopy-test-zc-{os.getpid()}-"


@pytest.fixture
def pair():
    tx = Channel.create(capacity=1 << 16)
    rx = Channel.attach(tx.name)
    yield tx, rx
    for c in (rx, tx):
        try:
            c.close()
        except ChannelError:
            pass
    tx.unlink()


# ---- loans and views: round trip -----------------------------------------------------------
@pytest.mark.parametrize("dtype,shape", [
    ("<f8", (10,)), ("|u1", (0,)), (">i2", (3, 4, 5)), ("<c16", ()),
    ([("a", "<i4"), ("b", "<f8", (2,))], (7,)),
])
def test_loan_publish_recv_view_round_trip(pair, dtype, shape):
    tx, rx = pair
    dt = np.dtype(dtype)
    expected = np.frombuffer(np.random.default_rng(1).bytes(dt.itemsize * int(np.prod(shape))), dt).reshape(shape)
    a = tx.loan(shape, dt)
    assert isinstance(a, LoanedArray) and a.flags.writeable and a.shape == shape and a.dtype == dt
    a[...] = expected
    tx.publish(a)
    v = rx.recv_view(timeout=5)
    assert type(v) is np.ndarray and v.dtype == dt and v.shape == shape
    assert v.tobytes() == expected.tobytes()
    assert not v.flags.writeable


def test_loan_is_in_the_ring_and_view_points_into_it(pair):
    tx, rx = pair
    a = tx.loan(1000, np.uint8)
    a[:] = 5
    addr = a.__array_interface__["data"][0]
    tx.publish(a)
    v = rx.recv_view(timeout=5)
    # Both ends map the same segment at different addresses; offsets in the ring agree.
    assert (v == 5).all()
    assert addr % 64 == 0 and v.__array_interface__["data"][0] % 64 == 0


def _header_word(name: str, field: str, value: int | None = None) -> int:
    """The word ``field`` (of _core.shm_layout()) of a channel's segment header; written first
    when ``value`` is given."""
    import mmap

    with open("/dev/shm/" + name, "r+b") as f, mmap.mmap(f.fileno(), CHANNEL["header_bytes"]) as m:
        if value is not None:
            poke(m, CHANNEL, field, value)
        return peek(m, CHANNEL, field)


def _ring_head(name: str) -> int:
    """The producer's head index (bytes ever written) from the segment header."""
    return _header_word(name, "head")


# The size rules as fastcopy.info()["shm"] reports them: the tests below check that the
# channel behaves as reported.
SHM_RULES = {rule["name"]: rule["value"] for rule in _core._shm_rules()}
PAGE_ALIGNED_LOAN_MIN = SHM_RULES["page_aligned_loan_bytes"]
EARLY_WRAP_MIN = SHM_RULES["early_wrap_bytes"]


def test_large_loans_start_on_a_page_and_small_loans_are_packed():
    """From 256 KiB a loan's payload starts on a page boundary at both ends (the producer
    writes a padding record the consumer skips); smaller loans follow the previous message
    directly. Random sizes and shapes over many laps of a ring whose capacity is not a page
    multiple, so padding before the header and padding to the ring's end meet."""
    rng = np.random.default_rng(11)
    tx = Channel.create(capacity=(1 << 20) + 64 * 37)
    rx = Channel.attach(tx.name)
    try:
        small_offsets = set()
        for i in range(120):
            small = int(rng.integers(1, 9000))
            head = _ring_head(tx.name)
            with tx.loan(small, np.uint8) as a:
                a[...] = i
                small_offsets.add(a.__array_interface__["data"][0] % PAGE)
            used = _ring_head(tx.name) - head
            # header (64 B) + payload rounded to 64, or a padding record to the ring's end first
            assert used == 64 + (small + 63) // 64 * 64 or (head + used) % tx.capacity < used, (i, small, used)
            v = rx.recv_view(timeout=5)
            assert v.nbytes == small and (v == i % 256).all()
            del v
            shape = (int(rng.integers(PAGE_ALIGNED_LOAN_MIN, 400 << 10)) // 32 * 4,)  # >= 256 KiB of f8
            if i % 2:
                shape = (shape[0] // 4, 4)
            expected = rng.random(shape)
            head = _ring_head(tx.name)
            with tx.loan(shape, "<f8") as a:
                assert a.__array_interface__["data"][0] % PAGE == 0, (i, head % PAGE)
                a[...] = expected
            assert _ring_head(tx.name) - head < 64 * 2 + expected.nbytes + 2 * PAGE + tx.capacity
            got = rx.recv_view(timeout=5) if i % 3 else rx.recv(timeout=5)
            if i % 3:
                assert got.__array_interface__["data"][0] % PAGE == 0
            assert got.shape == shape and np.array_equal(got, expected)
            del got
        assert len(small_offsets) > 1  # small loans were not page-aligned
        assert rx.held_views == 0
    finally:
        rx.close()
        tx.close()
        tx.unlink()


def test_an_outstanding_loan_publishes_nothing_not_even_its_padding():
    """The padding before a large loan (to the ring's end, and up to a page) goes out with the
    message: until publish the consumer sees nothing, and a discarded loan leaves no trace."""
    payload = PAGE_ALIGNED_LOAN_MIN
    tx = Channel.create(capacity=3 * (payload + PAGE) + 64 * 5)
    rx = Channel.attach(tx.name)
    try:
        wrapped = 0
        for i in range(12):
            tx.send(np.full(9000 * i + 8, i, np.uint8))   # moves the ring position
            assert (rx.recv(timeout=5) == i).all()
            head = _ring_head(tx.name)
            a = tx.loan(payload, np.uint8, timeout=5)
            assert _ring_head(tx.name) == head and rx.pending_bytes == 0
            with pytest.raises(TimeoutError):
                rx.recv_view(timeout=0)
            if i % 3 == 0:
                tx.discard(a)
                assert _ring_head(tx.name) == head
                continue
            a[...] = i
            tx.publish(a)
            wrapped += _ring_head(tx.name) - head > 64 + payload + PAGE  # padding to the ring's end too
            v = rx.recv_view(timeout=0)
            assert v.nbytes == payload and (v == i).all() and v.__array_interface__["data"][0] % PAGE == 0
            del v
        assert wrapped >= 2  # these sizes wrap at i = 4, 7 and 10
    finally:
        rx.close()
        tx.close()
        tx.unlink()


def test_large_loan_in_a_ring_without_room_to_align_it():
    """A loan too large to be moved to a page boundary in its ring is placed as before."""
    payload = PAGE_ALIGNED_LOAN_MIN
    tx = Channel.create(capacity=64 + payload + 2048)  # header + payload + less than a page
    rx = Channel.attach(tx.name)
    try:
        for i in range(6):
            tx.send(np.full(100 * i + 1, i, np.uint8))  # moves the ring position
            assert (rx.recv(timeout=5) == i).all()
            with tx.loan(payload, np.uint8, timeout=5) as a:  # it fits: never a wait
                a[...] = i + 1
            v = rx.recv_view(timeout=5)
            assert v.nbytes == payload and (v == i + 1).all()
            del v
    finally:
        rx.close()
        tx.close()
        tx.unlink()


CONSUMER_AWAITING = "consumer_awaiting"  # the header word a waiting consumer sets


def test_a_waiting_consumer_says_so_in_the_header(pair):
    tx, rx = pair
    got = []
    t = threading.Thread(target=lambda: got.append(rx.recv(timeout=10)))
    t.start()
    deadline = time.monotonic() + 10
    while _header_word(tx.name, CONSUMER_AWAITING) == 0:
        assert time.monotonic() < deadline, "the waiting consumer never set its word"
        time.sleep(0.001)
    tx.send(np.arange(8))
    t.join(10)
    assert not t.is_alive() and np.array_equal(got[0], np.arange(8))
    assert _header_word(tx.name, CONSUMER_AWAITING) == 0      # cleared when the wait ends
    tx.send(np.arange(3))
    assert np.array_equal(rx.recv(timeout=5), np.arange(3))  # no wait: the word stays 0
    assert _header_word(tx.name, CONSUMER_AWAITING) == 0


def test_large_loans_reuse_the_start_of_the_ring_only_for_a_waiting_consumer():
    """A large loan goes back to the start of the ring when the consumer waits for it and that
    room is free; otherwise loans walk through the ring and the producer keeps all of it as
    room. The consumer's word is forged here, so that each case is certain."""
    payload = EARLY_WRAP_MIN
    slot = payload + PAGE                               # what one page-aligned loan occupies
    tx = Channel.create(capacity=4 * slot)
    rx = Channel.attach(tx.name)

    def loan_and_send(i: int) -> int:
        with tx.loan(payload, np.uint8, timeout=0) as a:
            a[...] = i
            return int(a.__array_interface__["data"][0])

    try:
        walked = []                                     # a consumer that does not wait
        for i in range(8):
            walked.append(loan_and_send(i))
            v = rx.recv_view(timeout=5)
            assert (v == i).all()
            del v
        assert len(set(walked)) == 4
        start = min(walked)

        _header_word(tx.name, CONSUMER_AWAITING, value=1)      # a consumer that waits, holding nothing
        reused = []
        for i in range(8):
            reused.append(loan_and_send(i))
            v = rx.recv_view(timeout=5)                 # the message is there: no wait, the word stays
            assert (v == i).all()
            del v
        assert set(reused) == {start}

        held = None                                     # one that holds the previous message
        alternated = []
        for i in range(8):
            alternated.append(loan_and_send(i))
            held = rx.recv_view(timeout=5)              # the previous view goes only now
            assert (held == i).all()
        del held
        assert set(alternated) == {start, start + slot}

        _header_word(tx.name, CONSUMER_AWAITING, value=0)      # a consumer that stops reading
        for i in range(4):                              # keeps the whole ring as the producer's room
            loan_and_send(i)
        with pytest.raises(TimeoutError):
            tx.loan(payload, np.uint8, timeout=0)
        for i in range(4):
            v = rx.recv_view(timeout=5)
            assert (v == i).all()
            del v
    finally:
        rx.close()
        tx.close()
        tx.unlink()


@pytest.mark.parametrize("rule", ["page_aligned_loan_bytes", "early_wrap_bytes"])
def test_loans_just_below_the_reported_size_are_packed_and_walk_the_ring(rule):
    """One cache line below page_aligned_loan_bytes (or early_wrap_bytes, as fastcopy.info()
    reports them), a loan follows its header directly (not page-aligned), and it never goes back
    to the start of the ring early, even for a waiting consumer: the rules start where info()
    says (the tests above show them at and above it)."""
    payload = SHM_RULES[rule] - 64
    tx = Channel.create(capacity=4 * (payload + PAGE))
    rx = Channel.attach(tx.name)
    try:
        _header_word(tx.name, CONSUMER_AWAITING, value=1)      # a consumer that waits
        addresses = []
        for i in range(8):
            with tx.loan(payload, np.uint8, timeout=0) as a:
                a[...] = i
                addresses.append(int(a.__array_interface__["data"][0]))
            v = rx.recv_view(timeout=5)
            assert (v == i).all()
            del v
        assert all(address % PAGE != 0 for address in addresses)
        assert len(set(addresses)) > 2                          # walked, did not alternate
    finally:
        rx.close()
        tx.close()
        tx.unlink()


def test_recv_view_of_sent_messages_and_mixing_with_recv(pair):
    tx, rx = pair
    rng = np.random.default_rng(2)
    for i in range(300):  # several laps of the 64 KiB ring
        m = rng.integers(0, 255, int(rng.integers(0, 9000)), dtype=np.uint8)
        tx.send(m)
        got = rx.recv_view(timeout=5) if i % 3 else rx.recv(timeout=5)
        assert np.array_equal(got, m)
        if i % 3:
            assert not got.flags.writeable
        with tx.loan(m.shape, m.dtype) as a:
            a[...] = m
        got = rx.recv(timeout=5) if i % 2 else rx.recv_view(timeout=5)
        assert np.array_equal(got, m)
    del got
    assert rx.held_views == 0 and rx.held_bytes == 0


def test_sent_messages_that_would_wrap_go_to_the_ring_start_and_come_back_in_place(pair):
    """send() puts a message that would wrap around the end of the ring at its start, behind a
    padding record, when both fit in the ring: recv_view then returns every such message in
    place (it holds its slot) instead of a copy."""
    tx, rx = pair                                       # a 64 KiB ring
    rng = np.random.default_rng(5)
    wrapped = 0
    for i in range(400):
        m = rng.integers(0, 255, int(rng.integers(1, 30000)), dtype=np.uint8)  # at most half the ring
        head = _ring_head(tx.name)
        tx.send(m, timeout=5)
        used = _ring_head(tx.name) - head
        message = 64 + (m.nbytes + 63) // 64 * 64       # header + payload
        if used != message:                             # padding to the ring's end went first
            wrapped += 1
            assert (head + used) % tx.capacity == message, (i, head, used)
        v = rx.recv_view(timeout=5)
        assert rx.held_views == 1, i                    # in place: the view holds its slot
        assert np.array_equal(v, m)
        del v
    assert wrapped >= 20


def test_a_sent_message_that_would_wrap_starts_over_at_the_ring_start_and_comes_back_in_place(pair):
    """When the padding and the message do not both fit in the ring, send() waits for the ring
    to empty and starts the message at the ring's start: it is always one piece, so recv_view
    returns a view in place that holds its slot."""
    tx, rx = pair                                       # a 64 KiB ring
    tx.send(np.zeros(30000, np.uint8), timeout=5)       # the head moves to 30080
    assert rx.recv(timeout=5).nbytes == 30000
    m = np.arange(40000, dtype=np.uint8)                # 35456 bytes to the end + 40064 > 65536
    tx.send(m, timeout=5)
    v = rx.recv_view(timeout=5)
    assert np.array_equal(v, m) and not v.flags.writeable
    assert rx.held_views == 1
    del v
    assert rx.held_views == 0


# ---- lifetime --------------------------------------------------------------------------------
def test_slices_keep_the_slot_and_del_frees_it(pair):
    tx, rx = pair
    tx.send(np.arange(1000, dtype=np.int64))           # 8 KiB + header
    v = rx.recv_view(timeout=5)
    assert rx.held_views == 1 and rx.held_bytes >= 8000
    s = v[10:20]
    r = v.reshape(10, 100).T
    w = s.view(np.uint8)
    del v
    gc.collect()
    assert rx.held_views == 1                           # slices and views still point into the slot
    assert s[0] == 10 and r[3, 2] == 203 and w[0] == 10
    del s, r
    assert rx.held_views == 1
    del w
    assert rx.held_views == 0 and rx.held_bytes == 0


def test_held_view_blocks_producer_until_released(pair):
    tx, rx = pair
    big = np.ones(40000, np.uint8)
    tx.send(big)
    v = rx.recv_view(timeout=5)
    with pytest.raises(TimeoutError):
        tx.send(big, timeout=0.2)                       # the ring is 64 KiB and 40 KB are held
    assert rx.pending_bytes == 0 and rx.held_bytes >= 40000
    del v
    tx.send(big, timeout=5)
    assert np.array_equal(rx.recv(timeout=5), big)


def test_views_released_out_of_order_free_space_in_fifo_order(pair):
    tx, rx = pair
    for k in range(3):
        tx.send(np.full(15000, k, np.uint8))
    views = [rx.recv_view(timeout=5) for _ in range(3)]
    assert rx.held_views == 3
    before = rx.held_bytes
    del views[1]                                        # the middle one: no space until the first goes
    assert rx.held_views == 2 and rx.held_bytes < before
    with pytest.raises(TimeoutError):
        tx.send(np.zeros(40000, np.uint8), timeout=0.2)
    views.pop(0)
    views.pop(0)
    assert rx.held_views == 0
    tx.send(np.zeros(40000, np.uint8), timeout=5)


def test_view_dropped_in_another_thread_wakes_blocked_producer(pair):
    tx, rx = pair
    tx.send(np.ones(40000, np.uint8))
    holder = [rx.recv_view(timeout=5)]
    def drop_later():
        time.sleep(0.2)
        holder.clear()
    t = threading.Thread(target=drop_later)
    t.start()
    t0 = time.monotonic()
    tx.send(np.ones(40000, np.uint8), timeout=10)       # waits for the view to go
    assert 0.1 < time.monotonic() - t0 < 5
    t.join()


def test_view_outlives_closed_channel(pair):
    tx, rx = pair
    tx.send(np.arange(100.0))
    v = rx.recv_view(timeout=5)
    s = v[50:]
    rx.close()
    del v
    gc.collect()
    assert s[0] == 50.0 and s.sum() == sum(range(50, 100))  # still mapped, readable
    del s                                                   # releasing after close is harmless


@no_subprocess
def test_views_alive_at_interpreter_exit_and_in_daemon_threads(tmp_path):
    code = f"""
    import threading, numpy as np
    from fastcopy.shm import Channel
    tx = Channel.create("{PREFIX}exit", capacity=1 << 16)
    rx = Channel.attach(tx.name)
    tx.send(np.arange(10.0)); tx.send(np.arange(5.0))
    KEEP = [rx.recv_view(), rx.recv_view()[1:]]
    tx2 = Channel.create(capacity=1 << 16)
    LOAN = tx2.loan(100)
    # Published and discarded loans stay readable after their channel is closed.
    tx3 = Channel.create(capacity=1 << 16)
    rx3 = Channel.attach(tx3.name)
    with tx3.loan(10) as P:
        P[:] = 7
    D = tx3.loan(10)
    tx3.discard(D)
    V = rx3.recv_view()
    tx3.close(); rx3.close()
    assert P.sum() == 70 and V.sum() == 70 and D.shape == (10,)
    t = threading.Thread(target=rx.recv_view, daemon=True)
    t.start()
    print("ok", KEEP[0][3], KEEP[1][0])
    """
    proc = run_script(tmp_path, code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ok", "3.0", "1.0"]


# ---- read-only enforcement -------------------------------------------------------------------
def test_view_cannot_be_made_writable(pair):
    tx, rx = pair
    tx.send(np.arange(64, dtype=np.uint8))
    v = rx.recv_view(timeout=5)
    derived = [v, v[::2], v.view(), v.reshape(8, 8), v.view(np.int64), np.asarray(v), v.T]
    for d in derived:
        assert not d.flags.writeable
        with pytest.raises(ValueError):
            d.flags.writeable = True
        with pytest.raises(ValueError):
            d[...] = 0
        with pytest.raises(ValueError):
            d.setflags(write=True)
    with pytest.raises(ValueError):
        np.add(v, 1, out=v)
    assert memoryview(v).readonly
    assert not np.frombuffer(v, np.uint8).flags.writeable
    with pytest.raises(TypeError):
        memoryview(v)[0] = 1
    assert np.array_equal(v, np.arange(64))                 # unchanged
    c = v.copy()                                            # copies are ordinary arrays
    c[0] = 9
    assert c.flags.writeable and v[0] == 0


def test_published_loan_becomes_read_only(pair):
    tx, rx = pair
    a = tx.loan(16, np.uint8)
    tx.publish(a)
    assert not a.flags.writeable
    with pytest.raises(ValueError):
        a.flags.writeable = True
    with pytest.raises(ValueError):
        a[0] = 1


# ---- abandoned loans -------------------------------------------------------------------------
def test_exception_in_with_block_sends_nothing_and_frees_space(pair):
    tx, rx = pair
    for _ in range(5):                                  # 5 x 50 KB would not fit in 64 KiB
        with pytest.raises(KeyError):
            with tx.loan(50000, np.uint8, timeout=1) as a:
                a[:] = 1
                raise KeyError("no")
    with pytest.raises(TimeoutError):
        rx.recv(timeout=0)
    assert rx.pending_bytes == 0
    with tx.loan(50000, np.uint8, timeout=1) as a:
        a[:] = 2
    assert (rx.recv(timeout=5) == 2).all()


def test_garbage_collected_and_discarded_loans_send_nothing(pair):
    tx, rx = pair
    a = tx.loan(50000, np.uint8, timeout=1)
    a[:] = 3
    with pytest.raises(ChannelError, match="outstanding"):
        tx.send(b"x", timeout=0)
    with pytest.raises(ChannelError, match="outstanding"):
        tx.loan(10, timeout=0)
    s = a[10:]
    del a
    with pytest.raises(ChannelError):                   # the slice still holds the loan
        tx.send(b"x", timeout=0)
    del s
    gc.collect()
    b = tx.loan(50000, np.uint8, timeout=1)             # the space is free again
    tx.discard(b)
    assert not b.flags.writeable
    with pytest.raises(ChannelError, match="published or discarded"):
        tx.publish(b)
    tx.send(np.arange(3), timeout=1)
    assert np.array_equal(rx.recv(timeout=5), np.arange(3))
    with pytest.raises(TimeoutError):
        rx.recv(timeout=0)


def test_loan_on_closed_channel_sends_nothing_and_stays_readable(pair):
    tx, rx = pair
    a = tx.loan(1000, np.uint8)
    a[:] = 4
    tx.close()
    assert (a == 4).all()                               # still mapped
    a[0] = 5                                            # writing is harmless: nothing will send it
    with pytest.raises(ValueError):
        tx.publish(a)
    with pytest.raises(ChannelClosed):
        rx.recv(timeout=1)
    del a


def test_publish_checks_its_argument(pair):
    tx, rx = pair
    other = Channel.create(capacity=1 << 16)
    try:
        b = other.loan(10)
        a = tx.loan(10)
        for bad in (a[1:], np.zeros(10, np.uint8), b"xx", a.view(np.ndarray)):
            with pytest.raises(ValueError):
                tx.publish(bad)
        with pytest.raises(ValueError, match="not a loan of this channel"):
            tx.publish(b)
        tx.publish(a)
        with pytest.raises(ChannelError, match="published or discarded"):
            tx.publish(a)
        other.discard(b)
    finally:
        other.close()
        other.unlink()


def test_loan_argument_errors(pair):
    tx, rx = pair
    with pytest.raises(ValueError, match="fit"):
        tx.loan(1 << 16)                                # header + payload > capacity
    with pytest.raises(ValueError, match="negative"):
        tx.loan((-1, 3))
    with pytest.raises(TypeError):
        tx.loan("10")
    with pytest.raises(TypeError):
        tx.loan(10, dtype=object)
    with pytest.raises(TypeError):
        tx.loan(10, timeout="1")
    with pytest.raises(TypeError):
        tx.loan(True)
    with pytest.raises(TypeError):
        rx.recv_view(timeout="1")
    tx.send(np.zeros(60000, np.uint8))
    with pytest.raises(TimeoutError):
        tx.loan(60000, timeout=0.1)                     # full: nothing reserved
    rx.recv()
    with tx.loan(60000, timeout=1) as a:
        a[:] = 1
    assert rx.recv_view(timeout=1).sum() == 60000


# The C++ loan reads an int or a tuple of ints with a dtype, a type or a dtype name itself
# (numpy's converter) and hands every other form to shm._loan_args: both routes must give the
# same array, and refuse the same things.
@pytest.mark.parametrize("shape,dtype,expect_shape,expect_dtype", [
    (5, np.dtype(np.uint8), (5,), "|u1"),                      # read in C++
    ((2, 3), np.dtype("<f4"), (2, 3), "<f4"),                  # read in C++
    ((), np.dtype("<i8"), (), "<i8"),                          # read in C++: 0-d
    (6, "<f8", (6,), "<f8"),                                   # dtype by name: C++
    (6, "float32", (6,), "<f4"),                               # dtype by name: C++
    (2, "f4,i2", (2,), [("f0", "<f4"), ("f1", "<i2")]),         # structured, by name: C++
    (6, np.float32, (6,), "<f4"),                              # dtype by numpy type: C++
    (6, float, (6,), "<f8"),                                   # dtype by Python type: C++
    (6, None, (6,), "<f8"),                                    # None, as np.dtype(None): Python
    ([2, 3], np.dtype("<f4"), (2, 3), "<f4"),                  # a list: Python
    ([2, 3], np.float32, (2, 3), "<f4"),                       # a list and a type: Python
    (np.int64(4), np.dtype("<u2"), (4,), "<u2"),               # a numpy int: Python
    ((np.int32(2), 3), np.dtype("<u2"), (2, 3), "<u2"),        # numpy ints in a tuple: Python
])
def test_loan_shape_and_dtype_forms(pair, shape, dtype, expect_shape, expect_dtype):
    tx, rx = pair
    a = tx.loan(shape, dtype, timeout=1)
    assert isinstance(a, LoanedArray) and a.shape == expect_shape and a.dtype == np.dtype(expect_dtype)
    a[...] = 3
    tx.publish(a)
    v = rx.recv_view(timeout=5)
    assert v.shape == expect_shape and v.dtype == np.dtype(expect_dtype)
    assert v.tobytes() == np.full(expect_shape, 3, np.dtype(expect_dtype)).tobytes()


U8 = np.dtype(np.uint8)  # a dtype object: the shape is read in C++ (with np.uint8, a type, in Python)


@pytest.mark.parametrize("shape,dtype,error,match", [
    (True, U8, TypeError, "got bool"),
    (True, np.uint8, TypeError, "got bool"),
    ((True, 2), U8, TypeError, "a bool in it"),
    ((True, 2), np.uint8, TypeError, "a bool in it"),
    ((2, 2.0), U8, TypeError, "sequence of ints"),
    (2 ** 70, U8, ValueError, "shape too large"),
    ((1, 2 ** 64), U8, ValueError, "shape too large"),
    ((np.uint64(2 ** 64 - 1),), U8, ValueError, "shape too large"),
    ((2, -1), U8, ValueError, "negative"),
    (3, np.dtype(object), TypeError, "Channel.loan: arrays of dtype object hold Python object pointers"),
    (3, np.dtype([("a", "<i4"), ("b", "O")]), TypeError, "Channel.loan: .* hold Python object pointers"),
    (3, "no such dtype", TypeError, "Channel.loan: not a dtype: 'no such dtype'"),   # C++ tries numpy first
    (3, "O", TypeError, "Channel.loan: arrays of dtype object hold Python object pointers"),
    (3, "f4,O", TypeError, "Channel.loan: .* hold Python object pointers"),
    (3, object, TypeError, "Channel.loan: arrays of dtype object hold Python object pointers"),
    (3, dict, TypeError, "Channel.loan: arrays of dtype object hold Python object pointers"),
    (3, 3.5, TypeError, "Channel.loan: not a dtype: 3.5"),
])
def test_loan_argument_errors_name_the_problem_and_reserve_nothing(pair, shape, dtype, error, match):
    tx, rx = pair
    with pytest.raises(error, match=match):
        tx.loan(shape, dtype, timeout=1)
    assert rx.pending_bytes == 0
    with tx.loan(60000, np.uint8, timeout=0) as a:      # nothing was reserved: the whole ring is free
        a[:] = 9
    assert (rx.recv(timeout=5) == 9).all()


def test_with_block_publishes_once_and_refuses_other_arrays(pair):
    tx, rx = pair
    with tx.loan(4, np.uint8, timeout=1) as a:          # published inside: the exit does nothing more
        a[:] = 1
        tx.publish(a)
    assert (rx.recv(timeout=5) == 1).all()
    with pytest.raises(TimeoutError):
        rx.recv(timeout=0)
    b = tx.loan(4, np.uint8, timeout=1)
    for other in (b[1:], np.zeros(4, np.uint8).view(LoanedArray)):
        with pytest.raises(ValueError, match="only the array that Channel.loan"):
            other.__exit__(None, None, None)
    assert rx.pending_bytes == 0
    b.__exit__(KeyError, KeyError("no"), None)          # an exception: discarded, not sent
    assert not b.flags.writeable
    with pytest.raises(TimeoutError):
        rx.recv(timeout=0)
    with tx.loan(60000, np.uint8, timeout=0) as c:      # its space is free again
        c[:] = 5
    assert (rx.recv(timeout=5) == 5).all()


def test_ufunc_results_on_a_loan_are_plain_arrays(pair):
    tx, rx = pair
    with tx.loan(4, np.float64) as a:
        a[:] = 1
        b = a + 1
        assert type(b) is np.ndarray
        assert float(a.sum()) == 4.0


def test_consumer_role_and_producer_role_stay_separate(pair):
    tx, rx = pair
    tx.send(b"abc")
    rx.recv_view(timeout=1)
    with pytest.raises(ChannelError, match="consumer"):
        rx.loan(3)
    with pytest.raises(ChannelError, match="producer"):
        tx.recv_view(timeout=0)


# ---- hostile headers and peer death ----------------------------------------------------------
HOSTILE = r"""
import mmap, os, struct, sys
import numpy as np
from fastcopy import _core
from fastcopy.shm import Channel, ChannelCorrupted, ChannelError

PREFIX = sys.argv[1]
LAYOUT = _core.shm_layout()
CH, MSG = LAYOUT["channel"], LAYOUT["message"]
H = CH["header_bytes"]          # the ring starts here: the first message's header
SHAPE = H + MSG["bytes"]        # its shape
CAP = 1 << 16

def put(m, part, name, value, base=0):  # a header word of _core.shm_layout(), machine byte order
    offset, size = part["fields"][name]
    struct.pack_into({4: "=I", 8: "=Q"}[size], m, base + offset, value)

def pad(m, header_len, payload_len, seq=0):  # a padding record in place of the first message
    for name, value in (("magic", MSG["pad_magic"]), ("header_len", header_len), ("payload_len", payload_len),
                        ("dtype_len", 0), ("ndim", 0), ("seq", seq)):
        put(m, MSG, name, value, H)
n = [0]

def fresh():
    n[0] += 1
    tx = Channel.create(PREFIX + str(n[0]), capacity=CAP)
    rx = Channel.attach(tx.name)
    fd = os.open("/dev/shm/" + tx.name, os.O_RDWR)
    m = mmap.mmap(fd, 0)
    os.close(fd)
    return tx, rx, m

def done(tx, rx, m):
    m.close()
    for c in (rx, tx):
        try:
            c.close()
        except ChannelError:
            pass
    tx.unlink()

def expect(exc, fn, what):
    try:
        r = fn()
    except exc:
        return
    except BaseException as e:
        raise AssertionError(f"{what}: {type(e).__name__}: {e}")
    raise AssertionError(f"{what}: no exception, got {r!r}")

cases = 0
# A message whose payload length claims more than the ring: never a view beyond it.
for plen in (CAP, CAP - 64, 1 << 40, (1 << 46)):
    tx, rx, m = fresh()
    tx.send(np.zeros(100, np.uint8))
    put(m, MSG, "payload_len", plen, H)
    struct.pack_into("=Q", m, SHAPE, plen)          # shape[0] (uint8: product == payload)
    # (recv() alike: a huge claimed message cannot be allocated for the copy path)
    expect((ChannelError, TimeoutError, MemoryError), lambda: rx.recv_view(timeout=0.2), f"payload_len {plen}")
    done(tx, rx, m); cases += 1

# A message claiming bytes that are not published yet: the view waits, then times out.
tx, rx, m = fresh()
tx.send(np.zeros(100, np.uint8))
put(m, MSG, "payload_len", 20000, H); struct.pack_into("=Q", m, SHAPE, 20000)
expect(TimeoutError, lambda: rx.recv_view(timeout=0.2), "unpublished payload")
done(tx, rx, m); cases += 1

# Forged padding records.
for what, patch in [
    ("pad too short", lambda m: pad(m, 64, 100)),
    ("pad to a page not published", lambda m: pad(m, 64, 4032)),
    ("pad beyond ring", lambda m: pad(m, 64, CAP)),
    ("pad bad header_len", lambda m: pad(m, 128, CAP - 64)),
    ("pad not published", lambda m: pad(m, 64, CAP - 64)),
    ("pad wrong seq", lambda m: pad(m, 64, CAP - 64, seq=7)),
]:
    tx, rx, m = fresh()
    tx.send(np.zeros(100, np.uint8))
    patch(m)
    expect(ChannelCorrupted, lambda: rx.recv_view(timeout=0), what)
    done(tx, rx, m); cases += 1

# A padding record whose length is not a multiple of 64, over a full ring: skipping it would
# leave the tail off a message boundary, 8 bytes before the ring's end.
tx, rx, m = fresh()
tx.send(np.zeros(CAP - 64, np.uint8))
pad(m, 64, CAP - 72)
expect(ChannelCorrupted, lambda: rx.recv_view(timeout=0), "pad not a multiple of 64")
done(tx, rx, m); cases += 1

# The tail moved by someone else while a view is held.
tx, rx, m = fresh()
tx.send(np.zeros(100, np.uint8)); tx.send(np.zeros(100, np.uint8))
v = rx.recv_view(timeout=1)
put(m, CH, "tail", 12345 * 64)
expect(ChannelCorrupted, lambda: rx.recv_view(timeout=0), "tail moved")
del v
done(tx, rx, m); cases += 1

# Fuzz the first messages while views are taken: only clean exceptions.
rng = np.random.default_rng(5)
ok = (ChannelError, ValueError, TimeoutError, TypeError, MemoryError)
for k in range(300):
    tx, rx, m = fresh()
    for j in range(3):
        with tx.loan(int(rng.integers(0, 2000)), rng.choice(["<f8", "|u1", ">i2"]), timeout=5) as a:
            a[...] = 1
    for _ in range(int(rng.integers(1, 6))):
        off = int(rng.integers(H, H + 12000))
        nb = int(rng.integers(1, 9))
        m[off:off + nb] = rng.integers(0, 256, nb, dtype=np.uint8).tobytes()
    held = []
    for op in range(4):
        try:
            held.append(rx.recv_view(timeout=0))
            _ = held[-1].sum()                      # reading a view never faults
        except ok:
            pass
    del held
    done(tx, rx, m); cases += 1
print("OK", cases)
"""


@no_subprocess
def test_hostile_headers_under_views(tmp_path):
    proc = run_script(tmp_path, HOSTILE, PREFIX + "hostile-", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("OK"), proc.stdout
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(PREFIX + "hostile-")]


PEER_DEATH = r"""
import multiprocessing as mp, os, signal, sys, time
import numpy as np
from fastcopy.shm import Channel, PeerDied

def producer(name):
    ch = Channel.attach(name)
    with ch.loan(30000, np.uint8) as a:
        a[:] = 1
    ch.send(np.full(30000, 2, np.uint8))
    while True:
        time.sleep(1)

def consumer(name, ready):
    ch = Channel.attach(name)
    v = ch.recv_view(timeout=10)     # held: the producer cannot reuse its slot
    ready.set()
    while True:
        time.sleep(1)

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    # 1. The producer dies while the consumer holds a view: the view stays intact.
    with Channel.create(capacity=1 << 16) as ch:
        p = ctx.Process(target=producer, args=(ch.name,))
        p.start()
        v = ch.recv_view(timeout=30)
        time.sleep(0.2)
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        assert (v == 1).all() and not v.flags.writeable
        w = ch.recv_view(timeout=10)            # published before the death: still delivered
        assert (w == 2).all()
        try:
            ch.recv_view(timeout=10)
            raise SystemExit("no PeerDied")
        except PeerDied:
            pass
        assert (v == 1).all() and ch.held_views == 2
        del v, w
    # 2. The consumer dies holding a view while the producer waits for space.
    with Channel.create(capacity=1 << 16) as ch:
        ready = ctx.Event()
        c = ctx.Process(target=consumer, args=(ch.name, ready))
        c.start()
        ch.send(np.ones(40000, np.uint8))
        assert ready.wait(30)
        killer = __import__("threading").Timer(0.3, lambda: os.kill(c.pid, signal.SIGKILL))
        killer.start()
        t0 = time.monotonic()
        try:
            with ch.loan(40000, np.uint8, timeout=20) as a:
                a[:] = 1
            raise SystemExit("no PeerDied")
        except PeerDied:
            pass
        assert time.monotonic() - t0 < 10
        c.join()
    print("OK")
"""


@no_subprocess
def test_peer_death_while_a_view_is_held(tmp_path):
    proc = run_script(tmp_path, PEER_DEATH, timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "OK"


@no_subprocess
def test_ctrl_c_interrupts_recv_view_and_loan(tmp_path):
    code = SIGINT_HANDLER + textwrap.dedent(r"""
    import os, signal, threading, time
    import numpy as np
    from fastcopy.shm import Channel
    tx = Channel.create(capacity=1 << 16)
    rx = Channel.attach(tx.name)
    def full_then_loan():
        tx.send(np.zeros(30000, np.uint8))
        tx.loan(60000)
    for fn in (rx.recv_view, full_then_loan):
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        try:
            fn()
            raise SystemExit("not interrupted")
        except KeyboardInterrupt:
            dt = time.monotonic() - t0
            assert dt < 2.0, dt
    print("OK")
    """)
    proc = run_script(tmp_path, code, prefix=SIGINT_IGNORED)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "OK"


def test_forked_child_dropping_inherited_view_does_not_move_tail(pair):
    tx, rx = pair
    tx.send(np.ones(40000, np.uint8))
    v = rx.recv_view(timeout=5)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            del v
            gc.collect()
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert rx.held_views == 1
    with pytest.raises(TimeoutError):
        tx.send(np.ones(40000, np.uint8), timeout=0.2)  # still held by the parent
    del v
    tx.send(np.ones(40000, np.uint8), timeout=5)


def test_slot_type_is_internal():
    assert hasattr(_core, "ShmSlot")


# ---- how writes into the ring store (cached or streaming, learned as they run) -----------------
def _ring_write_kernel(dst: np.ndarray, src: np.ndarray):
    """The kernel the ToShared policy gives this copy, and its streaming twin when it has a
    usable one (else None): the two modes a loan's fill chooses between."""
    _core.reset_last_kernel()
    _core.copy_region(dst, src, 1)
    name = _core.last_kernel()
    table = {k["name"]: k for k in _core.kernel_table()}
    entry = table.get(name)
    twin = entry["twin"] if entry and not entry["streaming"] else None
    return name, twin if twin and table[twin]["supported"] else None


def test_fills_of_loans_by_fastcopy_learn_the_store_mode_and_stay_correct(loan_fills_can_stream):
    tx = Channel.create(capacity=4 << 20)
    rx = Channel.attach(tx.name)
    try:
        n = 1 << 20
        rng = np.random.default_rng(7)
        messages = 40
        # One page-aligned source buffer: every fill has (dst - src) mod the page size = 0 (large loans
        # start on a page), so the policy gives each the same kernel as the probe, and the NT
        # rule's page-distance guard never applies (where numpy put a plain np.empty depended
        # on the tests that ran before: at a small page offset the fills are not timed).
        buf = np.empty(n + PAGE, np.uint8)
        start = (-buf.ctypes.data) % PAGE
        src = buf[start:start + n]
        with tx.loan(n, np.uint8) as probe:
            assert _ring_write_kernel(probe, src) == loan_fills_can_stream
        cached, streaming = loan_fills_can_stream
        rx.recv_view()
        ran = set()
        for i in range(messages):
            src[...] = rng.integers(0, 256, n, dtype=np.uint8)
            with tx.loan(n, np.uint8) as a:
                _core.reset_last_kernel()
                fastcopy.copy(a, src)
                ran.add(_core.last_kernel())
            v = rx.recv_view()
            assert np.array_equal(v, src), f"message {i}"
            del v
        modes = tx.store_modes
        assert len(modes) == 1 and modes[0]["sizes"] == "1-4 MiB", modes
        m = modes[0]
        assert m["cached_writes"] + m["streaming_writes"] == messages, m
        # Each mode has run (the first trial of the other mode comes after 8 writes) and has a rate.
        assert m["cached_writes"] >= 1 and m["streaming_writes"] >= 1, m
        assert ran == {cached, streaming}, (ran, m)  # and each mode ran its own kernel
        assert m["cached_gbps"] > 0 and m["streaming_gbps"] > 0, m
        assert m["stores"] in ("cached", "streaming")
        # Copies that are not fills of the loan itself are not timed: a slice, np.copyto.
        with tx.loan(n, np.uint8) as a:
            fastcopy.copy(a[: n // 2], src[: n // 2])
            np.copyto(a[n // 2:], src[n // 2:])
        assert np.array_equal(rx.recv_view(), src)
        after = tx.store_modes[0]
        assert after["cached_writes"] + after["streaming_writes"] == messages, after
        # Small loans are never timed.
        with tx.loan(1000, np.uint8) as a:
            fastcopy.copy(a, src[:1000])
        assert np.array_equal(rx.recv_view(), src[:1000])
        assert len(tx.store_modes) == 1
        # send() is not timed: its consumer copies out while it writes, and streaming stores
        # cost that consumer more than they save (docs/shm.md).
        for _ in range(3):
            tx.send(src)
            assert np.array_equal(rx.recv(), src)
        assert tx.store_modes == [after], tx.store_modes
        assert rx.store_modes == []  # the consumer writes nothing into the ring
    finally:
        rx.close()
        tx.close()


@no_subprocess
def test_a_forced_kernel_is_not_replaced_by_the_store_mode(tmp_path):
    # FASTCOPY_KERNEL forces one kernel for every copy: fills of loans are not timed then.
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {SRC!r})
        import numpy as np, fastcopy
        from fastcopy import _core
        from fastcopy.shm import Channel
        tx = Channel.create(capacity=4 << 20); rx = Channel.attach(tx.name)
        src = np.arange(1 << 20, dtype=np.uint8)
        for _ in range(20):
            with tx.loan(src.shape, src.dtype) as a:
                _core.reset_last_kernel()
                fastcopy.copy(a, src)
                assert _core.last_kernel() == "generic", _core.last_kernel()
            assert np.array_equal(rx.recv_view(), src)
        assert tx.store_modes == [], tx.store_modes
        rx.close(); tx.close()
        print("ok")
    """)
    env = dict(os.environ, FASTCOPY_KERNEL="generic")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_fills_at_a_page_distance_the_nt_rule_forbids_are_not_timed(loan_fills_can_stream):
    # Streaming stores whose loads 4K-alias the stores in flight run several times slower; the
    # profile's NT rule names the distances where they are never used, and the store mode
    # does not try them there either (the forced profile's rule: none at distances 1-127).
    assert fastcopy.info()["profile"]["regions"]["to_shared"]["nt"]["min_page_distance"] == 128
    tx = Channel.create(capacity=4 << 20)
    rx = Channel.attach(tx.name)
    try:
        n = 1 << 20
        buf = np.empty(n + 8192, np.uint8)
        start = (4032 - buf.ctypes.data) % PAGE  # src at page offset 4032: a page-aligned loan is 64 ahead
        src = buf[start:start + n]
        src[...] = np.arange(n, dtype=np.uint64).astype(np.uint8)
        for _ in range(20):
            with tx.loan(n, np.uint8) as a:
                assert (a.ctypes.data - src.ctypes.data) % PAGE == 64
                fastcopy.copy(a, src)
            assert np.array_equal(rx.recv_view(), src)
        assert tx.store_modes == [], tx.store_modes
    finally:
        rx.close()
        tx.close()
