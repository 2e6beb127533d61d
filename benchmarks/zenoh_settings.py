"""Loopback throughput of plain Zenoh (fastcopy.net.bench.zenoh_plain: put of tobytes,
to_bytes at the receiver, two Zenoh peers in one process; with ``--transport net`` fastcopy.net's
Publisher and Subscriber, fastcopy.net.bench.fastcopy_net) under the Zenoh settings that could
matter for large arrays: the data queue's length, the receive buffer, QoS, and (reported as
failures when they cannot carry the message) small batches and the low-latency transport.
Each variant changes Zenoh's defaults at the paths it names. Medians of 5 interleaved rounds, GB/s.

The pair takes the path of ``--net-path`` (fastcopy.net.bench.PATHS): network (default), Zenoh's
shared-memory transport off, so that the payloads go through TCP as between hosts; host, Zenoh's
defaults, under which peers of one host pass payloads of 3 KiB and more through shared memory.
Each measurement runs in a child process of its own.

    python benchmarks/zenoh_settings.py [--net-path network|host] [--sizes 1M,16M]
        [--transport plain|net] [--variants default,data_queue_2,...]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys

from fastcopy.bench.units import parse_size
from fastcopy.net import bench

SETTINGS = {
    "default": {},
    "data_queue_16": {"transport/link/tx/queue/size/data": 16},
    "data_queue_2": {"transport/link/tx/queue/size/data": 2},  # Zenoh's own default
    "rx_buffer_16M": {"transport/link/rx/buffer_size": 16 << 20},
    "qos_off": {"transport/unicast/qos/enabled": False},
    "rx_buffer_16M+qos_off": {"transport/link/rx/buffer_size": 16 << 20, "transport/unicast/qos/enabled": False},
    "batch_8K": {"transport/link/tx/batch_size": 8192},
    "lowlatency": {"transport/unicast/lowlatency": True, "transport/unicast/qos/enabled": False},
    "tcp_buffers_4M": {"transport/link/tcp/so_sndbuf": 4 << 20, "transport/link/tcp/so_rcvbuf": 4 << 20},
    "tx_threads_2": {"transport/link/tx/threads": 2},
}


# A variant whose messages never arrive (Zenoh drops what a setting cannot carry) would leave the
# receive waiting for ever: each measurement runs in a child process of its own, given this long.
TIMEOUT_S = 60


def _measure(conn, transport: str, path: str, size: int, count: int, settings: dict) -> None:
    bench.path = path
    measure = bench.zenoh_plain if transport == "plain" else bench.fastcopy_net
    try:
        conn.send(("ok", measure(size, count, settings)))
    except Exception as exc:  # noqa: BLE001 - reported as the variant's failure
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _seconds(transport: str, path: str, size: int, count: int, settings: dict) -> float:
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=_measure, args=(theirs, transport, path, size, count, settings), daemon=True)
    proc.start()
    theirs.close()
    try:
        if not mine.poll(TIMEOUT_S):
            raise TimeoutError(f"no result within {TIMEOUT_S} s (messages lost)")
        what, value = mine.recv()
    finally:
        proc.kill()
        proc.join()
    if what != "ok":
        raise RuntimeError(value)
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--net-path", choices=tuple(bench.PATHS), default="network",
                    help="how Zenoh carries the payloads (fastcopy.net.bench.PATHS)")
    ap.add_argument("--sizes", default="1M,16M", help="message sizes, e.g. 64K,1M,16M")
    ap.add_argument("--transport", choices=("plain", "net"), default="plain",
                    help="plain: plain Zenoh's pair (Zenoh's defaults under each variant); net: fastcopy.net's "
                         "Publisher and Subscriber (fastcopy.net.ZENOH_SETTINGS under each variant)")
    ap.add_argument("--variants", default=",".join(SETTINGS), help="which variants, e.g. default,data_queue_16")
    args = ap.parse_args()
    for size in map(parse_size, args.sizes.split(",")):
        count = max(12, (60 << 20) // size)
        names = args.variants.split(",")
        res: dict = {k: [] for k in names}
        errors = {}
        for _ in range(5):
            for name in names:
                settings = SETTINGS[name]
                if name in errors:  # failed once
                    continue
                try:
                    res[name].append(size * count / _seconds(args.transport, args.net_path, size, count, settings) / 1e9)
                except Exception as exc:  # noqa: BLE001 - a setting that cannot carry the message
                    errors[name] = f"{type(exc).__name__}: {exc}"
        cells = [f"{k} {statistics.median(v):.2f}" for k, v in res.items() if v]
        print(f"{size >> 10:>6} KiB  " + "  ".join(cells), flush=True)
        for name, why in errors.items():
            print(f"        {name}: failed ({why})", file=sys.stderr)


if __name__ == "__main__":
    main()
