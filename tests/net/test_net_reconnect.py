"""The link cut: publisher and subscriber are Zenoh clients of a router; the router is killed and
restarted on the same port. Both reconnect; whatever Zenoh dropped while the link was down is
counted exactly by MessagesLost (received + lost == published since the first received message),
and every message that arrives is intact and in order."""
from __future__ import annotations

import sys
import time

import numpy as np
import pytest

from _net import endpoint, free_port, needs_zenoh
from _procs import Child
from conftest import no_subprocess

pytestmark = [pytest.mark.net, needs_zenoh, no_subprocess]

ROUTER = """
import sys, time
from fastcopy.net import open_session
s = open_session(listen=[sys.argv[1]], mode="router")
print("ready", flush=True)
while True:
    time.sleep(1)
"""

PUBLISHER = """
import os, sys, time
import numpy as np
from fastcopy.net import Publisher, open_session
pub = Publisher(sys.argv[2], open_session(connect=[sys.argv[1]], mode="client"))
print("ready", flush=True)
k = 0
while not os.path.exists(sys.argv[3]):
    pub.send(np.full(256, k, dtype=np.int64))
    k += 1
    time.sleep(0.002)
print("sent", k, flush=True)
time.sleep(1)
"""


def _receive(sub, counts, until, timeout=60.0):
    """Receives into counts (received, lost, last value) until `until(counts)` (bounded)."""
    from fastcopy.shm import MessagesLost

    deadline = time.monotonic() + timeout
    while not until(counts):
        assert time.monotonic() < deadline, f"stalled at {counts}"
        try:
            arr = sub.recv(timeout=0.5)
        except TimeoutError:
            continue
        except MessagesLost as exc:
            counts["lost"] += exc.count
            continue
        value = int(arr[0])
        assert (arr == value).all(), "torn message"
        assert value > counts["last"], "out of order"
        if counts["first"] is None:
            counts["first"] = value
        counts["last"] = value
        counts["received"] += 1


def test_router_restart_loses_nothing_uncounted(tmp_path):
    from fastcopy.net import Subscriber, open_session

    ep = endpoint(free_port())
    key = "fastcopy/test/reconnect"
    stop = tmp_path / "stop"
    router = Child([sys.executable, "-c", ROUTER, ep])
    router.expect("ready")
    sub = Subscriber(key, open_session(connect=[ep], mode="client"))
    pub = Child([sys.executable, "-c", PUBLISHER, ep, key, str(stop)])
    try:
        pub.expect("ready")
        counts = {"received": 0, "lost": 0, "last": -1, "first": None}
        _receive(sub, counts, lambda c: c["received"] >= 50)
        router.proc.kill()
        router.proc.wait(20)
        router = Child([sys.executable, "-c", ROUTER, ep])
        router.expect("ready")
        before = counts["received"]
        _receive(sub, counts, lambda c: c["received"] >= before + 50)
        stop.write_text("")
        total = int(pub.expect("sent").split()[1])
        _receive(sub, counts, lambda c: c["last"] == total - 1)
        assert counts["received"] + counts["lost"] == total - counts["first"]
        assert sub.lost == counts["lost"]
    finally:
        pub.stop()
        router.stop()
        sub.session.close()
