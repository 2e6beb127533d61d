"""The life of a segment and of a ring's space: a name appears only once its segment is whole,
a file that is not a segment is refused before its pages are allocated, a loan or a sent
message that must go to the start of the ring gets there in an empty ring (and one that times
out reserves nothing), a sent message that fits the ring is one piece of it (recv_view returns
it in place), and views a forked child inherits neither hang nor release the parent's slots."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import numpy as np
import pytest

from _child import explain, run_script
from _fixtures import pair  # noqa: F401  (a fixture)
from fastcopy import _core
from fastcopy.shm import Channel, ChannelCorrupted, Topic

pytestmark = pytest.mark.sanitize

PREFIX = f"fclife-{os.getpid()}-"
KIB = 1024


# The name a segment has while this process makes it. Only this process's: another pytest on the
# machine (the emulated suite runs beside the native one) makes segments of its own meanwhile.
CREATING_HERE = f"{_core.shm_layout()['creating_prefix']}{os.getpid()}-"


def shm_names():
    return {n for n in os.listdir("/dev/shm") if n.startswith(PREFIX) or n.startswith(CREATING_HERE)}


@pytest.fixture(autouse=True)
def no_leftover_segments():
    before = shm_names()
    yield
    assert shm_names() - before == set(), "test left segments in /dev/shm"


def test_leftovers_are_this_processs_own_unfinished_segments_not_another_ones():
    """The leftover check counts a segment this process left half made, not one another process
    (the parent here; in CI the other pytest beside this one) is making meanwhile."""
    creating = _core.shm_layout()["creating_prefix"]
    others, own = f"{creating}{os.getppid()}-424242", f"{CREATING_HERE}424242"
    for name in (others, own):
        open("/dev/shm/" + name, "wb").close()
    try:
        names = shm_names()
        assert others not in names and own in names, names
    finally:
        for name in (others, own):
            os.unlink("/dev/shm/" + name)


_counter = [0]


def new_name():
    _counter[0] += 1
    return f"{PREFIX}{_counter[0]}"


def test_a_loan_that_must_wrap_is_granted_in_an_empty_ring(pair):
    tx, rx = pair
    tx.send(np.zeros(10 * KIB, np.uint8))
    rx.recv(timeout=1)
    assert rx.pending_bytes == 0
    a = tx.loan(60 * KIB, np.uint8, timeout=2)  # goes to the start of the ring at once
    assert rx.pending_bytes == 0
    tx.discard(a)
    assert rx.pending_bytes == 0  # discarded: nothing sent, nothing reserved
    a = tx.loan(60 * KIB, np.uint8, timeout=2)
    a[:] = np.arange(60 * KIB) % 251
    tx.publish(a)
    v = rx.recv_view(timeout=1)
    assert v.base is not None and (v == np.arange(60 * KIB) % 251).all()
    del v
    tx.send(np.ones(60 * KIB, np.uint8), timeout=2)  # room again, also for a send
    assert (rx.recv(timeout=1) == 1).all()


def test_a_loan_that_times_out_reserves_nothing(pair):
    tx, rx = pair
    tx.send(np.zeros(10 * KIB, np.uint8))
    pending = rx.pending_bytes
    with pytest.raises(TimeoutError, match="the ring is full"):
        tx.loan(60 * KIB, np.uint8, timeout=0.05)  # message 0 is unread: the ring is not empty
    assert rx.pending_bytes == pending
    with pytest.raises(TimeoutError):
        tx.send(np.zeros(60 * KIB, np.uint8), timeout=0.05)
    assert rx.pending_bytes == pending
    assert (rx.recv(timeout=1) == 0).all()
    assert rx.pending_bytes == 0
    tx.send(np.full(60 * KIB, 7, np.uint8), timeout=1)
    assert (rx.recv(timeout=1) == 7).all()


def test_a_sent_message_that_fits_the_ring_is_one_piece(pair):
    tx, rx = pair
    tx.send(np.zeros(20 * KIB, np.uint8))
    rx.recv(timeout=1)
    a = (np.arange(50 * KIB) % 253).astype(np.uint8)
    tx.send(a)  # would wrap around the end of the ring, with no room for a padding record
    v = rx.recv_view(timeout=1)
    assert v.base is not None, "a copy: the message was not one piece of the ring"
    assert rx.held_views == 1
    assert (v == a).all()
    del v
    assert rx.held_views == 0


def _attach_as_soon_as_named(kind, name, q):
    open_ = Channel.attach if kind == "channel" else Topic.subscribe
    path = "/dev/shm/" + name
    deadline = time.monotonic() + 20
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            q.put("never named")
            return
    try:
        open_(name).close()
        q.put("ok")
    except ChannelCorrupted as e:
        q.put(f"corrupt: {e}")


@pytest.mark.parametrize("kind", ["channel", "topic"])
def test_a_name_appears_only_once_its_segment_is_whole(kind):
    # A process attaches the moment the name exists, while the creator allocates and maps a
    # large segment: it must find a whole one every time.
    ctx = mp.get_context("fork")
    outcomes = []
    for _ in range(12):
        name = new_name()
        q = ctx.Queue()
        p = ctx.Process(target=_attach_as_soon_as_named, args=(kind, name, q))
        p.start()
        if kind == "channel":
            end = Channel.create(name, capacity=64 << 20)
        else:
            end = Topic.create(name, slot_bytes=1 << 20, slots=64)
        outcomes.append(q.get(timeout=60))
        p.join(60)
        end.close()
        end.unlink()
    assert outcomes == ["ok"] * len(outcomes)


def test_creating_over_an_existing_name_still_fails():
    name = new_name()
    with Channel.create(name, capacity=64 * KIB) as c:
        with pytest.raises(FileExistsError):
            Channel.create(name, capacity=64 * KIB)
        with pytest.raises(FileExistsError):
            Topic.create(name, slot_bytes=64, slots=4)
        c.unlink()


@pytest.mark.parametrize("kind", ["channel", "topic"])
def test_a_sparse_non_segment_is_refused_before_its_pages_are_allocated(kind):
    name = new_name()
    path = "/dev/shm/" + name
    with open(path, "wb") as f:
        f.truncate(200 << 20)
    try:
        with pytest.raises(ChannelCorrupted, match="bad magic"):
            (Channel.attach if kind == "channel" else Topic.subscribe)(name)
        assert os.stat(path).st_blocks == 0, "the file's pages were allocated before its header was checked"
    finally:
        os.unlink(path)


def test_a_segment_whose_header_disagrees_with_its_size_is_refused_unallocated():
    name = new_name()
    path = "/dev/shm/" + name
    header = bytearray(4096)
    import struct
    struct.pack_into("<QIIQ", header, 0, 0x31484353504F4346, _core.SHM_CHANNEL_VERSION, 4096, 1 << 16)
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(4096 + (64 << 20))  # capacity says 64 KiB, the size 64 MiB
    try:
        with pytest.raises(ChannelCorrupted, match="capacity"):
            Channel.attach(name)
        assert os.stat(path).st_blocks * 512 <= 64 * KIB
    finally:
        os.unlink(path)


FORK_CHILD = r"""
import os, sys, threading, time
import numpy as np
from fastcopy.shm import Channel, Topic

