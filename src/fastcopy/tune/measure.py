"""What ``python -m fastcopy tune`` measures: the grid, the cells and the off-grid validation.

What is measured (docs/benchmarks.md, "Tuning"):

- every usable non-streaming kernel (``fastcopy.kernel(name)``) at every size of a grid (powers
  of two and the midpoints between, 256 B to 256 MiB; ``--quick``: powers of two to 64 MiB), for
  each address class (``page_aligned``: (dst - src) mod 4096 = 0; ``near``: 16 and 31; ``far``:
  64 and 2064; ``backward``: overlapping with dst above src by a drawn shift) and each region (``private``;
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
each band that ``decide.decide_bands`` changed against the built-in choice at sizes off the grid,
on the pool where the built-in profile splits those copies.

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
from .decide import (CLASSES, PARALLEL_MIN_GRID, REGIONS, Builtin, Ratios, Stat, Validation, changed_runs,
                     placement_verdict, pool_change)

# (dst - src) mod 4096 per class: a representative offset (where the built-in choice is read)
# and the range a placement draws its offset from (docs/profile-format.md: near 1..63, far 64..).
CLASS_OFFSETS = {"page_aligned": [0], "near": [16, 31], "far": [64, 2048 + 16]}
CLASS_RANGES = {"page_aligned": (0, 0), "near": (1, 63), "far": (64, 4095), "backward": (0, 0)}
# Hot private cells below this size get fresh numpy allocations per placement (above it, the
# arena: allocating and filling tens of MiB per placement costs more than the copies measured).
FRESH_MAX = 4 << 20

GRID_MIN = 256
GRID_MAX = 256 << 20
QUICK_GRID_MAX = 64 << 20


# Per cell: loops of ``min_time`` (milliseconds: a loop is long against the timer and the call
# overhead), ``repeats`` interleaved repeats per placement, placements (first, most) for the
# sequential rule (``measure_cell``); cold cells (slow to measure) at a fixed number of offsets.
# The held-out check at the end: ``check_points`` private points of ``check_repeats`` repeats, and,
# where tune changed a band of a shared region, ``shared_check_points`` points where the tuned
# and the built-in plans of copies into or out of shared memory differ (``profile.shared_check``).
SETTINGS: Dict[str, Dict[str, Any]] = {
    "default": {"repeats": 3, "min_time": 0.001, "placements": (4, 8), "cold_repeats": 3, "cold_min_time": 0.002,
                "cold_placements": (2, 2), "check_points": 60, "check_repeats": 11, "shared_check_points": 16},
    "quick": {"repeats": 3, "min_time": 0.0005, "placements": (4, 6), "cold_repeats": 2, "cold_min_time": 0.001,
              "cold_placements": (2, 2), "check_points": 24, "check_repeats": 7, "shared_check_points": 8},
}
# The held-out check at the end of tune draws its points with this seed (recorded in the profile):
# points tune never measured, the same ones on every run, so two runs' figures compare.
CHECK_SEED = 20261204


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


def placement_offset(cls: str, rng: random.Random, size: int) -> int:
    """A (dst - src) mod 4096 drawn from the whole of the class's range (``CLASS_RANGES``); for
    ``backward``, the shift dst - src of an overlapping copy of ``size`` bytes, drawn as the
    held-out check draws it (``check.backward_shift``): one fixed shift would judge the class by
    a single distance, and kernels that won there lost at others."""
    if cls == "backward":
        from .check import backward_shift

        return backward_shift(size, rng) if size >= 2 else 0
    lo, hi = CLASS_RANGES.get(cls, (0, 0))
    return rng.randint(lo, hi)


def _placement(memory: SizeMemory, region: str, cls: str, rng: random.Random
               ) -> Tuple[int, List[Tuple[np.ndarray, np.ndarray]]]:
    """(offset, pairs) of one placement: hot private forward copies on fresh numpy allocations
    (check.place: the source at a page offset drawn as malloc may place an array), the rest in ``memory``
    (shared memory, cold rotations, overlapping copies) at an offset drawn from the class, the
    source at a page offset drawn the same way: at one start every placement of such a cell
    would time the same addresses."""
    from .check import array_start, place

    off = placement_offset(cls, rng, memory.size)
    if region == "private" and cls != "backward" and memory.count == 1 and memory.size < FRESH_MAX:
        return off, [place(memory.size, off, rng.randrange(1 << 30))]
    start = array_start(np.random.default_rng(rng.randrange(1 << 30)))
    return off, memory.pairs(region, off, backward=cls == "backward", start=start)


def measure_cell(variants: Dict[str, Callable[[Any, Any], Any]], memory: SizeMemory, region: str, cls: str,
                 repeats: int, min_time: float, rng: random.Random, placements: Tuple[int, int] = (1, 1),
                 incumbent: Optional[str] = None) -> Dict[str, Stat]:
    """Throughput of each variant for one (size, region, class) over buffer placements: per
    placement (a fresh allocation or offset, ``_placement``) the variants interleaved in a new order
    each of ``repeats`` repeats, medians. ``placements`` = (first, most): after the first, another
    placement is measured while ``decide.placement_verdict`` of the leader against ``incumbent`` is
    "open" (neither a win nor a tie yet), up to the most. A variant scores the geometric mean of its
    per-placement medians (one that collapses at some placements must not hide in a median of mixed
    samples), the median of its per-placement spreads, and the medians themselves ("placements")."""
    first_n, most = placements
    names: List[str] = []
    iterations = 0
    samples: Dict[str, List[List[float]]] = {}
    while True:
        off, pairs = _placement(memory, region, cls, rng)
        if not names:
            ok = {name: _check(f, pairs, cls == "backward") for name, f in variants.items()}
            names = [k for k in variants if ok[k]]
            samples = {k: [] for k in names}
        timers = {k: _timer(variants[k], pairs) for k in names}
        if not iterations:
            first = timers[names[0]]
            if memory.count > 1 or memory.size >= 4 << 20:
                # large copies: one pass over the rotation warms up and times in one go
                per_copy = first(memory.count) / memory.count
                iterations = max(memory.count, math.ceil(min_time / max(per_copy, 1e-9)))
            else:
                iterations = engine.calibrate(first, min_time)
        here: Dict[str, List[float]] = {k: [] for k in names}
        for _ in range(max(repeats, 1)):
            got = engine.time_interleaved(timers, iterations, 1, rng)
            for k, v in got.items():
                here[k].append(memory.size / v[0] / 1e9)
        for k in names:
            samples[k].append(here[k])
        n = len(samples[names[0]])
        if n >= most or n < first_n:
            if n >= most:
                break
            continue
        if incumbent is None or incumbent not in samples:
            break
        leader = max(names, key=lambda k: statistics.geometric_mean([statistics.median(v) for v in samples[k]]))
        if leader == incumbent:
            break
        ratios = [statistics.median(a) / statistics.median(b) for a, b in zip(samples[leader], samples[incumbent])]
        if placement_verdict(ratios, most) != "open":
            break
    out: Dict[str, Stat] = {}
    for k in names:
        medians = [statistics.median(v) for v in samples[k]]
        # the median of the per-placement spreads: one placement's preempted repeat does not make the
        # whole cell a tie (the sign test over the placements judges how placement-dependent it is)
        out[k] = {"gbps": statistics.geometric_mean(medians),
                  "spread": statistics.median(engine.spread(v) for v in samples[k]), "placements": medians}
    return out


# ----------------------------------------------------------------------------- the measurement

def measure(quick: bool = False, grid: Optional[Sequence[int]] = None, repeats: Optional[int] = None,
            min_time: Optional[float] = None, progress: Optional[engine.Progress] = None,
            thread_counts: Optional[Sequence[int]] = None, builtin: Optional[Builtin] = None) -> Dict[str, Any]:
    """Every measurement tune decides from, as plain data (see ``decide``). ``builtin``: the
    built-in choices, the incumbent of each cell's sequential rule (None: the first placements only)."""
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
                       wide, cache_of, rng, progress, builtin, lambda: probes.append(system.cache_line_round_trip(pair)))
    finally:
        arena.close()
    return {"sizes": sizes, "cells": cells, "wide": wide, "cache": cache_of, "plain": plain,
            "streaming": streaming, "threads": list(thread_counts), "l2": l2, "l3": l3,
            "repeats": reps, "min_time": hot_time, "quick": quick, "placements": list(cfg["placements"]),
            "cpu_distance": system.cpu_distance_record(pair, probes)}


