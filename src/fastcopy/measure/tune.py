"""``python -m fastcopy tune``: measure this machine and write a dispatch profile.

What is measured (docs/benchmarks.md, "Tuning"):

- every usable non-streaming kernel (``fastcopy.kernel(name)``) at every size of a grid (powers
  of two and the midpoints between, 256 B to 256 MiB; ``--quick``: powers of two to 64 MiB), for
  each address class (``page_aligned``: (dst - src) mod 4096 = 0; ``near``: 16 and 31; ``far``:
  64 and 2064; ``backward``: overlapping with dst above src) and each region (``private``;
  ``to_shared`` and ``from_shared`` with the shared side in a real POSIX shared-memory mapping);
- the thread pool (``fastcopy.kernel(name, threads=t)``, t = 2, N/2 and N) against one thread,
  private and page-aligned, from 256 KiB up; the streaming kernel, alone and on the pool, at the
  cold sizes (page-aligned, every region).

Cache modes: below the L3 size the same buffers are copied over and over (hot: what loops over
small buffers see; the band kernels up to the L3 size are decided there); at and above the L3
size each copy reads a different source from a rotation holding twice the L3 (cold: the source
is not cached), and the non-temporal threshold and the large-size bands are decided there. Sizes
between the L2 and the L3 size are measured hot.

Noise: every cell interleaves its variants in a new order each repeat and keeps medians and
spreads (``engine.spread``). A size changes kernel only where the winner beats the built-in
profile's kernel by more than the larger of the two spreads; adjacent equal bands merge. A
validation pass then times each changed band against the built-in choice at sizes off the grid
and keeps, per band, whichever wins.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import _core
from . import engine, system
from .paths import not_regular, output_problem, read_regular, write_whole
from .units import MAX_MIN_TIME, PAGE, human_size, parse_sizes

REGIONS = ("private", "to_shared", "from_shared")
REGION_CODE = {"private": 0, "to_shared": 1, "from_shared": 2}
CLASSES = ("page_aligned", "near", "far", "backward")
# (dst - src) mod 4096 per class; a cell cycles through its offsets, one per repeat.
CLASS_OFFSETS = {"page_aligned": [0], "near": [16, 31], "far": [64, 2048 + 16]}
# Backward overlap: dst = src + this many bytes (at most half the size).
BACKWARD_SHIFT = 4096 + 64

GRID_MIN = 256
GRID_MAX = 256 << 20
QUICK_GRID_MAX = 64 << 20
# The pool is measured from this size up (below it one chunk of >= 16 KiB per thread would
# leave nothing to split on a machine of a few CPUs).
PARALLEL_MIN_GRID = 256 << 10

# The profile format is defined once, in C++ (the loader): its name, version and limits.
_LIMITS = _core.profile_limits()
PROFILE_FORMAT = _LIMITS["format"]
PROFILE_VERSION = _LIMITS["version"]
MAX_WHY = _LIMITS["max_why_chars"]

# Loop length per sample (hot) and repeats; quick uses fewer. Many short samples rather than a
# few long ones: on the shared 2-vCPU Zen 3 VM a sample that another process preempts runs 3-4x
# slower (bimodal: e.g. 49 or 12 GB/s for the same 57 KiB copy); with 2 ms loops about 4 samples in
# 10 were hit and medians of 5 flipped, with 0.2 ms loops few are and medians of 11-15 agreed
# within 1-5 % for the same kernel timed twice.
SETTINGS = {
    "default": {"repeats": 11, "min_time": 0.0002, "cold_repeats": 5, "cold_min_time": 0.002},
    "quick": {"repeats": 7, "min_time": 0.0002, "cold_repeats": 3, "cold_min_time": 0.001},
}


# ----------------------------------------------------------------------------- grid

def size_grid(quick: bool = False) -> List[int]:
    """Powers of two and the midpoints between (1.5x), 256 B to 256 MiB; quick: powers of two to 64 MiB."""
    top = QUICK_GRID_MAX if quick else GRID_MAX
    sizes, p = [], GRID_MIN
    while p <= top:
        sizes.append(p)
        if not quick and p * 3 // 2 <= top:
            sizes.append(p * 3 // 2)
        p *= 2
    return sizes


def validation_sizes(lo: int, hi: Optional[int], limit: int = 2) -> List[int]:
    """Sizes in [lo, hi) that are not on the grid: odd byte counts between grid points."""
    hi = hi if hi is not None else lo * 2
    out: List[int] = []
    s = lo
    while len(out) < limit:
        v = int(s * 1.22) | 1  # between a grid point and the next midpoint, never a power of two
        if v >= hi:
            break
        out.append(v)
        s = int(s * 1.5) + 1
    if not out and hi - lo > 2:
        out.append((lo + (hi - lo) // 3) | 1)
    return out


# ----------------------------------------------------------------------------- built-in choices

class Builtin:
    """What the built-in profile does, read from the running policy (``_core.chosen_kernel`` with
    synthetic addresses, so nothing is copied)."""

    def __init__(self) -> None:
        from .. import _core

        self._core = _core
        self.nt_threshold: Optional[int] = _core.nt_threshold()
        self.parallel_threshold: Optional[int] = _core.parallel_threshold()
        self.threads = int(_core.default_threads())
        self.streaming = {k["name"] for k in _core.kernel_table() if k.get("streaming")}

    def kernel(self, region: str, cls: str, size: int) -> str:
        """The band kernel (never a streaming one) for a copy of ``size`` bytes."""
        n = size
        if self.nt_threshold is not None and n >= self.nt_threshold:
            n = max(self.nt_threshold - 1, 1)  # the band under the non-temporal switch
        base = 1 << 44
        if cls == "backward":
            src, dst = base, base + max(1, min(BACKWARD_SHIFT, n // 2))
        else:
            src, dst = base, base + (1 << 40) + CLASS_OFFSETS[cls][0]
        name = self._core.chosen_kernel(dst, src, n, REGION_CODE[region])
        if name in self.streaming:  # defensive: a policy that streams below its threshold
            name = "generic"
        return str(name)

    def bands_below(self, region: str, cls: str, size: int) -> List[Dict[str, Any]]:
        """The built-in profile's bands that start below ``size`` (the first one starts at 0)."""
        bands = self._core.base_profile()["regions"][region][cls]
        return [b for b in bands if b["from"] < size] or [{"from": 0, "kernel": self.kernel(region, cls, 1)}]

    def uses_nt(self, size: int) -> bool:
        return self.nt_threshold is not None and size >= self.nt_threshold

    def uses_pool(self, size: int) -> bool:
        return self.parallel_threshold is not None and size >= self.parallel_threshold and self.threads > 1


