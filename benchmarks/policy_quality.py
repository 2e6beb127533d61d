"""How close fastcopy's automatic choice comes to the best kernel, at random sizes and offsets.

This is ``python -m fastcopy tune --check`` (``fastcopy.tune.check``: random log-uniform sizes,
random (dst - src) mod 4096 with extra weight on 1..255, fresh numpy allocations per point,
interleaved repeats, medians, bootstrap intervals) with the size range open to the command line,
and one more table: for every kernel, by size range and address class, the median over the points
of its speed relative to the C library (``generic``), with the lowest and highest point. That
table is where a profile's bands come from (docs/evidence/intel.md cites it).

Run: python benchmarks/policy_quality.py [--points 60] [--seed 1] [--min-size 64] [--max-size 4194304]
     [--repeats 15] [--min-time 0.0005] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from typing import Any, Dict, List, Tuple

import fastcopy
from fastcopy.tune import check
from fastcopy.tune.decide import point_class


def kernel_table(points: List[Dict[str, Any]], ranges_per_octave: int = 2) -> List[str]:
    """Lines: per size range (``ranges_per_octave`` per doubling) and class, each kernel's
    median generic-time / kernel-time over the points, with [min, max]."""
    groups: Dict[Tuple[int, str], List[Dict[str, Any]]] = {}
    for p in points:
        step = math.floor(math.log2(p["size"]) * ranges_per_octave)
        groups.setdefault((step, point_class(p)), []).append(p)
    names = [k for k in points[0]["median_seconds"] if k not in (check.AUTO, "generic") and " x" not in k]
    lines = [f"{'sizes':>17} {'class':>12} {'n':>3} " + " ".join(f"{n:>18}" for n in names),
             "(each kernel's speed / generic's: median over the points [min, max])"]
    for (step, cls), group in sorted(groups.items()):
        lo, hi = 2 ** (step / ranges_per_octave), 2 ** ((step + 1) / ranges_per_octave)
        cells = []
        for n in names:
            r = [g["median_seconds"]["generic"] / g["median_seconds"][n] for g in group]
            cells.append(f"{statistics.median(r):.2f} [{min(r):.2f}, {max(r):.2f}]")
        lines.append(f"{int(lo):>8}-{int(hi):<8} {cls:>12} {len(group):>3} " + " ".join(f"{c:>18}" for c in cells))
    return lines


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=check.DEFAULT_POINTS)
    ap.add_argument("--seed", type=int, default=None, help="default: drawn, printed")
    ap.add_argument("--min-size", type=int, default=check.MIN_SIZE, dest="min_size")
    ap.add_argument("--max-size", type=int, default=check.MAX_SIZE, dest="max_size")
    ap.add_argument("--repeats", type=int, default=check.DEFAULT_REPEATS)
    ap.add_argument("--min-time", type=float, default=check.DEFAULT_MIN_TIME, dest="min_time")
    ap.add_argument("--json", metavar="FILE", help="save every sample and the summary as JSON")
    args = ap.parse_args(argv)
    try:
        result = fastcopy.check_dispatch(points=args.points, seed=args.seed, min_size=args.min_size,
                                         max_size=args.max_size, repeats=args.repeats, min_time=args.min_time,
                                         command="benchmarks/policy_quality.py " + " ".join(argv))
    except ValueError as e:
        ap.error(str(e))
    print(result["report"])
    print()
    print("\n".join(kernel_table(result["points"])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
