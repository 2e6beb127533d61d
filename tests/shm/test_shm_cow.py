"""Copy-on-write receive views (``recv_view(cow=True)``) on a Channel and a Topic: writable
arrays whose writes copy the pages they touch into the receiving process, never into the
ring or the slot other subscribers read; the slot is held until the view dies, as with
read-only views; a forked child's copy neither releases the parent's slot nor sees its writes."""
from __future__ import annotations

import gc
import os
import warnings

import numpy as np
import pytest

from fastcopy.shm import Channel, ChannelError, Topic

pytestmark = pytest.mark.sanitize


@pytest.fixture
def pair():
    tx = Channel.create(capacity=1 << 20)
    rx = Channel.attach(tx.name)
    yield tx, rx
    for c in (rx, tx):
        try:
            c.close()
        except ChannelError:
            pass
    tx.unlink()


def _payload(n, seed=0):
    return np.random.default_rng(seed).integers(0, 255, n, dtype=np.uint8)


# Sizes and starts: small sent messages (not on a page), a loan of 256 KiB or more (on a page),
# a message that spans a page boundary at an odd offset, and an empty one.
@pytest.mark.parametrize("n,loan", [(10, False), (5000, False), (300000, False), (300000, True), (0, False)])
def test_channel_cow_view_is_writable_and_writes_stay_private(pair, n, loan):
    tx, rx = pair
    data = _payload(n)
    if loan:
        with tx.loan(n, np.uint8) as a:
            a[...] = data
    else:
        tx.send(data)
    v = rx.recv_view(timeout=5, cow=True)
    assert v.flags.writeable and v.dtype == np.uint8 and v.shape == (n,)
    assert np.array_equal(v, data)
    assert rx.held_views == 1
    if n:
        v[::97] = 255 - v[::97]
        assert np.array_equal(v[::97], 255 - data[::97])
    del v
    gc.collect()
    assert rx.held_views == 0


def test_channel_cow_writes_never_reach_the_ring(pair):
    tx, rx = pair
    data = _payload(300000, 1)
    with tx.loan(data.size, np.uint8) as a:
        a[...] = data
    v = rx.recv_view(timeout=5, cow=True)
    v[:] = 0
    assert not v.any()
    # The producer's mapping of the same bytes (the published loan stays readable) is unchanged.
    assert np.array_equal(a, data)
    del v


def test_channel_slot_is_released_when_the_cow_view_dies(pair):
    tx, rx = pair
    msg = np.ones(600000, np.uint8)
    tx.send(msg)
    v = rx.recv_view(timeout=5, cow=True)
    v[0] = 9
    with pytest.raises(TimeoutError):
        tx.send(msg, timeout=0.2)  # the view holds its slot: no room for a second message
    part = v[10:20]
    del v
    gc.collect()
    with pytest.raises(TimeoutError):
        tx.send(msg, timeout=0.2)  # a slice keeps the slot too
    del part
    gc.collect()
    tx.send(msg, timeout=5)  # the sender reuses the space
    assert np.array_equal(rx.recv(timeout=5), msg)


def test_topic_cow_writes_reach_no_other_subscriber():
    with Topic.create(slot_bytes=1 << 20, slots=4) as pub:
        s1, s2 = Topic.subscribe(pub.name), Topic.subscribe(pub.name)
        data = _payload(400000, 2)
        pub.send(data)
        v1 = s1.recv_view(timeout=5, cow=True)
        assert v1.flags.writeable
        v1[...] = 0
        v2 = s2.recv_view(timeout=5, cow=True)
        assert np.array_equal(v2, data)
        v2[:100] = 1
        assert not v1.any()
        assert s1.held_views == 1 and s2.held_views == 1
        s3 = Topic.subscribe(pub.name)
        pub.send(data)  # a later subscriber's read-only view of a second copy
        del v1, v2
        gc.collect()
        assert s1.held_views == 0 and s2.held_views == 0
        assert np.array_equal(s3.recv_view(timeout=5), data)
        for s in (s1, s2, s3):
            s.close()


def test_topic_slot_released_when_cow_view_dies():
    with Topic.create(slot_bytes=1 << 16, slots=2, history=0) as pub:
        sub = Topic.subscribe(pub.name)
        pub.send(np.zeros(100, np.uint8))
        v = sub.recv_view(timeout=5, cow=True)
        v[:] = 5
        pub.send(np.ones(100, np.uint8), timeout=5)
        with pytest.raises(TimeoutError):
            pub.send(np.ones(100, np.uint8), timeout=0.2)  # the view pins its slot
        del v
        gc.collect()
        pub.send(np.full(100, 2, np.uint8), timeout=5)
        assert np.array_equal(sub.recv(timeout=5), np.ones(100, np.uint8))
        sub.close()


def test_torch_from_numpy_takes_a_cow_view_without_warning(pair):
    torch = pytest.importorskip("torch")
    tx, rx = pair
    tx.send(np.arange(1000, dtype=np.float32))
    v = rx.recv_view(timeout=5, cow=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = torch.from_numpy(v)
    t += 1
    assert float(t[999]) == 1000.0 and float(v[0]) == 1.0
    # A read-only view is what torch warns about.
    tx.send(np.arange(1000, dtype=np.float32))
    ro = rx.recv_view(timeout=5)
    with pytest.warns(UserWarning):
        torch.from_numpy(ro)
    del t, v, ro


def test_forked_child_writes_and_drops_cow_view_without_touching_the_parents(pair):
    tx, rx = pair
    data = _payload(300000, 3)
    tx.send(data)
    v = rx.recv_view(timeout=5, cow=True)
    v[:10] = 1
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            v[:] = 2  # the child's own copy
            del v
            gc.collect()
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert np.array_equal(v[:10], np.ones(10, np.uint8)) and np.array_equal(v[10:], data[10:])
    assert rx.held_views == 1
    with pytest.raises(TimeoutError):
        tx.send(np.ones(900000, np.uint8), timeout=0.2)  # still held by the parent
    del v
    gc.collect()
    tx.send(np.ones(900000, np.uint8), timeout=5)
