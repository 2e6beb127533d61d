"""The "Failure modes" table of docs/shm.md, row by row: one scenario per row, and the words of
what each gives the caller must be in the row's cell. (docs/usage.md's table:
tests/copy/test_copy_hardening.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
from _child import (SIGINT_HANDLER, SIGINT_IGNORED, check_failure_cell, child_env, explain, failure_table,
                    leftovers_fixture, raised, run_script, shm_names)
from _shm_layout import CHANNEL, channel_header
from _shm_scenarios import CTRL_C, EXIT_BLOCKED, LEAK, RESUME, UNDER_ASAN, keep_without_memory, shm_total_bytes

from fastcopy import shm

pytestmark = pytest.mark.sanitize

subprocess_only = pytest.mark.skipif(
    os.environ.get("FASTCOPY_NO_SUBPROCESS") == "1",
    reason="FASTCOPY_NO_SUBPROCESS=1: tests that start processes are skipped",
)

PREFIX = f"fctf-{os.getpid()}-"
_remove_this_runs_segments = leftovers_fixture(PREFIX, fail=False)


def _pair(capacity=1 << 16):
    tx = shm.Channel.create(f"{PREFIX}fm-{time.monotonic_ns()}", capacity=capacity)
    return tx, shm.Channel.attach(tx.name)


def _close(*chans):
    for ch in chans:
        ch.close()
    chans[0].unlink()


TOPIC_PUBLISHER_KILLED = r"""
import subprocess, sys, time
from fastcopy.shm import PeerDied, Topic
code = ("import sys, time, numpy as np; from fastcopy.shm import Topic; "
        "t = Topic.create(sys.argv[1], slot_bytes=64, slots=4, history=3); "
        "[t.send(np.array([k])) for k in range(3)]; print('sent', flush=True); time.sleep(60)")