def _measure_sizes(sizes: Sequence[int], arena: Arena, l3: int, cfg: Dict[str, Any], reps: int, hot_time: float,
                   repeats: Optional[int], plain: List[str], streaming: List[str],
                   kernels: Dict[str, Callable[[Any, Any], Any]],
                   pooled: Dict[Tuple[str, int], Callable[[Any, Any], Any]], cells: Dict[str, Any],
                   wide: Dict[str, Dict[str, Stat]], cache_of: Dict[str, str], rng: random.Random,
                   progress: Optional[engine.Progress], builtin: Optional[Builtin], probe: Callable[[], None]) -> None:
    for size in sizes:
        probe()  # how far apart the first two CPUs are now (the pool's gain depends on it)
        cold = size >= l3
        cache_of[str(size)] = "cold" if cold else "hot"
        count = engine.cold_rotation_count(size, l3) if cold else 1
        # cold and large copies (no fresh allocations: the placements differ by their offset only,
        # and one copy takes milliseconds) at the cold settings' placements and repeats
        large = cold or size >= FRESH_MAX
        reps_here = int(cfg["cold_repeats"]) if large and not repeats else reps
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
                    res = measure_cell(variants, mem, region, cls, reps_here, t_here, rng,
                                       cfg["cold_placements"] if large else cfg["placements"],
                                       builtin.kernel(region, cls, size) if builtin is not None else None)
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
                      cold_min_time: float = 0.004, builtin: Optional[Builtin] = None,
                      placements: Tuple[int, int] = (4, 8), cold_placements: Tuple[int, int] = (2, 2)) -> Ratios:
    """Times the new kernel of every changed run of ``bands`` (``decide.changed_runs``) against the
    built-in one at sizes off the grid: two per run below the L3, hot, each at ``placements``
    (first, most: as many as a grid cell gets, so that the sign test over them can call a win;
    more than the first while it is open); one at and above it, cold, at ``cold_placements``
    (too few for the sign test: a cold copy takes milliseconds).
    Where ``builtin`` splits a copy across the pool (``uses_pool``; never an
    overlapping one), both kernels are timed on its threads, as those copies run: a kernel that
    wins on one thread can lose split (evidence: tune-validate-split-copies-split).
    Returns the speed ratios (new / built-in) per run, with each hot size's ratio per
    placement, for ``decide.apply_validation``."""
    import fastcopy

    rng = random.Random(7)
    out: Ratios = {}

    def as_run(kernel: str, size: int, cls: str) -> Callable[[Any, Any], Any]:
        if builtin is not None and cls != "backward" and builtin.uses_pool(size):
            return fastcopy.kernel(kernel, builtin.threads)
        return fastcopy.kernel(kernel)

    for region in REGIONS:
        for cls in CLASSES:
            points = bands[region][cls]
            for i, _, lo, hi, new, old in changed_runs(points):
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
                        res = measure_cell({new: as_run(new, s, cls), old: as_run(old, s, cls)}, mem, region, cls,
                                           cold_repeats if cold else repeats,
                                           cold_min_time if cold else min_time, rng,
                                           cold_placements if cold else placements, old)
                    finally:
                        mem.close()
                    if new in res and old in res:
                        each = () if cold else tuple(a / b for a, b in zip(res[new]["placements"],
                                                                          res[old]["placements"]))
                        ratios.append(Validation(s, res[new]["gbps"] / res[old]["gbps"], each))
                    if progress is not None:
                        progress.step(f"validate {region} {cls} {human_size(s)}")
                out[(region, cls, i)] = ratios
    return out


