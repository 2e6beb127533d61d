"""The automatic choice against the best single forced kernel and np.copyto (issue 9's speed bar).

For sizes from 200 B to 700 KB and (dst - src) mod 4096 of 0, 1..31 (16 and 31) and >= 64 (64
and 2080), times fastcopy.copy, every usable non-streaming kernel forced with fastcopy.kernel()
and np.copyto, interleaved (each repeat runs every variant, in rotating order), hot caches, and
prints per point auto / best-of-the-others with the geometric mean. One thread (FASTCOPY_THREADS=1
is set before import so the pool does not enter at 700 KB... it starts at 1 MiB anyway).

    PYTHONPATH=src python benchmarks/auto_vs_forced.py [--repeats 7] [--check 0.95,0.85]
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import timeit

os.environ.setdefault("FASTCOPY_THREADS", "1")

import numpy as np  # noqa: E402

import fastcopy  # noqa: E402
from fastcopy import _core  # noqa: E402

SIZES = [200, 1000, 4096, 20_000, 65536, 200_000, 400_000, 700_000]
OFFSETS = [0, 16, 31, 64, 2080]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--check", default="", help="GEO,POINT: exit 1 when the geometric mean or a point is below")
    args = ap.parse_args()
    kernels = [k["name"] for k in _core.kernel_table() if k["supported"] and not k["streaming"]]
    buf = np.zeros(4 << 20, dtype=np.uint8)
    base = (buf.ctypes.data + 4095) // 4096 * 4096 - buf.ctypes.data
    profile = _core.active_profile()["name"]
    print(f"profile {profile}; kernels {', '.join(kernels)}; ratios auto / best of (forced kernels, np.copyto)")
    print(f"{'size':>8} {'offset':>6} {'auto':>8} {'best':>8} {'by':>8} {'ratio':>6}   (ns per copy, medians)")
    ratios = []
    for n in SIZES:
        for off in OFFSETS:
            src = buf[base: base + n]
            dst = buf[base + (2 << 20) + off: base + (2 << 20) + off + n]
            env = {"src": src, "dst": dst, "np": np, "fc": fastcopy.copy}
            stmts = {"auto": "fc(dst, src)", "np.copyto": "np.copyto(dst, src)"}
            for k in kernels:
                env["k_" + k] = fastcopy.kernel(k)
                stmts[k] = f"k_{k}(dst, src)"
            timers = {name: timeit.Timer(s, globals=env) for name, s in stmts.items()}
            number = max(1, int(2e6 // (n + 2000)))
            names = list(stmts)
            times = {name: [] for name in names}
            for r in range(args.repeats):
                order = names[r % len(names):] + names[:r % len(names)]
                for name in order:
                    times[name].append(timers[name].timeit(number) / number * 1e9)
            med = {k: statistics.median(v) for k, v in times.items()}
            best = min((v, k) for k, v in med.items() if k != "auto")
            ratio = best[0] / med["auto"]
            ratios.append(ratio)
            print(f"{n:>8} {off:>6} {med['auto']:>8.0f} {best[0]:>8.0f} {best[1]:>8} {ratio:>6.2f}")
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"geometric mean {geo:.3f}, lowest point {min(ratios):.2f} ({len(ratios)} points)")
    if args.check:
        g, p = (float(x) for x in args.check.split(","))
        return 0 if geo >= g and min(ratios) >= p else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
