"""Held-out check of the dispatch profile: ``python -m fastcopy tune --check`` and
``fastcopy.check_dispatch()``.

The check measures the active profile (``fastcopy.copy``) against every usable kernel forced
(``fastcopy.kernel(name)``; from ``POOL_VARIANTS_FROM``, or the profile's parallel threshold if
lower, also each kernel on the thread pool) and ``np.copyto``, at points it draws at random
rather than at the sizes and offsets a profile was tuned on:

- sizes log-uniform from ``min_size`` to ``max_size`` (64 B to 4 MiB by default);
- (dst - src) mod 4096 from the whole 0..4095 range, a share of the points from 1..255 (where
  ``rep movsb`` collapses on some CPUs) and a share at 0 (page-aligned);
- a share of overlapping copies with dst inside (src, src + size) (the profile's ``backward``
  class), half of them at a shift of 1..255 bytes;
- each point on fresh numpy allocations, the source starting at a page offset drawn in steps
  of 16 bytes (where malloc may put an array), with the same buffers for every variant of that
  point (hot caches);
- in PASSES (three) passes over all the points, each point measured in each pass on fresh
  allocations with a third of the repeats, so that a disturbance of the machine lasting
  seconds reaches only a third of a point's repeats, and a point is judged over three
  placements; a point whose ratio interval is still wide after them (more than WIDE_INTERVAL,
  high / low) gets up to EXTRA_PASSES more, one at a time, until it narrows;
- with ``cold`` (sizes from 1 MiB), each variant timed one copy at a time instead, each copy
  after writing a buffer of twice the last-level cache, so that neither buffer is cached: the
  state of an array a program has not touched for a while;
- each variant timed in loops of at least 3 copies lasting at least ``min_time`` seconds, after
  untimed calibration loops, and where loops hold few copies (large sizes) every variant of a
  point runs the same count, so neither the timer nor the first copy after another variant
  weighs; the variants interleaved in a new order every repeat; medians. A loop during which
  this thread was not running (its CPU time under 90 % of the wall time: the OS ran another
  job) is run again, up to three times.

Per point: ratio = median time of the best other variant / median time of ``fastcopy.copy``
(1.0: the profile picked the fastest; above 1: it beat every single alternative, e.g. with the
thread pool), with a bootstrap confidence interval over the paired repeats, and the variant that
won. The best other variant is chosen on half of the repeats and timed against ``fastcopy.copy``
on the other half (both ways, over random halvings): choosing the fastest of a dozen noisy
medians and judging it on the same samples would pick lucky samples and put the ratio low even
where every variant runs the same code. Over all points: the geometric mean of the ratios with a
bootstrap interval over the points, and the lowest points.
"""
from __future__ import annotations

import math
import os
import platform
import random
import sys
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .decide import PARALLEL_MIN_GRID, point_class

PAGE = 4096
DEFAULT_POINTS = 60
DEFAULT_REPEATS = 15
DEFAULT_MIN_TIME = 0.0005  # seconds per timed loop
# A loop is run again (at most RERUNS times) when this thread got under RUNNING_SHARE of its wall time.
RUNNING_SHARE = 0.9
RERUNS = 3
# Where malloc puts a numpy array's data: a multiple of this many bytes (glibc on x86-64 and
# aarch64), so where a placement's source starts in its page is drawn in these steps.
ARRAY_ALIGNMENT = 16
MIN_SIZE = 64
MAX_SIZE = 4 << 20
NEAR_SHARE = 0.4     # of the offsets drawn from 1..255
ALIGNED_SHARE = 0.1  # of the offsets at 0 (page-aligned); the rest from 0..4095
BACKWARD_SHARE = 0.15  # of the points: overlapping copies, dst = src + shift inside the source
NEAR_MAX = 255
CONFIDENCE = 0.95
RESAMPLES = 2000
# Random halvings of the repeats the ratio is averaged over (held_out_ratio).
SPLITS = 64
# Passes over all the points, each measuring every point on fresh buffers (a placement of its
# own) with a third of the repeats: a disturbance of a few seconds (the host running another
# guest on a vCPU, or moving one) then reaches a third of a point's repeats, which its medians
# outlast, where in one pass it could reach all of them. The later passes time the loops the
# first one calibrated (its correctness copies warm the fresh buffers), so the passes cost
# little more than one (evidence: check-passes).
PASSES = 3
# A point whose ratio interval spans more than WIDE_INTERVAL (high / low) after the passes is
# measured in up to EXTRA_PASSES more, one at a time, each on fresh buffers with a pass's share
# of the repeats, until its interval narrows: at the thread pool's sizes on a 2-vCPU VM one
# variant's loops ran 25-90 GB/s from repeat to repeat (where the host runs the second vCPU),
# so 15 repeats put single points 10-15 % low or high by chance. Which points get more passes
# depends on the width of the interval only, not on which side of 1 the ratio lies, so the
# extra repeats move no point up or down on purpose (evidence: check-wide-points).
WIDE_INTERVAL = 1.25
EXTRA_PASSES = 3
LOWEST_SHOWN = 5
AUTO = "auto"
COPYTO = "np.copyto"
# Calibration doubles the iterations until a loop lasts min_time; this many doublings at most.
MAX_DOUBLINGS = 40
# The fewest copies in one timed loop of a hot point, and up to how many copies per loop every
# variant of a point runs the same count (loop_copies; evidence: large-copies-hot-cold-zen4).
MIN_LOOP_COPIES = 3
EQUAL_LOOPS_UP_TO = 64
# Cold points: one copy per sample, so a call's own cost (up to about a microsecond through
# Python) must stay small against the copy: from 1 MiB it is under 2 % at the 15-21 GB/s of an
# uncached copy (evidence: large-copies-hot-cold-zen4).
COLD_MIN_SIZE = 1 << 20
# The buffer written before each cold copy: this many times the last-level cache (at least
# COLD_EVICT_MIN_BYTES when the cache size is unknown).
COLD_EVICT_FACTOR = 2
COLD_EVICT_MIN_BYTES = 64 << 20


