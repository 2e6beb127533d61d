"""Messages interrupted half way: Ctrl-C with the peer stopped, a send cut by its timeout (the
consumer skips the cut, whether it is in the middle of the message or waiting for its rest), a
recv that times out half way and goes on at the next recv, and one without memory to keep its
place, which gives the message up and says so.

Each runs as a script in a fresh interpreter. FASTCOPY_NO_SUBPROCESS=1 skips them."""

from __future__ import annotations

import os

import pytest
from _child import SIGINT_IGNORED, explain, leftovers_fixture, run_script, shm_names
from _shm_scenarios import CTRL_C, RESUME, START_CHILD_AND_MAP_HEADER, UNDER_ASAN, keep_without_memory

pytestmark = pytest.mark.sanitize

subprocess_only = pytest.mark.skipif(
    os.environ.get("FASTCOPY_NO_SUBPROCESS") == "1",
    reason="FASTCOPY_NO_SUBPROCESS=1: tests that start processes are skipped",
)

PREFIX = f"fcti-{os.getpid()}-"
_remove_this_runs_segments = leftovers_fixture(PREFIX, fail=False)


# ---- Ctrl-C in the middle of a large message while the peer is stopped (CTRL_C) ---------------
@subprocess_only
@pytest.mark.parametrize("role", ["send", "recv"])
def test_ctrl_c_in_the_middle_of_a_message_with_the_peer_stopped(tmp_path, role):
    proc = run_script(tmp_path, CTRL_C, role, f"{PREFIX}ctrlc-{role}", timeout=90, prefix=SIGINT_IGNORED)
    assert proc.returncode == 0, explain(proc)
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    parent = lines["parent-result"]
    assert parent.startswith("interrupted after"), explain(proc)
    assert float(parent.split()[2]) < 1.5, explain(proc)  # not 3.0 s (when the peer resumes)
    child, after = lines["child-result"], lines["after"]
    if role == "send":
        assert child == "received next after skipping 1", explain(proc)
        assert after == "sent", explain(proc)
    else:
        assert child == "completed", explain(proc)
        assert after == f"resumed {8 << 20}", explain(proc)
    assert shm_names(PREFIX) == set()


# ---- a cut reaches a consumer in the middle of the message ---------------------------------------
# The child receives a 256 MiB message through a 64 KiB ring into out=; once it has read 1 MiB
# of it the parent stops it (SIGSTOP), so the parent's send times out half way and cuts the
# message. The resumed child, woken in the middle of that message, must skip the rest of it at
# once (before the parent sends again) and receive the parent's next message of the same shape
# whole into the same out (all 2s), not a torn mix of the two (a consumer that ignored cuts
# would read the next message's header as data).
CUT_MID_MESSAGE = r"""
import mmap, os, signal, subprocess, sys, threading, time
import numpy as np
from fastcopy.shm import Channel

name = sys.argv[1]
N = 256 << 20
ch = Channel.create(name, capacity=1 << 16)
child_code = '''
import sys, numpy as np
from fastcopy.shm import Channel
ch = Channel.attach(sys.argv[1])
out = np.zeros(256 << 20, np.uint8)
print("ready", flush=True)
ch.recv(out=out, timeout=60)
print("child-result", int(np.count_nonzero(out == 2)), int(np.count_nonzero(out != 2)), ch.cut_messages)
'''
""" + START_CHILD_AND_MAP_HEADER + r"""outcome = []

def send_first():
    try:
        ch.send(np.ones(N, np.uint8), timeout=2.0)
        outcome.append("sent whole")
    except TimeoutError as e:
        outcome.append("timed out: " + str(e))

sender = threading.Thread(target=send_first)
sender.start()
while tail() < (1 << 20) and sender.is_alive():
    time.sleep(0.0005)
stopped_at = tail()
os.kill(child.pid, signal.SIGSTOP)
sender.join()
os.kill(child.pid, signal.SIGCONT)
print("first", outcome[0])
print("stopped-at", stopped_at)
# The resumed child, waiting in the middle of the cut message, skips it at once (its
# acknowledgement equals the cut), not only when the next message arrives.
deadline = time.monotonic() + 20
while not (word("cut_at") != 0 and word("cut_ack") == word("cut_at")) and time.monotonic() < deadline:
    time.sleep(0.001)
print("skipped-before-next", "yes" if word("cut_at") != 0 and word("cut_ack") == word("cut_at") else "no")
ch.send(np.full(N, 2, np.uint8), timeout=60)
print(child.stdout.read().strip())
child.wait(timeout=60)
header.close(); ch.close(); ch.unlink()
"""


@subprocess_only
def test_a_cut_reaches_a_consumer_in_the_middle_of_the_message(tmp_path):
    proc = run_script(tmp_path, CUT_MID_MESSAGE, f"{PREFIX}cutmid", timeout=120)
    assert proc.returncode == 0, explain(proc)
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert lines["first"].startswith("timed out") and "in the middle" in lines["first"], explain(proc)
    assert (1 << 20) <= int(lines["stopped-at"]) < (256 << 20), explain(proc)  # the child was mid-message
    assert lines["skipped-before-next"] == "yes", explain(proc)
    assert lines["child-result"] == f"{256 << 20} 0 1", explain(proc)
    assert shm_names(PREFIX) == set()


