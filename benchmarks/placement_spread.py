"""How much a kernel's speed depends on where the buffers land: at each point (size and page
distance), many fresh placements (numpy allocations, as ``tune --check`` makes them), and at
each placement every kernel named timed in interleaved repeats (medians). Per point it prints,
for each kernel against the first one named (the reference), the geometric mean over the
placements of reference time / kernel time, the lowest placement, and how many placements ran
the kernel more than ``--slow`` times slower than the reference.

A kernel that is fast on average can still collapse at a few placements; a fixed grid of
placements (one arena, fixed offsets) would not see it. Compare two builds by running this with
each and the same arguments.

    PYTHONPATH=src python benchmarks/placement_spread.py [--kernels generic,avx2]
        [--points 1625@177,1808@222] [--placements 40] [--repeats 7] [--min-time 0.0005]
        [--slow 1.3] [--seed 11] [--threads 1] [--keep]

evidence: kernels-backward-short-distance (docs/evidence/kernels.md)
"""

from __future__ import annotations

import argparse
import random
from typing import Dict, List, Optional

import numpy as np

import fastcopy
from fastcopy.tune import check


def parse_points(text: str) -> List[tuple]:
    points = []
    for item in text.split(","):
        size, _, distance = item.partition("@")
        if not size.isdigit() or not distance.isdigit() or int(size) < 1 or int(distance) > 4095:
            raise SystemExit(f"--points: SIZE@DISTANCE with SIZE >= 1 and DISTANCE in 0..4095, got {item!r}")
        points.append((int(size), int(distance)))
    return points


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", default="generic,avx2", help="kernels to time; the first is the reference")
    ap.add_argument("--points", default="1625@177,1808@222", help="SIZE@DISTANCE, comma-separated")
    ap.add_argument("--placements", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--min-time", type=float, default=0.0005, help="seconds per timed loop")
    ap.add_argument("--slow", type=float, default=1.3, help="a placement is slow above this time ratio")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--threads", type=int, default=1, help="run each kernel on this many threads (the pool)")
    ap.add_argument("--keep", action="store_true",
                    help="keep every placement allocated, so that the next one lands elsewhere (default: keep those "
                         "of the current point only)")
    args = ap.parse_args(argv)
    names = args.kernels.split(",")
    unknown = sorted(set(names) - set(fastcopy.kernels()))
    if unknown:
        raise SystemExit(f"--kernels: not usable here: {', '.join(unknown)} (usable: {', '.join(fastcopy.kernels())})")
    if len(names) < 2 or args.placements < 1 or args.repeats < 1 or args.threads < 1:
        raise SystemExit("need at least two kernels, one placement, one repeat and one thread")
    rng = random.Random(args.seed)
    kept = []  # the placements stay allocated (the point's, or with --keep all), so the next lands elsewhere
    print(f"kernels {', '.join(names)} (reference {names[0]}); {args.placements} placements per point, "
          f"{args.repeats} interleaved repeats of >= {args.min_time * 1e3:g} ms loops, medians; "
          f"{args.threads} thread(s) per copy")
    for size, distance in parse_points(args.points):
        ratios: Dict[str, List[float]] = {name: [] for name in names[1:]}
        if not args.keep:
            kept.clear()
        for _ in range(args.placements):
            dst, src = check.place(size, distance, rng.randrange(1 << 30))
            kept.append((dst, src))
            fns = {name: fastcopy.kernel(name, args.threads) for name in names}
            loops = dict(zip(names, check.loop_copies([fns[n] for n in names], dst, src, args.min_time)))
            samples: Dict[str, List[float]] = {name: [] for name in names}
            order = list(names)
            for _ in range(args.repeats):
                rng.shuffle(order)
                for name in order:
                    samples[name].append(check._timed(fns[name], dst, src, loops[name])[0])
            ref = float(np.median(samples[names[0]]))
            for name in names[1:]:
                ratios[name].append(ref / float(np.median(samples[name])))
        for name, r in ratios.items():
            slow = sum(x < 1 / args.slow for x in r)
            print(f"{size:>9} B @ {distance:>4}: {names[0]}/{name} geometric mean {check.geomean(r):.3f}, "
                  f"lowest {min(r):.3f}, slower than {args.slow:g}x at {slow}/{len(r)} placements", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
