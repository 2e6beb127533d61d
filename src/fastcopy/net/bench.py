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
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _zenoh_pair(port: int, settings: Optional[Dict[str, Any]] = None) -> Tuple:
    from . import open_session

    ep = f"tcp/127.0.0.1:{port}"
    a = open_session(listen=[ep], settings=settings)
    b = open_session(connect=[ep], settings=settings)
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


def zenoh_plain(size: int, count: int, settings: Optional[Dict[str, Any]] = None) -> float:
    """Plain Zenoh: put(arr.tobytes()), receive np.frombuffer(payload.to_bytes()).reshape(shape);
    ``settings``: Zenoh configuration for both sessions (open_session)."""
    import queue

    a, b = _zenoh_pair(_port(), settings)
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


# ---- the inter-process benchmark's net transports (``python -m fastcopy bench --ipc --net``) ----
# fastcopy.bench.ipc_transports registers them: IPC_TRANSPORTS says which kind each is; the parent
# makes its ends with ipc_make(kind) and the child attaches with ipc_attach(what make returned).

IPC_KINDS = {
    "net": "fastcopy.net Publisher.send over tcp/127.0.0.1; Subscriber.recv_view (an ndarray over the received bytes)",
    "zenoh_plain": "plain Zenoh over tcp/127.0.0.1: put(arr.tobytes()); np.frombuffer(payload.to_bytes()).reshape",
    "zmq_pubsub": "pyzmq (X)PUB/SUB over tcp://127.0.0.1, send(copy=False), np.frombuffer of the frame (no-drop)",
}


class IpcEnds:
    """One process's ends of a net transport: it sends on one key (or socket) and receives on the
    other; the parent listens (sends forward), the child connects (sends back). The first send
    waits until the peer's subscriber is matched, so no message goes to nobody."""

    def __init__(self, kind: str, port: int, role: str) -> None:
        self.kind, self.role, self._matched = kind, role, False
        out_key, in_key = ("bench/fwd", "bench/back") if role == "parent" else ("bench/back", "bench/fwd")
        if kind == "zmq_pubsub":
            import zmq

            self.ctx = zmq.Context()
            # XPUB: a PUB that also reports its subscribers, so the first send waits for the peer's.
            self.pub, self.sub = self.ctx.socket(zmq.XPUB), self.ctx.socket(zmq.SUB)
            self.pub.setsockopt(zmq.XPUB_NODROP, 1)  # the sender waits at the high-water mark, never drops
            for s, opt in ((self.pub, zmq.SNDHWM), (self.sub, zmq.RCVHWM)):
                s.setsockopt(opt, 8)
            self.sub.setsockopt(zmq.SUBSCRIBE, b"")
            base = port if role == "parent" else port + 1
            self.pub.bind(f"tcp://127.0.0.1:{base}")
            self.sub.connect(f"tcp://127.0.0.1:{port + 1 if role == 'parent' else port}")
            return
        from . import Publisher, Subscriber, open_session

        ep = f"tcp/127.0.0.1:{port}"
        self.session = open_session(listen=[ep]) if role == "parent" else open_session(connect=[ep])
        if kind == "net":
            self.pub = Publisher(out_key, self.session)
            self.sub = Subscriber(in_key, self.session, capacity=8)
            self._zpub = self.pub._pub
        else:
            import queue

            self._q: "queue.Queue" = queue.Queue(8)
            # Blocking congestion control, as fastcopy.net's default: Zenoh's default drops, and a
            # dropped message would leave the receiving end waiting.
            zenoh = __import__("zenoh")
            self._zpub = self.pub = self.session.declare_publisher(
                out_key, congestion_control=zenoh.CongestionControl.BLOCK)
            self.sub = self.session.declare_subscriber(in_key, lambda s: self._q.put(s.payload))

    def _wait_matched(self) -> None:
        deadline = time.monotonic() + 30
        if self.kind == "zmq_pubsub":  # a PUB has no matching status: the peer's SUB says it is there
            while not self.pub.poll(100):  # the subscription message (b"\\x01")
                if time.monotonic() > deadline:
                    raise RuntimeError("net benchmark: the peer's subscriber never connected")
            self.pub.recv()
        else:
            while not self._zpub.matching_status.matching:
                if time.monotonic() > deadline:
                    raise RuntimeError("net benchmark: the peer's subscriber never matched")
                time.sleep(0.01)
            time.sleep(0.05)  # the route is declared on both sides
        self._matched = True

    def send(self, msg: Any) -> None:
        if not self._matched:
            self._wait_matched()
        if self.kind == "net":
            self.pub.send(msg)
        elif self.kind == "zenoh_plain":
            self.pub.put(msg.tobytes() if isinstance(msg, np.ndarray) else bytes(msg))
        else:
            self.pub.send(msg, copy=False)

    def recv(self) -> np.ndarray:
        if self.kind == "net":
            return self.sub.recv_view(timeout=600)
        if self.kind == "zenoh_plain":
            data = self._q.get(timeout=600).to_bytes()
            return np.frombuffer(data, np.uint8).reshape(len(data))
        return np.frombuffer(self.sub.recv(copy=False).buffer, np.uint8)

    def close(self) -> None:
        if self.kind == "zmq_pubsub":
            self.pub.close(0)
            self.sub.close(0)
            self.ctx.term()
            return
        if self.kind == "net":
            self.sub.close()
        self.pub.undeclare() if self.kind == "zenoh_plain" else self.pub.close()
        self.session.close()


def ipc_make(kind: str) -> Callable[[Any, str, int], Tuple[Any, Any]]:
    """The parent's make for the ipc benchmark's resource of ``kind``: (its ends, what the child gets)."""
    def make(ctx: Any, tag: str, max_size: int) -> Tuple[Any, Any]:
        port = _port() if kind != "zmq_pubsub" else _port_pair()
        return IpcEnds(kind, port, "parent"), (kind, port)
    return make


def ipc_attach(got: Tuple[str, int]) -> IpcEnds:
    return IpcEnds(got[0], got[1], "child")


def ipc_close(ends: IpcEnds, parent: bool) -> None:
    ends.close()


def _port_pair() -> int:
    """A free port p with p + 1 also free (the two directions of the pyzmq pair)."""
    for _ in range(100):
        p = _port()
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
    raise RuntimeError("net benchmark: no two adjacent free ports on 127.0.0.1")


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