# ---- the points -------------------------------------------------------------------------
class Point(NamedTuple):
    """One point of the check: ``size`` bytes; a forward copy at (dst - src) mod 4096 = ``offset``
    on separate buffers, or (``overlap``) a copy inside one buffer with dst = src + ``offset``,
    0 < offset < size (the profile's backward class)."""

    size: int
    offset: int
    overlap: bool = False


def draw_points(count: int, seed: int, min_size: int = MIN_SIZE, max_size: int = MAX_SIZE,
                near_share: float = NEAR_SHARE, aligned_share: float = ALIGNED_SHARE,
                backward_share: float = BACKWARD_SHARE) -> List[Point]:
    """``count`` points drawn with ``random.Random(seed)``: sizes log-uniform in [min_size,
    max_size]; with probability ``backward_share`` (sizes of 2 B or more) an overlapping copy
    shifted by 1..min(255, size - 1) bytes or, as often, by 1..size - 1; else a forward copy at
    (dst - src) mod 4096 in 1..255 with probability ``near_share``, 0 with ``aligned_share``, else
    uniform in 0..4095. The same arguments give the same points."""
    if count < 1:
        raise ValueError(f"points must be at least 1, got {count}")
    if not 1 <= min_size <= max_size:
        raise ValueError(f"sizes must satisfy 1 <= min_size <= max_size, got {min_size} and {max_size}")
    if not (0 <= near_share and 0 <= aligned_share and near_share + aligned_share <= 1):
        raise ValueError("near_share and aligned_share must be at least 0 and add up to at most 1")
    if not 0 <= backward_share <= 1:
        raise ValueError(f"backward_share must be between 0 and 1, got {backward_share}")
    rng = random.Random(seed)
    lo, hi = math.log(min_size), math.log(max_size)
    points = []
    for _ in range(count):
        size = min(max_size, max(min_size, int(round(math.exp(rng.uniform(lo, hi))))))
        if rng.random() < backward_share and size >= 2:
            points.append(Point(size, backward_shift(size, rng), True))
            continue
        u = rng.random()
        if u < near_share:
            offset = rng.randint(1, NEAR_MAX)
        elif u < near_share + aligned_share:
            offset = 0
        else:
            offset = rng.randint(0, PAGE - 1)
        points.append(Point(size, offset))
    return points


def backward_shift(size: int, rng: random.Random) -> int:
    """How far above its source an overlapping copy of ``size`` (>= 2) bytes writes: 1..min(255,
    size - 1) or, as often, 1..size - 1 (the check's overlapping points and tune's backward
    placements draw it here)."""
    top = min(NEAR_MAX, size - 1) if rng.random() < 0.5 else size - 1
    return rng.randint(1, top)


# ---- statistics (pure functions) ----------------------------------------------------------
def geomean(values: Sequence[float]) -> float:
    """The geometric mean of positive numbers."""
    if not values or min(values) <= 0:
        raise ValueError("geomean needs at least one value, all positive")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _percentile_interval(estimates: np.ndarray, level: float) -> Tuple[float, float]:
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(estimates, [tail, 100.0 - tail])
    return float(lo), float(hi)


def ratio_ci(auto_times: Sequence[float], best_times: Sequence[float], level: float = CONFIDENCE,
             resamples: int = RESAMPLES, seed: int = 0) -> Tuple[float, float, float]:
    """(median(best) / median(auto), low, high): the ratio of medians of two paired samples (the
    i-th time of each comes from the same interleaved repeat) and its percentile bootstrap
    interval at ``level``, resampling the repeats in pairs."""
    a, b = np.asarray(auto_times, float), np.asarray(best_times, float)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError("ratio_ci needs two samples of the same non-zero length")
    estimate = float(np.median(b) / np.median(a))
    idx = np.random.default_rng(seed).integers(0, a.size, size=(resamples, a.size))
    ratios = np.median(b[idx], axis=1) / np.median(a[idx], axis=1)
    lo, hi = _percentile_interval(ratios, level)
    return estimate, min(lo, estimate), max(hi, estimate)


def geomean_ci(ratios: Sequence[float], level: float = CONFIDENCE, resamples: int = RESAMPLES,
               seed: int = 0) -> Tuple[float, float, float]:
    """(geometric mean, low, high): the percentile bootstrap interval of the geometric mean at
    ``level``, resampling the points (how much the figure depends on which points were drawn)."""
    values = np.asarray(ratios, float)
    if values.ndim != 1 or values.size == 0 or not np.all((values > 0) & np.isfinite(values)):
        raise ValueError("geomean_ci needs at least one ratio, all positive and finite")
    logs = np.log(values)
    estimate = float(np.exp(logs.mean()))
    idx = np.random.default_rng(seed).integers(0, logs.size, size=(resamples, logs.size))
    lo, hi = _percentile_interval(np.exp(logs[idx].mean(axis=1)), level)
    return estimate, min(lo, estimate), max(hi, estimate)


