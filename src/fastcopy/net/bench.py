"""Loopback throughput of fastcopy.net against plain Zenoh and pyzmq (docs/net.md, "Speed").

Entry point: :func:`run` (``python -m fastcopy.net.bench``) prints, per size, the median
throughput of each transport and the ratios. Each transport is a function
``(size_bytes, count) -> seconds`` for moving ``count`` arrays of ``size_bytes`` from a publisher
to a subscriber in this process over tcp/127.0.0.1, received as ndarrays; :data:`TRANSPORTS`
maps names to them (the ones whose package is missing are left out, with the reason, by
:func:`available`).
"""
from __future__ import annotations

import socket
import statistics
import threading
import time
from typing import Callable, Dict, List, Tuple

import numpy as np


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _zenoh_pair(port: int) -> Tuple:
    from . import open_session

    ep = f"tcp/127.0.0.1:{port}"
    a = open_session(listen=[ep])
    b = open_session(connect=[ep])
    return a, b


def _wait(pub_send: Callable[[], None], got: Callable[[], int]) -> None:
    deadline = time.monotonic() + 20
    while got() == 0:
        if time.monotonic() > deadline:
            raise RuntimeError("loopback pair never connected")
        pub_send()
        time.sleep(0.02)


def fastcopy_net(size: int, count: int) -> float:
    """fastcopy.net.Publisher -> Subscriber.recv_view (an ndarray over the received bytes)."""
    from . import Publisher, Subscriber

    a, b = _zenoh_pair(_port())
    try:
        pub = Publisher("bench/net", a)
        sub = Subscriber("bench/net", b, capacity=8)
        probe = np.zeros(1, np.uint8)
        _wait(lambda: pub.send(probe), lambda: len(sub._q))
        time.sleep(0.1)
        while sub._q:
            sub.recv_view()
        arr = np.ones(size, np.uint8)
        sub._next = None
        t0 = time.perf_counter()
        th = threading.Thread(target=lambda: [pub.send(arr) for _ in range(count)])
        th.start()
        for _ in range(count):
            sub.recv_view(timeout=20)
        th.join()
        return time.perf_counter() - t0
    finally:
        a.close()
        b.close()


def zenoh_plain(size: int, count: int) -> float:
    """Plain Zenoh: put(arr.tobytes()), receive np.frombuffer(payload.to_bytes()).reshape(shape)."""
    import queue

    a, b = _zenoh_pair(_port())
    try:
        q: "queue.Queue" = queue.Queue(8)
        zpub = a.declare_publisher("bench/plain")
        b.declare_subscriber("bench/plain", lambda s: q.put(s.payload))
        _wait(lambda: zpub.put(b"x"), q.qsize)
        time.sleep(0.1)
        while not q.empty():
            q.get()
        arr = np.ones(size, np.uint8)
        t0 = time.perf_counter()
        th = threading.Thread(target=lambda: [zpub.put(arr.tobytes()) for _ in range(count)])
        th.start()
        for _ in range(count):
            np.frombuffer(q.get(timeout=20).to_bytes(), dtype=np.uint8).reshape(arr.shape)
        th.join()
        return time.perf_counter() - t0
    finally:
        a.close()
        b.close()


def pyzmq(size: int, count: int) -> float:
    """pyzmq PUB/SUB over tcp, send(copy=False) of the array, np.frombuffer of the frame."""
    import zmq

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    sub = ctx.socket(zmq.SUB)
    try:
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        pub.setsockopt(zmq.SNDHWM, 8)
        sub.setsockopt(zmq.RCVHWM, 8)
        sub.connect(f"tcp://127.0.0.1:{port}")
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        deadline = time.monotonic() + 20
        while not sub.poll(20):
            if time.monotonic() > deadline:
                raise RuntimeError("pyzmq pair never connected")
            pub.send(b"x")
        while sub.poll(100):
            sub.recv()
        arr = np.ones(size, np.uint8)
        done = threading.Event()

        def send() -> None:
            for _ in range(count):
                pub.send(arr, copy=False)
            done.set()

        t0 = time.perf_counter()
        th = threading.Thread(target=send)
        th.start()
        for _ in range(count):
            frame = sub.recv(copy=False)
            np.frombuffer(frame.buffer, dtype=np.uint8).reshape(arr.shape)
        th.join()
        return time.perf_counter() - t0
    finally:
        pub.close(0)
        sub.close(0)
        ctx.term()


TRANSPORTS: Dict[str, Callable[[int, int], float]] = {
    "fastcopy.net": fastcopy_net, "zenoh put+frombuffer": zenoh_plain, "pyzmq copy=False": pyzmq,
}
_NEEDS = {"fastcopy.net": "zenoh", "zenoh put+frombuffer": "zenoh", "pyzmq copy=False": "zmq"}


def available() -> Dict[str, str]:
    """Transport name -> "" when usable here, else the reason it is skipped."""
    import importlib.util

    return {name: "" if importlib.util.find_spec(mod) else f"{mod} is not installed"
            for name, mod in _NEEDS.items()}


def run(sizes: List[int] = [64 << 10, 1 << 20, 16 << 20], repeats: int = 3, total: int = 32 << 20) -> Dict:
    """Median seconds per transport and size (``count`` = total // size, 8 to 2000 messages)."""
    results: Dict = {}
    usable = [n for n, why in available().items() if not why]
    for size in sizes:
        count = max(8, min(2000, total // size))
        for _ in range(repeats):
            for name in usable:
                results.setdefault(size, {}).setdefault(name, []).append(TRANSPORTS[name](size, count) / count)
    return {size: {name: statistics.median(v) for name, v in per.items()} for size, per in results.items()}


def main() -> None:
    import os

    print(f"load average: {os.getloadavg()}")
    res = run()
    for size, per in res.items():
        base = per["fastcopy.net"]
        row = "  ".join(f"{name}: {size / t / 1e9:.2f} GB/s ({t / base:.2f}x)" for name, t in per.items())
        print(f"{size >> 10:>6} KiB  {row}")


if __name__ == "__main__":
    main()
