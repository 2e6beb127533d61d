"""One-way loopback throughput between two processes of the ways a receiver can take Zenoh
samples: a plain publisher (put of tobytes) to a Python callback that queues each payload
(queue.Queue of 8) or to a Zenoh FIFO channel of 8 (Zenoh's default handler), each received as
np.frombuffer(payload.to_bytes()); and fastcopy.net's Publisher to its Subscriber (capacity 8,
recv_view). The receiver is a child process listening on tcp/127.0.0.1; the parent sends
COUNT + 1 messages, the child times the last COUNT. Variants interleaved, ROUNDS rounds;
medians and each round's figure, GB/s.

    python benchmarks/net_receive.py [SIZE_BYTES [COUNT [ROUNDS [VARIANTS]]]]
    e.g. python benchmarks/net_receive.py 65536 3000 5 plain-callback,plain-fifo,fastcopy.net
"""
from __future__ import annotations

import multiprocessing as mp
import statistics
import sys
import time

import numpy as np

VARIANTS = ("plain-callback", "plain-fifo", "fastcopy.net")
KEY = "bench/receive"


def _session(listen=(), connect=()):
    from fastcopy.net import open_session

    return open_session(listen=list(listen), connect=list(connect))


def _receiver(endpoint: str, variant: str, size: int, count: int, q) -> None:  # pragma: no cover - child
    import queue

    import zenoh

    from fastcopy.net import Subscriber

    s = _session(listen=[endpoint])
    if variant == "plain-callback":
        payloads: "queue.Queue" = queue.Queue(8)
        sub = s.declare_subscriber(KEY, lambda sample: payloads.put(sample.payload))
        get = lambda: np.frombuffer(payloads.get(timeout=60).to_bytes(), np.uint8).reshape(size)  # noqa: E731
    elif variant == "plain-fifo":
        sub = s.declare_subscriber(KEY, zenoh.handlers.FifoChannel(8))
        get = lambda: np.frombuffer(sub.recv().payload.to_bytes(), np.uint8).reshape(size)  # noqa: E731
    else:
        sub = Subscriber(KEY, s, capacity=8)
        get = lambda: sub.recv_view(timeout=60)  # noqa: E731
    q.put("ready")
    get()
    t0 = time.perf_counter()
    for _ in range(count):
        get()
    q.put(time.perf_counter() - t0)
    time.sleep(0.2)
    s.close()


def one_run(variant: str, size: int, count: int) -> float:
    """GB/s of one run of ``variant``."""
    import socket

    import zenoh

    from fastcopy.net import Publisher

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"tcp/127.0.0.1:{sock.getsockname()[1]}"
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    child = ctx.Process(target=_receiver, args=(endpoint, variant, size, count, q))
    child.start()
    q.get(timeout=60)
    s = _session(connect=[endpoint])
    arr = np.ones(size, np.uint8)
    if variant.startswith("plain"):
        pub = s.declare_publisher(KEY, congestion_control=zenoh.CongestionControl.BLOCK)
        send = lambda: pub.put(arr.tobytes())  # noqa: E731
        matched = pub
    else:
        fpub = Publisher(KEY, s)
        send = lambda: fpub.send(arr)  # noqa: E731
        matched = fpub._pub
    deadline = time.monotonic() + 30
    while not matched.matching_status.matching:
        if time.monotonic() > deadline:
            raise RuntimeError("the receiver never matched")
        time.sleep(0.01)
    time.sleep(0.1)
    for _ in range(count + 1):
        send()
    seconds = q.get(timeout=600)
    child.join(30)
    s.close()
    return size * count / seconds / 1e9


def main(argv) -> None:
    size = int(argv[0]) if argv else 65536
    count = int(argv[1]) if len(argv) > 1 else 3000
    rounds = int(argv[2]) if len(argv) > 2 else 5
    variants = argv[3].split(",") if len(argv) > 3 else list(VARIANTS)
    got = {v: [] for v in variants}
    for _ in range(rounds):
        for v in variants:
            got[v].append(one_run(v, size, count))
    for v, runs in got.items():
        print(f"{v:16s} {size:>9d} B  median {statistics.median(runs):.2f} GB/s  runs "
              + " ".join(f"{x:.2f}" for x in runs))


if __name__ == "__main__":
    main(sys.argv[1:])
