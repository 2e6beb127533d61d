"""Whether private copies on the thread pool gain from learning split or alone
(parallel.learn_from) on this machine. Two measurements:

- pairs (the default): child processes alternate FASTCOPY_SPLIT_LEARN_FROM=256K (learning) and
  =off (always split). Each child times `fastcopy.copy` against every kernel forced on one and
  on two threads at POINTS random sizes (384 KiB to 1 MiB, log-uniform) and destination
  offsets (0..4095), on fresh allocations per trial, TRIALS interleaved 10 ms loops in random
  order; a point's ratio is the fastest variant's median time over auto's. Prints each child's
  geometric mean and lowest point, then the mean difference and how many pairs each side won.
- --probe SECONDS: rows of a cache-line round trip between CPUs 0 and 1
  (`_core.cache_line_round_trip_ns`) and the medians of 25 copies of 384 KiB on one thread
  and on two (`fastcopy.kernel("erms", threads=1|2)`); rows whose round trip exceeds 3x the
  lowest count as apart. Prints how many rows were apart and the two-thread speedup.

    python benchmarks/split_learning.py [--pairs N] [--seed S] | --probe SECONDS
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

import numpy as np

POINTS = 14
TRIALS = 7
LOOP_S = 0.01


def child(seed: int) -> None:
    import fastcopy

    rng = random.Random(seed)
    variants = {"auto": fastcopy.copy}
    for k in ("erms", "generic", "avx512"):
        if k in fastcopy.kernels():
            variants[k] = fastcopy.kernel(k, threads=1)
            variants[k + " x2"] = fastcopy.kernel(k, threads=2)
    ratios = []
    for _ in range(POINTS):
        size = int(np.exp(rng.uniform(np.log(384 << 10), np.log(1 << 20))))
        offset = rng.randrange(4096)
        reps = max(1, int(LOOP_S / (size / 12e9)))
        times = {name: [] for name in variants}
        for _ in range(TRIALS):
            src = np.ones(size, np.uint8)
            dst = np.zeros(size + 4096, np.uint8)[offset:offset + size]
            order = list(variants)
            rng.shuffle(order)
            for name in order:
                f = variants[name]
                t = time.perf_counter()
                for _ in range(reps):
                    f(dst, src)
                times[name].append((time.perf_counter() - t) / reps)
        medians = {name: statistics.median(v) for name, v in times.items()}
        ratios.append(min(medians.values()) / medians["auto"])
    print(json.dumps({"geomean": float(np.exp(np.mean(np.log(ratios)))), "lowest": min(ratios)}))


def pairs(n: int, seed: int) -> None:
    results = {"256K": [], "off": []}
    for i in range(n):
        for value in ("256K", "off"):
            env = dict(os.environ, FASTCOPY_SPLIT_LEARN_FROM=value)
            out = subprocess.run([sys.executable, __file__, "--child", str(seed + i)], env=env, check=True,
                                 capture_output=True, text=True).stdout
            r = json.loads(out)
            results[value].append(r)
            print(f"pair {i + 1} learn_from={value:4s}  geometric mean {r['geomean']:.3f}  lowest {r['lowest']:.3f}",
                  flush=True)
    diff = [o["geomean"] - d["geomean"] for o, d in zip(results["off"], results["256K"])]
    won = sum(x > 0 for x in diff)
    print(f"off - 256K: mean {statistics.mean(diff):+.4f} geometric mean; off ahead in {won} of {n} pairs; "
          f"lowest points, mean {statistics.mean(r['lowest'] for r in results['256K']):.3f} (256K) and "
          f"{statistics.mean(r['lowest'] for r in results['off']):.3f} (off)")


def probe(seconds: float) -> None:
    import fastcopy
    from fastcopy import _core

    n = 384 << 10
    src = np.ones(n, np.uint8)
    dst = np.zeros(n, np.uint8)
    one, two = fastcopy.kernel("erms", threads=1), fastcopy.kernel("erms", threads=2)
    rows = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        rt = _core.cache_line_round_trip_ns(0, 1)
        t1, t2 = [], []
        for _ in range(25):
            t = time.perf_counter()
            one(dst, src)
            t1.append(time.perf_counter() - t)
            t = time.perf_counter()
            two(dst, src)
            t2.append(time.perf_counter() - t)
        rows.append((rt, statistics.median(t1) / statistics.median(t2)))
        time.sleep(0.1)
    lowest = min(r for r, _ in rows)
    apart = [s for r, s in rows if r > 3 * lowest]
    speedups = sorted(s for _, s in rows)
    print(f"{len(rows)} rows; round trip {lowest:.0f}-{max(r for r, _ in rows):.0f} ns, median "
          f"{statistics.median(r for r, _ in rows):.0f}; apart {len(apart)}; two threads / one: median "
          f"{statistics.median(speedups):.2f}, 5th percentile {speedups[len(speedups) // 20]:.2f}, lowest "
          f"{speedups[0]:.2f}" + (f"; apart median {statistics.median(apart):.2f}" if apart else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--probe", type=float, metavar="SECONDS")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        child(a.child)
    elif a.probe:
        probe(a.probe)
    else:
        pairs(a.pairs, a.seed)


if __name__ == "__main__":
    main()
