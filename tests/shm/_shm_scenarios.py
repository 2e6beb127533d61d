"""Scenario scripts that more than one shm test file runs (each in a fresh interpreter, through
_child.run_script): the hardening tests run each for its own assertions, and the failure-modes
table of docs/shm.md (test_failure_modes.py) runs them again for its rows. Scripts read the
segment layout from ``_core.shm_layout()``."""

from __future__ import annotations

import os

import pytest

from _child import SIGINT_HANDLER, child_env, explain, run_script


# ---- interpreter exit while a daemon thread is inside a channel call or a copy -----------------
EXIT_BLOCKED = r"""
import sys, threading, time
import numpy as np
from fastcopy.shm import Channel
import fastcopy

case = sys.argv[1]
ch = Channel.create(sys.argv[2], capacity=1 << 16)
other = Channel.attach(ch.name)

def recv_loop():
    while True:
        try:
            other.recv(timeout=0.5)
        except TimeoutError:
            pass

def send_full():
    ch.send(np.zeros(40000, np.uint8))
    ch.send(np.zeros(40000, np.uint8))       # blocks: the ring is full

def copy_loop():
    a = np.ones(64 << 20, np.uint8); b = np.zeros_like(a)
    while True:
        fastcopy.copy(b, a)

def stream_send():
    ch.send(np.zeros(8 << 20, np.uint8))      # larger than the ring: blocks mid-message

target = {"recv": other.recv, "peek": lambda: other.peek(timeout=1e9), "recv_loop": recv_loop,
          "send_full": send_full, "copy_loop": copy_loop, "stream": stream_send}[case]
threading.Thread(target=target, daemon=True).start()
time.sleep(0.3)
ch.unlink()
print("exiting")
"""


# ---- Ctrl-C in the middle of a large message while the peer is stopped -------------------------
# The parent sends (or receives) an 8 MiB message through a 1 MiB ring while the child at the
# other end is stopped (SIGSTOP) with part of the message in transfer. SIGINT must end the
# parent's call with KeyboardInterrupt within a wait slice (50 ms; the bound below is loose
# for a loaded machine) instead of when the peer resumes (3 s here). A sending parent cuts the
# message: the resumed child skips it and receives the parent's next message. A receiving
# parent keeps its place: its next recv returns the whole message once the child goes on.
CTRL_C = SIGINT_HANDLER + r"""
import os, signal, subprocess, sys, threading, time
import numpy as np
from fastcopy.shm import Channel

role, name = sys.argv[1], sys.argv[2]
ch = Channel.create(name, capacity=1 << 20)
child_code = '''
import sys, numpy as np
from fastcopy.shm import Channel, ChannelError
ch = Channel.attach(sys.argv[2])
print("ready", flush=True)
try:
    if sys.argv[1] == "send":   # the parent sends: the child receives
        got = ch.recv(timeout=20)
        print("child-result received", got.tobytes().decode(), "after skipping", ch.cut_messages)
    else:
        ch.send(np.zeros(8 << 20, np.uint8), timeout=20)
        print("child-result completed")
except ChannelError as e:
    print("child-result", type(e).__name__, e)
'''
child = subprocess.Popen([sys.executable, "-c", child_code, role, name], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "ready"
if role == "send":
    time.sleep(0.3)                        # the child is waiting in recv
    os.kill(child.pid, signal.SIGSTOP)
else:
    while ch.pending_bytes < (1 << 20) - 4096:   # the child filled the ring and waits mid-message
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGSTOP)
sent_at = []

def interrupt():
    time.sleep(0.3)
    sent_at.append(time.monotonic())
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(3.0)
    os.kill(child.pid, signal.SIGCONT)

threading.Thread(target=interrupt, daemon=True).start()
try:
    if role == "send":
        ch.send(np.ones(8 << 20, np.uint8), timeout=20)
    else:
        ch.recv(timeout=20)
    print("parent-result completed")
except KeyboardInterrupt:
    print("parent-result interrupted after %.3f s" % (time.monotonic() - sent_at[0]))
time.sleep(3.5)
os.kill(child.pid, signal.SIGCONT)
try:
    if role == "send":
        ch.send(b"next", timeout=20)
        print("after sent")
    else:
        print("after resumed", ch.recv(timeout=20).nbytes)
except Exception as e:
    print("after", type(e).__name__, e)
print(child.stdout.read().strip())
child.wait(timeout=30)
ch.close(); ch.unlink()
"""


