"""The data a Channel consumer or a Topic subscriber reads is mapped read-only in its process.

numpy's `writeable` flag stops numpy, but not ctypes, torch or any C extension that ignores
it. Such a write through a view must fault in the writing process (SIGSEGV) instead of
changing the bytes the producer and the other readers see. The control words (indices, cursor
and pin records, futex words) stay writable, and an end that becomes the producer gets a
writable mapping. Each write runs in a child process, which must die by SIGSEGV.
"""
from __future__ import annotations

import mmap
import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
from _child import leftovers_fixture, name_maker, run_script
from _shm_layout import TOPIC, poke
from conftest import no_subprocess

from fastcopy import _core
from fastcopy.shm import Channel, ChannelCorrupted, Topic

PREFIX = f"fastcopy-test-ro-{os.getpid()}-"
fresh_name = name_maker(PREFIX)
no_leftovers = leftovers_fixture(PREFIX, fail=True)


def run_child(tmp_path: Path, code: str, *args: str) -> subprocess.CompletedProcess:
    return run_script(tmp_path, code, *args, timeout=120, name="child.py")


def segment_bytes(name: str) -> bytes:
    with open("/dev/shm/" + name, "rb") as f:
        return f.read()


# The child takes the next message as a view, says so, then writes 0xEE over it with ctypes,
# either with memmove or through a writable numpy array over a ctypes buffer at the view's
# address. No core file: the crash is the expected outcome.
WRITER = r"""
import ctypes, resource, sys
import numpy as np
from fastcopy.shm import Channel, Topic
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
kind, name, how = sys.argv[1:4]
end = Channel.attach(name) if kind == "channel" else Topic.subscribe(name)
v = end.recv_view(timeout=30)
addr, n = v.__array_interface__["data"][0], v.nbytes
print("viewed", n, flush=True)
if how == "memmove":
    ctypes.memmove(addr, bytes([0xEE]) * n, n)
else:
    a = np.frombuffer((ctypes.c_ubyte * n).from_address(addr), np.uint8)
    assert a.flags.writeable
    a[:] = 0xEE
print("wrote", flush=True)
"""


def assert_died_writing(proc: subprocess.CompletedProcess, n: int) -> None:
    out = proc.stdout + proc.stderr
    assert f"viewed {n}" in proc.stdout, out       # it got the view ...
    assert "wrote" not in proc.stdout, out          # ... and the write did not go through
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, out)


@no_subprocess
@pytest.mark.parametrize("how,nbytes,loaned", [
    ("memmove", 5000, False),            # a sent message
    ("frombuffer", 300_000, True),       # a loaned, page-aligned one
])
def test_channel_consumer_cannot_write_through_a_view(tmp_path, how, nbytes, loaned):
    data = np.random.default_rng(3).integers(0, 255, nbytes, dtype=np.uint8)  # no 0xEE byte
    with Channel.create(fresh_name("ch"), capacity=1 << 20) as tx:
        if loaned:
            with tx.loan(nbytes, np.uint8) as a:
                a[...] = data
        else:
            tx.send(data)
        proc = run_child(tmp_path, WRITER, "channel", tx.name, how)
        assert_died_writing(proc, nbytes)
        # The message in the ring is the producer's, byte for byte.
        assert data.tobytes() in segment_bytes(tx.name)
        assert bytes([0xEE]) * 64 not in segment_bytes(tx.name)


@no_subprocess
@pytest.mark.parametrize("how,slot_bytes,max_subscribers", [
    ("memmove", 5000, 3),                # packed slots; a subscriber table that ends mid-page
    ("frombuffer", 300_000, 16),         # page-aligned slots
])
def test_topic_subscriber_cannot_write_through_a_view(tmp_path, how, slot_bytes, max_subscribers):
    data = np.random.default_rng(4).integers(0, 255, slot_bytes, dtype=np.uint8)
    with Topic.create(fresh_name("tp"), slot_bytes=slot_bytes, slots=4, history=1,
                      max_subscribers=max_subscribers) as t, Topic.subscribe(t.name) as s:
        t.send(data)
        proc = run_child(tmp_path, WRITER, "topic", t.name, how)  # gets the message as history
        assert_died_writing(proc, slot_bytes)
        # The other subscriber reads the publisher's bytes, and the publisher goes on.
        assert np.array_equal(s.recv(timeout=5), data)
        t.send(data[::-1].copy(), timeout=5)
        assert np.array_equal(s.recv(timeout=5), data[::-1])
        assert data.tobytes() in segment_bytes(t.name)


FORKED_PRODUCER = r"""
import os, sys
import numpy as np
from fastcopy.shm import Channel
name = sys.argv[1]
with Channel.create(name, capacity=1 << 16) as tx:
    rx = Channel.attach(name)
    tx.send(np.arange(10, dtype=np.uint8))
    v = rx.recv_view(timeout=5)          # rx is the consumer here: its data is read-only
    assert v.tolist() == list(range(10))
    del v
    tx.close()                           # the producer role is free for another end
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            rx.send(np.full(100, 7, np.uint8), timeout=5)   # the same end, producer in the child
            with rx.loan(50, np.uint8) as a:
                a[...] = 9
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print("child", status, flush=True)
    assert status == 0, status
    assert rx.recv(timeout=5).tolist() == [7] * 100
    assert rx.recv(timeout=5).tolist() == [9] * 50
    rx.close()
print("ok")
"""


@no_subprocess
def test_an_end_that_was_a_consumer_gets_a_writable_mapping_as_producer(tmp_path):
    proc = run_child(tmp_path, FORKED_PRODUCER, fresh_name("fork"))
    assert proc.returncode == 0 and "ok" in proc.stdout, (proc.returncode, proc.stdout + proc.stderr)


def test_topic_of_the_previous_layout_is_refused_by_version():
    with Topic.create(fresh_name("old"), slot_bytes=64, slots=2) as t:
        assert _core.SHM_TOPIC_VERSION == 3
        with open("/dev/shm/" + t.name, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            poke(m, TOPIC, "version", 2)
        with pytest.raises(ChannelCorrupted, match=r"protocol version 2, this build speaks 3"):
            Topic.subscribe(t.name)
