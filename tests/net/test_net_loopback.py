"""fastcopy.net.Publisher and Subscriber between two Zenoh sessions on loopback (tcp/127.0.0.1,
ports picked here, multicast scouting off)."""
from __future__ import annotations

import time

import numpy as np
import pytest

from _child import SIGINT_HANDLER, explain, run_script
from _net import endpoint, free_port, needs_zenoh
from conftest import no_subprocess
from fastcopy.shm import MessagesLost

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
        sub.lost = 0  # the test counts from here: an end marker Zenoh lost is not the test's
        return sub

    yield pub, make
    for s in subs:
        s.close()
    pub.close()


def _wait_connected(pub, sub) -> None:
    """Sends probes (a 0-d int8 array, -1) until the subscriber gets one, then an end marker
    (-2), and drains up to it: one publisher's messages arrive in order, so no probe comes after
    it, however late the network delivers. Zenoh may lose a message even in block mode
    (docs/net.md): an end marker not seen within a second is followed by another (-3, -4, ...),
    and only the last one sent ends the drain, so no marker comes after it either (bounded: 20 s)."""
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
    for marker in range(-2, -100, -1):
        pub.send(np.int8(marker))
        resend = min(deadline, time.monotonic() + 1.0)
        while time.monotonic() < resend:
            try:
                if sub.recv_view(timeout=max(0.0, resend - time.monotonic())).item() == marker:
                    return
            except TimeoutError:
                break
            except MessagesLost:  # the lost message is counted; the next recv goes on
                continue
        if time.monotonic() >= deadline:
            break
    raise AssertionError("no end of the probes arrived")


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
    # and the message stays: the subscriber holds it, so the recv does not wait for the network
    np.testing.assert_array_equal(sub.recv(timeout=2), big)


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


LARGE = 2621440  # bytes: a message in pieces (above fastcopy.net._wire.SPLIT_FROM, checked below)


