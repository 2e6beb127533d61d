"""``bench --ipc --net``: the network transports of fastcopy.net.bench in the inter-process
benchmark (rows exist, values positive and finite; no timed assertions)."""

from __future__ import annotations

import importlib.util
import json
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
    """, kind, timeout=15)
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.startswith("timeout after"), explain(proc)
    if kind != "net":  # the Subscriber's own TimeoutError has its own words
        assert "no message from the peer within 0.5 s" in proc.stdout, explain(proc)


@pytest.mark.parametrize("path_name", ["network", "host"])
def test_the_network_path_keeps_payloads_out_of_zenohs_shared_memory(tmp_path, path_name):
    """On the network path (the default) Zenoh's peers on this host pass 64 KiB arrays through
    TCP, as between hosts: the process maps no Zenoh shared-memory segment; on the host path
    (Zenoh's defaults) it maps one. In a child process, so no other test's segment counts."""
    from _child import explain, run_script

    proc = run_script(tmp_path, """
        import sys
        import numpy as np
        from fastcopy.net import Publisher, Subscriber, bench
        bench.path = sys.argv[1]
        a, b = bench._zenoh_pair(bench._port())
        pub, sub = Publisher("fastcopy/test/path", a), Subscriber("fastcopy/test/path", b)
        try:
            bench._wait(lambda: pub.send(np.zeros(1, np.uint8)), lambda: bench._drained(sub))
            for k in range(3):
                pub.send(np.full(65536, k, np.uint8))
                assert (sub.recv(timeout=20) == k).all()
            with open("/proc/self/maps") as f:
                print("shared memory" if ".zenoh" in f.read() else "no shared memory")
        finally:
            sub.close()
            pub.close()
            a.close()
            b.close()
    """, path_name, timeout=60)
    assert proc.returncode == 0, explain(proc)
    want = "no shared memory" if path_name == "network" else "shared memory"
    assert proc.stdout.strip().splitlines()[-1] == want, explain(proc)


def test_plain_zenoh_rows_open_with_zenohs_own_defaults():
    """The zenoh_plain rows measure what a program that opens Zenoh with its defaults gets:
    their sessions leave the settings that fastcopy.net's sessions change at Zenoh's values;
    fastcopy.net's rows keep them."""
    import zenoh

    from fastcopy.net import ZENOH_SETTINGS, bench, zenoh_config

    defaults = zenoh.Config()
    plain = zenoh_config(settings=bench.peer_settings(zenoh_defaults=True))
    ours = zenoh_config(settings=bench.peer_settings())
    assert ZENOH_SETTINGS
    for key, value in ZENOH_SETTINGS.items():
        assert plain.get_json(key) == defaults.get_json(key), key
        assert json.loads(ours.get_json(key)) == value, key
    assert json.loads(ours.get_json("transport/shared_memory/enabled")) is False


def test_net_path_needs_ipc(tmp_path):
    from _child import explain, run_script

    proc = run_script(tmp_path, """
        import sys
        from fastcopy.__main__ import main
        sys.exit(main(["bench", "--net-path", "host", "--sizes", "4K", "--repeats", "1"]))
    """)
    assert proc.returncode == 2, explain(proc)
    assert "--net-path" in proc.stderr and "--ipc" in proc.stderr, explain(proc)


def test_the_in_process_pyzmq_pair_moves_every_message(tmp_path):
    """fastcopy.net.bench.pyzmq (``python -m fastcopy.net.bench``) sends far more messages than
    its high-water marks hold: its publisher waits there instead of dropping, so the receiver
    gets the whole count. In a child process: a dropped message would leave it waiting."""
    from _child import explain, run_script

    proc = run_script(tmp_path, """
        from fastcopy.net import bench
        seconds = bench.pyzmq(65536, 3000)
        print(f"moved in {seconds:.2f} s")
    """, timeout=120)
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.startswith("moved in"), explain(proc)
