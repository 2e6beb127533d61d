"""Per-call cost of fastcopy.copy for tiny numpy arrays, side by side with np.copyto and
``dst[...] = src``: medians of interleaved repeats (each repeat times all three methods,
in rotating order, so drift and noise from other processes hit all of them alike).

    PYTHONPATH=src python benchmarks/call_overhead.py            # 8 B and 64 B
    PYTHONPATH=src python benchmarks/call_overhead.py --check    # exit 1 if the targets are missed
    PYTHONPATH=src python benchmarks/call_overhead.py --gil      # GIL-release threshold data
    PYTHONPATH=src python benchmarks/call_overhead.py --torch    # torch tensors against copy_

Targets: at 8 B and 64 B, fastcopy.copy <= 0.6 x np.copyto and <= dst[...] = src; fastcopy.copyto
(the np.copyto drop-in, on its fast path: equal shapes and dtypes) <= 0.35 x np.copyto. For
torch tensors (--torch): fastcopy.copy and fastcopy.copyto <= 1.0 x dst.copy_(src).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit

import numpy as np

import fastcopy


def interleaved(stmts: dict, env: dict, number: int, repeats: int) -> dict:
    """{name: [ns per call for each repeat]}, the methods rotated inside every repeat."""
    timers = {name: timeit.Timer(stmt, globals=env) for name, stmt in stmts.items()}
    names = list(stmts)
    out = {name: [] for name in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            out[name].append(timers[name].timeit(number) / number * 1e9)
    return out


def call_overhead(number: int, repeats: int) -> bool:
    ok = True
    print(f"{'size':>6} {'fastcopy.copy':>14} {'fastcopy.copyto':>16} {'np.copyto':>10} {'dst[...]=src':>13} "
          f"{'copy/np':>8} {'copy/set':>9} {'copyto/np':>10}   (ns/call, medians of {repeats} interleaved repeats)")
    for nbytes in (8, 64):
        src = np.arange(nbytes // 8, dtype=np.float64)
        dst = np.zeros_like(src)
        env = {"fc": fastcopy.copy, "fct": fastcopy.copyto, "copyto": np.copyto, "d": dst, "s": src}
        res = interleaved({"fastcopy": "fc(d, s)", "fc_copyto": "fct(d, s)", "copyto": "copyto(d, s)",
                           "setitem": "d[...] = s"}, env, number, repeats)
        med = {k: statistics.median(v) for k, v in res.items()}
        # Ratios per repeat, then the median: robust against a slow repeat hitting one method.
        r_copyto = statistics.median(f / c for f, c in zip(res["fastcopy"], res["copyto"]))
        r_set = statistics.median(f / c for f, c in zip(res["fastcopy"], res["setitem"]))
        r_dropin = statistics.median(f / c for f, c in zip(res["fc_copyto"], res["copyto"]))
        print(f"{nbytes:>5}B {med['fastcopy']:>14.1f} {med['fc_copyto']:>16.1f} {med['copyto']:>10.1f} "
              f"{med['setitem']:>13.1f} {r_copyto:>7.2f}x {r_set:>8.2f}x {r_dropin:>9.2f}x")
        ok = ok and r_copyto <= 0.6 and r_set <= 1.0 and r_dropin <= 0.35
    print("targets (copy <= 0.6x np.copyto and <= 1.0x dst[...]=src; copyto <= 0.35x np.copyto):",
          "met" if ok else "MISSED")
    return ok


def torch_overhead(number: int, repeats: int) -> bool:
    """fastcopy.copy and fastcopy.copyto of two small contiguous float32 tensors against torch's
    own dst.copy_(src); Tensor.numpy() (what the general path pays per tensor) for scale."""
    import torch

    ok = True
    print(f"{'size':>6} {'fastcopy.copy':>14} {'fastcopy.copyto':>16} {'copy_':>8} {'numpy()':>8} "
          f"{'copy/copy_':>11} {'copyto/copy_':>13}   (ns/call, medians of {repeats} interleaved repeats)")
    for nbytes in (8, 64):
        src = torch.ones(nbytes // 4)
        dst = torch.zeros(nbytes // 4)
        env = {"fc": fastcopy.copy, "fct": fastcopy.copyto, "d": dst, "s": src}
        res = interleaved({"fastcopy": "fc(d, s)", "fc_copyto": "fct(d, s)", "copy_": "d.copy_(s)",
                           "numpy": "s.numpy()"}, env, number, repeats)
        med = {k: statistics.median(v) for k, v in res.items()}
        r_copy = statistics.median(f / c for f, c in zip(res["fastcopy"], res["copy_"]))
        r_copyto = statistics.median(f / c for f, c in zip(res["fc_copyto"], res["copy_"]))
        print(f"{nbytes:>5}B {med['fastcopy']:>14.1f} {med['fc_copyto']:>16.1f} {med['copy_']:>8.1f} "
              f"{med['numpy']:>8.1f} {r_copy:>10.2f}x {r_copyto:>12.2f}x")
        ok = ok and r_copy <= 1.0 and r_copyto <= 1.0
    print("target (copy and copyto <= 1.0x dst.copy_(src)):", "met" if ok else "MISSED")
    return ok


def gil_threshold(number: int, repeats: int) -> None:
    """Copy time around the GIL-release threshold (64 KiB in cpp/python/bindings.cpp). The step
    between 64 KiB - 1 and 64 KiB is the cost of releasing and re-acquiring the GIL."""
    print("size        ns/call   (fastcopy.copy, contiguous uint8; GIL released from 65536 B)")
    rows = {}
    for n in (1024, 4096, 16384, 32768, 65535, 65536, 262144, 1 << 20):
        src = np.ones(n, np.uint8)
        dst = np.zeros(n, np.uint8)
        res = interleaved({"c": "fc(d, s)"}, {"fc": fastcopy.copy, "d": dst, "s": src}, max(number // 20, 200),
                          repeats)
        rows[n] = statistics.median(res["c"])
        print(f"{n:>8} {rows[n]:>12.1f}")
    # Interleave the two sizes next to the threshold to isolate the release cost.
    a, b = np.zeros(65535, np.uint8), np.zeros(65536, np.uint8)
    env = {"fc": fastcopy.copy, "a": a, "b": b, "sa": np.ones(65535, np.uint8), "sb": np.ones(65536, np.uint8)}
    res = interleaved({"below": "fc(a, sa)", "at": "fc(b, sb)"}, env, max(number // 20, 200), repeats * 2)
    step = statistics.median(x - y for x, y in zip(res["at"], res["below"]))
    print(f"GIL release+acquire (t(65536) - t(65535)), median of pairs: {step:.1f} ns "
          f"= {100 * step / rows[65536]:.1f}% of a 64 KiB copy")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--number", type=int, default=20000, help="calls per timing (default 20000)")
    p.add_argument("--repeats", type=int, default=21, help="interleaved repeats (default 21)")
    p.add_argument("--check", action="store_true", help="exit with status 1 when a target is missed")
    p.add_argument("--gil", action="store_true", help="print the GIL-release threshold measurement instead")
    p.add_argument("--torch", action="store_true", help="torch tensors against dst.copy_(src) instead")
    args = p.parse_args(argv)
    if args.gil:
        gil_threshold(args.number, args.repeats)
        return 0
    ok = torch_overhead(args.number, args.repeats) if args.torch else call_overhead(args.number, args.repeats)
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
