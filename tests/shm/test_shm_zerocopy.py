"""Zero copy on a Channel: loaned arrays (``loan``/``publish``) and read-only views (``recv_view``).

Round trips, where loans and sent messages lie in the ring, lifetime (slices keep the slot,
``del`` frees it) and read-only enforcement. Loans that send nothing and loan arguments:
test_shm_loans.py; hostile peers under views: test_shm_views_hostile.py.
"""
from __future__ import annotations

import gc
import os
import threading
import time

import numpy as np
import pytest
from _child import run_script
from _shm_layout import CHANNEL, PAGE, peek, poke
from _fixtures import pair  # noqa: F401  (a fixture)
from conftest import no_subprocess

from fastcopy import _core
from fastcopy.shm import Channel, LoanedArray

pytestmark = pytest.mark.sanitize

# Children import the same fastcopy as this process (CI installs it; src/ has no _core there).
PREFIX = f"fastcopy-test-zc-{os.getpid()}-"


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


def test_a_padded_send_does_not_wait_for_the_consumer_to_empty_the_ring(pair):
    """A message that would wrap goes to the ring's start behind padding while an earlier
    message is still unread: it needs room for the padding and itself, not an empty ring."""
    tx, rx = pair                                       # a 64 KiB ring
    tx.send(np.zeros(30000, np.uint8), timeout=5)       # the head moves to 30080
    assert rx.recv(timeout=5).nbytes == 30000
    first = np.full(20000, 7, np.uint8)                 # 30080..50176, left unread
    tx.send(first, timeout=5)
    second = np.arange(20000, dtype=np.uint8)           # 15360 bytes to the end + 20096 fit the free 45440
    tx.send(second, timeout=0.5)                        # an empty ring is never needed: no TimeoutError
    assert np.array_equal(rx.recv(timeout=5), first)
    v = rx.recv_view(timeout=5)
    assert np.array_equal(v, second) and rx.held_views == 1
    del v


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