@pytest.mark.parametrize("elements, n, capacity", [(1000, 200, 8), (LARGE // 8, 40, 8), (LARGE // 8, 40, 4)],
                         ids=["whole", "in-pieces", "in-pieces-one-message-held"])
def test_slow_subscriber_in_drop_mode_counts_every_loss(pair, elements, n, capacity):
    """A subscriber that does not read while messages arrive keeps the newest `capacity`
    payloads (a message in pieces takes one per piece, four here); MessagesLost reports the
    rest exactly: received + lost == published, no torn message. It starts reading only once
    its Zenoh session has delivered every message: a second subscriber of the same session
    (which Zenoh hands each sample right after or before it) has read a last one, sent after
    them. Zenoh may lose messages even in block mode (docs/net.md); the witness then counts
    them lost too, and messages go on until it has read one from n on."""
    import threading

    import fastcopy.net as net
    from fastcopy.shm import MessagesLost

    from fastcopy.net import _wire

    assert (elements * 8 > _wire.SPLIT_FROM) == (elements == LARGE // 8)
    assert _wire.piece_bytes_for(LARGE) * 4 == LARGE
    pub, make = pair
    sub = make(capacity=capacity, overflow="drop")
    witness = net.Subscriber(pub.key, sub.session, capacity=64)
    seen, witness_lost = [], []

    def watch():
        while not seen or seen[-1] < n:
            try:
                seen.append(int(witness.recv(timeout=20)[0]))
            except MessagesLost as exc:
                witness_lost.append(exc.count)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        k = 0
        for k in range(n + 1):
            pub.send(np.full(elements, k, dtype=np.int64))
        deadline = time.monotonic() + 60
        while watcher.is_alive() and time.monotonic() < deadline:
            watcher.join(0.05)
            if watcher.is_alive() and k < n + 1000:  # message n lost on the way: one more
                k += 1
                pub.send(np.full(elements, k, dtype=np.int64))
        assert not watcher.is_alive(), "the witness never read a message from n on"
        assert seen == sorted(set(seen)) and seen[-1] >= n, seen
        assert len(seen) + sum(witness_lost) == seen[-1] - seen[0] + 1, (len(seen), witness_lost)
    finally:
        witness.close()
    last_delivered = seen[-1]
    received, lost, last = 0, 0, -1
    while last < last_delivered:
        try:
            arr = sub.recv(timeout=20)
        except MessagesLost as exc:
            lost += exc.count
            continue
        assert arr.shape == (elements,) and (arr == arr[0]).all(), "torn message"
        assert arr[0] > last
        last = int(arr[0])
        received += 1
    assert lost > 0
    assert received + lost == last + 1
    assert sub.lost == lost


class _CountingPuts:
    """Stands in for a Zenoh publisher: records whether each put was a piece (its kind byte)."""

    def __init__(self, inner):
        self.inner, self.puts = inner, []

    def put(self, payload, **kw):
        self.puts.append(bytes(payload[5:6]) == b"P")
        return self.inner.put(payload, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_large_messages_travel_in_pieces_and_arrive_exact(pair, monkeypatch):
    """Messages above the split size go as a head and pieces, one Zenoh message each,
    and come back exact through recv (the subscriber's own writable array), recv_view
    (read-only) and recv(out=); smaller ones go whole. The rule for peers across the network
    is forced (on loopback Zenoh reaches the subscriber through shared memory, where messages
    up to WHOLE_THROUGH_SHARED_MEMORY_UP_TO go whole)."""
    import fastcopy.net as net
    from fastcopy.net import _wire

    monkeypatch.setattr(net, "through_shared_memory_only", lambda session: False)
    pub, make = pair
    sub = make(capacity=4)
    pub._pub = counting = _CountingPuts(pub._pub)
    rng = np.random.default_rng(3)
    whole = rng.integers(0, 256, _wire.SPLIT_FROM, dtype=np.uint8)
    one_more = rng.integers(0, 256, _wire.SPLIT_FROM + 1, dtype=np.uint8)
    fortran = np.asfortranarray(rng.standard_normal((3, (_wire.PIECES + 1) * _wire.PIECE_BYTES // 24 + 5)))
    expected = []
    for arr in (whole, one_more, fortran):
        pub.send(arr)
        parts = -(-arr.nbytes // _wire.piece_bytes_for(arr.nbytes))
        expected += [False] + [True] * (parts - 1)
    assert _wire.piece_bytes_for(fortran.nbytes) == _wire.PIECE_BYTES
    assert _wire.piece_bytes_for(one_more.nbytes) == _wire.MIN_PIECE_BYTES == _wire.SPLIT_FROM
    # one_more: a head and one piece (of one byte); fortran: a head and PIECES + 1 pieces.
    assert counting.puts == expected and expected.count(True) == 1 + _wire.PIECES + 1
    got = sub.recv(timeout=20)
    assert got.tobytes() == whole.tobytes()
    got = sub.recv(timeout=20)
    assert got.flags.writeable and got.tobytes() == one_more.tobytes()
    view = sub.recv_view(timeout=20)
    assert not view.flags.writeable and view.flags.f_contiguous
    np.testing.assert_array_equal(view, fortran)
    pub.send(one_more)
    out = np.zeros_like(one_more)
    assert sub.recv(out=out, timeout=20) is out and out.tobytes() == one_more.tobytes()
    assert sub.lost == 0 and sub.rejected == 0


def test_a_payload_the_publisher_rebuilds_never_reaches_a_subscriber_changed(pair):
    """The publisher builds every payload in one bytearray of its own, which it overwrites for
    the next one as soon as put returns: Zenoh must have copied it by then. Messages of each
    kind (whole, whole through shared memory, in pieces), each filled with its own number,
    sent back to back from another thread while the subscriber reads, arrive each with its
    own bytes. On this one-host pair they go out of the publisher's pool of Zenoh shared memory,
    whose buffers Zenoh gives back to the pool only once the subscriber has let them go."""
    import threading

    pub, make = pair
    sub = make(capacity=8)
    sizes = [64 << 10, 1 << 20, 6 << 20]
    count = 60
    failed = []

    def send():
        try:
            for k in range(count):
                pub.send(np.full(sizes[k % 3], k % 251, np.uint8))
        except Exception as exc:  # reported below
            failed.append(exc)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        for k in range(count):
            got = sub.recv_view(timeout=30)
            assert got.nbytes == sizes[k % 3] and int(got.min()) == int(got.max()) == k % 251, k
    finally:
        sender.join(60)
    assert not failed and sub.lost == 0
    assert pub._shared.unavailable is None and pub._shared.through_pool >= count // 2, vars(pub._shared)


def _raw_publisher(pub):
    """A plain Zenoh publisher on the pair's key (the publisher's session), to send parts by hand."""
    zenoh = __import__("zenoh")
    return pub.session.declare_publisher(pub.key, congestion_control=zenoh.CongestionControl.BLOCK)


def _put_parts(raw, parts):
    for buf in parts:
        raw.put(buf)


def test_a_message_missing_a_piece_is_lost_and_counted_never_torn(pair):
    """A message whose middle piece never comes, a piece without its head, and a head of the
    same publisher cutting a message short: each cut message is counted in MessagesLost by the
    number gap, the complete ones arrive exact, and nothing is rejected."""
    from fastcopy.net._wire import encode_parts
    from fastcopy.shm import MessagesLost

    pub, make = pair
    sub = make(capacity=8)
    raw = _raw_publisher(pub)
    msgs = [np.full(1000, k, dtype=np.int32) for k in range(5)]
    parts = [list(encode_parts(m, k, 99, 1024)) for k, m in enumerate(msgs)]
    assert all(len(p) == 4 for p in parts)
    _put_parts(raw, parts[0])
    _put_parts(raw, parts[1][:2] + parts[1][3:])   # a piece missing
    _put_parts(raw, parts[2][2:3])                 # a piece whose head never came
    _put_parts(raw, parts[2][:2])                  # cut short by the next head
    _put_parts(raw, parts[3])
    _put_parts(raw, parts[4])
    assert sub.recv(timeout=20).tolist() == msgs[0].tolist()
    with pytest.raises(MessagesLost) as exc:
        sub.recv(timeout=20)
    assert exc.value.count == 2
    assert sub.recv(timeout=20).tolist() == msgs[3].tolist()
    assert sub.recv(timeout=20).tolist() == msgs[4].tolist()
    assert sub.lost == 2 and sub.rejected == 0
    raw.undeclare()


def test_two_publishers_pieces_interleaved_on_one_key(pair):
    """Two publishers' messages in pieces, interleaved piece by piece on one key, each complete
    and in its publisher's order, with no loss counted (each publisher is numbered on its own)."""
    from fastcopy.net._wire import encode_parts

    pub, make = pair
    sub = make(capacity=8)
    raw = _raw_publisher(pub)
    a = [np.full(700, 10 + k, dtype=np.int16) for k in range(3)]
    b = [np.full(900, 20 + k, dtype=np.int16) for k in range(3)]
    for k in range(3):
        pa = list(encode_parts(a[k], k, 1, 500))
        pb = list(encode_parts(b[k], k, 2, 500))
        order = [x for pair_ in zip(pa, pb) for x in pair_] + pb[len(pa):]
        _put_parts(raw, order)
    got = [sub.recv(timeout=20) for _ in range(6)]
    assert [g.tolist() for g in got if g[0] < 20] == [x.tolist() for x in a]
    assert [g.tolist() for g in got if g[0] >= 20] == [x.tolist() for x in b]
    assert sub.lost == 0 and sub.rejected == 0
    raw.undeclare()


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


def test_sessions_start_from_session_settings_and_settings_go_on_top():
    """open_session's configuration carries fastcopy.net.ZENOH_SETTINGS (values Zenoh's
    defaults do not have), and a caller's settings override them."""
    import json

    import zenoh

    import fastcopy.net as net

    defaults = zenoh.Config()
    conf = net.zenoh_config()
    for key, value in net.ZENOH_SETTINGS.items():
        assert json.loads(conf.get_json(key)) == value != json.loads(defaults.get_json(key)), key
    key = next(iter(net.ZENOH_SETTINGS))
    assert json.loads(net.zenoh_config(settings={key: 4}).get_json(key)) == 4