# ---- measuring one point ----------------------------------------------------------------
def array_start(rng: np.random.Generator) -> int:
    """Where in its page a numpy array's data may start, drawn from ``rng``: a multiple of
    ARRAY_ALIGNMENT below PAGE, as malloc places numpy's arrays."""
    return ARRAY_ALIGNMENT * int(rng.integers(0, PAGE // ARRAY_ALIGNMENT))


def place(size: int, offset: int, fill_seed: int, overlap: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """(dst, src): fresh numpy allocations of ``size`` bytes with (dst - src) mod 4096 = offset,
    src filled with random bytes; with ``overlap``, two views of one fresh allocation of
    size + offset bytes, dst = src + offset. Where src starts in its page is drawn from
    ``fill_seed``: a multiple of ARRAY_ALIGNMENT, as malloc places numpy's arrays. Left to the
    allocator, buffers freed and allocated again come back at the same address, so every pass
    of a point (and every small point) would be timed at one placement (evidence:
    check-placements-drawn)."""
    rng = np.random.default_rng(fill_seed)
    src_start = array_start(rng)
    if overlap:
        if not 0 < offset < size:
            raise ValueError(f"an overlapping point needs 0 < offset < size, got offset {offset} at {size} B")
        raw = _starting_at(size + offset, src_start)
        raw[...] = rng.integers(0, 256, size=size + offset, dtype=np.uint8)
        return raw[offset:offset + size], raw[:size]
    src = _starting_at(size, src_start)
    src[...] = rng.integers(0, 256, size=size, dtype=np.uint8)
    dst = _starting_at(size, (src_start + offset) % PAGE)
    assert (dst.ctypes.data - src.ctypes.data) % PAGE == offset
    return dst, src


def _starting_at(size: int, page_offset: int) -> np.ndarray:
    """``size`` bytes of a fresh numpy allocation, starting ``page_offset`` bytes into a page."""
    raw = np.empty(size + PAGE, np.uint8)
    start = (page_offset - raw.ctypes.data) % PAGE
    return raw[start:start + size]


# Each kernel is also timed on the thread pool from this size (or from the profile's parallel
# threshold where that is lower), whatever the profile's threshold: a profile that splits too
# late is judged against the split copies it does not make. The size from which tune measures
# the pool.
POOL_VARIANTS_FROM = PARALLEL_MIN_GRID


def variants_for(size: int) -> Dict[str, Callable[[Any, Any], Any]]:
    """The variants timed at ``size``: auto, every usable kernel forced, np.copyto, and from
    POOL_VARIANTS_FROM or the parallel threshold, whichever is lower (when more than one thread
    is set), each kernel on the pool as well."""
    import fastcopy

    out: Dict[str, Callable[[Any, Any], Any]] = {AUTO: fastcopy.copy}
    names = fastcopy.kernels()
    for name in names:
        out[name] = fastcopy.kernel(name)
    out[COPYTO] = np.copyto
    threads = fastcopy.get_threads()
    parallel_from = fastcopy._core.parallel_threshold()
    pool_from = POOL_VARIANTS_FROM if parallel_from is None else min(parallel_from, POOL_VARIANTS_FROM)
    if threads > 1 and size >= pool_from:
        for name in names:
            out[f"{name} x{threads}"] = fastcopy.kernel(name, threads)
    return out


def _loop(f: Callable[[Any, Any], Any], dst: np.ndarray, src: np.ndarray, n: int) -> Tuple[float, float]:
    """(wall seconds, this thread's CPU seconds) of ``n`` calls ``f(dst, src)``."""
    clock, cpu = time.perf_counter, time.thread_time
    c0, t0 = cpu(), clock()
    for _ in range(n):
        f(dst, src)
    t1, c1 = clock(), cpu()
    return t1 - t0, c1 - c0


def _calibrate(f: Callable[[Any, Any], Any], dst: np.ndarray, src: np.ndarray, min_time: float) -> int:
    """Iterations for a loop of at least ``min_time`` (the loops run here also warm up)."""
    n = 1
    for _ in range(MAX_DOUBLINGS):
        elapsed = _loop(f, dst, src, n)[0]
        if elapsed >= min_time:
            return n
        n = n * 2 if elapsed <= 0 else max(n * 2, int(n * min_time * 1.2 / elapsed) + 1)
    return n


def loop_copies(fns: Sequence[Callable[[Any, Any], Any]], dst: np.ndarray, src: np.ndarray,
                min_time: float) -> List[int]:
    """Copies per timed loop of each variant: enough for its loop to last ``min_time``, at least
    MIN_LOOP_COPIES; where every variant needs at most EQUAL_LOOPS_UP_TO, all run the largest
    count. The first copy of a loop finds the caches as the variant before it left them (a
    streaming one evicts the destination): in loops of a few copies a variant given fewer
    copies would pay that more often. In loops of many copies it weighs nothing, and one count
    for all would make the slowest calls' loops many times longer."""
    counts = [max(MIN_LOOP_COPIES, _calibrate(f, dst, src, min_time)) for f in fns]
    return [max(counts)] * len(counts) if max(counts) <= EQUAL_LOOPS_UP_TO else counts


def _timed(f: Callable[[Any, Any], Any], dst: np.ndarray, src: np.ndarray, n: int) -> Tuple[float, int]:
    """(seconds per copy, loops run again): a loop during which the OS ran another thread in
    this one's place (CPU time under RUNNING_SHARE of the wall time) is run again, up to
    RERUNS times: on a machine shared with other jobs such loops ran 2-3 times slower whole."""
    for again in range(RERUNS + 1):
        wall, cpu = _loop(f, dst, src, n)
        if cpu >= RUNNING_SHARE * wall:
            break
    return wall / n, again


def evict_bytes() -> int:
    """How many bytes a cold point writes before each copy: COLD_EVICT_FACTOR times the
    last-level cache this process detected (sysfs before CPUID), at least COLD_EVICT_MIN_BYTES."""
    from .. import _core

    facts = _core.cpu_facts()
    llc = facts.get("l3_bytes") or facts.get("l2_bytes") or 0
    return max(COLD_EVICT_FACTOR * int(llc), COLD_EVICT_MIN_BYTES)


class Evictor:
    """Writes ``nbytes`` of scratch memory, copied from as many other bytes, on every thread the
    pool copies with: the last-level cache and each worker's own caches then hold none of a
    point's buffers (a pool variant's workers would otherwise keep their chunks of the last copy)."""

    def __init__(self, nbytes: int):
        import fastcopy

        self.nbytes = nbytes
        self.dst = np.zeros(nbytes, np.uint8)
        self.src = np.ones(nbytes, np.uint8)
        threads = fastcopy.get_threads()
        self.copy = fastcopy.kernel("generic", threads) if threads > 1 else np.copyto

    def __call__(self) -> None:
        self.copy(self.dst, self.src)


def _timed_cold(f: Callable[[Any, Any], Any], dst: np.ndarray, src: np.ndarray,
                evict: Callable[[], None]) -> Tuple[float, int]:
    """(seconds, copies run again): one copy right after ``evict()`` (neither buffer is then
    cached), run again like ``_timed`` when the thread lost its CPU during it."""
    for again in range(RERUNS + 1):
        evict()
        wall, cpu = _loop(f, dst, src, 1)
        if cpu >= RUNNING_SHARE * wall:
            break
    return wall, again


def measure_point(size: int, offset: int, repeats: int, min_time: float, rng: random.Random,
                  overlap: bool = False, evict: Optional[Callable[[], None]] = None,
                  loops: Optional[Dict[str, int]] = None) -> Dict[str, Any]:
    """Times every variant at one point on fresh buffers; seconds per copy, one per repeat.
    With ``evict`` (a cold point), each sample is one copy right after ``evict()``. ``loops``:
    the copies per timed loop of each variant ("iterations" of an earlier measurement of the
    point), instead of calibrating them here."""
    from .. import _core

    dst, src = place(size, offset, rng.randrange(1 << 30), overlap)
    variants = variants_for(size)
    original = src.copy()
    for name, f in variants.items():  # a variant that copies wrong bytes must not win
        if overlap:
            src[...] = original  # dst's bytes outside src change with it
        else:
            dst.fill(0)
        if evict is not None and name == AUTO:
            # auto's copies teach the run-time learners (store mode, split): on a cold point this
            # one runs cold too. A hot copy here, several times faster with cached stores, would
            # raise the cached rate at the start of every pass by more than the pass's few cold
            # copies bring it down, and hold the point on cached stores (evidence:
            # check-cold-first-copy).
            evict()
        f(dst, src)
        if not np.array_equal(dst, original):
            raise RuntimeError(f"fastcopy check: {name} copied wrong bytes at {size} B, offset {offset}"
                               + (" (overlapping)" if overlap else ""))
    if evict is not None:
        loops = {name: 1 for name in variants}
    elif loops is None:
        loops = dict(zip(variants, loop_copies(list(variants.values()), dst, src, min_time)))
    samples: Dict[str, List[float]] = {name: [] for name in variants}
    reruns = 0
    order = list(variants)
    for _ in range(repeats):
        rng.shuffle(order)
        for name in order:
            if evict is None:
                seconds, again = _timed(variants[name], dst, src, loops[name])
            else:
                seconds, again = _timed_cold(variants[name], dst, src, evict)
            samples[name].append(seconds)
            reruns += again

    def on_pool(kernel: str) -> str:  # " xN"
        pool = [name for name in variants if name.startswith(kernel + " x")]
        return pool[0] if pool else kernel

    def ran(kernel: str, split: bool) -> str:
        return on_pool(kernel) if split else kernel

    return {"size": size, "offset": offset, "overlap": overlap, "src_page_offset": src.ctypes.data % PAGE,
            "dst_page_offset": dst.ctypes.data % PAGE,
            # the profile's kernel, on the pool where the profile splits the copy (from its
            # parallel threshold; overlapping copies never split)
            "picked": ran(_core.chosen_kernel(dst.ctypes.data, src.ctypes.data, size),
                          _core.chosen_split(dst.ctypes.data, src.ctypes.data, size)),
            # the kernel fastcopy.copy runs after the repeats: where copies learn their store
            # mode (the profile's nt.learn_from), the band's or the NT kernel, as learned; on the
            # pool where copies split now (from the parallel threshold, as learned)
            "ran": ran(_core.learned_kernel(dst.ctypes.data, src.ctypes.data, size),
                       _core.learned_split(dst.ctypes.data, src.ctypes.data, size)),
            "iterations": loops, "reruns": reruns, "seconds": samples}


def pass_repeats(repeats: int) -> List[int]:
    """The repeats of each of the PASSES passes: ``repeats`` shared out, the first passes
    taking one more where it does not divide (a pass may get none)."""
    return [repeats // PASSES + (k < repeats % PASSES) for k in range(PASSES)]


def merge_placements(parts: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """One point from its measurements on several placements (measure_point, in the order
    taken): every variant's samples in that order (each repeat's samples stay paired), the
    loops run again summed, the first placement's page offsets and pick, the last one's kernel
    auto ran, and each placement's own in ``placements``."""
    point = dict(parts[0])
    point["seconds"] = {name: [t for p in parts for t in p["seconds"][name]] for name in parts[0]["seconds"]}
    point["reruns"] = sum(p["reruns"] for p in parts)
    point["ran"] = parts[-1]["ran"]
    point["placements"] = [{key: p[key] for key in ("src_page_offset", "dst_page_offset", "picked", "ran",
                                                    "iterations")} for p in parts]
    return point


def held_out_ratio(auto_times: Sequence[float], others: Dict[str, Sequence[float]], level: float = CONFIDENCE,
                   resamples: int = RESAMPLES, splits: int = SPLITS, seed: int = 0) -> Tuple[float, float, float]:
    """(ratio, low, high): how fast auto is against the best other variant, with the best chosen
    on repeats the ratio is not measured on. The paired repeats (the i-th time of every variant
    comes from the same interleaved round) are split in two halves; the variant with the lowest
    median on one half is timed against auto on the other half, and the other way round:
    ratio = its median time / auto's median time there. The geometric mean of both directions,
    averaged over ``splits`` random splits, is the estimate; the interval is the percentile
    bootstrap over the repeats, resampled in rounds. Choosing and judging on the same repeats
    would favour whichever variant had lucky samples: with ten variants as fast as auto, the
    same-sample ratio of the fastest median comes out below 1."""
    a = np.asarray(auto_times, float)
    t = np.asarray([others[name] for name in others], float)
    if a.ndim != 1 or a.size < 2 or t.ndim != 2 or t.shape[1] != a.size:
        raise ValueError("held_out_ratio needs at least two repeats of auto and of every other variant, paired")
    rng = np.random.default_rng(seed)
    rounds = a.size

    def log_ratio(idx: np.ndarray) -> np.ndarray:
        # idx: (n, rounds) repeat indices, each row one resample or split; its first half judges
        # the choice its second half makes, and the other way round.
        half = rounds // 2
        first, second = idx[:, :half], idx[:, half:]
        total = np.zeros(idx.shape[0])
        for choose, judge in ((first, second), (second, first)):
            chosen = np.argmin(np.median(t[:, choose], axis=2), axis=0)
            judged = np.median(t[:, judge], axis=2)[chosen, np.arange(idx.shape[0])]
            total += np.log(judged / np.median(a[judge], axis=1))
        return total / 2

    split_rows = np.argsort(rng.random((splits, rounds)), axis=1)
    estimate = float(np.exp(log_ratio(split_rows).mean()))
    boot = np.exp(log_ratio(rng.integers(0, rounds, size=(resamples, rounds))))
    lo, hi = _percentile_interval(boot, level)
    return estimate, min(lo, estimate), max(hi, estimate)


def judge_point(point: Dict[str, Any], level: float = CONFIDENCE, seed: int = 0) -> Dict[str, Any]:
    """Adds to a measured point: medians (seconds and GB/s), the winner (the variant other than
    auto with the lowest median), and the ratio of auto to the best other variant with its
    interval, chosen and judged on different repeats (``held_out_ratio``)."""
    seconds = point["seconds"]
    medians = {name: float(np.median(s)) for name, s in seconds.items()}
    winner = min((name for name in medians if name != AUTO), key=lambda name: medians[name])
    ratio, lo, hi = held_out_ratio(seconds[AUTO], {name: s for name, s in seconds.items() if name != AUTO},
                                   level, seed=seed)
    point.update({"median_seconds": medians,
                  "gbps": {name: point["size"] / t / 1e9 for name, t in medians.items()},
                  "winner": winner, "ratio": ratio, "ci": [lo, hi]})
    return point


# ---- the whole check --------------------------------------------------------------------
def estimate_seconds(points: int, repeats: int, min_time: float, variants: int, cold_seconds: float = 0.0,
                     copy_seconds: float = 0.0) -> float:
    """A rough duration: every variant at every point runs repeats + about 4 loops (calibration,
    in the first pass) of at least min_time, or of MIN_LOOP_COPIES copies of ``copy_seconds``
    each where longer; a cold check (``cold_seconds``: one eviction and one copy) runs repeats
    of one copy each."""
    if cold_seconds:
        return points * variants * repeats * cold_seconds
    return points * variants * (repeats + 4) * max(min_time * 1.2, MIN_LOOP_COPIES * copy_seconds)


def validate_settings(who: str, points: int, repeats: int, min_time: float, min_size: int, max_size: int,
                      confidence: float) -> None:
    """ValueError naming ``who`` and the argument when a setting of the check (or of a comparison
    of profiles, which measures the same way) is out of range."""
    for label, value, low in (("points", points, 1), ("repeats", repeats, 2), ("min_size", min_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{who}: {label} must be an int of at least {low}, got {value!r}")
    if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < min_size:
        raise ValueError(f"{who}: max_size must be an int of at least min_size ({min_size}), got {max_size!r}")
    if not (isinstance(min_time, (int, float)) and 0 < min_time <= 10):
        raise ValueError(f"{who}: min_time must be above 0 and at most 10 seconds, got {min_time!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"{who}: confidence must be between 0 and 1, got {confidence!r}")


def check_dispatch(points: int = DEFAULT_POINTS, seed: Optional[int] = None, repeats: int = DEFAULT_REPEATS,
                   min_time: float = DEFAULT_MIN_TIME, min_size: int = MIN_SIZE, max_size: int = MAX_SIZE,
                   confidence: float = CONFIDENCE, progress: Optional[Callable[[int, int], None]] = None,
                   command: str = "fastcopy.check_dispatch()", cold: bool = False) -> Dict[str, Any]:
    """Measures the active dispatch profile at random points (see the module's description) and
    returns a dict: ``config``, ``machine``, ``profile``, ``points`` (each with size, offset,
    the kernel the profile picked and the kernel fastcopy.copy ran (they differ where copies
    learn their store mode), medians, the winner and the ratio with its interval),
    ``summary`` (geometric mean and lowest points with intervals, wins per variant) and
    ``report`` (the text :func:`format_report` makes). ``seed`` None draws one and records it.
    ``cold``: every sample one copy with neither buffer cached (sizes from COLD_MIN_SIZE).
    Raises ValueError for a bad argument."""
    import fastcopy
    from .. import _core

    validate_settings("check_dispatch", points, repeats, min_time, min_size, max_size, confidence)
    if not isinstance(cold, bool):
        raise ValueError(f"check_dispatch: cold must be True or False, got {cold!r}")
    if cold and min_size < COLD_MIN_SIZE:
        raise ValueError(f"check_dispatch: a cold check times one copy per sample and needs min_size of at least "
                         f"{COLD_MIN_SIZE} ({_size_words(COLD_MIN_SIZE)}), got {min_size}")
    if seed is None:
        seed = random.SystemRandom().randrange(1, 1 << 31)
    drawn = draw_points(points, seed, min_size, max_size)
    rng = random.Random(seed + 1)
    profile = _core.active_profile()
    evict = Evictor(evict_bytes()) if cold else None  # run before every cold copy
    # A cold sample: the eviction and one copy, each byte once at about 10 GB/s (a rough figure).
    cold_seconds = (2 * evict.nbytes + 2 * (min_size * max_size) ** 0.5) / 10e9 if evict is not None else 0.0
    config = {"points": points, "seed": seed, "repeats": repeats, "min_time": min_time, "min_size": min_size,
              "max_size": max_size, "near_share": NEAR_SHARE, "aligned_share": ALIGNED_SHARE,
              "backward_share": BACKWARD_SHARE, "cold": cold, "evict_bytes": 0 if evict is None else evict.nbytes,
              "confidence": confidence, "resamples": RESAMPLES, "command": command,
              # a copy of the sizes' geometric middle at about 20 GB/s (a rough figure)
              "estimated_seconds": estimate_seconds(points, repeats, min_time,
                                                    len(variants_for(max_size if cold else min_size)), cold_seconds,
                                                    (min_size * max_size) ** 0.5 / 20e9)}
    t0 = time.monotonic()
    load_before = _load()
    shares = [share for share in pass_repeats(repeats) if share]
    parts: List[List[Dict[str, Any]]] = [[] for _ in drawn]
    for k, share in enumerate(shares):
        for i, (size, offset, overlap) in enumerate(drawn):
            loops = parts[i][0]["iterations"] if parts[i] else None
            parts[i].append(measure_point(size, offset, share, min_time, rng, overlap, evict, loops))
            if progress is not None:
                progress(k * points + i + 1, len(shares) * points)
    measured = [judge_point(merge_placements(got), confidence, seed + i) for i, got in enumerate(parts)]
    share = shares[0]
    for _ in range(EXTRA_PASSES):
        wide = [i for i, p in enumerate(measured) if is_wide(p)]
        for i in wide:
            size, offset, overlap = drawn[i]
            parts[i].append(measure_point(size, offset, share, min_time, rng, overlap, evict,
                                          parts[i][0]["iterations"]))
            measured[i] = judge_point(merge_placements(parts[i]), confidence, seed + i)
    for got, point in zip(parts, measured):
        point["extra_passes"] = len(got) - len(shares)
    result = {"config": config, "machine": _machine(), "profile": {"name": profile["name"],
                                                                 "source": profile["source"]},
              "load_before": load_before, "load_after": _load(), "elapsed_seconds": time.monotonic() - t0,
              "fastcopy_version": fastcopy.__version__, "points": measured,
              "summary": summarize(measured, confidence, seed)}
    result["report"] = format_report(result)
    return result


def is_wide(point: Dict[str, Any]) -> bool:
    """Whether a judged point's ratio interval spans more than WIDE_INTERVAL (high / low)."""
    low, high = point["ci"]
    return high > WIDE_INTERVAL * low


def summarize(points: List[Dict[str, Any]], confidence: float = CONFIDENCE, seed: int = 0) -> Dict[str, Any]:
    """Geometric mean with its interval, the lowest points, wins per variant, counts below 0.9."""
    ratios = [p["ratio"] for p in points]
    geo, lo, hi = geomean_ci(ratios, confidence, seed=seed)
    lowest = sorted(range(len(points)), key=lambda i: ratios[i])[:LOWEST_SHOWN]
    wins: Dict[str, int] = {}
    for p in points:
        wins[p["winner"]] = wins.get(p["winner"], 0) + 1
    return {"geomean": geo, "geomean_ci": [lo, hi], "min": min(ratios), "max": max(ratios),
            "lowest": lowest, "below_0_90": sum(r < 0.90 for r in ratios), "below_0_97": sum(r < 0.97 for r in ratios),
            "wins": dict(sorted(wins.items(), key=lambda kv: -kv[1]))}


def _load() -> Optional[List[float]]:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def _machine() -> Dict[str, Any]:
    from .. import _core

    cpu = _core.cpu_facts()
    libc = " ".join(x for x in platform.libc_ver() if x) or "unknown"
    return {"arch": cpu.get("arch"), "vendor": cpu.get("vendor"), "family": cpu.get("family"),
            "model": cpu.get("model"), "cpus": os.cpu_count(), "libc": libc, "python": platform.python_version(),
            "numpy": np.__version__}


def _size_words(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def format_report(result: Dict[str, Any]) -> str:
    """The check as text to paste into a bug report: the setting, one line per point, the summary."""
    c, m, s, pts = result["config"], result["machine"], result["summary"], result["points"]
    pct = round(c["confidence"] * 100)
    lines = [
        f"fastcopy {result['fastcopy_version']} dispatch check: profile {result['profile']['name']} "
        f"({result['profile']['source']})",
        f"CPU {m['vendor']} family {m['family']} model {m['model']} ({m['arch']}), {m['cpus']} CPUs; {m['libc']}; "
        f"Python {m['python']}, numpy {m['numpy']}; load average {result['load_before']} before, "
        f"{result['load_after']} after",
        f"{c['points']} points, seed {c['seed']}: sizes log-uniform {_size_words(c['min_size'])}-"
        f"{_size_words(c['max_size'])}; {c['backward_share']:.0%} overlapping (dst = src + offset, the backward "
        f"class); the others (dst - src) mod 4096 from 1..{NEAR_MAX} for {c['near_share']:.0%}, 0 for "
        f"{c['aligned_share']:.0%}, else 0..4095; fresh numpy arrays per point in each of {PASSES} passes "
        f"over the points (the repeats shared between them); {_extra_words(pts, pct)}",
        (f"{c['repeats']} interleaved repeats of one cold copy per variant (before each, "
         f"{_size_words(c['evict_bytes'])} written over so neither buffer is cached), medians; "
         if c.get("cold") else
         f"{c['repeats']} interleaved repeats of >= {c['min_time'] * 1e3:g} ms loops per variant (hot caches), medians; ")
        +
        f"estimated {c['estimated_seconds']:.0f} s, took {result['elapsed_seconds']:.0f} s; loops run again "
        f"because the thread was descheduled: {sum(p['reruns'] for p in pts)}",
        f"ratio = median time of the best other variant / median time of fastcopy.copy, the best chosen on other "
        f"repeats than it is timed on ({pct}% bootstrap intervals)",
        "",
        f"{'size':>9} {'offset':>6} {'class':>12} {'src%4K':>6} {'auto runs':>12} {'winner':>13} {'winner GB/s':>11} "
        f"{'auto GB/s':>9} {'ratio':>6}  {pct}% CI",
    ]
    for p in sorted(pts, key=lambda p: (p["size"], p["offset"])):
        lines.append(f"{p['size']:>9} {p['offset']:>6} {point_class(p):>12} {p['src_page_offset']:>6} {_auto_runs(p):>12} "
                     f"{p['winner']:>13} {p['gbps'][p['winner']]:>11.2f} {p['gbps'][AUTO]:>9.2f} {p['ratio']:>6.3f}  "
                     f"[{p['ci'][0]:.3f}, {p['ci'][1]:.3f}]" + ("  <" if p["ratio"] < 0.9 else ""))
    lo, hi = s["geomean_ci"]
    lines += ["", f"geometric mean {s['geomean']:.3f} [{lo:.3f}, {hi:.3f}] over {len(pts)} points "
                  f"(interval: resampling the points); range {s['min']:.3f}-{s['max']:.3f}; "
                  f"below 0.97: {s['below_0_97']}, below 0.90: {s['below_0_90']}",
              "lowest points:"]
    for i in s["lowest"]:
        p = pts[i]
        lines.append(f"  {p['ratio']:.3f} [{p['ci'][0]:.3f}, {p['ci'][1]:.3f}] at {p['size']} B, offset {p['offset']}"
                     f" ({point_class(p)}, src at {_src_offsets(p)} in its page): auto ran {_auto_ran_words(p)}, "
                     f"{p['winner']} won")
    lines.append("wins: " + ", ".join(f"{name} {n}" for name, n in s["wins"].items()))
    if any(_learned(p) for p in pts):
        lines.append("*: what the copies timed so far learned (cached or streaming stores; split across the pool or "
                     "not) runs this, not what the profile picks")
    return "\n".join(lines)


def _extra_words(points: List[Dict[str, Any]], pct: int) -> str:
    """How many points had more passes for a wide interval (is_wide), and how many passes."""
    extra = [p.get("extra_passes", 0) for p in points]
    rule = f"a point whose {pct}% interval spans more than {WIDE_INTERVAL:g}x gets up to {EXTRA_PASSES} more"
    if not any(extra):
        return rule + ": none did"
    return rule + f": {sum(e > 0 for e in extra)} points, {sum(extra)} passes in all"


def _src_offsets(point: Dict[str, Any]) -> str:
    """Where the source starts in its page in the placements, each offset once ("1296 and 2256")."""
    got = [str(pl["src_page_offset"]) for pl in point.get("placements", [point])]
    return " and ".join(dict.fromkeys(got))


def _learned(point: Dict[str, Any]) -> bool:
    """Whether auto's copies at the point ran another kernel, or on another number of threads,
    than the profile picks (a learned store mode or split); points recorded without "ran" ran
    the profile's kernel."""
    return point.get("ran", point["picked"]) != point["picked"]


def _auto_runs(point: Dict[str, Any]) -> str:
    return point["ran"] + "*" if _learned(point) else point["picked"]


def _auto_ran_words(point: Dict[str, Any]) -> str:
    if _learned(point):
        return f"{point['ran']} (learned at run time; the profile picks {point['picked']})"
    return point["picked"]


# ---- command line (python -m fastcopy tune --check) ---------------------------------------
def add_check_arguments(p: Any) -> None:
    """Adds --check and its options to the tune parser (its --repeats and --min-time apply too)."""
    from ..bench.cli import int_at_least, typed
    from ..bench.units import parse_size

    p.add_argument("--check", action="store_true",
                   help="measure the active profile against every kernel forced and np.copyto at random sizes "
                        f"and offsets, print the report (default {DEFAULT_POINTS} points, {DEFAULT_REPEATS} repeats "
                        f"of {DEFAULT_MIN_TIME * 1e3:g} ms loops: about a minute); writes no profile")
    p.add_argument("--points", type=typed(int_at_least(1, 100000)), metavar="N",
                   help=f"--check: how many random points (default {DEFAULT_POINTS})")
    p.add_argument("--seed", type=typed(int_at_least(0, (1 << 63) - 1)), metavar="N",
                   help="--check: the seed of the points and of the order of the variants (default: drawn, printed)")
    p.add_argument("--json", metavar="FILE", help="--check: also save every sample and the summary as JSON")
    p.add_argument("--min-size", type=typed(parse_size), metavar="SIZE", dest="min_size",
                   help=f"--check: the smallest size drawn (default {_size_words(MIN_SIZE)}; e.g. 4M)")
    p.add_argument("--max-size", type=typed(parse_size), metavar="SIZE", dest="max_size",
                   help=f"--check: the largest size drawn (default {_size_words(MAX_SIZE)}; e.g. 256M)")
    p.add_argument("--cold", action="store_true",
                   help="--check: time one copy at a time with neither buffer cached (twice the last-level "
                        f"cache written over before each), sizes from {_size_words(COLD_MIN_SIZE)} "
                        f"(--min-size defaults to it)")


def refuse_check_options(p: Any, args: Any) -> None:
    """Errors out (``p``: the tune parser) when an option of the check (or of --compare) is given
    without --check (or --compare)."""
    for option, given in (("--points", args.points is not None), ("--seed", args.seed is not None),
                          ("--json", args.json is not None), ("--min-size", args.min_size is not None),
                          ("--max-size", args.max_size is not None)):
        if given:
            p.error(f"argument {option}: applies to --check and --compare only")
    if args.cold:
        p.error("argument --cold: applies to --check only")


def run_check_cli(p: Any, args: Any, argv: List[str]) -> int:
    """Runs ``tune --check`` (``p``: the tune parser, for errors)."""
    from ..bench.cli import check_outputs

    for option, given in (("--show", args.show), ("--reset", args.reset), ("--dry-run", args.dry_run),
                          ("--quick", args.quick), ("--grid", args.grid is not None),
                          ("--output", args.output is not None)):
        if given:
            p.error(f"argument --check: {option} does not apply to the check (it writes no profile)")
    check_outputs(p, args)
    if args.repeats is not None and args.repeats < 2:
        p.error("argument --repeats: --check needs at least 2 repeats")
    min_size = args.min_size if args.min_size is not None else (COLD_MIN_SIZE if args.cold else MIN_SIZE)
    max_size = args.max_size if args.max_size is not None else max(MAX_SIZE, min_size)
    if min_size < 1 or max_size < min_size:
        p.error(f"arguments --min-size/--max-size: need 1 <= min ({min_size}) <= max ({max_size})")
    if args.cold and min_size < COLD_MIN_SIZE:
        p.error(f"argument --cold: needs --min-size of at least {_size_words(COLD_MIN_SIZE)} (one copy per sample "
                f"must outweigh a call's own cost), got {_size_words(min_size)}")
    try:
        result = check_dispatch(points=args.points or DEFAULT_POINTS, seed=args.seed,
                                repeats=args.repeats or DEFAULT_REPEATS, min_time=args.min_time or DEFAULT_MIN_TIME,
                                min_size=min_size, max_size=max_size, cold=args.cold,
                                progress=progress_on_terminal(), command="python -m fastcopy tune " + " ".join(argv[1:]))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return print_result(args, result)


def progress_on_terminal() -> Callable[[int, int], None]:
    """A progress callback that counts points on stderr, only when stderr is a terminal."""
    show = sys.stderr.isatty()

    def progress(done: int, total: int) -> None:
        if show:
            print(f"\r{done}/{total} points", end="" if done < total else "\n", file=sys.stderr, flush=True)
    return progress


def print_result(args: Any, result: Dict[str, Any]) -> int:
    """Prints a check's or a comparison's report and, with --json, saves the whole result."""
    import json

    from ..bench.cli import save_json

    print(result["report"])
    if args.json:
        return save_json(args.json, json.loads(json.dumps(result, default=str)), f"{len(result['points'])} points")
    return 0
