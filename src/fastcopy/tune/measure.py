"""What ``python -m fastcopy tune`` measures: the grid, the cells and the off-grid validation.

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
spreads (``engine.spread``), for ``fastcopy.tune.decide`` to judge. The validation pass times
each band that ``decide.decide_bands`` changed against the built-in choice at sizes off the grid.

Everything here is timing; what the measurements mean is decided in ``decide``.
"""

from __future__ import annotations

import math
import random
import statistics
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import _core
from ..bench import engine, system
from ..bench.engine import Arena, SizeMemory, slot_bytes
from ..bench.units import human_size
from .decide import CLASSES, PARALLEL_MIN_GRID, REGIONS, Ratios, Stat, changed_runs

# (dst - src) mod 4096 per class; a cell cycles through its offsets, one per repeat.
CLASS_OFFSETS = {"page_aligned": [0], "near": [16, 31], "far": [64, 2048 + 16]}

GRID_MIN = 256
GRID_MAX = 256 << 20
QUICK_GRID_MAX = 64 << 20


# Loop length per sample (hot) and repeats; quick uses fewer. Many short samples rather than a
# few long ones: on a shared machine a sample that another process preempts runs several times
# slower, and short loops are hit less often, so their medians agree from run to run
# (evidence: tune-short-samples).
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


# ----------------------------------------------------------------------------- one cell

def _timer(copy: Callable[[Any, Any], Any], pairs: List[Tuple[np.ndarray, np.ndarray]]) -> engine.Timer:
    if len(pairs) == 1:
        return engine.loop_timer(copy)(*pairs[0])
    return engine.rotating_timer(copy)(pairs)


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
    per_offset = {off: memory.pairs(region, off, backward=cls == "backward") for off in offsets}
    ok = {name: _check(f, per_offset[offsets[0]], cls == "backward") for name, f in variants.items()}
    names = [k for k in variants if ok[k]]
    timers = {off: {k: _timer(variants[k], pairs) for k in names} for off, pairs in per_offset.items()}
    first = timers[offsets[0]][names[0]]
    if memory.count > 1 or memory.size >= 4 << 20:
        # large copies: one pass over the rotation warms up and times in one go
        per_copy = first(memory.count) / memory.count
        iterations = max(memory.count, math.ceil(min_time / max(per_copy, 1e-9)))
    else:
        iterations = engine.calibrate(first, min_time)
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


# ----------------------------------------------------------------------------- validation pass

def validation_ratios(m: Dict[str, Any], bands: Dict[str, Any], repeats: int, min_time: float,
                      progress: Optional[engine.Progress] = None, cold_repeats: int = 3,
                      cold_min_time: float = 0.004) -> Ratios:
    """Times the new kernel of every changed run of ``bands`` (``decide.changed_runs``) against the
    built-in one at sizes off the grid: two per run below the L3, hot; one at and above it, cold.
    Returns the speed ratios (new / built-in) per run, for ``decide.apply_validation``."""
    import fastcopy

    rng = random.Random(7)
    out: Ratios = {}
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
                    sizes = sizes[:1]  # cold sizes are slow to measure: one point per run
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
                out[(region, cls, i)] = ratios
    return out