# Shared by the scenarios that watch the consumer: starts `child_code` with the channel's name,
# waits for its "ready" and maps the channel's header read-only (word(field): a header word of
# _core.shm_layout(); tail(): the consumer's read position).
START_CHILD_AND_MAP_HEADER = r"""
child = subprocess.Popen([sys.executable, "-c", child_code, name], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "ready"
fd = os.open("/dev/shm/" + name, os.O_RDONLY)
from fastcopy import _core
CHANNEL = _core.shm_layout()["channel"]
header = mmap.mmap(fd, CHANNEL["header_bytes"], prot=mmap.PROT_READ)
os.close(fd)
def word(field):  # a header word (the machine's byte order)
    offset, size = CHANNEL["fields"][field]
    return int.from_bytes(header[offset:offset + size], sys.byteorder)
tail = lambda: word("tail")  # the consumer's read position
head = lambda: word("head")  # the producer's write position
def wait_until_sending():
    # The child has begun its message. Building it (np.tile of 128 MiB) can take seconds on a
    # loaded machine, which must not eat the timed recv's timeout.
    give_up = time.monotonic() + 60
    while head() == 0 and time.monotonic() < give_up:
        time.sleep(0.0005)
"""


# ---- a recv given up half way goes on at the next recv ----------------------------------------
# The parent receives a 128 MiB message through a 64 KiB ring; once it has read 1 MiB of it a
# watcher thread stops the producing child (SIGSTOP), so the parent's recv times out half way.
# After the child resumes, the next recv must return the whole message, byte for byte, and the
# message after it: nothing lost, nothing torn, whichever way each call takes the message (a new
# array, or a buffer of the caller's: the first call's part is kept, not read back from that
# buffer, which is filled with 0xFF in between; or, for the second, recv_view, which returns a
# message larger than the ring as a read-only copy).
RESUME = r"""
import mmap, os, signal, subprocess, sys, threading, time
import numpy as np
from fastcopy.shm import Channel

name, first, second = sys.argv[1:4]
N = 128 << 20
pattern = np.tile(np.arange(251, dtype=np.uint8), N // 251 + 1)[:N]
ch = Channel.create(name, capacity=1 << 16)
child_code = '''
import sys, numpy as np
from fastcopy.shm import Channel
ch = Channel.attach(sys.argv[1])
N = 128 << 20
print("ready", flush=True)
ch.send(np.tile(np.arange(251, dtype=np.uint8), N // 251 + 1)[:N], timeout=60)
ch.send(b"after", timeout=60)
print("child-result sent both")
'''
""" + START_CHILD_AND_MAP_HEADER + r"""stopped = []

def stop_child():
    give_up = time.monotonic() + 20  # a run that never got there fails on stopped-at, not by hanging
    while tail() < (1 << 20) and time.monotonic() < give_up:
        time.sleep(0.0002)
    os.kill(child.pid, signal.SIGSTOP)
    stopped.append(tail())

watcher = threading.Thread(target=stop_child)
buf = np.zeros(N, np.uint8)
wait_until_sending()
watcher.start()
try:
    ch.recv(timeout=1.5) if first == "new" else ch.recv(out=buf, timeout=1.5)
    print("first completed")
except TimeoutError as e:
    print("first", "TimeoutError", e)
watcher.join()
print("stopped-at", stopped[0])
buf[:] = 0xFF  # the caller reuses its buffer: the part kept must not come from it
os.kill(child.pid, signal.SIGCONT)
other = np.zeros(N, np.uint8)
if second == "view":  # a message larger than the ring comes back as a read-only copy
    got = ch.recv_view(timeout=60)
    print("view-writeable", got.flags.writeable)
else:
    got = ch.recv(timeout=60) if second == "new" else ch.recv(out=other, timeout=60)
print("second", got.nbytes, "mismatches", int(np.count_nonzero(got != pattern)))
print("third", ch.recv(timeout=60).tobytes().decode())
print(child.stdout.read().strip())
child.wait(timeout=60)
header.close(); ch.close(); ch.unlink()
"""


