"""CPU cost of one send and one receive of a 64 KiB uint8 array in one Zenoh session, no network:
fastcopy.net's Publisher.send and Subscriber.recv_view against plain Zenoh (put of tobytes;
np.frombuffer of a FIFO channel's payload). A receive is timed over messages already queued
(COUNT put, then COUNT taken); a send with a subscriber that keeps only the newest payload.
Medians of ROUNDS interleaved rounds, microseconds per call.

    python benchmarks/net_call_cost.py [SIZE_BYTES [COUNT [ROUNDS]]]
"""
from __future__ import annotations

import statistics
import sys
import time

import numpy as np


def main(argv) -> None:
    import zenoh

    from fastcopy.net import Publisher, Subscriber, open_session

    size = int(argv[0]) if argv else 65536
    count = int(argv[1]) if len(argv) > 1 else 2000
    rounds = int(argv[2]) if len(argv) > 2 else 5
    arr = np.ones(size, np.uint8)
    s = open_session()

    def receive_plain() -> float:
        sub = s.declare_subscriber("cost/p", zenoh.handlers.FifoChannel(count + 10))
        pub = s.declare_publisher("cost/p")
        for _ in range(count):
            pub.put(arr.tobytes())
        t0 = time.perf_counter()
        for _ in range(count):
            np.frombuffer(sub.recv().payload.to_bytes(), np.uint8).reshape(size)
        dt = time.perf_counter() - t0
        sub.undeclare()
        pub.undeclare()
        return dt

    def receive_net() -> float:
        sub = Subscriber("cost/n", s, capacity=count + 10)
        pub = Publisher("cost/n", s)
        for _ in range(count):
            pub.send(arr)
        t0 = time.perf_counter()
        for _ in range(count):
            sub.recv_view()
        dt = time.perf_counter() - t0
        sub.close()
        pub.close()
        return dt

    def send_plain() -> float:
        sub = s.declare_subscriber("cost/q", zenoh.handlers.RingChannel(1))
        pub = s.declare_publisher("cost/q")
        t0 = time.perf_counter()
        for _ in range(count):
            pub.put(arr.tobytes())
        dt = time.perf_counter() - t0
        sub.undeclare()
        pub.undeclare()
        return dt

    def send_net() -> float:
        sub = s.declare_subscriber("cost/r", zenoh.handlers.RingChannel(1))
        pub = Publisher("cost/r", s)
        t0 = time.perf_counter()
        for _ in range(count):
            pub.send(arr)
        dt = time.perf_counter() - t0
        sub.undeclare()
        pub.close()
        return dt

    runs = {f: [] for f in (receive_plain, receive_net, send_plain, send_net)}
    for _ in range(rounds):
        for f in runs:
            runs[f].append(f() / count * 1e6)
    for f, v in runs.items():
        print(f"{f.__name__:14s} {size:>9d} B  median {statistics.median(v):.2f} us  runs "
              + " ".join(f"{x:.2f}" for x in v))
    s.close()


if __name__ == "__main__":
    main(sys.argv[1:])
