"""The network link between two "hosts" cut for 2 s while a Topic streams across a bridge pair:
in block mode nothing is lost and nothing is torn. The hosts are two network namespaces joined
by a veth pair (created and removed by the test, which needs root and iproute2; it skips
otherwise), so each bridge has its own address and the cut is a real link going down. The
publisher and the subscriber stay in this namespace: the Topics are in /dev/shm, which the
namespaces share."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import zlib

import numpy as np
import pytest

from _net import free_port, needs_zenoh
from _procs import SUBSCRIBER, Child
from fastcopy.net.bench import SETTLE_S
from conftest import no_subprocess

pytestmark = [pytest.mark.net, needs_zenoh, no_subprocess]

N_MESSAGES = 400
PACE_S = 0.01      # 4 s of messages; the link is down from 1 s to 3 s


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_hosts():
    """(namespace A, namespace B, A's address, B's address, A's link name): a veth pair between
    two new network namespaces, each end up with a /30 address; removed afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (ip netns) to make two network namespaces")
    tag = f"{os.getpid() % 100000}"
    ns_a, ns_b, link_a, link_b = f"fcA{tag}", f"fcB{tag}", f"fca{tag}", f"fcb{tag}"
    subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
    ip_a, ip_b = f"{subnet}.1", f"{subnet}.2"
    made = []
    try:
        for ns in (ns_a, ns_b):
            r = _ip("netns", "add", ns)
            if r.returncode != 0:
                pytest.skip(f"cannot make a network namespace here: {r.stderr.strip()}")
            made.append(ns)
        steps = [
            ("link", "add", link_a, "netns", ns_a, "type", "veth", "peer", "name", link_b, "netns", ns_b),
            ("-n", ns_a, "addr", "add", f"{ip_a}/30", "dev", link_a),
            ("-n", ns_b, "addr", "add", f"{ip_b}/30", "dev", link_b),
            ("-n", ns_a, "link", "set", link_a, "up"), ("-n", ns_b, "link", "set", link_b, "up"),
            ("-n", ns_a, "link", "set", "lo", "up"), ("-n", ns_b, "link", "set", "lo", "up"),
        ]
        r = _ip(*steps[0])
        if r.returncode != 0:  # a kernel without veth, or namespaces without the right to add links
            pytest.skip(f"cannot join two network namespaces with a veth pair here: {r.stderr.strip()}")
        for step in steps[1:]:
            r = _ip(*step)
            assert r.returncode == 0, f"ip {' '.join(step)}: {r.stderr}"
        yield ns_a, ns_b, ip_a, ip_b, link_a
    finally:
        for ns in made:
            _ip("netns", "del", ns)


def _in(ns: str, argv):
    return ["ip", "netns", "exec", ns, *argv]


def test_a_link_cut_for_two_seconds_in_block_mode_loses_nothing(two_hosts):
    from fastcopy.shm import Topic

    ns_a, ns_b, ip_a, _ip_b, link_a = two_hosts
    tag = f"fcnetcut-{os.getpid()}"
    a, b, key = f"{tag}-A", f"{tag}-B", f"fastcopy/test/{tag}"
    port = free_port()
    bridge = [sys.executable, "-m", "fastcopy", "bridge"]
    with Topic.create(a, slot_bytes=64 << 10) as topic:
        out = Child(_in(ns_a, bridge + ["--topic", a, "--key", key, "--listen", f"tcp/{ip_a}:{port}"]))
        out.expect("bridge ")
        into = Child(_in(ns_b, bridge + ["--into", "--topic", b, "--key", key, "--connect", f"tcp/{ip_a}:{port}",
                                         "--slot-bytes", str(64 << 10)]))
        into.expect("bridge ")
        sub = Child([sys.executable, "-c", SUBSCRIBER, b, "0"])
        sub.expect("subscribed")
        try:
            deadline = time.monotonic() + 60
            while True:                              # the whole path is up: a probe arrives
                assert time.monotonic() < deadline, "the bridge path never came up"
                topic.send(np.int8(-1))
                try:
                    sub.expect("probe", timeout=0.1)
                    break
                except AssertionError:
                    pass
            time.sleep(SETTLE_S)  # a new Zenoh connection may lose its next messages (docs/net.md)
            cut = {}

            def cut_the_link():
                time.sleep(1.0)
                cut["down"] = _ip("-n", ns_a, "link", "set", link_a, "down").returncode
                time.sleep(2.0)
                cut["up"] = _ip("-n", ns_a, "link", "set", link_a, "up").returncode

            first = len(sub.arrivals)
            cutter = threading.Thread(target=cut_the_link)
            cutter.start()
            rng = np.random.default_rng(5)
            sent = []
            for k in range(N_MESSAGES):
                arr = rng.integers(0, 1 << 30, size=int(rng.integers(1, 4096)), dtype=np.int32)
                topic.send(arr)
                sent.append(f"msg {zlib.crc32(arr.tobytes())} {arr.dtype.str} {arr.shape}")
                time.sleep(PACE_S)
            cutter.join()
            assert cut == {"down": 0, "up": 0}
            topic.send(np.int8(-2))
            got = []
            while True:
                line = sub.line(timeout=120)
                if line.startswith("end") or line == "<eof>":
                    break
                if line.startswith(("msg ", "lost ")):
                    got.append(line)
            assert line == "end 0", (line, "".join(sub.stderr))
            assert got == sent
            # The cut was real: the stream stopped for most of the 2 s, then went on.
            times = sub.arrivals[first:]
            assert max(b - a for a, b in zip(times, times[1:])) > 1.0
        finally:
            sub.stop()
            assert into.stop() == 0, "".join(into.stderr)
            assert out.stop() == 0, "".join(out.stderr)
