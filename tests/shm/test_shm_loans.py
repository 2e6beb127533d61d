"""Loans on a Channel that send nothing (abandoned, discarded, garbage-collected, on a closed
channel), loan arguments and their errors, the with-block, the roles; and how fills of a loan
store into the ring (cached or streaming, learned as they run).
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
from typing import List

import numpy as np
import pytest
from _child import SRC
from _shm_layout import PAGE
from _fixtures import pair  # noqa: F401  (a fixture)
from conftest import no_subprocess, profile_forced

import fastcopy
from fastcopy import _core
from fastcopy.shm import Channel, ChannelClosed, ChannelError, LoanedArray

pytestmark = pytest.mark.sanitize

# Children import the same fastcopy as this process (CI installs it; src/ has no _core there).
PREFIX = f"fastcopy-test-zcl-{os.getpid()}-"


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


def _fill_loans_at_distance_64(n: int) -> List:
    """Fills 20 loans of n bytes from a source 64 bytes behind them (mod 4096); the store modes
    the Channel recorded."""
    tx = Channel.create(capacity=4 << 20)
    rx = Channel.attach(tx.name)
    try:
        buf = np.empty(n + 8192, np.uint8)
        start = (4032 - buf.ctypes.data) % PAGE  # src at page offset 4032: a page-aligned loan is 64 ahead
        src = buf[start:start + n]
        src[...] = np.arange(n, dtype=np.uint64).astype(np.uint8)
        for _ in range(20):
            with tx.loan(n, np.uint8) as a:
                assert (a.ctypes.data - src.ctypes.data) % PAGE == 64
                fastcopy.copy(a, src)
            assert np.array_equal(rx.recv_view(), src)
        return list(tx.store_modes)
    finally:
        rx.close()
        tx.close()


def test_fills_beyond_the_guards_size_limit_are_timed_at_any_distance(loan_fills_can_stream):
    # The NT rule's guard limited to copies below 512 KiB (min_page_distance_below): 1 MiB fills at
    # distance 64 may stream, so the store mode times both ways there.
    profile = json.loads(fastcopy._core.active_profile_json())
    profile["regions"]["to_shared"]["nt"]["min_page_distance_below"] = 512 << 10
    with profile_forced(profile):
        assert fastcopy.info()["profile"]["regions"]["to_shared"]["nt"]["min_page_distance_below"] == 512 << 10
        assert _fill_loans_at_distance_64(1 << 20) != []


def test_fills_at_a_page_distance_the_nt_rule_forbids_are_not_timed(loan_fills_can_stream):
    # Streaming stores whose loads 4K-alias the stores in flight run several times slower; the
    # profile's NT rule names the distances where they are never used, and the store mode
    # does not try them there either (the forced profile's rule: none at distances 1-127).
    assert fastcopy.info()["profile"]["regions"]["to_shared"]["nt"]["min_page_distance"] == 128
    assert fastcopy.info()["profile"]["regions"]["to_shared"]["nt"]["min_page_distance_below"] is None
    assert _fill_loans_at_distance_64(1 << 20) == []

