"""Regression tests for channel faults found by hostile testing: a buffer resized under a
transfer that runs without the GIL, interpreter exit with a daemon thread blocked in a channel
call, SIGBUS on a segment whose pages cannot be allocated, two producer objects in one process,
timeouts of any real type. (The copy's own faults: tests/copy/test_copy_hardening.py.)

Crash-prone cases run as scripts in a fresh interpreter and assert their exit status.
FASTCOPY_NO_SUBPROCESS=1 skips those."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from _child import child_env, explain, leftovers_fixture, run_script, shm_names
from _shm_layout import CHANNEL, channel_header
from _shm_scenarios import EXIT_BLOCKED, shm_total_bytes

from fastcopy import shm

pytestmark = pytest.mark.sanitize

subprocess_only = pytest.mark.skipif(
    os.environ.get("FASTCOPY_NO_SUBPROCESS") == "1",
    reason="FASTCOPY_NO_SUBPROCESS=1: tests that start processes are skipped",
)

PREFIX = f"fcth-{os.getpid()}-"
_remove_this_runs_segments = leftovers_fixture(PREFIX, fail=False)


# ---- a buffer resized while a channel transfer runs without the GIL ----------------------------
RESIZE_CHANNEL = r"""
import sys, threading, time
import numpy as np
from fastcopy.shm import Channel

side = sys.argv[1]
N = 64 << 20
ch = Channel.create(sys.argv[2], capacity=4 << 20)
rx = Channel.attach(ch.name)
L = [np.arange(N, dtype=np.uint8)]
outcome = []
done = False

def resizer():
    while sys.getrefcount(L[0]) <= 2:  # until a transfer holds it (see RESIZE in tests/copy/test_copy_hardening.py)
        if done:
            outcome.append("late"); return
        time.sleep(0.0001)
    try:
        L.pop().resize(4096); outcome.append("resized")
    except ValueError:
        outcome.append("refused")

t = threading.Thread(target=resizer)
if side == "send":       # a streamed send (64 MiB through a 4 MiB ring) of L[0]
    got = []
    reader = threading.Thread(target=lambda: got.append(rx.recv(timeout=30)))
    reader.start(); t.start()
    ch.send(L[0], timeout=30)
    done = True
    reader.join(); t.join()
    if outcome[0] == "refused":   # else the resize came first (see RESIZE) and 4096 B were sent
        assert (got[0] == np.arange(N, dtype=np.uint8)).all()
else:                    # a streamed recv into out=L[0]
    writer = threading.Thread(target=lambda: ch.send(np.full(N, 7, np.uint8), timeout=30))
    writer.start(); t.start()
    rx.recv(out=L[0], timeout=30)
    done = True
    writer.join(); t.join()
ch.close(); rx.close(); ch.unlink()
print(outcome[0])
"""


@subprocess_only
@pytest.mark.parametrize("side", ["send", "recv"])
def test_channel_buffer_resized_during_transfer_is_refused(tmp_path, side):
    proc = run_script(tmp_path, RESIZE_CHANNEL, side, f"{PREFIX}rz-{side}")
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.split()[-1] in ("refused", "late", "resized"), explain(proc)
    assert shm_names(PREFIX) == set()

# ---- interpreter exit while a daemon thread is inside a channel call or a copy -----------------
# (EXIT_BLOCKED: _shm_scenarios.py)
@subprocess_only
@pytest.mark.parametrize("case", ["recv", "peek", "recv_loop", "send_full", "copy_loop", "stream"])
def test_exit_with_daemon_thread_blocked_is_clean(tmp_path, case):
    for attempt in range(2):  # the abort depended on timing; two clean exits in a row
        proc = run_script(tmp_path, EXIT_BLOCKED, case, f"{PREFIX}exit-{case}-{attempt}")
        assert proc.returncode == 0, explain(proc)
        assert "terminate" not in proc.stderr and "exiting" in proc.stdout, explain(proc)
    assert shm_names(PREFIX) == set()


# The thread that runs the finalization itself must not be parked: __del__ methods that copy


# ---- 3. attach to a segment whose pages tmpfs cannot supply -------------------------------------
SPARSE_ATTACH = r"""
import os, struct, sys
import numpy as np
from fastcopy import _core
from fastcopy.shm import Channel, ChannelError

name = "fcth-sparse"
cap = 64 << 20
layout = _core.shm_layout()["channel"]
header = bytearray(layout["header_bytes"])  # a valid header that no end has opened yet
for field, value in (("magic", layout["magic"]), ("version", layout["version"]),
                     ("header_bytes", layout["header_bytes"]), ("capacity", cap)):
    offset, size = layout["fields"][field]
    struct.pack_into({4: "=I", 8: "=Q"}[size], header, offset, value)
fd = os.open("/dev/shm/" + name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, bytes(header))
os.ftruncate(fd, len(header) + cap)          # sparse: the ring's pages were never allocated
os.close(fd)
try:
    ch = Channel.attach(name)
    ch.send(np.ones(48 << 20, np.uint8), timeout=5)
    print("sent")
except OSError as e:
    print("OSError", e.errno)
except ChannelError as e:
    print("ChannelError", e)
finally:
    os.unlink("/dev/shm/" + name)
