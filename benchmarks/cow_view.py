"""Receive a 16 MiB message and write to 1 % of it: ``recv_view(cow=True)`` (a writable
copy-on-write view: only the pages written are copied) against ``recv(out=)`` (the whole
message copied into a buffer of the receiver's). Medians of interleaved repeats (each repeat
times both, in rotating order). One process holds both ends of a Channel; the sender's part
(a loan, published without filling it) is outside the timed region.

    PYTHONPATH=src python benchmarks/cow_view.py [--repeats N] [--size BYTES] [--touch FRACTION]

evidence: shm-cow-view-cost (docs/evidence/shm.md)
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from fastcopy.shm import Channel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=41)
    ap.add_argument("--size", type=int, default=16 << 20)
    ap.add_argument("--touch", type=float, default=0.01, help="fraction of the message written")
    args = ap.parse_args()
    n = args.size
    out = np.empty(n, np.uint8)
    count = max(1, int(n * args.touch))
    step = max(1, n // count)
    with Channel.create(capacity=4 * n) as tx:
        rx = Channel.attach(tx.name)

        def publish() -> None:
            with tx.loan(n, np.uint8) as a:
                a[::4096] = 1

        def cow_block() -> None:  # one contiguous stretch: count // 4096 pages copied
            v = rx.recv_view(cow=True)
            v[:count] = 7
            del v

        def cow_spread() -> None:  # one byte every `step`: every page is written, so copied
            v = rx.recv_view(cow=True)
            v[::step] = 7
            del v

        def copy_block() -> None:
            got = rx.recv(out=out)
            got[:count] = 7

        calls = {"recv(out=) + write (block)": copy_block, "recv_view(cow=True) + write (block)": cow_block,
                 "recv_view(cow=True) + write (spread)": cow_spread}
        times = {k: [] for k in calls}
        names = list(calls)
        for r in range(args.repeats):
            order = names[r % 3:] + names[:r % 3]
            if r % 2:
                order.reverse()
            for k in order:
                publish()
                t0 = time.perf_counter()
                calls[k]()
                times[k].append(time.perf_counter() - t0)
        rx.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{n} B message, {count} bytes written ({args.touch:.1%}): block = one contiguous stretch, "
          f"spread = one byte every {step} B (every page); medians of {args.repeats} interleaved repeats")
    base = med["recv(out=) + write (block)"]
    for k in names:
        print(f"  {k:<38} {med[k] * 1e3:8.3f} ms   recv(out=)/this {base / med[k]:5.2f}x")


if __name__ == "__main__":
    main()
