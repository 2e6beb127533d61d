"""``bench --ipc --net``: the network transports of fastcopy.net.bench in the inter-process
benchmark (rows exist, values positive and finite; no timed assertions)."""

from __future__ import annotations

import importlib.util
import math

import pytest

from _cli import NO_SUBPROCESS

pytestmark = [
    pytest.mark.net,
    pytest.mark.skipif(NO_SUBPROCESS, reason="FASTCOPY_NO_SUBPROCESS=1: the benchmark starts processes"),
    pytest.mark.skipif(importlib.util.find_spec("zenoh") is None or importlib.util.find_spec("zmq") is None,
                       reason="bench --net needs eclipse-zenoh (the net extra) and pyzmq"),
]


def test_net_transports_give_rows():
    from fastcopy.bench.ipc import format_ipc_table, run_ipc_bench

    names = ["net", "zenoh_plain", "zmq_pubsub"]
    res = run_ipc_bench(sizes=[4096, 65536], repeats=1, min_time=0.02, transports=names)
    assert not res["skipped"]
    assert {(r["transport"], r["size"]) for r in res["rows"]} == {(t, s) for t in names for s in [4096, 65536]}
    for r in res["rows"]:
        for key in ("msg_rate", "bandwidth_gbps", "rtt_median_us"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["transport"], key, r[key])
    table = format_ipc_table(res)
    assert all(n in table for n in names)


def test_net_transports_are_not_in_the_default_run():
    from fastcopy.bench.ipc_transports import DEFAULT_TRANSPORTS, NET_TRANSPORTS, TRANSPORTS

    for name, *_ in NET_TRANSPORTS:
        assert name in TRANSPORTS and name not in DEFAULT_TRANSPORTS


def test_net_option_without_zenoh_names_the_net_extra(tmp_path):
    from _child import explain, run_script

    proc = run_script(tmp_path, """
        import sys
        sys.modules["zenoh"] = None  # what an environment without eclipse-zenoh looks like to import
        from fastcopy.__main__ import main
        sys.exit(main(["bench", "--ipc", "--net", "--sizes", "4K", "--repeats", "1"]))
    """)
    assert proc.returncode == 2, explain(proc)
    assert "net extra" in proc.stdout + proc.stderr and "zenoh" in proc.stdout + proc.stderr, explain(proc)


@pytest.mark.parametrize("kind", ["net", "zenoh_plain", "zmq_pubsub"])
def test_a_receive_from_a_silent_peer_ends_in_timeout_error(tmp_path, kind):
    """The benchmark parent's receive of every net transport gives up after its timeout (a child
    that died mid-run sends nothing more) instead of waiting for ever. In a child process, so a
    receive that never returns fails the test by the run's own timeout."""
    from _child import explain, run_script

    proc = run_script(tmp_path, """
        import sys, time
        from fastcopy.net import bench
        kind = sys.argv[1]
        port = bench._port_pair() if kind == "zmq_pubsub" else bench._port()
        ends = bench.IpcEnds(kind, port, "parent", recv_timeout=0.5)
        t0 = time.monotonic()
        try:
            ends.recv()
            print("received a message nobody sent")
        except TimeoutError as exc:
            print(f"timeout after {time.monotonic() - t0:.1f} s: {exc}")
        finally:
            ends.close()
    """, kind, timeout=30)
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.startswith("timeout after"), explain(proc)
    if kind != "net":  # the Subscriber's own TimeoutError has its own words
        assert "no message from the peer within 0.5 s" in proc.stdout, explain(proc)
