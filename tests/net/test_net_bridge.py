"""Publisher -> Topic A -> bridge out -> Zenoh (loopback) -> bridge into -> Topic B -> subscribers:
the two "hosts" share this machine, so the remote Topic has another name. Bridges and subscribers
are child processes; every wait is bounded."""
from __future__ import annotations

import os
import secrets
import time
import zlib

import numpy as np
import pytest

from _net import endpoint, free_port, needs_zenoh
from _procs import bridge, subscriber
from fastcopy.net.bench import SETTLE_S
from conftest import no_subprocess

pytestmark = [pytest.mark.net, needs_zenoh, no_subprocess]

DTYPES = ["u1", "<i2", ">i4", "f4", "<f8", "c8", "?", "S3", "m8[s]"]
# Messages of the stress below; FASTCOPY_NET_STRESS sets another count.
N_MESSAGES = int(os.environ.get("FASTCOPY_NET_STRESS", "10000"))


def _names():
    tag = f"fcnet-{os.getpid()}-{secrets.token_hex(4)}"
    return f"{tag}-A", f"{tag}-B", f"fastcopy/test/{tag}"


def _probe_until(topic, subs, timeout: float = 60.0) -> None:
    """Publishes probes until every subscriber has seen one (the whole path is up), then waits
    SETTLE_S: right after a Zenoh connection carries its first message, Zenoh may lose the next
    ones even in block mode (docs/net.md)."""
    pending = list(subs)
    deadline = time.monotonic() + timeout
    while pending:
        assert time.monotonic() < deadline, "the bridge path never came up"
        topic.send(np.int8(-1))
        still = []
        for s in pending:
            try:
                s.expect("probe", timeout=0.05)
            except AssertionError:
                still.append(s)
        pending = still
    time.sleep(SETTLE_S)


def _probe_in_process(send_probe, sub, timeout: float = 30.0) -> None:
    """Calls ``send_probe`` until the local Topic subscriber ``sub`` of a bridge running in this
    process gets a message (the path is up), then takes every probe still coming."""
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, "the bridge never forwarded a probe"
        send_probe()
        try:
            sub.recv(timeout=0.05)
            break
        except TimeoutError:
            continue
    time.sleep(0.2)
    while True:
        try:
            sub.recv(timeout=0.2)
        except TimeoutError:
            break


def _message(rng, k):
    dt = np.dtype(DTYPES[k % len(DTYPES)])
    nbytes = int(rng.integers(0, 48 << 10))
    n = nbytes // dt.itemsize
    raw = rng.integers(0, 256, size=n * dt.itemsize, dtype=np.uint8)
    arr = raw.view(dt)
    if k % 4 == 1 and n % 4 == 0 and n:
        arr = np.asfortranarray(arr.reshape(4, -1))
    return arr


def _line(arr) -> str:
    return f"msg {zlib.crc32(arr.tobytes(order='C'))} {arr.dtype.str} {arr.shape}"


def test_bridge_to_three_subscribers_one_killed_midway():
    from fastcopy.shm import Topic

    a, b, key = _names()
    port = free_port()
    with Topic.create(a, slot_bytes=64 << 10) as topic:
        out = bridge("--topic", a, "--key", key, "--listen", endpoint(port))
        into = bridge("--into", "--topic", b, "--key", key, "--connect", endpoint(port), "--slot-bytes", str(64 << 10))
        subs = [subscriber(b) for _ in range(3)]
        try:
            _probe_until(topic, subs)
            rng = np.random.default_rng(11)
            sent = []
            for k in range(N_MESSAGES):
                arr = _message(rng, k)
                topic.send(arr)
                sent.append(_line(arr))
                if k == N_MESSAGES // 2:
                    subs[2].proc.kill()
            topic.send(np.int8(-2))
            for s in subs[:2]:
                got = []
                while True:
                    line = s.line()
                    if line.startswith("end"):
                        break
                    if line != "probe" and not line.startswith("msg ") and line != "<eof>":
                        continue
                    got.append(line)
                assert line == "end 0"
                got = [g for g in got if g != "probe"]
                assert len(got) == len(sent)
                assert got == sent
            assert subs[2].proc.wait(20) != 0
        finally:
            for s in subs:
                s.stop()
            assert into.stop() == 0, "".join(into.stderr)
            assert out.stop() == 0, "".join(out.stderr)


def test_stalled_remote_subscriber_in_drop_mode_counts_every_loss():
    """Topic B drops (overflow='drop'): a subscriber that reads slowly gets MessagesLost, with
    received + lost == published, and every message it gets intact."""
    from fastcopy.shm import Topic

    a, b, key = _names()
    port = free_port()
    with Topic.create(a, slot_bytes=4096) as topic:
        out = bridge("--topic", a, "--key", key, "--listen", endpoint(port))
        into = bridge("--into", "--topic", b, "--key", key, "--connect", endpoint(port), "--slot-bytes", "4096",
                      "--slots", "4", "--overflow", "drop")
        slow = subscriber(b, stall=0.002)
        try:
            _probe_until(topic, [slow])
            n = 400
            sent = set()
            for k in range(n):
                arr = np.full(64, k, dtype=np.int64)
                topic.send(arr)
                sent.add(_line(arr))
            topic.send(np.int8(-2))
            received = lost = 0
            while True:
                line = slow.line()
                if line.startswith("end"):
                    break
                if line.startswith("lost"):
                    lost += int(line.split()[1])
                elif line.startswith("msg"):
                    assert line in sent, "torn or foreign message"
                    received += 1
            assert int(line.split()[1]) == lost
            assert received + lost == n
        finally:
            slow.stop()
            into.stop()
            out.stop()


