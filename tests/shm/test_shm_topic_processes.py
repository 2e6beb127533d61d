"""Topic across processes: subscribers and publishers in other processes, killed peers, drop mode
against a running publisher, Ctrl-C while waiting. Crash-prone cases run in a subprocess."""

from __future__ import annotations

import mmap
import os
import struct
import subprocess
import sys
import threading
import time
import zlib

import numpy as np
import pytest

import fastcopy
from fastcopy import shm
from fastcopy.shm import ChannelClosed, ChannelError, MessagesLost, PeerDied, Topic

from _child import child_env, leftovers_fixture, name_maker, spawn
from _shm_layout import MESSAGE, TOPIC, at, poke, topic_data_offset
from conftest import no_subprocess

pytestmark = pytest.mark.sanitize

# Children import the same fastcopy as this process: the installed package in CI, src/ with a
# developer build (a plain checkout's src/ has no compiled _core).
PREFIX = f"fctopic-{os.getpid()}-"
fresh_name = name_maker(PREFIX)
no_leftovers = leftovers_fixture(PREFIX, fail=True)

SLOT_HDR = TOPIC["slot_header_bytes"]


def slot_state_offset(t: Topic, seq: int) -> int:
    """Where the slot of message ``seq`` begins (its state word) in a topic whose slots are
    below 256 KiB (packed: a slot header, then the payload padded to the alignment)."""
    align = MESSAGE["align"]
    stride = SLOT_HDR + (t.slot_bytes + align - 1) // align * align
    return topic_data_offset(t.max_subscribers) + (seq % t.slots) * stride


def patch(name: str, offset: int, fmt: str, value) -> None:
    with open("/dev/shm/" + name, "r+b") as f:
        with mmap.mmap(f.fileno(), 0) as m:
            struct.pack_into(fmt, m, offset, value)


def peek(name: str, offset: int, fmt: str):
    with open("/dev/shm/" + name, "rb") as f:
        f.seek(offset)
        return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


# ---- across processes ------------------------------------------------------------------------------
SUBSCRIBER = r"""
import sys, time, zlib
import numpy as np
from fastcopy.shm import Topic, ChannelClosed
name, stall_after = sys.argv[1], int(sys.argv[2])
s = Topic.subscribe(name)
print("ready", flush=True)
n, chain = 0, 0
while True:
    if n == stall_after:
        print("stalled", n, flush=True)
        time.sleep(600)
    try:
        a = s.recv(timeout=30)
    except ChannelClosed:
        break
    b = a.tobytes()
    seq, crc = int.from_bytes(b[:8], "little"), int.from_bytes(b[8:12], "little")
    if seq != n or zlib.crc32(b[12:]) != crc:
        print("bad", n, seq, flush=True)
        sys.exit(1)
    chain = zlib.crc32(b[:12], chain)
    n += 1
print("done", n, chain, flush=True)
"""


@no_subprocess
def test_three_subscribers_get_10k_random_messages_and_a_killed_one_is_dropped():
    count, slots, stall_at = 10_000, 32, 2_000
    rng = np.random.default_rng(5)
    pool = rng.integers(0, 256, size=1 << 16, dtype=np.uint8).tobytes()
    with Topic.create(fresh_name("fan"), slot_bytes=2048, slots=slots) as t:
        children = [spawn(SUBSCRIBER, t.name, str(-1)) for _ in range(3)]
        victim = spawn(SUBSCRIBER, t.name, str(stall_at))
        try:
            for c in children + [victim]:
                assert c.stdout.readline().strip() == "ready", c.stderr.read()
            assert t.subscribers == 4
            sent = [0]
            blocked_at = []

            def kill_victim():
                line = victim.stdout.readline().split()
                assert line[:2] == ["stalled", str(stall_at)]
                # Wait until the publisher is stuck on the stalled subscriber (no progress for
                # 0.3 s; at most 20 s on a loaded machine), then kill it.
                last, still_since, deadline = -1, time.monotonic(), time.monotonic() + 20
                while time.monotonic() < deadline:
                    if sent[0] != last:
                        last, still_since = sent[0], time.monotonic()
                    elif time.monotonic() - still_since > 0.3:
                        break
                    time.sleep(0.01)
                blocked_at.append(sent[0])
                victim.kill()

            killer = threading.Thread(target=kill_victim)
            killer.start()
            chain = 0
            sizes = rng.integers(12, 2049, size=count)
            offsets = rng.integers(0, len(pool) - 2048, size=count)
            for k in range(count):
                rest = pool[offsets[k]:offsets[k] + sizes[k] - 12]
                head = k.to_bytes(8, "little") + zlib.crc32(rest).to_bytes(4, "little")
                chain = zlib.crc32(head, chain)
                t.send(np.frombuffer(head + rest, np.uint8), timeout=30)
                sent[0] = k + 1
            killer.join()
            t.close()
            # Blocked on the stalled subscriber until it was killed, at most `slots` past it.
            assert stall_at <= blocked_at[0] <= stall_at + slots, blocked_at
            for c in children:
                out, err = c.communicate(timeout=60)
                assert out.split() == ["done", str(count), str(chain)], (out, err)
        finally:
            for c in children + [victim]:
                c.kill()
                c.wait()


