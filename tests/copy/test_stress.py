"""A bounded stress run (about 5 s): everything at once, in a subprocess whose exit status is
checked (a crash or a hang fails the test instead of killing pytest).

* three threads, each with its own pair of channels to an echo process: random sizes 0 B to
  4 MiB (rings of 1 MiB, so large messages stream), random ``out=`` reuse on receive, every
  echo checked byte for byte and by sequence number (no loss while the peer lives, no
  duplicate, no corruption); the echo process is killed at random points (SIGKILL), the
  thread must then get a ChannelError (PeerDied) or TimeoutError, never wrong data, and it
  starts a new pair and a new process;
* a thread changing ``fastcopy.set_threads`` between 1, 2 and the default;
* a thread copying 8-32 MiB arrays while another takes them away and resizes them: numpy
  must refuse (or the resize comes before the call), never a crash; every copy whose
  destination survives, and one strided copy per round into arrays only that thread holds,
  is compared byte for byte with np.copyto's result.

FASTCOPY_NO_SUBPROCESS=1 skips it; FASTCOPY_STRESS_SECONDS changes the duration."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fastcopy

SRC = Path(fastcopy.__file__).resolve().parent.parent

STRESS = r'''
import os, random, signal, subprocess, sys, threading, time, weakref
import numpy as np
import fastcopy
from fastcopy.shm import Channel, ChannelError, ChannelCorrupted

SECONDS = float(sys.argv[1])
PREFIX = sys.argv[2]
deadline = time.monotonic() + SECONDS
failures = []
stats = {"echoed": 0, "bytes": 0, "kills": 0, "peer_errors": 0, "resize_refused": 0, "resize_early": 0,
         "copies": 0, "copies_checked": 0, "strided_checked": 0, "thread_changes": 0}
lock = threading.Lock()

ECHO = """
import sys
import numpy as np
from fastcopy.shm import Channel, ChannelClosed
req, rep = Channel.attach(sys.argv[1]), Channel.attach(sys.argv[2])
print("ready", flush=True)
buf = None
try:
    while True:
        info = req.peek()
        if info is None:
            continue
        dtype, shape = info
        if buf is not None and buf.dtype == dtype and buf.shape == shape:
            req.recv(out=buf)            # reuse the previous array when it fits
            msg = buf
        else:
            msg = buf = req.recv()
        rep.send(msg)
except ChannelClosed:
    pass
