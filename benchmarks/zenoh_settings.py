"""Loopback throughput of plain Zenoh (put of tobytes, to_bytes at the receiver, two sessions in
this process) under the Zenoh settings that could matter for large arrays: the receive buffer,
QoS, and (printed as errors when they cannot carry the message) small batches and the
low-latency transport. Medians of 5 interleaved rounds, GB/s.

    python benchmarks/zenoh_settings.py
"""
from __future__ import annotations

import json
import queue
import socket
import statistics
import sys
import threading
import time

import numpy as np


def _port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def _session(zenoh, extra, listen=None, connect=None):
    c = zenoh.Config()
    c.insert_json5("mode", '"peer"')
    c.insert_json5("scouting/multicast/enabled", "false")
    if listen:
        c.insert_json5("listen/endpoints", json.dumps([listen]))
    if connect:
        c.insert_json5("connect/endpoints", json.dumps([connect]))
    for k, v in extra.items():
        c.insert_json5(k, json.dumps(v))
    return zenoh.open(c)


def _gbps(zenoh, extra, size, count) -> float:
    ep = f"tcp/127.0.0.1:{_port()}"
    a = _session(zenoh, extra, listen=ep)
    b = _session(zenoh, extra, connect=ep)
    try:
        q: "queue.Queue" = queue.Queue(8)
        pub = a.declare_publisher("bench/settings")
        b.declare_subscriber("bench/settings", lambda s: q.put(s.payload))
        t0 = time.monotonic()
        while q.empty():
            pub.put(b"x")
            time.sleep(0.02)
            if time.monotonic() - t0 > 10:
                raise RuntimeError("the loopback pair never connected")
        time.sleep(0.1)
        while not q.empty():
            q.get()
        arr = np.ones(size, np.uint8)
        t = time.perf_counter()
        th = threading.Thread(target=lambda: [pub.put(arr.tobytes()) for _ in range(count)])
        th.start()
        for _ in range(count):
            q.get(timeout=30).to_bytes()
        th.join()
        return size * count / (time.perf_counter() - t) / 1e9
    finally:
        a.close()
        b.close()


SETTINGS = {
    "default": {},
    "rx_buffer_16M": {"transport/link/rx/buffer_size": 16 << 20},
    "qos_off": {"transport/unicast/qos/enabled": False},
    "rx_buffer_16M+qos_off": {"transport/link/rx/buffer_size": 16 << 20, "transport/unicast/qos/enabled": False},
    "batch_8K": {"transport/link/tx/batch_size": 8192},
    "lowlatency": {"transport/unicast/lowlatency": True, "transport/unicast/qos/enabled": False},
}


def main() -> None:
    import zenoh

    for size, count in ((1 << 20, 60), (16 << 20, 12)):
        res = {k: [] for k in SETTINGS}
        errors = {}
        for _ in range(5):
            for name, extra in SETTINGS.items():
                try:
                    res[name].append(_gbps(zenoh, extra, size, count))
                except Exception as exc:  # noqa: BLE001 - a setting that cannot carry the message
                    errors[name] = f"{type(exc).__name__}: {exc}"
        cells = [f"{k} {statistics.median(v):.2f}" for k, v in res.items() if v]
        print(f"{size >> 20:>3} MiB  " + "  ".join(cells), flush=True)
        for name, why in errors.items():
            print(f"        {name}: failed ({why})", file=sys.stderr)


if __name__ == "__main__":
    main()