# ----------------------------------------------------------------------------- memory for one size

def slot_bytes(size: int) -> int:
    """Bytes of one SizeMemory slot for copies of ``size`` bytes."""
    return 2 * (-(-size // PAGE) * PAGE + PAGE)


class Arena:
    """Private and POSIX shared memory of ``nbytes`` each, faulted in once and lent to every
    SizeMemory of a run (re-mapping a gigabyte per large size cost more system time than the
    copies measured there)."""

    def __init__(self, nbytes: int, shared: bool = True):
        self.private = engine.aligned_buffer(nbytes)
        self.private.fill(0x5A)  # faults the pages in (content does not change a copy's speed)
        head = min(nbytes, 1 << 16)
        self.private[:head] = np.resize(np.arange(251, dtype=np.uint8), head)
        self.shm: Optional[engine.SharedBuffer] = engine.SharedBuffer(nbytes) if shared else None
        self.shared: Optional[np.ndarray] = self.shm.array if self.shm is not None else None
        if self.shared is not None:
            self.shared.fill(7)

    def close(self) -> None:
        self.shared = None
        if self.shm is not None:
            self.shm.close()


class SizeMemory:
    """Buffers for copies of ``size`` bytes: ``count`` slots (cold rotations use several) in
    private memory and in a POSIX shared-memory mapping (from ``arena``, else its own). A slot
    holds a source at its start and a destination one page-rounded size plus a page later, so every
    offset keeps its (dst - src) mod 4096; backward copies run inside one slot (dst = src + shift)."""

    def __init__(self, size: int, count: int, shared: bool, arena: Optional[Arena] = None):
        self.size, self.count = size, count
        self.dst_at = -(-size // PAGE) * PAGE + PAGE
        self.slot = slot_bytes(size)
        need = self.slot * count
        self._own: Optional[Arena] = None
        if arena is None or arena.private.size < need or (shared and arena.shared is None):
            arena = self._own = Arena(need, shared)
        self.private = arena.private[:need]
        self.shared: Optional[np.ndarray] = arena.shared[:need] if shared and arena.shared is not None else None

    def pairs(self, region: str, cls: str, offset: int) -> List[Tuple[np.ndarray, np.ndarray]]:
        n, out = self.size, []
        for i in range(self.count):
            base = i * self.slot
            if cls == "backward":
                mem = self.private if region == "private" else self.shared
                assert mem is not None
                shift = max(1, min(BACKWARD_SHIFT, n // 2))
                out.append((mem[base + shift:base + shift + n], mem[base:base + n]))
                continue
            dst_mem = self.shared if region == "to_shared" else self.private
            src_mem = self.shared if region == "from_shared" else self.private
            assert dst_mem is not None and src_mem is not None
            d0 = base + self.dst_at + offset
            out.append((dst_mem[d0:d0 + n], src_mem[base:base + n]))
        return out

    def close(self) -> None:
        self.shared = None
        if self._own is not None:
            self._own.close()


# ----------------------------------------------------------------------------- one cell

Stat = Dict[str, float]  # {"gbps": median, "spread": relative}


def _timer(copy: Callable[[Any, Any], Any], pairs: List[Tuple[np.ndarray, np.ndarray]]) -> engine.Timer:
    if len(pairs) == 1:
        return engine._callable_timer(copy)(*pairs[0])
    return engine._rotating(copy)(pairs)


# Kernels are checked on at most this many bytes (plus an odd tail): a full check of a 256 MiB
# copy per kernel would cost more than its measurement; the test suite covers large copies.
CHECK_MAX_BYTES = (4 << 20) + 77


def _check(copy: Callable[[Any, Any], Any], pairs: List[Tuple[np.ndarray, np.ndarray]], backward: bool) -> bool:
    """Copies once and checks the bytes (a kernel that copies wrong is never chosen)."""
    d, s = pairs[0]
    if d.size > CHECK_MAX_BYTES and not backward:
        d, s = d[:CHECK_MAX_BYTES], s[:CHECK_MAX_BYTES]
    if backward:
        expect = np.array(s[-4096:], copy=True)
        copy(d, s)
        return bool(np.array_equal(d[-4096:], expect))
    d[:64] = ~s[:64]
    copy(d, s)
    if d.size <= 1 << 22:
        return bool(np.array_equal(d, s))
    return bool(np.array_equal(d[::4099], s[::4099]) and np.array_equal(d[-4096:], s[-4096:]))


def measure_cell(variants: Dict[str, Callable[[Any, Any], Any]], memory: SizeMemory, region: str, cls: str,
                 repeats: int, min_time: float, rng: random.Random) -> Dict[str, Stat]:
    """Median throughput and spread of each variant for one (size, region, class): the variants
    interleaved in a new order each repeat, each repeat at the class's next offset; with several
    offsets, the geometric mean of the per-offset medians."""
    offsets = CLASS_OFFSETS.get(cls, [0])
    per_offset = {off: memory.pairs(region, cls, off) for off in offsets}
    ok = {name: _check(f, per_offset[offsets[0]], cls == "backward") for name, f in variants.items()}
    names = [k for k in variants if ok[k]]
    timers = {off: {k: _timer(variants[k], pairs) for k in names} for off, pairs in per_offset.items()}
    first = timers[offsets[0]][names[0]]
    if memory.count > 1 or memory.size >= 4 << 20:
        # large copies: one pass over the rotation warms up and times in one go
        per_copy = first(memory.count) / memory.count
        iterations = max(memory.count, math.ceil(min_time / max(per_copy, 1e-9)))
    else:
        iterations = engine._calibrate(first, min_time)
    samples: Dict[Tuple[str, int], List[float]] = {(k, off): [] for k in names for off in offsets}
    for r in range(max(repeats, len(offsets))):
        off = offsets[r % len(offsets)]
        got = engine.time_interleaved(timers[off], iterations, 1, rng)
        for k, v in got.items():
            samples[(k, off)].append(memory.size / v[0] / 1e9)
    # Per offset a median; a class with several offsets scores the geometric mean of them (a kernel
    # that collapses at one offset of the class must not hide in a median of mixed samples) and
    # the largest of their spreads.
    out: Dict[str, Stat] = {}
    for k in names:
        per = [samples[(k, off)] for off in offsets if samples[(k, off)]]
        out[k] = {"gbps": statistics.geometric_mean([statistics.median(v) for v in per]),
                  "spread": max(engine.spread(v) for v in per)}
    return out


# ----------------------------------------------------------------------------- the measurement

def measure(quick: bool = False, grid: Optional[Sequence[int]] = None, repeats: Optional[int] = None,
            min_time: Optional[float] = None, progress: Optional[engine.Progress] = None,
            thread_counts: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """Every measurement tune decides from, as plain data (see ``decide``)."""
    import fastcopy
    from .. import _core

    table = {k["name"]: k for k in _core.kernel_table() if k["supported"]}
    plain = [k for k in fastcopy.kernels() if not table[k].get("streaming")]
    streaming = [k for k in fastcopy.kernels() if table[k].get("streaming")]
    l2, l3 = engine.cache_sizes()
    cfg = SETTINGS["quick" if quick else "default"]
    reps = repeats or int(cfg["repeats"])
    hot_time = min_time or cfg["min_time"]
    sizes = sorted(set(grid)) if grid else size_grid(quick)
    n_cpus = max(1, int(_core.default_threads()))
    if thread_counts is None:
        thread_counts = sorted({t for t in (2, n_cpus // 2, n_cpus) if 2 <= t <= n_cpus})
    rng = random.Random(20261130)
    kernels = {k: fastcopy.kernel(k) for k in plain + streaming}
    pooled = {(k, t): fastcopy.kernel(k, threads=t) for k in plain + streaming for t in thread_counts}
    cells: Dict[str, Dict[str, Dict[str, Dict[str, Stat]]]] = {r: {c: {} for c in CLASSES} for r in REGIONS}
    wide: Dict[str, Dict[str, Stat]] = {}  # private, page-aligned: streaming and pool variants
    cache_of: Dict[str, str] = {}
    need = max(slot_bytes(s) * (engine.cold_rotation_count(s, l3) if s >= l3 else 1) for s in sizes)
    arena = Arena(need)
    pair = system.cpu_pair()
    probes: List[Optional[float]] = []
    try:
        _measure_sizes(sizes, arena, l3, cfg, reps, hot_time, repeats, plain, streaming, kernels, pooled, cells,
                       wide, cache_of, rng, progress, lambda: probes.append(system.cache_line_round_trip(pair)))
    finally:
        arena.close()
    return {"sizes": sizes, "cells": cells, "wide": wide, "cache": cache_of, "plain": plain,
            "streaming": streaming, "threads": list(thread_counts), "l2": l2, "l3": l3,
            "repeats": reps, "min_time": hot_time, "quick": quick,
            "cpu_distance": system.cpu_distance_record(pair, probes)}


def _measure_sizes(sizes: Sequence[int], arena: Arena, l3: int, cfg: Dict[str, float], reps: int, hot_time: float,
                   repeats: Optional[int], plain: List[str], streaming: List[str],
                   kernels: Dict[str, Callable[[Any, Any], Any]],
                   pooled: Dict[Tuple[str, int], Callable[[Any, Any], Any]], cells: Dict[str, Any],
                   wide: Dict[str, Dict[str, Stat]], cache_of: Dict[str, str], rng: random.Random,
                   progress: Optional[engine.Progress], probe: Callable[[], None]) -> None:
    for size in sizes:
        probe()  # how far apart the first two CPUs are now (the pool's gain depends on it)
        cold = size >= l3
        cache_of[str(size)] = "cold" if cold else "hot"
        count = engine.cold_rotation_count(size, l3) if cold else 1
        reps_here = int(cfg["cold_repeats"]) if cold and not repeats else reps
        t_here = cfg["cold_min_time"] if cold else hot_time
        mem = SizeMemory(size, count, shared=True, arena=arena)
        try:
            for region in REGIONS:
                for cls in CLASSES:
                    if progress is not None:
                        progress.step(f"{human_size(size)} {region} {cls}", 0)
                    variants: Dict[str, Callable[[Any, Any], Any]] = {k: kernels[k] for k in plain}
                    widen = cls == "page_aligned" and size >= PARALLEL_MIN_GRID and (
                        region == "private" or cold)
                    if widen:
                        if cold:  # the non-temporal threshold is decided cold only
                            variants.update({k: kernels[k] for k in streaming})
                        if region == "private":
                            for (k, t), f in pooled.items():
                                if k in plain or cold:
                                    variants[f"{k}@{t}"] = f
                    res = measure_cell(variants, mem, region, cls, reps_here, t_here, rng)
                    cells[region][cls][str(size)] = {k: v for k, v in res.items() if k in plain}
                    if widen:
                        wide.setdefault(region, {})
                        for k, v in res.items():
                            wide[region][f"{size}:{k}"] = v
                    if progress is not None:
                        progress.step(f"{human_size(size)} {region} {cls}")
        finally:
            mem.close()


def cell_count(sizes: Sequence[int]) -> int:
    return len(sizes) * len(REGIONS) * len(CLASSES)


# ----------------------------------------------------------------------------- decisions

# A change needs at least this gain even when the spreads are tighter: below it a change buys
# nothing a user would notice and mostly follows noise (on the shared 2-vCPU Zen 3 VM this was
# developed on, repeated quick runs flipped bands on 1-3 % differences).
MIN_GAIN = 0.03


def _beats(w: Stat, inc: Stat) -> bool:
    """True when w is faster than inc by more than the larger of their spreads (and MIN_GAIN)."""
    return w["gbps"] > inc["gbps"] * (1 + max(w["spread"], inc["spread"], MIN_GAIN))


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def decide_bands(m: Dict[str, Any], builtin: Builtin) -> Dict[str, Dict[str, List[Dict[str, Any]]]]:
    """Per region and class: per grid size, the kernel, the built-in kernel and the evidence."""
    out: Dict[str, Dict[str, List[Dict[str, Any]]]] = {}
    for region in REGIONS:
        out[region] = {}
        for cls in CLASSES:
            points = []
            for size in m["sizes"]:
                stats = m["cells"][region][cls].get(str(size)) or {}
                inc = builtin.kernel(region, cls, size)
                if not stats:
                    continue
                best = max(stats, key=lambda k: stats[k]["gbps"])
                point = {"size": size, "builtin": inc, "kernel": inc, "gain": 1.0, "stats": stats,
                         "cache": m["cache"][str(size)]}
                if inc not in stats:  # the built-in kernel failed its check or is not usable
                    point["kernel"], point["why"] = best, f"fastest measured; built-in {inc} unusable here"
                elif best != inc and _beats(stats[best], stats[inc]):
                    point["kernel"] = best
                    point["gain"] = stats[best]["gbps"] / stats[inc]["gbps"]
                    point["why"] = (f"{point['gain']:.2f}x {inc} at {human_size(size)} {point['cache']} "
                                    f"(spread {_pct(max(stats[best]['spread'], stats[inc]['spread']))})")
                else:
                    r = stats[best]["gbps"] / stats[inc]["gbps"]
                    point["why"] = (f"built-in choice kept: fastest at {human_size(size)}" if best == inc else
                                    f"built-in choice kept: {best} {r:.2f}x within the spread "
                                    f"({_pct(max(stats[best]['spread'], stats[inc]['spread']))})")
                points.append(point)
            _fill_gaps(points)
            out[region][cls] = points
    return out


def _fill_gaps(points: List[Dict[str, Any]]) -> None:
    """A single grid size between two sizes that changed to the same kernel takes that kernel too
    when it was the fastest there as well (only within the spread): one band instead of three."""
    for i in range(1, len(points) - 1):
        before, here, after = points[i - 1], points[i], points[i + 1]
        k = before["kernel"]
        if k == after["kernel"] and k != here["kernel"] and k != before["builtin"] and k in here["stats"] \
                and max(here["stats"], key=lambda n: here["stats"][n]["gbps"]) == k:
            inc = here["stats"].get(here["kernel"])
            here["gain"] = here["stats"][k]["gbps"] / inc["gbps"] if inc else 1.0
            here["kernel"] = k
            here["why"] = (f"{here['gain']:.2f}x {here['builtin']} at {human_size(here['size'])} (within the "
                           f"spread), between two sizes where {k} won beyond it")


def _bands_from_points(points: List[Dict[str, Any]], below: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Bands from per-size decisions (a decision holds from its size to the next); the sizes
    below the grid keep the built-in bands (``below``: those that start under the first measured
    size); adjacent equal kernels merge."""
    bands: List[Dict[str, Any]] = [{"from": b["from"], "kernel": b["kernel"],
                                    "why": ("below the measured grid, the built-in choice: " + b.get("why", ""))[:MAX_WHY]}
                                   for b in below]
    for p in points:
        if p["kernel"] == bands[-1]["kernel"]:
            continue
        bands.append({"from": p["size"], "kernel": p["kernel"], "why": p["why"][:MAX_WHY]})
    merged: List[Dict[str, Any]] = []
    for b in bands:
        if merged and merged[-1]["kernel"] == b["kernel"]:
            continue
        merged.append(b)
    return merged


def _threshold_from(flags: List[Tuple[int, bool]]) -> Optional[int]:
    """The smallest size from which every flag holds (None when the largest does not)."""
    thr = None
    for size, on in reversed(flags):
        if not on:
            break
        thr = size
    return thr


def decide_parallel(m: Dict[str, Any], bands: Dict[str, Any], builtin: Builtin) -> Dict[str, Any]:
    """Pool threshold and threads from the private page-aligned pool measurements."""
    wide = m["wide"].get("private", {})
    kernel_at = {p["size"]: p["kernel"] for p in bands["private"]["page_aligned"]}
    per_t: Dict[int, List[Tuple[int, bool, float, float]]] = {}
    for t in m["threads"]:
        rows = []
        for size in m["sizes"]:
            k = kernel_at.get(size)
            one, many = wide.get(f"{size}:{k}"), wide.get(f"{size}:{k}@{t}")
            if not one or not many:
                continue
            inc = builtin.uses_pool(size)
            use = (not _beats(one, many)) if inc else _beats(many, one)
            rows.append((size, use, many["gbps"] / one["gbps"], max(one["spread"], many["spread"])))
        per_t[t] = rows
    if not any(per_t.values()):
        thr = builtin.parallel_threshold if builtin.threads > 1 else None
        return {"threshold": thr, "threads": 0, "why": "not measured (grid below "
                f"{human_size(PARALLEL_MIN_GRID)} or one CPU): the built-in rule", "changed": False}

    def score(t: int) -> float:
        rows = [r for r in per_t[t] if r[1]]
        return statistics.geometric_mean([r[2] for r in rows]) if rows else 0.0

    best_t = max(per_t, key=score)
    rows = per_t[best_t]
    thr = _threshold_from([(s, u) for s, u, _, _ in rows])
    # Where the built-in rule uses the pool, a size keeps it unless one thread wins beyond the
    # spread; that must not leave the pool on for a range where it loses on average (a tune
    # on the Zen 3 VM kept it from 256 MiB only, where 2 threads ran 0.87x one thread within
    # a wide spread). Sizes are dropped from the bottom of the range until the pool gains.
    while thr is not None:
        kept = [g for s, _, g, _ in rows if s >= thr]
        if statistics.geometric_mean(kept) > 1.0:
            break
        larger = [s for s, _, _, _ in rows if s > thr]
        thr = larger[0] if larger else None
    builtin_thr = builtin.parallel_threshold if builtin.threads > 1 else None
    if thr is None and rows and builtin_thr is not None and rows[-1][0] < builtin_thr:
        return {"threshold": builtin_thr, "threads": 0, "changed": False, "rows": rows,
                "why": f"the grid stops below the built-in {human_size(builtin_thr)}: the built-in rule"}
    if thr is None:
        why = (f"the pool never beat one thread beyond the spread ({best_t} threads: "
               + ", ".join(f"{human_size(s)} {g:.2f}x" for s, _, g, _ in rows[-3:]) + ")")
    else:
        gains = [g for s, _, g, _ in rows if s >= thr]
        why = (f"{best_t} threads {min(gains):.2f}-{max(gains):.2f}x one thread from {human_size(thr)} "
               f"({'cold' if m['cache'][str(thr)] == 'cold' else 'hot'} at the threshold)")
        if rows and thr == rows[0][0] and builtin.parallel_threshold is not None \
                and builtin.parallel_threshold < thr and builtin.uses_pool(thr):
            thr = builtin.parallel_threshold  # below the measured range: keep the built-in start
            why += f"; below {human_size(rows[0][0])} not measured: the built-in {human_size(thr)} kept"
    threads = 0 if best_t >= builtin.threads else best_t
    changed = thr != (builtin.parallel_threshold if builtin.threads > 1 else None) or threads != 0
    return {"threshold": thr, "threads": threads, "why": why[:MAX_WHY], "changed": changed, "rows": rows}


def decide_nt(m: Dict[str, Any], bands: Dict[str, Any], parallel: Dict[str, Any],
              builtin: Builtin) -> Dict[str, Dict[str, Any]]:
    """Per region: the non-temporal threshold from the cold page-aligned measurements, with the
    thread count the dispatcher would use at each size."""
    out: Dict[str, Dict[str, Any]] = {}
    nt_kernel = m["streaming"][0] if m["streaming"] else None
    threads = parallel["threads"] or max(m["threads"] or [1])
    for region in REGIONS:
        wide = m["wide"].get(region, {})
        kernel_at = {p["size"]: p["kernel"] for p in bands[region]["page_aligned"]}
        rows = []
        for size in m["sizes"]:
            if m["cache"][str(size)] != "cold" or nt_kernel is None:
                continue
            pool = region == "private" and parallel["threshold"] is not None and size >= parallel["threshold"]
            suffix = f"@{threads}" if pool and threads > 1 else ""
            plain, nt = wide.get(f"{size}:{kernel_at.get(size)}{suffix}"), wide.get(f"{size}:{nt_kernel}{suffix}")
            if not plain or not nt:
                continue
            inc = builtin.uses_nt(size)
            use = (not _beats(plain, nt)) if inc else _beats(nt, plain)
            rows.append((size, use, nt["gbps"] / plain["gbps"]))
        if nt_kernel is None:
            out[region] = {"threshold": None, "kernel": None, "why": "no streaming kernel on this CPU",
                           "changed": builtin.nt_threshold is not None}
            continue
        if not rows:
            thr = builtin.nt_threshold
            out[region] = {"threshold": thr, "kernel": nt_kernel if thr is not None else None,
                           "why": "not measured cold (grid below the L3 size): the built-in threshold",
                           "changed": False}
            continue
        thr = _threshold_from([(s, u) for s, u, _ in rows])
        if thr is not None and thr == rows[0][0] and builtin.nt_threshold is not None and builtin.nt_threshold < thr:
            thr = builtin.nt_threshold  # NT won from the first cold size: the built-in start stands
        if thr is None:
            why = ("plain stores at least as fast as non-temporal ones cold: "
                   + ", ".join(f"{human_size(s)} {g:.2f}x" for s, _, g in rows[-3:]))
        else:
            gains = [g for s, _, g in rows if s >= thr]
            why = (f"{nt_kernel} {min(gains):.2f}-{max(gains):.2f}x the band kernel cold from "
                   f"{human_size(max(thr, rows[0][0]))}")
            if thr == builtin.nt_threshold:
                why = f"built-in threshold kept (no loss beyond the spread): {why}"
        out[region] = {"threshold": thr, "kernel": nt_kernel if thr is not None else None, "why": why[:MAX_WHY],
                       "changed": thr != builtin.nt_threshold, "rows": rows}
    return out


# ----------------------------------------------------------------------------- validation pass

def changed_runs(points: List[Dict[str, Any]]) -> List[Tuple[int, int]]:
    """(first, last) indexes of runs of consecutive grid sizes whose kernel differs from the built-in one."""
    runs, i = [], 0
    while i < len(points):
        if points[i]["kernel"] != points[i]["builtin"]:
            j = i
            while j + 1 < len(points) and points[j + 1]["kernel"] == points[i]["kernel"] \
                    and points[j + 1]["builtin"] != points[j + 1]["kernel"]:
                j += 1
            runs.append((i, j))
            i = j + 1
        else:
            i += 1
    return runs


def validate_changes(m: Dict[str, Any], bands: Dict[str, Any], repeats: int, min_time: float,
                     progress: Optional[engine.Progress] = None, cold_repeats: int = 3,
                     cold_min_time: float = 0.004) -> List[Dict[str, Any]]:
    """Times every changed band against the built-in kernel at sizes off the grid (two per band below
    the L3, hot; one at and above it, cold) and reverts the band unless the new kernel wins there by
    more than MIN_GAIN. Returns the report."""
    import fastcopy

    rng = random.Random(7)
    report = []
    for region in REGIONS:
        for cls in CLASSES:
            points = bands[region][cls]
            for i, j in changed_runs(points):
                lo = points[i]["size"]
                hi = points[j + 1]["size"] if j + 1 < len(points) else None
                new, old = points[i]["kernel"], points[i]["builtin"]
                top = m["sizes"][-1] + m["sizes"][-1] // 8  # memory: stay near the largest grid size
                sizes = [s for s in validation_sizes(lo, hi if hi is not None else lo + lo // 8 + 2) if s <= top]
                if lo >= m["l3"]:
                    sizes = sizes[:1]  # cold sizes are slow to measure: one point per band
                ratios = []
                for s in sizes:
                    cold = s >= m["l3"]
                    count = engine.cold_rotation_count(s, m["l3"]) if cold else 1
                    mem = SizeMemory(s, count, shared=region != "private")
                    try:
                        res = measure_cell({new: fastcopy.kernel(new), old: fastcopy.kernel(old)}, mem, region, cls,
                                           cold_repeats if cold else repeats,
                                           cold_min_time if cold else min_time, rng)
                    finally:
                        mem.close()
                    if new in res and old in res:
                        ratios.append((s, res[new]["gbps"] / res[old]["gbps"]))
                    if progress is not None:
                        progress.step(f"validate {region} {cls} {human_size(s)}")
                gain = statistics.geometric_mean([r for _, r in ratios]) if ratios else None
                # the newcomer must win here too, by MIN_GAIN: noise alone rarely wins twice
                keep = gain is None or gain > 1 + MIN_GAIN
                if not keep:
                    for p in points[i:j + 1]:
                        p["kernel"], p["why"] = p["builtin"], (
                            f"built-in choice kept: {new} lost the validation at "
                            + ", ".join(f"{s} B {r:.2f}x" for s, r in ratios))
                else:
                    for p in points[i:j + 1]:
                        if ratios:
                            p["why"] = (p["why"] + "; validated " +
                                        ", ".join(f"{s} B {r:.2f}x" for s, r in ratios))[:MAX_WHY]
                grid_gain = statistics.geometric_mean([p["gain"] for p in points[i:j + 1]])
                report.append({"region": region, "class": cls, "from": lo, "to": hi, "builtin": old, "new": new,
                               "grid_gain": grid_gain, "validation": ratios, "validation_gain": gain,
                               "kept": keep})
    return report


# ----------------------------------------------------------------------------- the profile

def machine_words(l3: int) -> str:
    from .. import _core
    from .system import cpu_model_name

    f = _core.cpu_facts()
    words = [cpu_model_name() or f.get("vendor") or "unknown CPU"]
    if f.get("family") is not None:
        words.append(f"family {f['family']} model {f['model']}")
    if f.get("hypervisor"):
        words.append("under a hypervisor")
    words.append(f"{os.cpu_count()} CPUs")
    words.append(f"{human_size(l3)} L3")
    return ", ".join(words)


def libc_words() -> str:
    name, version = platform.libc_ver()
    return f"{name} {version}".strip() or "unknown C library"


def build_profile(m: Dict[str, Any], bands: Dict[str, Any], nt: Dict[str, Any], parallel: Dict[str, Any],
                  command: str, note: Optional[str] = None) -> Dict[str, Any]:
    """The profile (docs/profile-format.md). ``note``: appended to the method. Its ``notes``
    (shown by info()) say when the host moved the CPUs during the measurements."""
    from .._profile import signature

    regions: Dict[str, Any] = {}
    builtin = Builtin()
    first = m["sizes"][0]
    for region in REGIONS:
        r: Dict[str, Any] = {}
        for cls in CLASSES:
            r[cls] = _bands_from_points(bands[region][cls], builtin.bands_below(region, cls, first))
        r["nt"] = {"threshold": nt[region]["threshold"], "kernel": nt[region]["kernel"], "why": nt[region]["why"]}
        regions[region] = r
    method = (f"{command}: hot caches below the {human_size(m['l3'])} L3 (L2 {human_size(m['l2'])}), cold at and "
              f"above it (rotation of >= {engine.COLD_L3_FACTOR}x L3); {m['repeats']} interleaved repeats of "
              f">= {m['min_time'] * 1e3:g} ms loops, medians; a band changes only beyond the measured spread; "
              f"validated off the grid; sizes {human_size(m['sizes'][0])} to {human_size(m['sizes'][-1])}"
              + (f"; {note}" if note else ""))
    profile: Dict[str, Any] = {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "name": "tuned",
        "provenance": {
            "machine": machine_words(m["l3"]),
            "date": datetime.date.today().isoformat(),
            "libc": libc_words(),
            "method": method[:MAX_WHY],
        },
        "signature": signature(),
        "regions": regions,
        "parallel": {"threshold": parallel["threshold"], "threads": parallel["threads"], "why": parallel["why"]},
    }
    moved = system.cpu_moved_note(m.get("cpu_distance"))
    if moved:
        profile["notes"] = [moved[:MAX_WHY]]
    return profile


def validate_profile(profile: Any) -> None:
    """Checks ``profile`` (a dict) exactly as loading it would (docs/profile-format.md), against
    this machine's kernels: ValueError names the first problem. The check is the loader's own
    (_core.validate_profile), so tune and import never judge a file differently."""
    try:
        text = json.dumps(profile)
    except (TypeError, ValueError) as e:
        raise ValueError(f"profile: not JSON data: {e}") from None
    try:
        _core.validate_profile(text)
    except ValueError as e:
        raise ValueError(f"profile: {e}") from None


# ----------------------------------------------------------------------------- output

def _range_words(lo: int, hi: Optional[int]) -> str:
    return f"{human_size(lo)} - {human_size(hi) if hi is not None else 'up'}"


def format_profile(profile: Dict[str, Any]) -> str:
    """The profile as a table: per region and class, each band's sizes, kernel and reason."""
    lines = [f"profile '{profile['name']}': {profile['provenance']['machine']}",
             f"  measured {profile['provenance']['date']}, {profile['provenance']['libc']}"]
    for region in REGIONS:
        r = profile["regions"][region]
        lines.append(f"{region}:")
        for cls in CLASSES:
            bands = r[cls]
            for i, b in enumerate(bands):
                hi = bands[i + 1]["from"] if i + 1 < len(bands) else None
                head = f"  {cls:<13}" if i == 0 else " " * 15
                lines.append(f"{head}{_range_words(b['from'], hi):<22} {b['kernel']:<8} {b['why']}")
        nt = r["nt"]
        lines.append(f"  {'nt':<13}" + (f"from {human_size(nt['threshold'])}: {nt['kernel']}"
                                          if nt["threshold"] is not None else "never") + f"  ({nt['why']})")
    par = profile["parallel"]
    lines.append("parallel: " + (f"from {human_size(par['threshold'])} on "
                                 f"{par['threads'] or 'every usable CPU (0)'} threads"
                                 if par["threshold"] is not None else "never") + f"  ({par['why']})")
    return "\n".join(lines)


def format_changes(report: List[Dict[str, Any]], nt: Dict[str, Any], parallel: Dict[str, Any],
                   builtin: Builtin) -> str:
    lines = ["changes against the built-in profile:"]
    kept = [c for c in report if c["kept"]]
    for c in kept:
        v = (f", validated {c['validation_gain']:.2f}x off the grid" if c["validation_gain"] is not None
             else ", not validated (no size off the grid in the band)")
        lines.append(f"  {c['region']:<11} {c['class']:<13} {_range_words(c['from'], c['to']):<22} "
                     f"{c['builtin']} -> {c['new']}: {c['grid_gain']:.2f}x on the grid{v}")
    for c in report:
        if not c["kept"]:
            lines.append(f"  {c['region']:<11} {c['class']:<13} {_range_words(c['from'], c['to']):<22} "
                         f"{c['builtin']} kept: {c['new']} measured {c['grid_gain']:.2f}x on the grid but "
                         f"{c['validation_gain']:.2f}x off it")
    for region in REGIONS:
        if nt[region].get("changed"):
            old = builtin.nt_threshold
            new = nt[region]["threshold"]
            lines.append(f"  {region:<11} non-temporal threshold {human_size(old) if old else 'never'} -> "
                         f"{human_size(new) if new else 'never'}: {nt[region]['why']}")
    if parallel.get("changed"):
        old = builtin.parallel_threshold if builtin.threads > 1 else None
        lines.append(f"  parallel threshold {human_size(old) if old else 'never'} -> "
                     f"{human_size(parallel['threshold']) if parallel['threshold'] else 'never'}, threads "
                     f"{parallel['threads'] or 'all'}: {parallel['why']}")
    if len(lines) == 1:
        lines.append("  none: the built-in profile was as fast as anything measured, within the spread")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- entry points

def busy_warning() -> Optional[str]:
    """Words on other load when the 1-minute load average exceeds half the usable CPUs, else None:
    then the pool and large copies measure contention, not the machine."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if load > cpus / 2:
        return (f"load average {load:.1f} on {cpus} CPUs before measuring: other work shares the machine, "
                "so thread-pool and large-copy figures reflect it; tune on an idle machine for a profile to keep")
    return None


def default_output() -> str:
    from .._profile import cache_path

    return cache_path()


def tune(quick: bool = False, output: Optional[str] = None, grid: Optional[Sequence[int]] = None,
         repeats: Optional[int] = None, min_time: Optional[float] = None, progress: Optional[bool] = None,
         write: bool = True, verbose: bool = False, command: str = "fastcopy.tune()") -> Dict[str, Any]:
    """Measures this machine and returns the profile (docs/profile-format.md); with ``write``, saves
    it to ``output`` (default: the user cache, ``fastcopy._profile.cache_path()``). ``grid``:
    sizes to measure instead of the default grid (for tests and focused runs). ``verbose``:
    print the table and the changes against the built-in profile."""
    # Measure against the built-in profile, not a tuned one loaded at import (a second tune run
    # would otherwise compare with the first one's result); the caller's profile comes back after.
    from .. import _core

    if write and output is not None:
        problem = output_problem(output)
        if problem:
            raise ValueError(f"fastcopy.tune: output {problem}")
    previous = _core.active_profile()
    previous_json, previous_source = _core.active_profile_json(), str(previous.get("source", ""))
    _core.use_builtin_profile("")
    try:
        return _tune(quick, output, grid, repeats, min_time, progress, write, verbose, command)
    finally:
        if previous.get("source") == "built-in":
            _core.use_builtin_profile("")
        else:
            _core.load_profile(previous_json, previous_source)


def _tune(quick: bool, output: Optional[str], grid: Optional[Sequence[int]], repeats: Optional[int],
          min_time: Optional[float], progress: Optional[bool], write: bool, verbose: bool,
          command: str) -> Dict[str, Any]:
    builtin = Builtin()
    sizes = sorted(set(grid)) if grid else size_grid(quick)
    load = busy_warning()
    if load and verbose:
        print(f"warning: {load}", file=sys.stderr)
    cfg = SETTINGS["quick" if quick else "default"]
    bar = engine.Progress(cell_count(sizes) + 8, enabled=progress, delay=0.5)
    t0 = time.monotonic()
    try:
        m = measure(quick=quick, grid=sizes, repeats=repeats, min_time=min_time, progress=bar)
        bands = decide_bands(m, builtin)
        report = validate_changes(m, bands, repeats or int(cfg["repeats"]), min_time or cfg["min_time"], bar,
                                  int(cfg["cold_repeats"]), cfg["cold_min_time"])
        parallel = decide_parallel(m, bands, builtin)
        nt = decide_nt(m, bands, parallel, builtin)
    finally:
        bar.close()
    note = load.split(":")[0] + ": the pool and large copies measured other work too" if load else None
    profile = build_profile(m, bands, nt, parallel, command, note)
    validate_profile(profile)
    if verbose:
        for words in profile.get("notes", []):
            print(f"warning: {words}", file=sys.stderr)
        print(format_profile(profile))
        print()
        print(format_changes(report, nt, parallel, builtin))
        print(f"\nmeasured in {time.monotonic() - t0:.1f} s")
    if write:
        path = output if output is not None else default_output()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_whole(path, json.dumps(profile, indent=1) + "\n")  # readers never see half a file
        if verbose:
            print(f"profile written to {path}")
    return profile


def add_tune_parser(sub: Any) -> argparse.ArgumentParser:
    from .cli import MAX_REPEATS, int_at_least, positive_float, typed

    p = sub.add_parser(
        "tune", help="measure this machine and write a dispatch profile",
        description="Measures every usable kernel over a size grid, each address class and region, the thread "
                    "pool and non-temporal stores; writes the profile to the user cache (docs/benchmarks.md, "
                    "docs/profile-format.md). Hot caches below the L3 size, cold at and above it.")
    p.add_argument("--quick", action="store_true", help="a coarser grid (powers of two, 256 B to 64 MiB), "
                                                        "7 repeats (3 cold): about 10 s of CPU time on 2 CPUs")
    p.add_argument("--output", metavar="FILE",
                   help="write the profile here instead of the user cache: a regular file (replaced whole) or a "
                        "new name in an existing folder; --reset removes it only when it is a fastcopy profile")
    act = p.add_mutually_exclusive_group()
    act.add_argument("--show", action="store_true",
                     help="print the cached profile (or --output FILE) and the policy in force; measure nothing")
    act.add_argument("--reset", action="store_true", help="remove the cached profile (or --output FILE)")
    act.add_argument("--dry-run", action="store_true", dest="dry_run",
                     help="measure and print, write nothing")
    p.add_argument("--grid", type=typed(parse_sizes), metavar="LIST",
                   help="measure only these sizes (bench's syntax, e.g. '256,4K,64K' or '1K:1M:x4'): focused runs "
                        "and tests; the profile then holds decisions for these sizes only")
    p.add_argument("--repeats", type=typed(int_at_least(1)), metavar="N",
                   help=f"interleaved repeats per cell (at most {MAX_REPEATS})")
    p.add_argument("--min-time", type=typed(positive_float), metavar="SECONDS", dest="min_time",
                   help=f"shortest timed loop per sample for hot sizes, above 0 and at most {MAX_MIN_TIME:g} "
                        "seconds (default 0.0002)")
    p.add_argument("--no-progress", action="store_false", dest="progress", default=None,
                   help="no progress bar (it is shown on a terminal only)")
    from .. import _check_module
    _check_module().add_check_arguments(p)
    return p


def _not_a_profile(path: str) -> Optional[str]:
    """Why the file at ``path`` is not a fastcopy profile (JSON with "format": "fastcopy-profile",
    whatever its version), or None when it is one."""
    from .._profile import MAX_PROFILE_BYTES

    try:
        doc = json.loads(read_regular(path, MAX_PROFILE_BYTES))
    except ValueError as e:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        return str(e) if str(e).startswith(path) else f"not JSON: {e}"
    if not isinstance(doc, dict) or doc.get("format") != "fastcopy-profile":
        return 'no "format": "fastcopy-profile"'
    return None


def _show(path: str) -> int:
    import fastcopy
    from .. import _core
    from .._profile import MAX_PROFILE_BYTES

    if os.path.exists(path):
        try:
            profile = json.loads(read_regular(path, MAX_PROFILE_BYTES))  # bounded: the loader's own limit
            validate_profile(profile)
        except (OSError, ValueError) as e:
            print(f"{path}: unusable profile: {e}")
        else:
            print(f"tuned profile {path}:")
            print(format_profile(profile))
    else:
        print(f"no tuned profile at {path} (run python -m fastcopy tune)")
    print()
    active = getattr(_core, "active_profile", None)
    if active is not None:
        print("active profile:")
        print(json.dumps(active(), indent=1, default=str))
    else:
        print("policy in force (fastcopy.info()):")
        for row in fastcopy.info()["policy"]:
            hi = row["max_bytes"]
            print(f"  {row['region']:<11} {_range_words(row['min_bytes'], hi):<22} {row['kernel']:<18} {row['reason']}")
    return 0


def run_cli(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: List[str]) -> int:
    from .cli import subparser

    p = subparser(parser, "tune")
    if args.check:
        from .. import _check_module
        return _check_module().run_check_cli(p, args, argv)
    path = args.output if args.output is not None else default_output()
    # Checked before anything is read, removed or measured: a device, a FIFO (reading it hangs),
    # a directory or a folder such as /proc is refused, never replaced or written into.
    if args.output is not None:
        problem = not_regular(path) if args.show else output_problem(path)
        if problem:
            p.error(f"argument --output: {problem}")
    if args.show:
        return _show(path)
    if args.reset:
        if not os.path.lexists(path):
            print(f"no tuned profile at {path}: nothing to remove")
            return 0
        if args.output is not None:
            why = _not_a_profile(path)
            if why:
                p.error(f"argument --output: {path} is not a fastcopy profile ({why}); --reset removes only profiles")
        try:
            os.remove(path)
        except OSError as e:
            p.error(f"argument --output: cannot remove {path}: {e.strerror or e}")
        print(f"removed {path}")
        return 0
    command = "python -m fastcopy tune" + (" --quick" if args.quick else "")
    try:
        profile = tune(quick=args.quick, grid=args.grid, repeats=args.repeats, min_time=args.min_time,
                       progress=args.progress, write=False, verbose=True, command=command)
    except KeyboardInterrupt:
        print("interrupted; nothing written", file=sys.stderr)
        return 130
    except MemoryError:
        print("python -m fastcopy tune: not enough memory for the largest size (use --grid)", file=sys.stderr)
        return 1
    if args.dry_run:
        return 0
    # Written here rather than by tune(): should the write fail after the measurement (a full
    # disk), the profile goes to stdout instead of being lost.
    text = json.dumps(profile, indent=1) + "\n"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_whole(path, text)  # readers never see half a file
    except OSError as e:
        print(text, end="")
        print(f"python -m fastcopy tune: cannot write {path}: {e.strerror or e}; the profile is on stdout above "
              f"(save it and load it with FASTCOPY_PROFILE=FILE)", file=sys.stderr)
        return 1
    print(f"profile written to {path}")
    return 0
