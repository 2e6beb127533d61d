"""How a fastcopy.net.Publisher puts its messages out: every payload built in one bytearray of
its own (Zenoh copies a payload before put returns), and each message whole or in pieces by the
rule its session's Zenoh transports give (whole up to WHOLE_THROUGH_SHARED_MEMORY_UP_TO where
every peer is reached through shared memory, else up to SPLIT_FROM). Fake sessions stand in
for Zenoh where a test needs given transports; the last test opens real ones on loopback."""
from __future__ import annotations

import time

import numpy as np
import pytest

from _net import endpoint, free_port, needs_zenoh

pytestmark = [pytest.mark.net, needs_zenoh]

MiB = 1 << 20


class FakeTransport:
    def __init__(self, is_shm, is_multicast=False):
        self.is_shm, self.is_multicast = is_shm, is_multicast


class FakeSession:
    """Stands in for a zenoh.Session: ``info.transports()`` gives ``self.links``; its publisher
    records each payload object put and the bytes it held at that moment."""

    def __init__(self, links):
        self.links = list(links)
        self.info = self
        self.puts = []

    def transports(self):
        return iter(self.links)

    def declare_publisher(self, key, congestion_control=None):
        return self

    def put(self, payload, **kw):
        self.puts.append((payload, bytes(payload)))

    def undeclare(self):
        pass


def publisher(links):
    import fastcopy.net as net

    session = FakeSession(links)
    return net.Publisher("fastcopy/test/rule", session), session


def payload_count(session, arr, pub):
    """How many payloads one send of ``arr`` puts."""
    before = len(session.puts)
    pub.send(arr)
    return len(session.puts) - before


def test_every_payload_is_built_in_the_publishers_own_bytearray():
    """Whole messages (one C++ call or the full way), heads and pieces all go out in the same
    bytearray, and each holds, when put, exactly the payload the wire format gives."""
    from fastcopy.net import _wire

    pub, session = publisher([])
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 256, 100, dtype=np.uint8),       # whole, in one C++ call
              rng.standard_normal((3, 5))[:, ::2],              # whole, the full way (a strided view)
              [1.5, 2.5, 3.5],                                  # whole, the full way (a list)
              rng.integers(0, 256, MiB + 7, dtype=np.uint8),    # a head and pieces
              np.asfortranarray(rng.standard_normal((3, 50000)))]
    expected = []
    for seq, arr in enumerate(arrays):
        pub.send(arr)
        expected += list(_wire.encode_parts(np.asarray(arr), seq, pub.source))
    assert [got for _, got in session.puts] == expected
    assert len(expected) > len(arrays)  # pieces were among them
    assert all(obj is pub._payload for obj, _ in session.puts)
    pub.close()


