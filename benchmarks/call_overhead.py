"""Per-call cost of fastcopy.copy for tiny numpy arrays, side by side with np.copyto and
``dst[...] = src``: medians of interleaved repeats (each repeat times all three methods,
in rotating order, so drift and noise from other processes hit all of them alike).

    PYTHONPATH=src python benchmarks/call_overhead.py            # 8 B and 64 B
    PYTHONPATH=src python benchmarks/call_overhead.py --check    # exit 1 if the targets are missed
    PYTHONPATH=src python benchmarks/call_overhead.py --gil      # GIL-release threshold data
    PYTHONPATH=src python benchmarks/call_overhead.py --torch    # torch tensors against copy_
    PYTHONPATH=src python benchmarks/call_overhead.py --kernels  # copy against forced kernels, placed
    PYTHONPATH=src python benchmarks/call_overhead.py --uniform  # the smallest sizes' shortcut, on and off

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


# (size, source offset in its page, destination offset in its page): no range crosses a page,
# so builds compared with --kernels run the same code paths at the same addresses.
PLACED_POINTS = ((64, 128, 640), (237, 256, 1344), (1000, 512, 2112), (3000, 64, 96), (3000, 0, 1000))


def placed_kernels(number: int, repeats: int, as_json: bool) -> None:
    """ns per call of fastcopy.copy (auto) and of every forced kernel (fastcopy.kernel(name)) at
    PLACED_POINTS, in one page-aligned arena: the addresses are the same in every process, which
    fresh allocations are not (a module that allocates more at import moves them)."""
    import json

    arena = np.zeros(64 * 4096, np.uint8)
    base = (-arena.ctypes.data) % 4096
    variants = {"auto": fastcopy.copy}
    variants.update({name: fastcopy.kernel(name) for name in fastcopy.kernels()})
    rows = {}
    for size, src_off, dst_off in PLACED_POINTS:
        src = arena[base + src_off:base + src_off + size]
        dst = arena[base + 32 * 4096 + dst_off:base + 32 * 4096 + dst_off + size]
        env = {"d": dst, "s": src}
        env.update({f"f{i}": f for i, f in enumerate(variants.values())})
        res = interleaved({name: f"f{i}(d, s)" for i, name in enumerate(variants)}, env, number, repeats)
        rows[f"{size} B, src {src_off}, dst {dst_off}"] = {k: statistics.median(v) for k, v in res.items()}
    if as_json:
        print(json.dumps(rows))
        return
    names = list(variants)
    print(f"{'point':>28} " + " ".join(f"{n:>9}" for n in names) + f"   (ns/call, medians of {repeats} interleaved repeats)")
    for point, med in rows.items():
        print(f"{point:>28} " + " ".join(f"{med[n]:>9.2f}" for n in names))


def without_uniform_sizes(profile_json: str) -> str:
    """The profile with one change no copy can see: the private backward class names another
    kernel for 0-byte copies (which never reach the policy), so no size of the region is
    uniform across the classes and every copy takes the address class and the band search."""
    import json

    profile = json.loads(profile_json)
    bands = profile["regions"]["private"]["backward"]
    other = next(k for k in fastcopy.kernels() if k != bands[0]["kernel"])
    if len(bands) > 1 and bands[1]["from"] == 1:
        bands[0]["kernel"] = other
    else:
        bands[0]["from"] = 1
        bands.insert(0, {"from": 0, "kernel": other, "why": "differs at 0 B only: no uniform sizes"})
    return json.dumps(profile)


def uniform_shortcut(number: int, repeats: int) -> None:
    """ns per call of fastcopy.copy under the active profile and under the same profile without
    uniform sizes (without_uniform_sizes), in one process, alternating, at the placements of
    PLACED_POINTS below 3000 B; both run the same kernel at each point."""
    import timeit

    from fastcopy import _core

    before = _core.active_profile()
    with_json = _core.base_profile_json()  # the overrides in force apply on top of both
    profiles = {"shortcut": with_json, "no shortcut": without_uniform_sizes(with_json)}
    arena = np.zeros(64 * 4096, np.uint8)
    base = (-arena.ctypes.data) % 4096
    print(f"{'point':>28} {'shortcut':>9} {'without':>9} {'saved':>6}   (ns/call, medians of {repeats} alternating "
          f"repeats)")
    try:
        for size, src_off, dst_off in PLACED_POINTS:
            if size >= 3000:
                continue
            src = arena[base + src_off:base + src_off + size]
            dst = arena[base + 32 * 4096 + dst_off:base + 32 * 4096 + dst_off + size]
            timer = timeit.Timer("f(d, s)", globals={"f": fastcopy.copy, "d": dst, "s": src})
            kernels = set()
            res: dict = {name: [] for name in profiles}
            for r in range(repeats):
                for name in (list(profiles) if r % 2 == 0 else list(profiles)[::-1]):
                    _core.load_profile(profiles[name], name)
                    kernels.add(_core.chosen_kernel(dst.ctypes.data, src.ctypes.data, size))
                    res[name].append(timer.timeit(number) / number * 1e9)
            assert len(kernels) == 1, kernels
            a, b = (statistics.median(res[name]) for name in profiles)
            print(f"{f'{size} B, src {src_off}, dst {dst_off}':>28} {a:>9.2f} {b:>9.2f} {b - a:>6.2f}")
    finally:  # the profile active before, from where it came
        if before["source"] == "built-in":
            _core.use_builtin_profile(before["name"])
        else:
            _core.load_profile(with_json, before["source"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--number", type=int, default=20000, help="calls per timing (default 20000)")
    p.add_argument("--repeats", type=int, default=21, help="interleaved repeats (default 21)")
    p.add_argument("--check", action="store_true", help="exit with status 1 when a target is missed")
    p.add_argument("--gil", action="store_true", help="print the GIL-release threshold measurement instead")
    p.add_argument("--torch", action="store_true", help="torch tensors against dst.copy_(src) instead")
    p.add_argument("--kernels", action="store_true",
                   help="fastcopy.copy and every forced kernel at fixed placements (PLACED_POINTS) instead")
    p.add_argument("--json", action="store_true", help="with --kernels: one JSON line, for comparing builds")
    p.add_argument("--uniform", action="store_true",
                   help="fastcopy.copy with and without the uniform sizes' shortcut, in one process, instead")
    args = p.parse_args(argv)
    if args.uniform:
        uniform_shortcut(args.number, args.repeats)
        return 0
    if args.kernels:
        placed_kernels(args.number, args.repeats, args.json)
        return 0
    if args.gil:
        gil_threshold(args.number, args.repeats)
        return 0
    ok = torch_overhead(args.number, args.repeats) if args.torch else call_overhead(args.number, args.repeats)
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