def pool_validation_ratios(m: Dict[str, Any], bands: Dict[str, Any], parallel: Dict[str, Any], builtin: Builtin,
                           repeats: int, min_time: float, progress: Optional[engine.Progress] = None
                           ) -> List[Tuple[int, float]]:
    """Times the plan of a pool threshold that changes the built-in one (``decide.pool_change``)
    against the built-in plan at two sizes off the grid inside the change and below the L3:
    the private far band kernel at that size split across the pool's threads against it on one
    thread, on fresh placements at offsets drawn from the far class (not the grid's page-aligned
    ones). Returns (size, the new plan's speed / the built-in plan's), for
    ``decide.apply_parallel_validation``."""
    import fastcopy

    change = pool_change(parallel, builtin)
    if change is None:
        return []
    threads = parallel["threads"] or builtin.threads
    top = min(m["sizes"][-1] + m["sizes"][-1] // 8, m["l3"] - 1)
    sizes = [s for s in validation_sizes(change.lo, change.hi) if s <= top]
    rng = random.Random(11)
    out: List[Tuple[int, float]] = []
    for s in sizes:
        kernel = [p for p in bands["private"]["far"] if p["size"] <= s][-1]["kernel"]
        plans = {"split": fastcopy.kernel(kernel, threads), "one": fastcopy.kernel(kernel)}
        new, old = ("split", "one") if change.pool else ("one", "split")
        mem = SizeMemory(s, 1, shared=False)
        try:
            res = measure_cell(plans, mem, "private", "far", repeats, min_time, rng, (2, 4), incumbent=old)
        finally:
            mem.close()
        if new in res and old in res:
            out.append((s, res[new]["gbps"] / res[old]["gbps"]))
        if progress is not None:
            progress.step(f"validate the pool at {human_size(s)}")
    return out