DROP_PUBLISHER = r"""
import sys, time
import numpy as np
from fastcopy.shm import Topic
name, count = sys.argv[1], int(sys.argv[2])
with Topic.create(name, slot_bytes=1 << 19, slots=4, overflow="drop") as t:
    deadline = time.monotonic() + 30
    while t.subscribers < 1 and time.monotonic() < deadline:
        time.sleep(0.001)
    msg = np.empty(65536, np.uint64)
    for k in range(count):
        msg.fill(k)
        t.send(msg, timeout=30)  # waits only for a held view
        if (k // 200) % 2 == 0 and k % 8 == 7:
            # Paced in every other stretch of 200: the subscriber keeps up (views, whole runs of
            # messages); unpaced stretches overwrite slots while it copies them (torn copies).
            time.sleep(0.0005)
    print("published", count, flush=True)
"""


@no_subprocess
def test_drop_mode_against_a_running_publisher_never_tears_and_counts_exactly():
    count = 2000
    name = fresh_name("dropx")
    pub = spawn(DROP_PUBLISHER, name, str(count))
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists("/dev/shm/" + name):
            assert time.monotonic() < deadline and pub.poll() is None, pub.stderr.read()
            time.sleep(0.005)
        time.sleep(0.05)
        s = Topic.subscribe(name)
        expected, received, lost_total, views_checked = 0, 0, 0, 0
        held = []
        while True:
            try:
                if expected % 11 == 5 and not held:  # one view at a time: it blocks the publisher
                    got = s.recv_view(timeout=30)
                    held.append((expected, got))
                else:
                    got = s.recv(timeout=30)
            except MessagesLost as e:
                assert e.count >= 1
                expected += e.count
                lost_total += e.count
                continue
            except ChannelClosed:
                break
            assert got.shape == (65536,) and got[0] == expected and (got == expected).all(), (expected, got[:4])
            expected += 1
            received += 1
            if received % 50 == 0:
                time.sleep(0.002)  # fall behind now and then
            if held and expected - held[0][0] >= 3:  # the slot had 3 chances to be rewritten
                seq, view = held.pop()
                assert (view == seq).all()  # views never change under the reader, even in drop mode
                views_checked += 1
                del view, got  # the last references: the pin goes
        out, err = pub.communicate(timeout=30)
        assert out.split() == ["published", str(count)], err
        assert received + lost_total == count == expected and s.lost == lost_total
        assert lost_total > 0 and views_checked > 0
        held.clear()
        s.close()
    finally:
        pub.kill()
        pub.wait()
        if os.path.exists("/dev/shm/" + name):
            os.unlink("/dev/shm/" + name)


DYING_PUBLISHER = r"""
import sys, time
import numpy as np
from fastcopy.shm import Topic
t = Topic.create(sys.argv[1], slot_bytes=64, slots=4, history=3)
for k in range(3):
    t.send(np.array([k]))
print("sent", flush=True)
time.sleep(600)
"""


@no_subprocess
def test_publisher_death_gives_peer_died_after_its_messages():
    name = fresh_name("dead")
    pub = spawn(DYING_PUBLISHER, name)
    try:
        assert pub.stdout.readline().strip() == "sent", pub.stderr.read()
        s = Topic.subscribe(name)
        pub.kill()
        pub.wait()
        assert [int(s.recv(timeout=5)[0]) for _ in range(3)] == [0, 1, 2]
        start = time.monotonic()
        with pytest.raises(PeerDied):
            s.recv(timeout=10)
        assert time.monotonic() - start < 2.0
        s.close()
        assert [x["stale"] for x in shm.list_segments(name)] == [True]
        assert shm.clean_segments(name) == [name]
    finally:
        pub.kill()
        pub.wait()


