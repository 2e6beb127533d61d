"""A program that exits while its threads wait in fastcopy.net receives or publish in a loop: the
process ends normally. A thread still inside Zenoh's code while the interpreter finalizes aborts
the process as it takes the GIL back ("FATAL: exception not rethrown"); fastcopy.net closes
every open Publisher and Subscriber at exit, while every thread still runs, so each send and
receive has left Zenoh's code by then."""
from __future__ import annotations

import re
import subprocess

import pytest

from _child import explain, run_script
from _net import needs_zenoh
from conftest import no_subprocess

pytestmark = [pytest.mark.net, needs_zenoh, no_subprocess]

WAITING_THREADS = """
    import sys, threading, time
    import fastcopy.net as net

    mode = sys.argv[2]
    session = net.open_session()
    subs = [net.Subscriber(f"fastcopy/test/exit/{i}", session) for i in range(8)]
    ended = []

    def receive(sub):
        try:
            if mode == "iterate":
                for _ in sub:
                    pass
                ended.append("iteration ended")
            else:
                sub.recv()
        except ValueError as exc:
            ended.append(str(exc))

    for sub in subs:
        threading.Thread(target=receive, args=(sub,), daemon=True).start()
    time.sleep(float(sys.argv[1]))  # the receives wait in Zenoh's channel, woken every WAKE_EVERY
    print("main returns")
"""


# Without the close at exit such runs abort at these delays (evidence:
# net-exit-threads-in-zenoh).
@pytest.mark.parametrize("mode", ["recv", "iterate"])
@pytest.mark.parametrize("delay", ["0.19", "0.6"])
def test_exit_while_receives_wait_ends_normally(tmp_path, delay, mode):
    for _ in range(2):
        proc = run_script(tmp_path, WAITING_THREADS, delay, mode, timeout=60)
        assert proc.returncode == 0 and "main returns" in proc.stdout, explain(proc)
        assert "FATAL" not in proc.stderr and "Traceback" not in proc.stderr, explain(proc)


PUBLISHING_THREADS = """
    import sys, threading, time
    import numpy as np
    import fastcopy.net as net

    session = net.open_session()
    pubs = [net.Publisher(f"fastcopy/test/exit/pub{i}", session) for i in range(2)]
    arr = np.zeros(int(sys.argv[1]), np.uint8)

    def publish(pub):
        try:
            while True:
                pub.send(arr)
        except ValueError as exc:
            assert "closed publisher" in str(exc), exc

    for pub in pubs:
        threading.Thread(target=publish, args=(pub,), daemon=True).start()
    time.sleep(0.3)
    print("main returns")
"""


# Without the close at exit such a run aborts, at both sizes (evidence: net-exit-threads-in-zenoh).
@pytest.mark.parametrize("nbytes", ["1000", "1000000"])
def test_exit_while_threads_publish_ends_normally(tmp_path, nbytes):
    for _ in range(2):
        proc = run_script(tmp_path, PUBLISHING_THREADS, nbytes, timeout=60)
        assert proc.returncode == 0 and "main returns" in proc.stdout, explain(proc)
        assert "FATAL" not in proc.stderr and "Traceback" not in proc.stderr, explain(proc)


def test_a_subscriber_closed_at_exit_ends_an_iteration_quietly():
    """close() from another thread ends a `for msg in sub` loop instead of raising in it."""
    import threading

    import fastcopy.net as net

    session = net.open_session()
    try:
        sub = net.Subscriber("fastcopy/test/exit/iter", session)
        done = []
        th = threading.Thread(target=lambda: done.append([m for m in sub]), daemon=True)
        th.start()
        th.join(0.3)
        assert th.is_alive()
        sub.close()
        th.join(10)
        assert not th.is_alive() and done == [[]]
    finally:
        session.close()