# ---- no memory to keep the part received: the message is given up, and said so ----------------
# As above (a recv into the caller's out that times out half way through a 128 MiB message), but
# once the child is stopped the receiving process may map only 2 MiB more than it has
# (RLIMIT_AS, set by the watcher thread while the recv waits), so the copy of the 40 MiB or more
# received cannot be made. (With one malloc arena, MALLOC_ARENA_MAX=1: glibc retries a failed
# allocation in another thread's arena, whose 64 MiB of address space is reserved already.) The
# message is then given up for good (the channel's abandoned word), the TimeoutError says so
# instead of promising that the next recv goes on, and from then on both ends get ChannelError
# naming the cause.
KEEP_WITHOUT_MEMORY = r"""
import mmap, os, resource, signal, subprocess, sys, threading, time
import numpy as np
from fastcopy.shm import Channel, ChannelError

name = sys.argv[1]
N = 128 << 20
ch = Channel.create(name, capacity=1 << 16)
child_code = '''
import sys, numpy as np
from fastcopy.shm import Channel, ChannelError
ch = Channel.attach(sys.argv[1])
print("ready", flush=True)
try:
    ch.send(np.ones(128 << 20, np.uint8), timeout=60)
    print("child-result sent")
except ChannelError as e:
    print("child-result", type(e).__name__, e)
'''
""" + START_CHILD_AND_MAP_HEADER + r"""stopped = []

def stop_child_and_limit_memory():
    give_up = time.monotonic() + 20
    while tail() < (40 << 20) and time.monotonic() < give_up:
        time.sleep(0.0002)
    os.kill(child.pid, signal.SIGSTOP)
    stopped.append(tail())
    with open("/proc/self/status") as f:
        vm_size = next(int(line.split()[1]) << 10 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm_size + (2 << 20), resource.RLIM_INFINITY))

buf = np.zeros(N, np.uint8)
watcher = threading.Thread(target=stop_child_and_limit_memory)
wait_until_sending()
watcher.start()
try:
    ch.recv(out=buf, timeout=5)
    print("first completed")
except TimeoutError as e:
    print("first", "TimeoutError", e)
watcher.join()
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
print("stopped-at", stopped[0])
os.kill(child.pid, signal.SIGCONT)
try:
    ch.recv(out=buf, timeout=10)
    print("second received")
except ChannelError as e:
    print("second", type(e).__name__, e)
print(child.stdout.read().strip())
child.wait(timeout=60)
header.close(); ch.close(); ch.unlink()
"""


# AddressSanitizer (.ci/asan_pytest.sh preloads it) maps its own memory as it goes, which a
# tight RLIMIT_AS stops: the process hangs instead of reaching the scenario's point.
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")


def keep_without_memory(tmp_path, name):
    """Runs KEEP_WITHOUT_MEMORY and checks its outcome (also a row of the failure-modes table)."""
    proc = run_script(tmp_path, KEEP_WITHOUT_MEMORY, name, timeout=120, env=child_env(MALLOC_ARENA_MAX="1"))
    assert proc.returncode == 0, explain(proc)
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert (40 << 20) <= int(lines["stopped-at"]) < (128 << 20), explain(proc)  # half way
    first = lines["first"]
    assert first.startswith("TimeoutError") and "no memory to keep" in first, explain(proc)
    assert "goes on with it" not in first, explain(proc)
    assert lines["second"].startswith("ChannelError") and "out of memory" in lines["second"], explain(proc)
    assert lines["child-result"].startswith("ChannelError") and "consumer gave up" in lines["child-result"], \
        explain(proc)


# ---- names left in /dev/shm ---------------------------------------------------------------------
LEAK = r"""
import multiprocessing as mp, os, signal, sys, time
from fastcopy.shm import Channel

case, prefix = sys.argv[1], sys.argv[2]

def make(tag):
    ch = Channel.create(f"{prefix}{tag}-{os.getpid()}", capacity=1 << 16)   # never unlinked
    return ch.name

if __name__ == "__main__":
    # The default actions, whatever this run inherited: under nohup SIGHUP is ignored, and the
    # library leaves an ignored signal ignored, so the signalled creator would not end.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    if case in ("fork", "forkserver", "spawn"):
        p = mp.get_context(case).Process(target=make, args=(case,))
        p.start(); p.join()
        print("exitcode", p.exitcode)
    elif case == "pool-close":
        with mp.get_context("fork").Pool(2) as pool:
            print(pool.map(make, ["pool-a", "pool-b"]))
            pool.close(); pool.join()
    elif case == "pool-terminate":   # Pool.__exit__ terminates its workers with SIGTERM
        with mp.get_context("fork").Pool(2) as pool:
            print(pool.map(make, ["poolt-a", "poolt-b"]))
    elif case in ("SIGTERM", "SIGHUP", "SIGKILL"):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            ch = Channel.create(f"{prefix}{case}-{os.getpid()}", capacity=1 << 16)
            os.write(w, b"x")
            ch.recv()                       # blocked until the signal ends this process
            os._exit(3)
        os.close(w)
        os.read(r, 1)
        time.sleep(0.2)
        os.kill(pid, getattr(signal, case))
        _, status = os.waitpid(pid, 0)
        print("signal", os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1)
"""


def shm_total_bytes():
    """Size of the /dev/shm file system: a capacity above it is refused at once by fallocate
    (tmpfs checks the request against its size before allocating anything)."""
    st = os.statvfs("/dev/shm")
    total = st.f_blocks * st.f_frsize
    if total == 0 or total > (1 << 40) - (64 << 20):  # no limit, or beyond a channel's 1 TiB
        pytest.skip("/dev/shm has no size limit here, or one above 1 TiB")
    return total
