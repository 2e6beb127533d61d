"""Private copies that learn their store mode (the profile's nt.learn_from) in the loops a program
runs, each from a fresh process and a fresh destination (``np.empty``: its first copy pays the
page faults):

- cold: before each copy, twice the last-level cache written over (the check's Evictor), so
  neither buffer is cached;
- hot: the same buffers copied back to back;
- hotcold: half the copies hot, then half cold (the figures are of the cold half).

Each is run with the profile as it is (auto), with cached stores only (FASTCOPY_NT_THRESHOLD=off)
and with streaming stores only (FASTCOPY_NT_THRESHOLD=4K), the last two with
FASTCOPY_NT_LEARN_FROM=off. Per run: GB/s over the copies after the first (total bytes / total
time) and the share of them that streamed. Rounds alternate the order of the variants.

    PYTHONPATH=src python benchmarks/learned_store_modes.py [--sizes 20M,42M,100M] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

VARIANTS = {
    "auto": {},
    "cached only": {"FASTCOPY_NT_THRESHOLD": "off", "FASTCOPY_NT_LEARN_FROM": "off"},
    "streaming only": {"FASTCOPY_NT_THRESHOLD": "4K", "FASTCOPY_NT_LEARN_FROM": "off"},
}
COPIES = {"cold": 40, "hot": 200, "hotcold": 200}


def one_run(scenario: str, size: int, copies: int) -> dict:  # pragma: no cover - child process
    import numpy as np

    import fastcopy
    from fastcopy import _core
    from fastcopy.tune.check import Evictor, evict_bytes

    src = np.random.default_rng(1).integers(0, 256, size=size, dtype=np.uint8)
    dst = np.empty(size + 4096, np.uint8)[100:100 + size]  # (dst - src) mod 4096 far from 0
    evict = Evictor(evict_bytes()) if scenario != "hot" else None
    times, streamed = [], []
    for i in range(copies):
        if evict is not None and (scenario == "cold" or i >= copies // 2):
            evict()
        t0 = time.perf_counter()
        fastcopy.copy(dst, src)
        times.append(time.perf_counter() - t0)
        streamed.append((_core.last_kernel() or "").endswith("_nt"))
    first = copies // 2 if scenario == "hotcold" else 1
    return {"gbps": size * (copies - first) / sum(times[first:]) / 1e9,
            "streamed": sum(streamed[first:]) / (copies - first), "first_copy_gbps": size / times[0] / 1e9}


def main() -> None:
    from fastcopy.bench.units import parse_sizes

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="20M,42M,100M", help="sizes (bench's syntax)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scenarios", default="cold,hot,hotcold")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_run(args.child[0], int(args.child[1]), int(args.child[2]))))
        return
    print(f"load average {os.getloadavg()[0]:.2f}; GB/s over the copies after the first / share streamed")
    names = list(VARIANTS)
    for scenario in args.scenarios.split(","):
        for size in parse_sizes(args.sizes):
            got = {name: [] for name in names}
            for r in range(args.rounds):
                for name in (names if r % 2 == 0 else names[::-1]):
                    env = dict(os.environ, **VARIANTS[name])
                    out = subprocess.run([sys.executable, __file__, "--child", scenario, str(size),
                                          str(COPIES[scenario])], env=env, capture_output=True, text=True, check=True)
                    got[name].append(json.loads(out.stdout))
            cells = "; ".join(f"{name} " + ", ".join(f"{g['gbps']:.1f}/{g['streamed']:.2f}" for g in runs)
                              for name, runs in got.items())
            print(f"{scenario:8} {size:>10}: {cells}")


if __name__ == "__main__":
    main()
