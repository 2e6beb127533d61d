"""fastcopy.net.Publisher and Subscriber between two Zenoh sessions on loopback (tcp/127.0.0.1,
ports picked here, multicast scouting off)."""
from __future__ import annotations

import time

import numpy as np
import pytest

from _child import SIGINT_HANDLER, explain, run_script
from _net import endpoint, free_port, needs_zenoh
from conftest import no_subprocess

pytestmark = [pytest.mark.net, needs_zenoh]

DTYPES = ["u1", "<i2", ">i4", "f4", "<f8", "c16", "?", "S3", "U2", "M8[us]"]


@pytest.fixture
def pair():
    """(publisher, subscriber factory) on a fresh port; the subscriber is connected when returned."""
    import fastcopy.net as net

    port = free_port()
    pub = net.Publisher("fastcopy/test/arrays", listen=[endpoint(port)])
    subs = []

    def make(**kw):
        sub = net.Subscriber("fastcopy/test/arrays", connect=[endpoint(port)], **kw)
        subs.append(sub)
        _wait_connected(pub, sub)
        return sub

    yield pub, make
    for s in subs:
        s.close()
    pub.close()


def _wait_connected(pub, sub) -> None:
    """Sends probes (a 0-d int8 array) until the subscriber gets one; then drains them and numbers
    from scratch (bounded: 20 s)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pub.send(np.int8(-1))
        try:
            sub.recv_view(timeout=0.05)
            break
        except TimeoutError:
            continue
    else:
        raise AssertionError("subscriber never connected")
    time.sleep(0.1)
    while True:
        try:
            sub.recv_view(timeout=0.1)
        except TimeoutError:
            break
        except Exception:
            continue
    sub.lost = 0


def _random_message(rng, k):
    dt = np.dtype(DTYPES[k % len(DTYPES)])
    shape = tuple(int(n) for n in rng.integers(0, 40, size=int(rng.integers(0, 4))))
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
    arr = raw.view(dt).reshape(shape)
    return np.asfortranarray(arr) if k % 3 == 0 else arr


def test_random_arrays_arrive_exact_and_in_order(pair):
    pub, make = pair
    sub = make(capacity=16)
    rng = np.random.default_rng(7)
    sent = [_random_message(rng, k) for k in range(300)]
    for arr in sent:
        pub.send(arr)
    for k, arr in enumerate(sent):
        got = sub.recv(timeout=20)
        assert got.dtype == arr.dtype and got.shape == arr.shape, k
        assert got.tobytes(order="A") == arr.tobytes(order="A"), k
        assert got.flags.writeable
    assert sub.lost == 0


def test_recv_into_out_and_recv_view(pair):
    pub, make = pair
    sub = make()
    big = np.random.default_rng(3).random((512, 1024))  # 4 MiB: fragmented by Zenoh
    pub.send(big)
    pub.send(big[::-1])
    out = np.empty_like(big)
    assert sub.recv(out=out, timeout=20) is out
    np.testing.assert_array_equal(out, big)
    view = sub.recv_view(timeout=20)
    assert not view.flags.writeable
    np.testing.assert_array_equal(view, big[::-1])
    pub.send(big)
    wrong = np.full((3,), 7.0)
    with pytest.raises(ValueError, match="shape"):
        sub.recv(out=wrong, timeout=20)
    assert (wrong == 7.0).all()                         # the destination is untouched
    np.testing.assert_array_equal(sub.recv(timeout=20), big)  # and the message stays


def test_foreign_payload_is_rejected_and_the_stream_goes_on(pair):
    import fastcopy.net as net

    pub, make = pair
    sub = make()
    pub._pub.put(b"not a fastcopy message, long enough to hold a header")
    pub._pub.put(b"FCN1" + bytes(40))
    pub.send(np.arange(5))
    with pytest.raises(net.WireError, match="foreign"):
        sub.recv(timeout=20)
    with pytest.raises(net.WireError):
        sub.recv(timeout=20)
    np.testing.assert_array_equal(sub.recv(timeout=20), np.arange(5))
    assert sub.rejected == 2


def test_slow_subscriber_in_drop_mode_counts_every_loss(pair):
    """A subscriber that does not read while 200 messages arrive keeps the newest `capacity`;
    MessagesLost reports the rest exactly: received + lost == published, no torn message."""
    from fastcopy.shm import MessagesLost

    pub, make = pair
    sub = make(capacity=8, overflow="drop")
    n = 200
    for k in range(n):
        pub.send(np.full(1000, k, dtype=np.int64))
    received, lost, last = 0, 0, -1
    while last != n - 1:
        try:
            arr = sub.recv(timeout=20)
        except MessagesLost as exc:
            lost += exc.count
            continue
        assert (arr == arr[0]).all(), "torn message"
        assert arr[0] > last
        last = int(arr[0])
        received += 1
    assert lost > 0
    assert received + lost == n
    assert sub.lost == lost


def test_open_session_applies_further_zenoh_settings():
    """settings= reaches Zenoh's configuration: a path Zenoh does not know is refused by Zenoh,
    a real one opens a session that carries arrays."""
    import fastcopy.net as net

    with pytest.raises(Exception, match="unknown key"):
        net.open_session(settings={"transport/link/rx/no_such_setting": 1})
    port = free_port()
    settings = {"transport/link/rx/buffer_size": 1 << 20}
    pub = net.Publisher("fastcopy/test/settings", net.open_session(listen=[endpoint(port)], settings=settings))
    sub = net.Subscriber("fastcopy/test/settings", net.open_session(connect=[endpoint(port)], settings=settings))
    try:
        _wait_connected(pub, sub)
        pub.send(np.arange(1000, dtype=np.int64))
        assert sub.recv(timeout=20).tolist() == list(range(1000))
    finally:
        sub.close()
        pub.close()
        pub.session.close()
        sub.session.close()


def test_recv_without_timeout_waits_and_close_from_another_thread_ends_it(pair):
    """A recv without a timeout waits for the next message; close() from another thread ends a
    wait with ValueError, and recv after close raises at once."""
    import threading

    pub, make = pair
    sub = make()
    threading.Timer(0.3, lambda: pub.send(np.arange(3))).start()
    t0 = time.monotonic()
    assert sub.recv().tolist() == [0, 1, 2]
    assert time.monotonic() - t0 >= 0.25
    outcome = []

    def reader():
        try:
            sub.recv()
            outcome.append("returned")
        except ValueError as exc:
            outcome.append(str(exc))

    waiting = threading.Thread(target=reader, daemon=True)
    waiting.start()
    time.sleep(0.3)
    sub.close()
    waiting.join(10)
    assert not waiting.is_alive(), "close() did not end the wait"
    assert len(outcome) == 1 and "closed subscriber" in outcome[0], outcome
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="closed subscriber"):
        sub.recv(timeout=5)
    assert time.monotonic() - t0 < 1


def test_recv_with_a_timeout_raises_on_time_and_takes_what_arrives(pair):
    import threading

    pub, make = pair
    sub = make()
    for timeout in (0, 0.05, 0.3):
        outcome = []

        def reader():
            t0 = time.monotonic()
            try:
                sub.recv(timeout=timeout)
                outcome.append(("returned", 0.0))
            except TimeoutError:
                outcome.append(("timed out", time.monotonic() - t0))

        waiting = threading.Thread(target=reader, daemon=True)
        waiting.start()
        waiting.join(timeout + 5)
        assert not waiting.is_alive(), f"recv(timeout={timeout}) still waiting"
        assert outcome[0][0] == "timed out" and timeout <= outcome[0][1] < timeout + 2, outcome
    threading.Timer(0.2, lambda: pub.send(np.arange(4))).start()
    assert sub.recv(timeout=20).tolist() == [0, 1, 2, 3]


@no_subprocess
def test_ctrl_c_ends_a_recv_without_timeout(tmp_path):
    """Ctrl-C during a recv that waits without a timeout raises KeyboardInterrupt there."""
    code = SIGINT_HANDLER + f"""
import os, threading, time
import fastcopy.net as net
sub = net.Subscriber("fastcopy/test/ctrl-c", listen=["{endpoint(free_port())}"])
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
t0 = time.monotonic()
try:
    sub.recv()
    print("returned")
except KeyboardInterrupt:
    print("interrupted", round(time.monotonic() - t0, 1))
sub.close()
"""
    proc = run_script(tmp_path, code, timeout=60)
    assert proc.returncode == 0, explain(proc)
    words = proc.stdout.split()
    assert words[0] == "interrupted" and 0.4 <= float(words[1]) < 5, explain(proc)