@pytest.mark.parametrize("links, reached_through_shared_memory", [
    ([FakeTransport(True)], True),
    ([FakeTransport(True), FakeTransport(True)], True),
    ([], False),                                             # nobody to reach yet
    ([FakeTransport(True), FakeTransport(False)], False),    # one peer across the network
    ([FakeTransport(True, is_multicast=True)], False),
], ids=["one-peer", "two-peers", "no-peer", "one-across-the-network", "multicast"])
def test_messages_go_whole_up_to_the_limit_where_every_peer_is_reached_through_shared_memory(
        links, reached_through_shared_memory):
    import fastcopy.net as net
    from fastcopy.net import _wire

    assert net.through_shared_memory_only(FakeSession(links)) is reached_through_shared_memory
    pub, session = publisher(links)
    limit = _wire.WHOLE_THROUGH_SHARED_MEMORY_UP_TO if reached_through_shared_memory else _wire.SPLIT_FROM
    for n, whole in ((_wire.SPLIT_FROM, True), (_wire.SPLIT_FROM + 1, limit > _wire.SPLIT_FROM),
                     (limit, True), (limit + 1, False)):
        arr = np.full(n, 7, np.uint8)
        puts = payload_count(session, arr, pub)
        assert (puts == 1) is whole, (n, puts)
        assert puts == (1 if whole else 1 + -(-(n - _wire.piece_bytes_for(n)) // _wire.piece_bytes_for(n)))
    seq, back = _wire.decode(b"".join(got for _, got in session.puts[:1]))
    assert seq == 0 and back.tobytes() == np.full(_wire.SPLIT_FROM, 7, np.uint8).tobytes()
    pub.close()


def test_the_rule_follows_peers_that_join_and_leave_within_the_recheck_time():
    import fastcopy.net as net
    from fastcopy.net import _wire

    pub, session = publisher([FakeTransport(True)])
    arr = np.zeros(MiB, np.uint8)
    assert _wire.SPLIT_FROM < MiB <= _wire.WHOLE_THROUGH_SHARED_MEMORY_UP_TO
    assert payload_count(session, arr, pub) == 1
    session.links.append(FakeTransport(False))     # a peer across the network joins
    assert payload_count(session, arr, pub) == 1   # not looked at again yet
    pub._transports_at -= net.TRANSPORTS_RECHECK_S  # the recheck time has passed
    assert payload_count(session, arr, pub) > 1
    session.links.pop()                            # it leaves
    pub._transports_at -= net.TRANSPORTS_RECHECK_S
    assert payload_count(session, arr, pub) == 1
    pub.close()


def test_zenoh_peers_on_one_host_are_reached_through_shared_memory_unless_one_turns_it_off():
    """Real sessions on loopback: with Zenoh's shared memory on at both ends the transport is a
    shared-memory one; a third peer with it off makes the rule fall back to pieces."""
    import fastcopy.net as net

    port = free_port()
    opened = [net.open_session(listen=[endpoint(port)])]
    first = opened[0]

    def transports_become(n):
        deadline = time.monotonic() + 20
        while len(list(first.info.transports())) != n:
            assert time.monotonic() < deadline, f"Zenoh never had {n} transports"
            time.sleep(0.05)

    try:
        assert not net.through_shared_memory_only(first)  # no peer yet
        opened.append(net.open_session(connect=[endpoint(port)]))
        transports_become(1)
        assert net.through_shared_memory_only(first)
        opened.append(net.open_session(connect=[endpoint(port)],
                                       settings={"transport/shared_memory/enabled": False}))
        transports_become(2)
        assert not net.through_shared_memory_only(first)
    finally:
        for s in reversed(opened):
            s.close()


class Recorder:
    """A put that keeps every payload object (a payload from the pool holds its buffer while kept)
    and the bytes it held when put."""

    def __init__(self):
        self.puts = []

    def __call__(self, payload):
        self.puts.append((payload, bytes(payload)))


def test_where_every_peer_is_reached_through_shared_memory_payloads_go_out_of_the_publishers_pool():
    """Whole messages, heads and pieces of SMALLEST bytes or more go out of the publisher's pool
    of Zenoh shared memory (a zenoh.ZBytes over a buffer of it) holding exactly the wire format's
    bytes; smaller payloads, and every payload where a peer is across the network, go as the
    publisher's bytearray."""
    import zenoh

    from fastcopy.net import _shared_payloads, _wire

    pub, session = publisher([FakeTransport(True)])
    rng = np.random.default_rng(3)
    arrays = [rng.integers(0, 256, 100, dtype=np.uint8),                 # below SMALLEST
              rng.integers(0, 256, MiB, dtype=np.uint8),                 # whole, in one C++ call
              rng.standard_normal((300, 400))[:, ::2],                   # whole, the full way
              rng.integers(0, 256, 5 * MiB + 5000, dtype=np.uint8)]      # a head and pieces
    expected = []
    for seq, arr in enumerate(arrays):
        pub.send(arr)
        nbytes = np.asarray(arr).nbytes
        whole = nbytes <= _wire.WHOLE_THROUGH_SHARED_MEMORY_UP_TO
        expected += list(_wire.encode_parts(np.asarray(arr), seq, pub.source,
                                            nbytes if whole else _wire.piece_bytes_for(nbytes)))
    assert [got for _, got in session.puts] == expected
    pooled = [len(got) >= _shared_payloads.SMALLEST for got in expected]
    assert pooled[0] is False and all(pooled[1:]) and len(expected) > len(arrays)
    assert [type(obj) is zenoh.ZBytes for obj, _ in session.puts] == pooled
    assert session.puts[0][0] is pub._payload
    assert pub._shared.through_pool == sum(pooled) and pub._shared.pool_full == 0
    session.links.append(FakeTransport(False))      # a peer across the network joins
    pub._transports_at -= 1e9
    pub.send(arrays[1][:_wire.SPLIT_FROM])
    assert session.puts[-1][0] is pub._payload and pub._shared.through_pool == sum(pooled)
    assert pub._shared._provider is not None
    pub.close()
    assert pub._shared._provider is None  # the pool goes with the publisher


def test_the_smallest_payload_through_the_pool_is_zenohs_own_threshold():
    from fastcopy.net._shared_payloads import SMALLEST, SharedPayloads

    put = Recorder()
    shared = SharedPayloads(put)
    for n in (SMALLEST - 1, SMALLEST, 0):
        payload = bytearray(np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes())
        shared.put(payload)
        assert put.puts[-1][1] == payload
        assert (put.puts[-1][0] is payload) is (n < SMALLEST), n
    assert shared.through_pool == 1


def test_a_full_pool_leaves_payloads_to_zenoh_until_subscribers_let_its_buffers_go(monkeypatch):
    """Where every buffer of the pool is still held (here by the recorder; in use by
    subscribers that have not taken their payloads yet) a payload goes as it is, at once: the
    pool never makes a publisher wait. Buffers let go of are used again."""
    from fastcopy.net import _shared_payloads

    monkeypatch.setattr(_shared_payloads, "POOL_BYTES", 256 << 10)
    put = Recorder()
    shared = _shared_payloads.SharedPayloads(put)
    payload = bytearray(100 << 10)
    shared.put(payload)
    shared.put(payload)
    assert shared.through_pool == 2 and shared.pool_full == 0
    shared.put(payload)   # the third does not fit beside the two held
    assert put.puts[-1][0] is payload and shared.pool_full == 1 and shared.through_pool == 2
    put.puts.clear()      # every buffer let go of
    payload[:4] = b"next"
    shared.put(payload)
    assert put.puts[-1][0] is not payload and put.puts[-1][1] == payload
    assert shared.through_pool == 3 and shared.pool_full == 1


@pytest.mark.parametrize("why", ["too-large", "no-zenoh-shm"])
def test_a_pool_that_cannot_be_made_leaves_every_payload_to_zenoh(monkeypatch, why):
    """No pool (a size Zenoh refuses, or a zenoh without its shm module): every payload goes as
    it is, ``unavailable`` says why, and the pool is not tried again."""
    import types

    import zenoh

    from fastcopy.net import _shared_payloads

    if why == "too-large":
        monkeypatch.setattr(_shared_payloads, "POOL_BYTES", 1 << 50)
    else:
        monkeypatch.setattr(zenoh, "shm", types.SimpleNamespace())
    put = Recorder()
    shared = _shared_payloads.SharedPayloads(put)
    payload = bytearray(64 << 10)
    shared.put(payload)
    reason = shared.unavailable
    assert reason and ("ZError" if why == "too-large" else "AttributeError") in reason, reason
    monkeypatch.undo()    # a pool could be made now: it is not tried again
    shared.put(payload)
    assert [obj is payload for obj, _ in put.puts] == [True, True]
    assert shared.unavailable == reason and shared.through_pool == 0
