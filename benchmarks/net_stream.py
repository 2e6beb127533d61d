"""A steady stream of arrays between two fresh processes over Zenoh: one publisher process ->
tcp/127.0.0.1 -> one receiver process, both spawned for each measurement (so that a malloc
setting or a send rule lasts for that measurement only). Variants (--variants), alternated
ROUNDS times per size:
  net          fastcopy.net.Publisher -> Subscriber.recv_view, fastcopy.net's Zenoh settings;
  net+keep     the same with fastcopy.net.keep_freed_memory() called first in both processes;
  net-whole    the same with every message sent whole (no pieces, whatever its size);
  net-pieces   the same with the publisher's rule for peers across the network (messages above
               fastcopy.net.SPLIT_FROM in pieces) on either path;
  net-bytes    the same with every payload built as a new bytes object instead of in the
               publisher's own bytearray;
  net-zenoh-copies
               the same with every payload put as it is where every peer is reached through
               shared memory (Zenoh copies it into its own pool) instead of out of the
               publisher's pool of Zenoh shared memory;
  net-own-pool32, net-own-pool64
               the same as net with a publisher's pool of 32 / 64 MiB
               (fastcopy.net._shared_payloads.POOL_BYTES; 16 MiB);
  plain        Zenoh's defaults: put(arr.tobytes()) -> a FIFO channel of 8,
               np.frombuffer(payload.to_bytes());
  plain+keep   the same with keep_freed_memory() called first in both processes;
  net+pool64, plain+pool64
               the same as net / plain with a pool of 64 MiB (Zenoh's default: 16 MiB) for
               Zenoh's shared-memory transport (the one-host path's payloads).
Zenoh's path between the two peers: "network" (its shared-memory transport off, every payload
through TCP as between hosts) or "host" (Zenoh's defaults: payloads of 3 KiB and more through
its shared memory), as fastcopy.net.bench.PATHS names them.
The receiver times SECONDS of steady receiving after WARM_S; per variant the medians over the
rounds of its GB/s (and the ratio to the first variant named), and of the CPU microseconds
(every thread of the process) and page faults (getrusage's minor faults) per message of the
receiver and of the publisher over the same seconds. Messages that fastcopy.net's Subscriber
reports lost while timed are counted and printed (none expected in block mode).

    python benchmarks/net_stream.py [--sizes 64K,1M,16M] [--rounds 3] [--paths network,host]
                                    [--variants net,net+keep,plain,plain+keep]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import statistics
import time

import numpy as np

VARIANTS = ("net", "net+keep", "net-whole", "net-pieces", "net-bytes", "net-zenoh-copies", "net-own-pool32",
            "net-own-pool64", "plain", "plain+keep", "net+pool64",
            "plain+pool64")
POOL64 = {"transport/shared_memory/transport_optimization/pool_size": 64 << 20}
KEY = "bench/stream"
WARM_S = 1.0
SECONDS = 2.0


def _session(variant: str, path: str, listen=(), connect=()):
    from fastcopy.net import keep_freed_memory, open_session
    from fastcopy.net.bench import peer_settings

    if variant.endswith("+keep"):
        keep_freed_memory()
    if variant == "net-whole":  # the Publisher's rule (fastcopy.net.SPLIT_FROM): every message whole
        import fastcopy.net

        if not isinstance(getattr(fastcopy.net, "SPLIT_FROM", None), int):
            raise RuntimeError("net-whole: fastcopy.net.SPLIT_FROM, the size up to which a message goes whole, is gone")
        fastcopy.net.SPLIT_FROM = 1 << 62
    if variant == "net-pieces":  # the rule for peers across the network, whatever the path
        import fastcopy.net

        if not callable(getattr(fastcopy.net, "through_shared_memory_only", None)):
            raise RuntimeError("net-pieces: fastcopy.net.through_shared_memory_only, the publisher's rule, is gone")
        fastcopy.net.through_shared_memory_only = lambda session: False
    if variant == "net-zenoh-copies":  # no payload is large enough for the publisher's pool
        from fastcopy.net import _shared_payloads

        if not isinstance(getattr(_shared_payloads, "SMALLEST", None), int):
            raise RuntimeError("net-zenoh-copies: fastcopy.net._shared_payloads.SMALLEST, the smallest payload put "
                               "out of the publisher's pool, is gone")
        _shared_payloads.SMALLEST = 1 << 62
    if variant.startswith("net-own-pool"):
        from fastcopy.net import _shared_payloads

        if not isinstance(getattr(_shared_payloads, "POOL_BYTES", None), int):
            raise RuntimeError(f"{variant}: fastcopy.net._shared_payloads.POOL_BYTES, the size of the publisher's "
                               "pool, is gone")
        _shared_payloads.POOL_BYTES = int(variant[len("net-own-pool"):]) << 20
    settings = peer_settings(zenoh_defaults=variant.startswith("plain"), path_name=path)
    if variant.endswith("+pool64"):
        settings.update(POOL64)
    return open_session(listen=list(listen), connect=list(connect), settings=settings)


def _usage() -> tuple:
    """(CPU seconds of every thread of this process, its minor page faults)."""
    return time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _publisher(endpoint: str, variant: str, path: str, size: int, timing, q) -> None:  # pragma: no cover - child
    from fastcopy.net import Publisher, _congestion

    s = _session(variant, path, listen=[endpoint])
    arr = np.ones(size, np.uint8)
    if variant.startswith("net"):
        pub = Publisher(KEY, s)
        if variant == "net-bytes":
            if not isinstance(getattr(pub, "_payload", None), bytearray):
                raise RuntimeError("net-bytes: Publisher._payload, the bytearray it builds payloads in, is gone")
            pub._payload = None
        send = pub.send
    else:
        zpub = s.declare_publisher(KEY, congestion_control=_congestion("block"))
        send = lambda a: zpub.put(a.tobytes())  # noqa: E731
    # Counted while the receiver times (its `timing` event set), then reported once.
    n, start, timed = 0, None, False
    while True:
        send(arr)
        if timing.is_set():
            if not timed:
                timed, n, start = True, 0, _usage()
            n += 1
        elif timed:
            cpu, faults = _usage()
            q.put(("publisher", (cpu - start[0]) / n * 1e6, (faults - start[1]) / n))
            timed = False


def _receiver(endpoint: str, variant: str, path: str, size: int, timing, q) -> None:  # pragma: no cover - child
    import zenoh

    from fastcopy.net import Subscriber
    from fastcopy.shm import MessagesLost

    s = _session(variant, path, connect=[endpoint])
    lost = 0
    if variant.startswith("net"):
        sub = Subscriber(KEY, s, capacity=8)

        def recv():
            nonlocal lost
            try:
                return sub.recv_view(timeout=30)
            except MessagesLost as exc:  # counted; the next receive returns the message after the gap
                lost += exc.count
                return sub.recv_view(timeout=30)
    else:
        zsub = s.declare_subscriber(KEY, zenoh.handlers.FifoChannel(8))
        recv = lambda: np.frombuffer(zsub.recv().payload.to_bytes(), np.uint8)  # noqa: E731
    recv()
    t_end = time.monotonic() + WARM_S
    while time.monotonic() < t_end:
        recv()
    lost = 0  # Zenoh may lose block-mode messages right after a connection: only those timed count
    timing.set()
    n, (cpu0, faults0), t0 = 0, _usage(), time.monotonic()
    while time.monotonic() - t0 < SECONDS:
        view = recv()
        if view.nbytes != size:
            raise RuntimeError(f"received {view.nbytes} bytes, expected {size}")
        n += 1
    dt = time.monotonic() - t0
    timing.clear()
    cpu, faults = _usage()
    q.put(("receiver", n * size / dt / 1e9, (cpu - cpu0) / n * 1e6, (faults - faults0) / n, lost))
    q.close()
    q.join_thread()
    os._exit(0)  # the publisher is stopped from outside; nothing of this process needs closing


def one_run(variant: str, path: str, size: int):
    """(GB/s, receiver CPU us per message, receiver page faults per message, messages lost while
    timed, publisher CPU us per message, publisher page faults per message)."""
    from fastcopy.net.bench import _endpoint, _port

    ctx = mp.get_context("spawn")
    endpoint = _endpoint(_port())
    q, timing = ctx.Queue(), ctx.Event()
    pub = ctx.Process(target=_publisher, args=(endpoint, variant, path, size, timing, q), daemon=True)
    pub.start()
    rcv = ctx.Process(target=_receiver, args=(endpoint, variant, path, size, timing, q), daemon=True)
    rcv.start()
    got = {}
    try:
        deadline = time.monotonic() + 60
        while len(got) < 2:
            try:
                who, *figures = q.get(timeout=1)
                got[who] = figures
            except Exception:
                if rcv.exitcode is not None and "receiver" not in got or pub.exitcode is not None \
                        or time.monotonic() > deadline:
                    raise RuntimeError(f"{variant} at {size} B on the {path} path: the receiver or the publisher "
                                       f"ended (exit codes {rcv.exitcode}, {pub.exitcode}) or gave no figure "
                                       "within 60 s") from None
        return tuple(got["receiver"]) + tuple(got["publisher"])
    finally:
        for p in (rcv, pub):
            p.terminate()
            p.join(10)


def main() -> None:
    from fastcopy.bench.units import human_size, parse_sizes

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="64K,1M,16M")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--paths", default="network,host")
    ap.add_argument("--variants", default="net,net+keep,plain,plain+keep")
    args = ap.parse_args()
    sizes = parse_sizes(args.sizes)
    variants = tuple(args.variants.split(","))
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    for path in args.paths.split(","):
        got = {(s, v): [] for s in sizes for v in variants}
        for r in range(args.rounds):
            order = variants if r % 2 == 0 else variants[::-1]
            for s in sizes:
                for v in order:
                    got[(s, v)].append(one_run(v, path, s))
        print(f"path: {path}")
        for s in sizes:
            base = statistics.median(x[0] for x in got[(s, variants[0])])
            for v in variants:
                rows = got[(s, v)]
                med = [statistics.median(x[i] for x in rows) for i in range(6)]
                print(f"  {human_size(s):>10}  {v:11s} {med[0]:5.2f} GB/s ({med[0] / base:.2f}x {variants[0]})  "
                      f"per message: receiver {med[1]:7.1f} us, {med[2]:6.2f} page faults, publisher "
                      f"{med[4]:7.1f} us, {med[5]:6.2f} page faults; rounds "
                      + ", ".join(f"{x[0]:.2f}" for x in rows)
                      + (f"; {sum(x[3] for x in rows)} messages lost while timed" if any(x[3] for x in rows) else ""))


if __name__ == "__main__":
    main()