name = sys.argv[1]
tx = Channel.create(name + "-c", capacity=1 << 16)
rx = Channel.attach(tx.name)
pub = Topic.create(name + "-t", slot_bytes=64, slots=2, overflow="drop")
sub = Topic.subscribe(pub.name)
tx.send(np.arange(8)); pub.send(np.arange(8))
view, tview = rx.recv_view(timeout=1), sub.recv_view(timeout=1)
held = rx.held_bytes

# Other threads are inside calls while this one forks: one blocked in recv on a second
# channel, one in recv on a second topic, one taking and dropping views on a third channel (its
# slot ledger's lock).
tx2 = Channel.create(name + "-c2", capacity=1 << 16)
rx2 = Channel.attach(tx2.name)
pub2 = Topic.create(name + "-t2", slot_bytes=64, slots=2)
sub2 = Topic.subscribe(pub2.name)
tx3 = Channel.create(name + "-c3", capacity=1 << 16)
rx3 = Channel.attach(tx3.name)
stop = threading.Event()
def churn():
    while not stop.is_set():
        tx3.send(np.arange(4)); v = rx3.recv_view(timeout=1); del v
threads = [threading.Thread(target=rx2.recv), threading.Thread(target=sub2.recv), threading.Thread(target=churn)]
for t in threads:
    t.start()
time.sleep(0.2)  # the two receivers are asleep in their waits
pids = []
for _ in range(20):
    pid = os.fork()
    if pid == 0:
        # The child's copies of the views and ends: releasing and closing them must neither
        # hang nor release the parent's slots.
        del view, tview
        for end in (rx, sub, tx, pub, rx2, tx2, sub2, pub2, rx3, tx3):
            end.close()
        os._exit(0)
    pids.append(pid)
stop.set(); tx2.send(np.arange(2)); pub2.send(np.arange(2))
for t in threads:
    t.join()
print("children", sorted(os.waitpid(p, 0)[1] for p in pids)[-1])
# The parent's views still pin their slots.
print("channel", rx.held_views, rx.held_bytes == held, bool((view == np.arange(8)).all()))
sent = 0
for i in range(3):
    try:
        pub.send(np.arange(8) + 1, timeout=0.1); sent += 1
    except TimeoutError:
        pass
print("topic", sub.held_views, sent, bool((tview == np.arange(8)).all()))
del view, tview
rx.close(); sub.close(); tx.close(); pub.close(); tx.unlink(); pub.unlink()
for end in (rx2, tx2, sub2, pub2, rx3, tx3):
    end.close()
tx2.unlink(); pub2.unlink(); tx3.unlink()
"""


def test_views_a_forked_child_inherits_neither_hang_nor_release_the_parents(tmp_path):
    proc = run_script(tmp_path, FORK_CHILD, new_name(), timeout=120)
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.split("\n")[:3] == ["children 0", "channel 1 True True", "topic 1 1 True"], explain(proc)