child = subprocess.Popen([sys.executable, "-c", code, sys.argv[1]], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "sent"
s = Topic.subscribe(sys.argv[1])
child.kill(); child.wait()
got = [int(s.recv(timeout=5)[0]) for _ in range(3)]
start = time.monotonic()
try:
    s.recv(timeout=10)
    print("nothing")
except PeerDied:
    print("PeerDied", got, time.monotonic() - start)
s.close()
import os
os.unlink("/dev/shm/" + sys.argv[1])
"""


PEER_KILLED = r"""
import os, signal, subprocess, sys, time
import numpy as np
from fastcopy.shm import Channel, PeerDied
ch = Channel.create(sys.argv[1], capacity=1 << 16)
code = "import sys, time, numpy as np; from fastcopy.shm import Channel; c = Channel.attach(sys.argv[1]); " \
       "c.send(np.arange(3)); print('sent', flush=True); time.sleep(60)"
child = subprocess.Popen([sys.executable, "-c", code, ch.name], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "sent"
child.kill(); child.wait()
first = ch.recv(timeout=5)
t0 = time.monotonic()
try:
    ch.recv()
except PeerDied:
    print("PeerDied", first.tolist(), "%.3f" % (time.monotonic() - t0))
ch.close(); ch.unlink()
"""

CTRL_C_BETWEEN = SIGINT_HANDLER + r"""
import os, signal, sys, threading, time
import numpy as np
from fastcopy.shm import Channel
ch = Channel.create(sys.argv[1], capacity=1 << 16); rx = Channel.attach(ch.name)
threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    rx.recv()
except KeyboardInterrupt:
    ch.send(np.arange(4))
    print("KeyboardInterrupt", "usable" if (rx.recv(timeout=1) == np.arange(4)).all() else "broken")
ch.close(); rx.close(); ch.unlink()
"""


def shm_scenarios(tmp_path):
    def peer_killed():
        proc = run_script(tmp_path, PEER_KILLED, f"{PREFIX}fm-kill")
        out = proc.stdout.split()
        assert out[:4] == ["PeerDied", "[0,", "1,", "2]"] and float(out[4]) < 2.0, explain(proc)
        return "PeerDied"

    def peer_closed():
        tx, rx = _pair()
        tx.send(np.arange(2))
        tx.close()
        assert (rx.recv(timeout=1) == np.arange(2)).all()
        outcome = raised(lambda: rx.recv(timeout=1))
        _close(rx, tx)
        return outcome

    def timeout_fits():
        tx, rx = _pair()
        tx.send(np.zeros(40000, np.uint8))
        outcome = raised(lambda: tx.send(np.zeros(40000, np.uint8), timeout=0.05))
        assert rx.recv(timeout=1).nbytes == 40000 and rx.peek(timeout=0) is None  # nothing half sent
        tx.send(np.ones(3), timeout=1)
        assert (rx.recv(timeout=1) == 1).all()
        _close(tx, rx)
        return outcome + " usable"

    def timeout_mid_message():
        tx, rx = _pair()
        rx.peek(timeout=0)  # rx is the consumer
        outcome = raised(lambda: tx.send(np.zeros(1 << 20, np.uint8), timeout=0.2))
        skipped = raised(lambda: rx.recv(timeout=0.2))  # skips the cut message; nothing else comes
        assert skipped == "TimeoutError" and rx.cut_messages == 1, (skipped, rx.cut_messages)
        tx.send(b"x", timeout=1)
        assert bytes(rx.recv(timeout=1)) == b"x"
        _close(tx, rx)
        return outcome + " cut skips usable"

    def ctrl_c_between():
        proc = run_script(tmp_path, CTRL_C_BETWEEN, f"{PREFIX}fm-int", prefix=SIGINT_IGNORED)
        assert proc.stdout.split() == ["KeyboardInterrupt", "usable"], explain(proc)
        return "KeyboardInterrupt usable"

    def ctrl_c_mid_send():
        proc = run_script(tmp_path, CTRL_C, "send", f"{PREFIX}fm-intmid", timeout=90, prefix=SIGINT_IGNORED)
        assert "parent-result interrupted" in proc.stdout, explain(proc)
        assert "child-result received next after skipping 1" in proc.stdout, explain(proc)
        return "KeyboardInterrupt cut skips usable"

    def ctrl_c_mid_recv():
        proc = run_script(tmp_path, CTRL_C, "recv", f"{PREFIX}fm-intmidr", timeout=90, prefix=SIGINT_IGNORED)
        assert "parent-result interrupted" in proc.stdout, explain(proc)
        assert f"after resumed {8 << 20}" in proc.stdout and "child-result completed" in proc.stdout, explain(proc)
        return "KeyboardInterrupt next recv goes on nothing lost usable"

    def recv_timeout_mid_message():
        proc = run_script(tmp_path, RESUME, f"{PREFIX}fm-resume", "out", "new", timeout=120)
        assert "first TimeoutError" in proc.stdout, explain(proc)
        assert f"second {128 << 20} mismatches 0" in proc.stdout and "third after" in proc.stdout, explain(proc)
        return "TimeoutError next recv goes on nothing lost usable"

    def recv_timeout_mid_message_without_memory():
        if UNDER_ASAN:
            return None  # cannot run here (see UNDER_ASAN); the plain run checks this row
        keep_without_memory(tmp_path, f"{PREFIX}fm-keepoom")
        return "TimeoutError saying so given up both ends get ChannelError"

    def second_producer():
        tx, rx = _pair()
        other = shm.Channel.attach(tx.name)
        tx.send(b"a")
        outcome = raised(lambda: other.send(b"b"))
        tx.send(b"c")
        assert [bytes(rx.recv(timeout=1)) for _ in range(2)] == [b"a", b"c"]
        other.close()
        _close(tx, rx)
        return outcome

    def two_threads():
        import threading

        tx, rx = _pair()
        t = threading.Thread(target=lambda: raised(lambda: rx.recv(timeout=1)))
        t.start()
        time.sleep(0.2)
        outcome = raised(lambda: rx.recv(timeout=0))
        t.join()
        _close(tx, rx)
        return outcome

    def garbage_header():
        tx, rx = _pair()
        with open("/dev/shm/" + tx.name, "r+b") as f:
            f.write(os.urandom(64))
        outcome = raised(lambda: tx.send(b"x"))
        _close(tx, rx)
        return outcome

    def wrong_out():
        tx, rx = _pair()
        tx.send(np.arange(5.0))
        outcome = raised(lambda: rx.recv(out=np.empty(4), timeout=1))
        stays = (rx.recv(out=np.empty(5), timeout=1) == np.arange(5.0)).all()
        _close(tx, rx)
        return outcome + (" stays" if stays else "")

    def wrong_type():
        tx, rx = _pair()
        outcome = raised(lambda: rx.recv(timeout="1"))
        _close(tx, rx)
        return outcome

    def after_close():
        tx, rx = _pair()
        tx.close()
        outcome = raised(lambda: tx.send(b"x"))
        _close(tx, rx)
        return outcome

    def create_no_room():
        cap = shm_total_bytes() + (64 << 20)  # more than the whole /dev/shm: refused at once
        name = f"{PREFIX}fm-big"
        try:
            shm.Channel.create(name, capacity=cap)
        except shm.ShmSpaceError as e:
            assert e.errno == 28 and not os.path.exists("/dev/shm/" + name)
            return "ShmSpaceError OSError ENOSPC nothing is left behind"
        return "created"

    def attach_no_pages():
        cap = shm_total_bytes() + (64 << 20)
        name = f"{PREFIX}fm-sparse"
        with open("/dev/shm/" + name, "wb") as f:
            f.write(channel_header(cap))
            f.truncate(CHANNEL["header_bytes"] + cap)  # sparse: no page of the ring exists, and they cannot
        try:
            shm.Channel.attach(name)
        except shm.ShmSpaceError as e:
            return "ShmSpaceError OSError ENOSPC" if e.errno == 28 else f"ShmSpaceError {e.errno}"
        except OSError as e:
            return f"OSError {e.errno}"
        finally:
            os.unlink("/dev/shm/" + name)
        return "attached"

    def exit_blocked():
        for case in ("recv", "send_full", "peek"):
            proc = run_script(tmp_path, EXIT_BLOCKED, case, f"{PREFIX}fm-exit-{case}")
            assert proc.returncode == 0, explain(proc)
        return "exit status 0"

    def sigterm():
        for case in ("SIGTERM", "SIGHUP"):
            proc = run_script(tmp_path, LEAK, case, f"{PREFIX}fm-leak-")
            assert f"signal {int(getattr(signal, case))}" in proc.stdout, explain(proc)
        return "ends by the signal" if not shm_names(f"{PREFIX}fm-leak-") else "left"

    def sigkill():
        proc = run_script(tmp_path, LEAK, "SIGKILL", f"{PREFIX}fm-kill-")
        assert "signal 9" in proc.stdout, explain(proc)
        stays = len(shm_names(f"{PREFIX}fm-kill-")) == 1
        removed = shm.clean_segments(f"{PREFIX}fm-kill-")
        assert removed and all(n.startswith(f"{PREFIX}fm-kill-") for n in removed), removed
        return ("name stays" if stays else "gone") + " shm --clean"

    def topic_subscriber_killed():
        # A subscriber in another process that never reads: the publisher (slots=2, block mode)
        # waits for it at the third message until it is killed, then goes on.
        with shm.Topic.create(f"{PREFIX}fm-tsub", slot_bytes=64, slots=2) as t, shm.Topic.subscribe(t.name) as s:
            code = ("import sys, time; from fastcopy.shm import Topic; s = Topic.subscribe(sys.argv[1]); "
                    "print('ready', flush=True); time.sleep(60)")
            child = subprocess.Popen([sys.executable, "-c", code, t.name], stdout=subprocess.PIPE, text=True,
                                     env=child_env())
            try:
                assert child.stdout.readline().strip() == "ready"
                got = []
                for k in range(2):
                    t.send(np.array([k]))
                    got.append(int(s.recv(timeout=1)[0]))
                assert raised(lambda: t.send(np.array([2]), timeout=0.2)) == "TimeoutError"  # it waits
                child.kill()
                child.wait()
                killed = time.monotonic()
                t.send(np.array([2]), timeout=10)
                waited = time.monotonic() - killed
                got.append(int(s.recv(timeout=1)[0]))
            finally:
                child.kill()
                child.wait()
        assert got == [0, 1, 2] and waited < 2.0, (got, waited)
        return "the publisher drops it and goes on; the other subscribers get every message"

    def topic_drop_behind():
        with shm.Topic.create(f"{PREFIX}fm-tdrop", slot_bytes=64, slots=2, overflow="drop") as t:
            with shm.Topic.subscribe(t.name) as s:
                for k in range(5):
                    t.send(np.array([k]), timeout=0)
                try:
                    s.recv(timeout=1)
                    return "nothing"
                except shm.MessagesLost as e:
                    count = e.count
                nxt = int(s.recv(timeout=1)[0])
        assert (count, nxt) == (3, 3), (count, nxt)
        return "MessagesLost with the exact count, then the next intact message"

    def topic_publisher_killed():
        proc = run_script(tmp_path, TOPIC_PUBLISHER_KILLED, f"{PREFIX}fm-tpub")
        out = proc.stdout.split()
        assert out[:4] == ["PeerDied", "[0,", "1,", "2]"] and float(out[4]) < 2.0, explain(proc)
        return "PeerDied"

    return {
        "the peer process is killed while this end waits for it": peer_killed,
        "the peer calls `close()`": peer_closed,
        "`timeout` passes before a message that fits the ring could be sent": timeout_fits,
        "a `send` times out in the middle of a message larger than the ring": timeout_mid_message,
        "Ctrl-C while blocked between messages": ctrl_c_between,
        "Ctrl-C in `send` in the middle of a message while the consumer is stopped": ctrl_c_mid_send,
        "Ctrl-C in `recv` in the middle of a message while the producer is stopped": ctrl_c_mid_recv,
        "a `recv` times out in the middle of a message larger than the ring": recv_timeout_mid_message,
        "the same, and there is no memory to keep the part received (a copy of the caller's `out`)":
            recv_timeout_mid_message_without_memory,
        "a second producer or consumer (another process, or another `Channel` object of this process)": second_producer,
        "one `Channel` object used by two threads at once": two_threads,
        "the segment's header is overwritten with garbage": garbage_header,
        "`out` has the wrong dtype, shape or size": wrong_out,
        "a wrong argument type (`timeout=\"1\"`, `capacity=\"1\"`, `name=5`)": wrong_type,
        "a call on a `Channel` after `close()`": after_close,
        "`/dev/shm` has no room for a new channel": create_no_room,
        "`attach` to a segment whose pages `/dev/shm` cannot supply": attach_no_pages,
        "the interpreter exits while a daemon thread is blocked in `send`, `recv` or `peek`": exit_blocked,
        "SIGTERM or SIGHUP ends the creator": sigterm,
        "SIGKILL ends the creator": sigkill,
        "a Topic subscriber stops reading and is killed while the publisher waits for it": topic_subscriber_killed,
        "a Topic subscriber falls behind with `overflow=\"drop\"`": topic_drop_behind,
        "the Topic publisher is killed while a subscriber waits": topic_publisher_killed,
    }


@subprocess_only
@pytest.mark.parametrize("doc, scenarios", [("shm.md", shm_scenarios)])
def test_failure_modes_table_matches_behaviour(tmp_path, doc, scenarios):
    table = failure_table(doc)
    runs = scenarios(tmp_path)
    assert set(table) == set(runs), (sorted(set(table) ^ set(runs)))  # one scenario per row, no more
    for fault, cell in table.items():
        outcome = runs[fault]()
        if outcome is None:  # a scenario that cannot run in this build says so
            warnings.warn(f"failure-modes row not checked in this build: {fault}")
            continue
        check_failure_cell(outcome, cell)
    assert shm_names(PREFIX) == set()


def test_limits_section_names_limits_the_core_has():
    """The "Limits" section of docs/shm.md names its limits by the keys of
    _core.shm_limits() (where the generated reference reads them): each one exists."""
    import re

    from _child import ROOT

    from fastcopy import _core

    text = (ROOT / "docs" / "shm.md").read_text()
    section = text.split("## Limits", 1)[1].split("\n## ", 1)[0]
    limits = _core.shm_limits()
    named = set(re.findall(r"`((?:channel|message|max|topic)_[a-z_*]+)`", section))
    assert len(named) >= 8, named
    for name in named:
        assert (any(k.startswith(name[:-1]) for k in limits) if name.endswith("*") else name in limits), name
