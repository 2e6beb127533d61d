"""A program that exits while its threads wait in fastcopy.net receives or publish in a loop: the
process ends normally. A thread still inside Zenoh's code while the interpreter finalizes aborts
the process as it takes the GIL back ("FATAL: exception not rethrown"); fastcopy.net closes
every open Publisher and Subscriber at exit, while every thread still runs, so each send and
receive has left Zenoh's code by then."""
from __future__ import annotations

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