HELD_PUBLISHER = """
    import atexit, os, sys, threading, time
    import numpy as np

    # Registered before fastcopy.net's own handler, so it runs after it (atexit runs the last
    # registered first): how long the close at exit took.
    atexit.register(lambda: print(f"closed after {time.monotonic() - started:.1f} s", flush=True))
    import fastcopy.net as net

    where, mode, go = sys.argv[1:4]
    # Zenoh holds a blocked put up to wait_before_close (a few seconds by default) before it gives
    # up on the link: 60 s here, so the send is still held when close() stops waiting.
    session = net.open_session(listen=[where], settings={
        "transport/link/tx/queue/congestion_control/block/wait_before_close": 60_000_000})
    pub = net.Publisher("fastcopy/test/exit/held", session)
    arr = np.zeros(16 << 20, np.uint8)
    sent, ended = [0], []

    def publish():
        try:
            while True:
                pub.send(arr)
                sent[0] += 1
        except ValueError as exc:
            ended.append(str(exc))

    sender = threading.Thread(target=publish, daemon=True)
    sender.start()
    print("listening", flush=True)
    # Goes on once a send has been held for a second: the subscriber stopped reading and
    # Zenoh's queues are full.
    last, since, give_up = -1, time.monotonic(), time.monotonic() + 30
    while time.monotonic() < give_up:
        time.sleep(0.1)
        if sent[0] != last:
            last, since = sent[0], time.monotonic()
        elif time.monotonic() - since > 1.0:
            break
    print(f"held: {time.monotonic() - since > 1.0}", flush=True)
    started = time.monotonic()
    if mode == "close":
        pub.close()
        print(f"close took {time.monotonic() - started:.1f} s; sender alive {sender.is_alive()}; "
              f"undeclared {pub._undeclared}", flush=True)
        while not os.path.exists(go):  # the parent ends the subscriber, and the put returns
            time.sleep(0.05)
        sender.join(30)
        print(f"then: sender alive {sender.is_alive()}; undeclared {pub._undeclared}; ended {ended}", flush=True)
    else:
        # Registered after fastcopy.net's own handler, so it runs before it: whether the send is
        # still in flight as the close at exit starts.
        atexit.register(lambda: print(f"send in flight at exit: {pub._lock.locked()}", flush=True))
"""

STALLED_SUBSCRIBER = """
    import sys, time
    import fastcopy.net as net

    sub = net.Subscriber("fastcopy/test/exit/held", connect=[sys.argv[1]], capacity=1)
    sub.recv(timeout=30)
    print("stopped reading", flush=True)
    time.sleep(60)
"""


def held_send(tmp_path, mode: str) -> str:
    """Runs HELD_PUBLISHER in `mode` against STALLED_SUBSCRIBER; its stdout. In "close" mode the
    subscriber process ends once the publisher has printed how close() went."""
    from _child import spawn
    from _net import endpoint, free_port

    where, go = endpoint(free_port()), tmp_path / "go"
    pub = spawn(HELD_PUBLISHER, where, mode, str(go))
    sub = None
    try:
        assert pub.stdout.readline().strip() == "listening"
        sub = spawn(STALLED_SUBSCRIBER, where)
        lines = [pub.stdout.readline() for _ in range(2 if mode == "close" else 0)]
        if mode == "close":
            sub.kill()
            sub.communicate()
            go.touch()
        # At exit the close waits 5 s for the held send and the process ends: 40 s is ample
        # under load, and well under the subscriber's 60 s stall, which a close that waited
        # for the send would sit through.
        try:
            out, err = pub.communicate(timeout=40 if mode == "exit" else 90)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the publisher did not end within the bound ({mode}): its close waited for the held send")
    finally:
        for proc in (pub, sub):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    out = "".join(lines) + out
    assert pub.returncode == 0, f"exit {pub.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    assert err.strip() == "", err
    assert "held: True" in out, out
    return out


def test_exit_while_a_send_is_held_by_a_stalled_subscriber_ends_normally(tmp_path):
    """A subscriber in another process stops reading; the publisher's sending thread is held in
    Zenoh's put when the main thread returns, and stays held. The close at exit waits for that
    send 5 s and leaves it where it waits (undeclaring under it raises "Already borrowed"):
    the process ends normally, with nothing on stderr."""
    out = held_send(tmp_path, "exit")
    assert "send in flight at exit: True" in out, out
    closed = re.search(r"closed after ([0-9.]+) s", out)
    assert closed, out
    # At least the close's 5 s wait (the send stayed held through it); well under the
    # subscriber's 60 s stall: the wait ends by itself.
    assert 4.5 <= float(closed.group(1)) < 20, out


def test_close_while_a_send_is_held_returns_and_the_send_undeclares_on_its_way_out(tmp_path):
    """close() while a send is held in Zenoh's put returns after its 5 s wait without an error;
    once the put returns (the subscriber process is gone) the sending thread undeclares the
    publisher, and its next send raises ValueError."""
    out = held_send(tmp_path, "close")
    took = re.search(r"close took ([0-9.]+) s; sender alive True; undeclared False", out)
    assert took and 4.5 <= float(took.group(1)) < 20, out
    assert "then: sender alive False; undeclared True; ended ['fastcopy.net.Publisher: send on a closed" in out, out