FUZZ = r"""
import mmap, os, random, sys
import numpy as np
from fastcopy import _core
from fastcopy.shm import ChannelError, Topic
TOPIC, PAGE = _core.shm_layout()["topic"], _core.shm_layout()["page_bytes"]
HEADER, RECORDS = TOPIC["header_bytes"], 16 * TOPIC["record_bytes"]  # 16: the default max_subscribers
rng = np.random.default_rng(int(sys.argv[2]))
pick = random.Random(int(sys.argv[2]))
outcomes = {}
for round_ in range(150):
    name = f"{sys.argv[1]}-{round_}"
    mode = "drop" if round_ % 2 else "block"
    with Topic.create(name, slot_bytes=256, slots=4, history=3, overflow=mode) as t:
        for k in range(3):
            t.send(np.arange(k + 1, dtype=np.float64))
        subs = [Topic.subscribe(name)]
        with open("/dev/shm/" + name, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            slots0 = (HEADER + RECORDS + PAGE - 1) // PAGE * PAGE  # the page after the records
            # The geometry words, the head, the subscriber records, the 4 slots.
            regions = [(0, 64), (TOPIC["fields"]["head"][0], 8), (HEADER, RECORDS),
                       (slots0, 4 * (TOPIC["slot_header_bytes"] + 256))]
            for _ in range(int(rng.integers(1, 6))):
                start, length = regions[int(rng.integers(len(regions)))]
                off = start + int(rng.integers(0, length - 7)) // 8 * 8
                value = pick.choice([0, 1, 2, 3, 5, 7, 64, 255, 2**31, 2**32 - 1, 2**62, 2**64 - 1,
                                     pick.getrandbits(64)])
                m[off:off + 8] = value.to_bytes(8, sys.byteorder)
            try:
                subs.append(Topic.subscribe(name))
            except ChannelError as e:
                outcomes[type(e).__name__] = outcomes.get(type(e).__name__, 0) + 1
            for s in subs:
                for call in range(4):
                    try:
                        a = s.recv_view(timeout=0) if call % 2 else s.recv(timeout=0)
                        assert a.nbytes <= 256
                        outcomes["message"] = outcomes.get("message", 0) + 1
                        del a
                    except (ChannelError, TimeoutError) as e:
                        outcomes[type(e).__name__] = outcomes.get(type(e).__name__, 0) + 1
                try:
                    t.send(np.zeros(4), timeout=0)
                except (ChannelError, TimeoutError) as e:
                    outcomes["send " + type(e).__name__] = outcomes.get("send " + type(e).__name__, 0) + 1
            for s in subs:
                s.close()
print(sorted(outcomes.items()), file=sys.stderr); print(sorted(outcomes))
"""


@no_subprocess
def test_random_hostile_segments_never_crash(tmp_path):
    script = tmp_path / "fuzz.py"
    script.write_text(FUZZ)
    proc = subprocess.run([sys.executable, str(script), fresh_name("fuzz"), "11"], capture_output=True, text=True,
                          timeout=120, env=child_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ChannelCorrupted" in proc.stdout and "message" in proc.stdout, proc.stdout


@no_subprocess
def test_records_of_dead_processes_are_reused_even_half_claimed():
    dead = subprocess.Popen(["true"])
    dead.wait()
    with Topic.create(fresh_name("reuse"), slot_bytes=64, max_subscribers=1) as t:
        record = TOPIC["header_bytes"]  # the first (and only) subscriber record
        states = TOPIC["record_states"]
        state_at, pid_at = at(TOPIC, "state", "record_fields"), at(TOPIC, "pid", "record_fields")
        # Active, closed with pins, being claimed (3: kClaiming, which the topic's C++ keeps to itself).
        for state in (states["active"], states["pins_only"], 3):
            with open("/dev/shm/" + t.name, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
                poke(m, TOPIC, "state", state, record, "record_fields")
                poke(m, TOPIC, "pid", os.getpid(), record, "record_fields")  # a live process holds it
            with pytest.raises(ChannelError, match="max_subscribers"):
                Topic.subscribe(t.name)
            with open("/dev/shm/" + t.name, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
                poke(m, TOPIC, "pid", dead.pid, record, "record_fields")  # a process that is gone
                poke(m, TOPIC, "start", 0, record, "record_fields")
            s = Topic.subscribe(t.name)
            assert peek(t.name, record + pid_at[0], pid_at[1]) == os.getpid() and t.subscribers == 1
            s.close()
            assert peek(t.name, record + state_at[0], state_at[1]) == states["free"]


def test_the_publishers_writes_learn_the_store_mode(loan_fills_can_stream):
    # Fills of loans by fastcopy.copy of 256 KiB or more are timed, each once; sends are not.
    t = Topic.create(slot_bytes=1 << 20, slots=4)
    sub = Topic.subscribe(t.name)
    try:
        # A page-aligned source: every fill has (dst - src) mod 4096 = 0 (slots of 256 KiB and
        # more start on a page), so the NT rule's page-distance guard never applies; where numpy
        # puts a plain np.arange depends on the allocations before it, and at a page offset of
        # 1-127 from the slot the fills are not timed.
        buf = np.empty((1 << 20) + 4096, np.uint8)
        start = (-buf.ctypes.data) % 4096
        src = buf[start:start + (1 << 20)]
        src[...] = np.arange(1 << 20, dtype=np.uint64).astype(np.uint8)
        for _ in range(12):
            t.send(src)
            assert np.array_equal(sub.recv(), src)
        for _ in range(12):
            with t.loan(src.shape, src.dtype) as a:
                assert (a.ctypes.data - src.ctypes.data) % 4096 == 0
                fastcopy.copy(a, src)
            assert np.array_equal(sub.recv_view(), src)
        modes = t.store_modes
        assert [m["sizes"] for m in modes] == ["1-4 MiB"], modes
        assert modes[0]["cached_writes"] + modes[0]["streaming_writes"] == 12, modes
    finally:
        sub.close()
        t.close()