# ---- a cut wakes a consumer that waits for the rest of the message -----------------------------
# The child sends 1 MiB through a 64 KiB ring; once the ring is full and the child waits for
# room, the parent stops it (SIGSTOP). The parent's recv reads what is in the ring and goes to
# wait for more. Then the parent stores a cut where the stopped producer's head is, in the
# header word the producer writes when its send gives up there (cut_message), and wakes no one:
# the waiting consumer must find the cut at its next look (its futex sleeps are sliced at 50
# ms), skip to it and acknowledge it, and then wait for a next message, which never comes
# (TimeoutError). A consumer whose wait ignored cuts would sleep in the middle of the message
# until the timeout and keep its place there. (A real producer cuts only while it waits for
# room, so the consumer normally finds the cut between two chunks; the wait matters when it had
# read the last chunk before the cut: a race this scenario takes out of timing.)
CUT_WHILE_WAITING = r"""
import mmap, os, signal, subprocess, sys, threading, time
import numpy as np
from fastcopy.shm import Channel

name = sys.argv[1]
ch = Channel.create(name, capacity=1 << 16)
child_code = '''
import sys, numpy as np
from fastcopy.shm import Channel
ch = Channel.attach(sys.argv[1])
print("ready", flush=True)
ch.send(np.ones(1 << 20, np.uint8), timeout=60)
'''
""" + START_CHILD_AND_MAP_HEADER + r"""fd = os.open("/dev/shm/" + name, os.O_RDWR)
writable = mmap.mmap(fd, CHANNEL["header_bytes"])
os.close(fd)
# Aligned loads and stores of whole words (an 8-byte word as one numpy element).
words = {4: np.frombuffer(writable, np.uint32), 8: np.frombuffer(writable, np.uint64)}
def at(field):
    offset, size = CHANNEL["fields"][field]
    return words[size], offset // size
def load(field):
    array, index = at(field)
    return int(array[index])
head, tail, cut_at, cut_ack = (lambda: load("head"), lambda: load("tail"),
                               lambda: load("cut_at"), lambda: load("cut_ack"))
producer_waiting, consumer_waiting = lambda: load("producer_waiting"), lambda: load("consumer_waiting")

def wait_for(condition, what):
    give_up = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < give_up, what
        time.sleep(0.001)

wait_for(lambda: head() == 1 << 16 and producer_waiting() == 1, "the producer never waited for room")
os.kill(child.pid, signal.SIGSTOP)
outcome = []

def receive():
    try:
        ch.recv(timeout=3)
        outcome.append("received")
    except TimeoutError as e:
        outcome.append("TimeoutError " + str(e))

receiver = threading.Thread(target=receive)
receiver.start()
wait_for(lambda: tail() == head() and consumer_waiting() == 1, "the consumer never waited mid-message")
print("waiting-at", tail())
array, index = at("cut_at")
array[index] = head()  # the cut, where the producer stopped
receiver.join()
print("recv", outcome[0])
print("cut", cut_at(), "ack", cut_ack(), "skipped", ch.cut_messages)
os.kill(child.pid, signal.SIGKILL)
child.wait(timeout=30)
del words, array
writable.close(); header.close(); ch.close(); ch.unlink()
"""


@subprocess_only
def test_a_cut_wakes_a_consumer_waiting_in_the_middle_of_the_message(tmp_path):
    proc = run_script(tmp_path, CUT_WHILE_WAITING, f"{PREFIX}cutwait", timeout=90)
    assert proc.returncode == 0, explain(proc)
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert lines["waiting-at"] == str(1 << 16), explain(proc)  # the ring read, mid-message
    assert lines["cut"] == f"{1 << 16} ack {1 << 16} skipped 1", explain(proc)
    # Timed out waiting for a next message, not in the middle of the cut one.
    assert lines["recv"].startswith("TimeoutError") and "middle" not in lines["recv"], explain(proc)
    assert shm_names(PREFIX) == set()

# ---- a recv given up half way goes on at the next recv (RESUME) --------------------------------
@subprocess_only
@pytest.mark.parametrize("first, second", [("new", "new"), ("new", "out"), ("out", "new"), ("out", "out"),
                                           ("new", "view"), ("out", "view")])
def test_a_recv_that_times_out_half_way_goes_on_at_the_next_recv(tmp_path, first, second):
    proc = run_script(tmp_path, RESUME, f"{PREFIX}resume-{first}-{second}", first, second, timeout=120)
    assert proc.returncode == 0, explain(proc)
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert lines["first"].startswith("TimeoutError") and "goes on with it" in lines["first"], explain(proc)
    assert (1 << 20) <= int(lines["stopped-at"]) < (128 << 20), explain(proc)  # half way
    assert lines["second"] == f"{128 << 20} mismatches 0", explain(proc)
    if second == "view":
        assert lines["view-writeable"] == "False", explain(proc)
    assert lines["third"] == "after", explain(proc)
    assert lines["child-result"] == "sent both", explain(proc)
    assert shm_names(PREFIX) == set()

# ---- no memory to keep the part received (KEEP_WITHOUT_MEMORY) ---------------------------------
@subprocess_only
@pytest.mark.skipif(UNDER_ASAN, reason="AddressSanitizer cannot run under the tight RLIMIT_AS this scenario sets")
def test_a_recv_without_memory_to_keep_its_place_gives_the_message_up_and_says_so(tmp_path):
    keep_without_memory(tmp_path, f"{PREFIX}keepoom")
    assert shm_names(PREFIX) == set()