def test_message_larger_than_remote_slots_is_reported_and_the_bridge_goes_on():
    from fastcopy.shm import Topic

    a, b, key = _names()
    port = free_port()
    with Topic.create(a, slot_bytes=64 << 10) as topic:
        out = bridge("--topic", a, "--key", key, "--listen", endpoint(port))
        into = bridge("--into", "--topic", b, "--key", key, "--connect", endpoint(port), "--slot-bytes", "1024")
        sub = subscriber(b)
        try:
            _probe_until(topic, [sub])
            small = np.arange(10, dtype=np.int32)
            topic.send(np.zeros(4096, dtype=np.uint8))  # 4 KiB > 1 KiB slots over there
            topic.send(small)
            topic.send(np.int8(-2))
            assert sub.expect("msg") == _line(small)
            assert sub.expect("end") == "end 0"
        finally:
            sub.stop()
            into.stop()
            out.stop()
        assert "does not fit the local topic's 1024-byte slots" in "".join(into.stderr)


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "apart"])
def test_bridge_into_forwards_messages_in_pieces_exact(in_place, monkeypatch):
    """A receiving bridge (in this process) forwards messages that came in pieces, C- and
    Fortran-order and of a str dtype, into its local Topic with every value and the shape; the
    C-order ones straight into a slot of the Topic unless ``in_place=False``. The publisher's
    rule for peers across the network (pieces) is forced: on loopback Zenoh reaches the bridge
    through shared memory, where these messages would go whole."""
    import threading

    from fastcopy import net, shm
    from fastcopy.net import _wire

    monkeypatch.setattr(net, "through_shared_memory_only", lambda session: False)
    _, local, key = _names()
    port = free_port()
    rng = np.random.default_rng(5)
    big = _wire.SPLIT_FROM * 3
    c_order = rng.integers(0, 256, big, dtype=np.uint8).reshape(3, -1)
    strings = np.array(["abc", "de", "f"] * (big // 36), dtype="<U3")
    fortran = np.asfortranarray(rng.standard_normal((4, big // 32)))
    pub = net.Publisher(key, listen=[endpoint(port)])
    br = net.Bridge.into(key, local, slot_bytes=4 * big, connect=[endpoint(port)], log=open(os.devnull, "w"),
                         in_place=in_place)
    runner = threading.Thread(target=br.run, daemon=True)
    runner.start()
    sub = shm.Topic.subscribe(local)
    try:
        _probe_in_process(lambda: pub.send(np.int8(-1)), sub)
        for arr in (c_order, strings, fortran):
            pub.send(arr)
        for arr in (c_order, strings, fortran):
            got = sub.recv(timeout=20)
            assert got.dtype == arr.dtype and got.shape == arr.shape
            np.testing.assert_array_equal(got, arr)
        assert br.lost == 0 and br.rejected == 0 and br.too_big == 0
        # The C-order and str messages were assembled in a loan of the Topic; the Fortran-order
        # one apart, then sent.
        assert br.in_place == (2 if in_place else 0)
    finally:
        br.stop()
        runner.join(10)
        sub.close()
        br.close()
        pub.close()


def test_bridge_into_a_message_in_pieces_interleaved_or_cut_short_is_never_torn():
    """Payloads put in a fixed order by a plain Zenoh publisher, from three publisher ids, to a
    receiving bridge in this process: a whole message from one publisher arriving while another's
    message in pieces fills the Topic's loan (that message goes on apart and arrives whole), and
    a message whose last piece never comes (its loan is given back, the loss counted, and the
    next message is assembled in a loan again)."""
    import threading

    import zenoh

    from fastcopy import net, shm
    from fastcopy.net import _wire

    _, local, key = _names()
    port = free_port()
    big = _wire.SPLIT_FROM * 3  # a head and two pieces

    def parts(value, seq, source, nbytes=big):
        return list(_wire.encode_parts(np.full(nbytes // 4, value, np.int32), seq, source))

    session = net.open_session(listen=[endpoint(port)])
    raw = session.declare_publisher(key, congestion_control=zenoh.CongestionControl.BLOCK)
    br = net.Bridge.into(key, local, slot_bytes=2 * big, connect=[endpoint(port)], log=open(os.devnull, "w"))
    runner = threading.Thread(target=br.run, daemon=True)
    runner.start()
    sub = shm.Topic.subscribe(local)
    try:
        probes = iter(range(1 << 30))
        _probe_in_process(lambda: raw.put(parts(-1, next(probes), 9, 4)[0]), sub)
        before = br.forwarded  # the probes
        x, y = parts(1, 0, 1), parts(2, 0, 2, 64)
        v, z, w = parts(3, 0, 3, 64), parts(4, 1, 3), parts(5, 2, 3)
        assert len(x) == 3 and len(y) == 1 and len(z) == 3
        order = [x[0], x[1], y[0], x[2],  # publisher 2's message while publisher 1's fills the loan
                 v[0], z[0], z[1],        # publisher 3's message 1 never gets its last piece
                 w[0], w[1], w[2]]        # its message 2 does
        for payload in order:
            raw.put(payload)
        got = [sub.recv(timeout=20) for _ in range(4)]
        assert [(int(a[0]), a.nbytes) for a in got] == [(2, 64), (1, big), (3, 64), (5, big)]
        for a in got:
            assert (a == a[0]).all(), "torn message"
        end = time.monotonic() + 10
        while br.forwarded < before + 4 and time.monotonic() < end:
            time.sleep(0.01)
        assert (br.forwarded - before, br.lost, br.in_place) == (4, 1, 1)
        with pytest.raises(TimeoutError):
            sub.recv(timeout=0.3)
    finally:
        br.stop()
        runner.join(10)
        sub.close()
        br.close()
        raw.undeclare()
        session.close()
