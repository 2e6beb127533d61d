"""Block-mode messages that plain Zenoh loses right after two peers connect on loopback.

Each iteration opens two Zenoh sessions (one listens on a fresh port of 127.0.0.1, the other
connects to it; multicast scouting off), declares a publisher with blocking congestion control
and a subscriber with a FIFO channel of 8, and puts a one-byte probe until the subscriber takes
one (polling the channel every 0.2 ms, so the next put follows within a fraction of a
millisecond). It then waits ``--settle`` seconds (draining the probes still coming), puts an end
marker and a burst of 50 messages of 8000 bytes, each carrying its number, and takes them (at
most 3 s). An iteration fails when the marker or any message of the burst does not arrive, or
arrives out of order.

    python benchmarks/zenoh_connect_loss.py [--iterations 1000] [--settle 0]

Needs eclipse-zenoh; fastcopy is not used.
"""
from __future__ import annotations

import argparse
import json
import socket
import time

BURST = 50
MESSAGE_BYTES = 8000


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _session(zenoh, listen=(), connect=(), shm=True):
    conf = zenoh.Config()
    conf.insert_json5("mode", '"peer"')
    conf.insert_json5("scouting/multicast/enabled", "false")
    if not shm:
        conf.insert_json5("transport/shared_memory/enabled", "false")
    if listen:
        conf.insert_json5("listen/endpoints", json.dumps(list(listen)))
    if connect:
        conf.insert_json5("connect/endpoints", json.dumps(list(connect)))
    return zenoh.open(conf)


def _take(sub, seconds: float):
    """The next payload's bytes, polling the channel for up to ``seconds``; None at the end."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sample = sub.try_recv()
        if sample is not None:
            return sample.payload.to_bytes()
        time.sleep(0.0002)
    return None


def one(zenoh, settle: float, shm: bool = True) -> str:
    """'' when every message arrived in order, else what went wrong."""
    ep = f"tcp/127.0.0.1:{_port()}"
    a = _session(zenoh, listen=[ep], shm=shm)
    b = _session(zenoh, connect=[ep], shm=shm)
    pub = a.declare_publisher("loss/x", congestion_control=zenoh.CongestionControl.BLOCK)
    sub = b.declare_subscriber("loss/x", zenoh.handlers.FifoChannel(8))
    try:
        deadline = time.monotonic() + 10
        while True:
            if time.monotonic() > deadline:
                return "never connected"
            pub.put(b"\xff")
            if _take(sub, 0.05) is not None:
                break
        if settle:
            time.sleep(settle)
            while sub.try_recv() is not None:
                pass
        pub.put(b"\xfe")
        for k in range(BURST):
            pub.put(k.to_bytes(2, "little") * (MESSAGE_BYTES // 2))
        got = []
        while len(got) < BURST + 1:
            data = _take(sub, 3.0)
            if data is None:
                break
            if data == b"\xff":
                continue  # a probe still coming (no settle)
            got.append(-1 if data == b"\xfe" else int.from_bytes(data[:2], "little"))
        want = [-1] + list(range(BURST))
        if got == want:
            return ""
        missing = [k for k in want if k not in got]
        return f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''} ({len(missing)} of {len(want)})"
    finally:
        sub.undeclare()
        pub.undeclare()
        b.close()
        a.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--settle", type=float, default=0.0, help="seconds between the first probe and the marker")
    ap.add_argument("--zenoh-shm", choices=("on", "off"), default="on",
                    help="Zenoh's shared-memory transport between peers of one host (on: Zenoh's default)")
    args = ap.parse_args()
    import zenoh

    failed = 0
    for i in range(args.iterations):
        why = one(zenoh, args.settle, args.zenoh_shm == "on")
        if why:
            failed += 1
            print(f"iteration {i}: {why}", flush=True)
    from importlib.metadata import version

    print(f"eclipse-zenoh {version('eclipse-zenoh')}, settle {args.settle:g} s, shared memory {args.zenoh_shm}: {failed} of {args.iterations} "
          "iterations lost a block-mode message", flush=True)


if __name__ == "__main__":
    main()