"""


def message(seq, size, rng):
    kind = rng.integers(3)
    if kind == 0:
        m = np.empty(size, np.uint8)
    elif kind == 1:
        m = np.empty(max(size // 8, 1), np.float64)
    else:
        m = np.empty((2, max(size // 8, 1)), np.int32)
    raw = m.view(np.uint8).reshape(-1)
    raw[:] = (np.arange(raw.size) * 31 + seq).astype(np.uint8)
    if raw.size >= 8:
        raw[:8] = np.frombuffer(np.uint64(seq).tobytes(), np.uint8)
    return m


def start_pair(tag):
    req = Channel.create(f"{PREFIX}{tag}-{time.monotonic_ns()}-q", capacity=1 << 20)
    rep = Channel.create(f"{PREFIX}{tag}-{time.monotonic_ns()}-p", capacity=1 << 20)
    child = subprocess.Popen([sys.executable, "-c", ECHO, req.name, rep.name], stdout=subprocess.PIPE, text=True)
    if child.stdout.readline().strip() != "ready":
        raise RuntimeError("echo process did not start")
    return req, rep, child


def end_pair(req, rep, child, kill):
    if kill:
        child.kill()
    else:
        req.close()
    child.wait(timeout=30)
    for ch in (req, rep):
        ch.close()
        ch.unlink()


def channel_worker(k):
    rng = np.random.default_rng(1000 + k)
    req, rep, child = start_pair(f"w{k}")
    seq = 0
    reuse = None
    try:
        while time.monotonic() < deadline:
            size = int(rng.choice([0, 1, 64, 4096, 65536, 300_000, 1 << 20, 4 << 20]))
            msg = message(seq, size, rng)
            kill_now = rng.random() < 0.04
            if kill_now:   # kill the echo process at a random point: before, during or after the send
                delay = rng.random() * 0.01
                threading.Timer(delay, child.kill).start()
            try:
                req.send(msg, timeout=10)
                if reuse is not None and reuse.dtype == msg.dtype and reuse.shape == msg.shape and rng.random() < 0.5:
                    got = rep.recv(out=reuse, timeout=10)
                else:
                    got = rep.recv(timeout=10)
                    reuse = got
            except ChannelCorrupted as e:
                failures.append(f"worker {k}: corrupted: {e}")
                return
            except (ChannelError, TimeoutError) as e:
                if not kill_now:
                    failures.append(f"worker {k}: {type(e).__name__} without a kill: {e}")
                    return
                with lock:
                    stats["peer_errors"] += 1
                    stats["kills"] += 1
                end_pair(req, rep, child, kill=True)
                req, rep, child = start_pair(f"w{k}")
                seq = 0
                continue
            if got.dtype != msg.dtype or got.shape != msg.shape or not np.array_equal(
                    got.view(np.uint8), msg.view(np.uint8)):
                failures.append(f"worker {k}: message {seq} came back different ({got.dtype}{got.shape})")
                return
            with lock:
                stats["echoed"] += 1
                stats["bytes"] += msg.nbytes
            seq += 1
            if kill_now:   # the kill came after the echo: restart anyway
                with lock:
                    stats["kills"] += 1
                end_pair(req, rep, child, kill=True)
                req, rep, child = start_pair(f"w{k}")
                seq = 0
    except Exception as e:  # anything unexpected is a failure, reported with its type
        failures.append(f"worker {k}: {type(e).__name__}: {e}")
    finally:
        try:
            end_pair(req, rep, child, kill=True)
        except Exception:
            pass


def thread_changer():
    rng = np.random.default_rng(7)
    while time.monotonic() < deadline:
        fastcopy.set_threads(int(rng.choice([0, 1, 2])))
        with lock:
            stats["thread_changes"] += 1
        time.sleep(0.005)
    fastcopy.set_threads(0)


shared = []


def copier():
    rng = np.random.default_rng(3)
    exposed = False
    private = []
    while time.monotonic() < deadline:
        n = int(rng.integers(8, 33)) << 20
        src = (np.arange(n, dtype=np.uint32) * 2654435761 >> 13).astype(np.uint8)
        expected = np.zeros(n, np.uint8)
        np.copyto(expected, src)
        # Every other destination is out of the resizer's reach, so some copies are always
        # byte-checked however the threads are scheduled (a loaded machine let the resizer win
        # all 11 races of one run).
        exposed = not exposed
        (shared if exposed else private).append(np.zeros(n, np.uint8))
        # A weak reference: holding the array itself would make every resize refuse.
        target = weakref.ref((shared if exposed else private)[-1])
        try:
            fastcopy.copy((shared if exposed else private)[-1], src)
            copied = True
        except (ValueError, IndexError):
            copied = False           # the resizer came first: a clean error (or nothing to copy)
        dst = target()
        if copied and dst is not None:   # still alive: whole (or resized after the copy, a prefix of it)
            if dst.size not in (n, 4096) or not np.array_equal(dst, expected[:dst.size]):
                wrong = np.count_nonzero(dst != expected[:dst.size]) if dst.size <= n else dst.size
                failures.append(f"copy of {n} bytes: {dst.size} bytes, {wrong} differ from np.copyto's")
            with lock:
                stats["copies_checked"] += 1
        del dst
        # A strided copy into arrays only this thread holds, compared with np.copyto's bytes.
        own, want = np.zeros(n, np.uint8), np.zeros(n, np.uint8)
        fastcopy.copy(own[::2], src[1::2])
        np.copyto(want[::2], src[1::2])
        if not np.array_equal(own, want):
            failures.append(f"strided copy of {n // 2} elements: {np.count_nonzero(own != want)} bytes differ")
        with lock:
            stats["copies"] += 1
            stats["strided_checked"] += 1
        shared.clear()
        private.clear()


def resizer():
    while time.monotonic() < deadline:
        if shared:
            try:
                shared.pop().resize(4096)
                with lock:
                    stats["resize_early"] += 1
            except ValueError:
                with lock:
                    stats["resize_refused"] += 1
            except IndexError:
                pass
        time.sleep(0.0005)


threads = [threading.Thread(target=channel_worker, args=(k,)) for k in range(3)]
threads += [threading.Thread(target=f) for f in (thread_changer, copier, resizer)]
for t in threads:
    t.start()
for t in threads:
    t.join(timeout=SECONDS + 60)
    if t.is_alive():
        failures.append(f"hang: {t.name} still running")
print("stats", stats)
for f in failures:
    print("FAILURE", f)
sys.exit(1 if failures else 0)
'''


@pytest.mark.skipif(os.environ.get("FASTCOPY_NO_SUBPROCESS") == "1",
                    reason="FASTCOPY_NO_SUBPROCESS=1: tests that start processes are skipped")
def test_stress_channels_copies_resizes_kills_and_thread_changes(tmp_path):
    seconds = os.environ.get("FASTCOPY_STRESS_SECONDS", "5")
    prefix = f"fcst-{os.getpid()}-"
    script = tmp_path / "stress.py"
    script.write_text(textwrap.dedent(STRESS))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    try:
        proc = subprocess.run([sys.executable, str(script), seconds, prefix], capture_output=True, text=True,
                              timeout=float(seconds) + 120, env=env, cwd=str(tmp_path))
    finally:
        left = [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
        for name in left:
            os.unlink("/dev/shm/" + name)
    report = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, report
    stats = eval(proc.stdout.split("stats ", 1)[1].splitlines()[0], {})  # a dict literal we printed
    assert stats["echoed"] > 20 and stats["copies"] > 5 and stats["thread_changes"] > 10, report
    assert stats["copies_checked"] >= 1, report  # byte-checked copies (the others lost their array to the resizer)
    assert stats["strided_checked"] == stats["copies"], report  # every strided copy compared with np.copyto
    assert left == [], f"segments left in /dev/shm: {left}"