"""


def _can_mount_small_tmpfs() -> bool:
    try:
        r = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                           capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


@subprocess_only
def test_attach_to_unallocatable_segment_raises_instead_of_sigbus(tmp_path):
    # A private mount namespace with a 32 MiB tmpfs on /dev/shm (needs root or CAP_SYS_ADMIN).
    if not _can_mount_small_tmpfs():
        pytest.skip("cannot mount a small tmpfs in a private mount namespace here")
    script = tmp_path / "scenario.py"
    script.write_text(textwrap.dedent(SPARSE_ATTACH))
    cmd = f"mount -t tmpfs -o size=32m tmpfs /dev/shm && exec {sys.executable} {script}"
    proc = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, timeout=60,
                          env=child_env(), cwd=str(tmp_path))
    assert proc.returncode == 0, explain(proc)  # not -7 (SIGBUS)
    assert proc.stdout.split()[0] == "OSError" and proc.stdout.split()[1] == "28", explain(proc)  # ENOSPC


def test_attach_to_segment_larger_than_dev_shm_raises_enospc():
    # Without a private mount: a sparse segment larger than the whole /dev/shm. attach must
    # allocate its pages first (posix_fallocate), which tmpfs refuses at once: ENOSPC, and no
    # mapping whose first write would be a SIGBUS.
    cap = shm_total_bytes() + (64 << 20)
    name = f"{PREFIX}sparse-big"
    with open("/dev/shm/" + name, "wb") as f:
        f.write(channel_header(cap))
        f.truncate(CHANNEL["header_bytes"] + cap)
    try:
        with pytest.raises(OSError) as e:
            shm.Channel.attach(name)
        assert e.value.errno == 28 and "shm" in str(e.value), e.value  # ENOSPC, naming /dev/shm
    finally:
        os.unlink("/dev/shm/" + name)


@subprocess_only
def test_attach_to_sparse_segment_with_room_works(tmp_path):
    # The same sparse file where /dev/shm has room: attach allocates the pages and the send works.
    st = os.statvfs("/dev/shm")
    if st.f_bavail * st.f_frsize < (256 << 20):
        pytest.skip("less than 256 MiB free in /dev/shm")
    proc = run_script(tmp_path, SPARSE_ATTACH.replace("fcth-sparse", f"{PREFIX}sparse"))
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.strip() == "sent", explain(proc)

# ---- 4. a second producer or consumer object in the same process -------------------------------
def test_second_producer_object_in_same_process_is_refused():
    with shm.Channel.create(f"{PREFIX}two-prod", capacity=1 << 16) as ch:
        a = shm.Channel.attach(ch.name)
        b = shm.Channel.attach(ch.name)
        a.send(np.zeros(4, np.uint8))
        with pytest.raises(shm.ChannelError, match="already has a producer"):
            b.send(np.zeros(4, np.uint8))
        with pytest.raises(shm.ChannelError, match="already has a producer"):
            ch.send(np.zeros(4, np.uint8))
        rx = shm.Channel.attach(ch.name)
        assert rx.recv(timeout=1).shape == (4,)
        with pytest.raises(shm.ChannelError, match="already has a consumer"):
            ch.recv(timeout=0)
        a.close()           # a producer closed cleanly can be taken over, in this process too
        b.send(np.ones(2, np.uint8))
        assert (rx.recv(timeout=1) == 1).all()
        b.close()
        rx.close()


def test_two_producer_threads_lose_nothing():
    # The scenario: two threads each attach and send 3000 messages while the main
    # thread receives. One of them must get ChannelError; every send that returned normally
    # must be received, in order.
    import threading

    count, size = 3000, 4096
    with shm.Channel.create(f"{PREFIX}two-thr", capacity=1 << 20) as ch:
        sent = [0, 0]
        errors = []

        def producer(k):
            p = shm.Channel.attach(ch.name)
            try:
                for i in range(count):
                    msg = np.full(size, k, np.uint8)
                    msg[:8] = np.frombuffer(np.uint64(i).tobytes(), np.uint8)
                    p.send(msg, timeout=20)
                    sent[k] += 1
            except shm.ChannelError as e:
                errors.append(e)
            finally:
                p.close()

        threads = [threading.Thread(target=producer, args=(k,)) for k in (0, 1)]
        for t in threads:
            t.start()
        got = []
        try:
            while True:
                m = ch.recv(timeout=5)
                got.append((int(m[8]), int(np.frombuffer(m[:8].tobytes(), np.uint64)[0])))
        except (shm.ChannelClosed, TimeoutError):
            pass
        for t in threads:
            t.join()
        assert sum(sent) == len(got), (sent, len(got), errors)
        for k in (0, 1):  # each producer's messages arrive complete and in order
            assert [i for who, i in got if who == k] == list(range(sent[k]))
        if errors:  # the usual case: the second producer was refused while the first was sending
            assert len(errors) == 1 and "already has a producer" in str(errors[0])
        else:       # or the second started after the first had closed: one after the other
            first = got[0][0]
            assert got == [(first, i) for i in range(count)] + [(1 - first, i) for i in range(count)]


def test_numeric_timeouts_of_any_real_type_are_accepted():
    ch = shm.Channel.create(f"{PREFIX}types-{time.monotonic_ns()}", capacity=1 << 16)
    tx, rx = ch, shm.Channel.attach(ch.name)
    try:
        for timeout in (0, 0.0, np.float32(0.001), np.int64(0)):
            assert rx.peek(timeout=timeout) is None
        tx.send(np.arange(3), timeout=np.float64(1.0))
        assert (rx.recv(timeout=np.int32(1)) == np.arange(3)).all()
    finally:
        tx.close(); rx.close(); tx.unlink()
