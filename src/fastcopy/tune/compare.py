"""Two dispatch profiles measured against each other where they plan copies differently:
``python -m fastcopy tune --compare A B`` and :func:`compare_profiles`.

Two runs of ``tune`` on one machine can write different bands where kernels run within noise of
each other; a tuned profile differs from the built-in one by design. This says, on this machine,
whether a difference matters:

- candidate points are drawn the way the held-out check draws its points (``draw_points``:
  sizes log-uniform, (dst - src) mod 4096 from the whole page with extra weight on 1..255, a
  share of overlapping copies), in each region: private memory, copies into a POSIX
  shared-memory mapping and copies out of one;
- a point is kept where the two profiles plan it differently: another kernel, or the thread pool
  in one and not in the other. The core makes both plans (``_core.copy_plans``: the profile as
  given, without the environment's overrides, before anything learned at run time);
- the points measured are spread over the distinct differences (region, address class, the two
  plans), round-robin, so a rare difference is measured as well as a common one;
- at a point both plans run forced (``fastcopy.kernel(name, threads)``) on the same buffers, new
  ones in each of the check's passes (numpy allocations for private copies, a new mapping for
  the shared side), in interleaved loops of at least ``min_time``, a new order every repeat;
- per point: ratio = median time of B's plan / median time of A's plan (above 1: A's plan is
  faster) with a percentile bootstrap interval over the paired repeats. The point is a tie
  where the interval holds 1: at that confidence the measurement cannot tell the plans apart.

Two geometric means sum it up: over the points measured, and weighted by how often each
difference came up among the candidates (what the difference costs a copy drawn the check's way).
"""
from __future__ import annotations

import os
import random
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .check import (CONFIDENCE, MAX_SIZE, MIN_SIZE, PAGE, PASSES, Point, _load, _machine, _size_words, array_start,
                    draw_points, geomean, loop_copies, pass_repeats, place, print_result, progress_on_terminal, ratio_ci,
                    validate_settings, _timed)
from .decide import MIN_GAIN, REGIONS, point_class

DEFAULT_POINTS = 40
DEFAULT_REPEATS = 30
DEFAULT_MIN_TIME = 0.0005  # seconds per timed loop
# Candidates drawn per region: enough that a difference covering 1 % of the copies comes up
# about 20 times.
CANDIDATES = 2000
# The most candidates a comparison draws per region (each costs a plan from the core, about 1 us).
MAX_CANDIDATES = 1000000
# Synthetic addresses for the plans of candidates: far apart, page-aligned sources.
PLAN_BASE = 1 << 40
PLAN_DST_GAP = 1 << 32
A, B = "A", "B"
TIE, A_FASTER, B_FASTER = "tie", "A faster", "B faster"

Plan = Tuple[str, int]  # (kernel, threads)


# ---- which points differ (pure, apart from the core's plans) ---------------------------------
def plan_words(plan: Plan) -> str:
    kernel, threads = plan
    return kernel if threads <= 1 else f"{kernel} x{threads}"


def plan_addresses(point: Point) -> Tuple[int, int]:
    """(dst, src) synthetic addresses with the point's geometry: dst = src + offset when the
    copy overlaps, else dst PLAN_DST_GAP above src plus the offset (the same mod 4096)."""
    src = PLAN_BASE
    return (src + point.offset, src) if point.overlap else (src + PLAN_DST_GAP + point.offset, src)


def plans_of(profile: str, points: Sequence[Point], region: str) -> List[Plan]:
    """The plan ``profile`` (JSON text or a built-in name) makes for each point in ``region``."""
    from .. import _core

    r = REGIONS.index(region)
    copies = [(*plan_addresses(p), p.size, r) for p in points]
    return [(k, int(t)) for k, t in _core.copy_plans(profile, copies)]


def difference_key(region: str, point: Point, plan_a: Plan, plan_b: Plan) -> Tuple[str, str, str, str]:
    """(region, address class, A's plan, B's plan): the points of one difference share it."""
    return region, point_class(point._asdict()), plan_words(plan_a), plan_words(plan_b)


def differing_points(candidates: Dict[str, List[Point]], plans_a: Dict[str, List[Plan]],
                     plans_b: Dict[str, List[Plan]]) -> Dict[Tuple[str, str, str, str], List[Tuple[Point, Plan, Plan]]]:
    """The candidates (per region) whose two plans differ, grouped by difference_key, each
    group's points in the order drawn."""
    groups: Dict[Tuple[str, str, str, str], List[Tuple[Point, Plan, Plan]]] = {}
    for region, points in candidates.items():
        for point, pa, pb in zip(points, plans_a[region], plans_b[region]):
            if pa != pb:
                groups.setdefault(difference_key(region, point, pa, pb), []).append((point, pa, pb))
    return groups


def spread(groups: Dict[Any, List[Any]], count: int) -> List[Tuple[Any, Any]]:
    """Up to ``count`` (key, item) pairs taken round-robin over the groups, the largest group
    first, each group's items in order: every difference gets points before any gets many."""
    order = sorted(groups, key=lambda k: (-len(groups[k]), k))
    picked: List[Tuple[Any, Any]] = []
    depth = 0
    while len(picked) < count and any(depth < len(groups[k]) for k in order):
        for k in order:
            if depth < len(groups[k]) and len(picked) < count:
                picked.append((k, groups[k][depth]))
        depth += 1
    return picked


def verdict(low: float, high: float) -> str:
    """A tie where the interval of B's time / A's holds 1; else which plan is faster."""
    if low > 1.0:
        return A_FASTER
    if high < 1.0:
        return B_FASTER
    return TIE


def within_gain(low: float, high: float, gain: float = MIN_GAIN) -> bool:
    """Whether the interval of B's time / A's lies within ``gain`` either way: neither plan is
    faster by as much as tune needs to change a band (MIN_GAIN), a difference its bands cannot
    resolve, even where the interval leaves out 1."""
    return 1.0 / (1.0 + gain) <= low and high <= 1.0 + gain


def summarize_groups(measured: List[Dict[str, Any]], shares: Dict[Tuple[str, str, str, str], float]) -> Dict[str, Any]:
    """Per difference: its points' geometric mean and verdicts; over all: the geometric mean of
    the points, and one weighted by each difference's share of the candidates."""
    by_key: Dict[Tuple[str, str, str, str], List[Dict[str, Any]]] = {}
    for p in measured:
        by_key.setdefault(tuple(p["difference"]), []).append(p)  # type: ignore[arg-type]
    groups: List[Dict[str, Any]] = []
    for key, pts in sorted(by_key.items(), key=lambda kv: -shares.get(kv[0], 0.0)):
        counts = {v: sum(p["verdict"] == v for p in pts) for v in (TIE, A_FASTER, B_FASTER)}
        groups.append({"difference": list(key), "share": shares.get(key, 0.0), "points": len(pts),
                       "sizes": [min(p["size"] for p in pts), max(p["size"] for p in pts)],
                       "geomean": geomean([p["ratio"] for p in pts]), "verdicts": counts})
    ratios = [p["ratio"] for p in measured]
    weight = sum(g["share"] for g in groups)
    weighted = (float(np.exp(sum(g["share"] * np.log(g["geomean"]) for g in groups) / weight))
                if weight > 0 else None)
    return {"geomean": geomean(ratios) if ratios else None, "weighted_geomean": weighted, "groups": groups,
            "verdicts": {v: sum(p["verdict"] == v for p in measured) for v in (TIE, A_FASTER, B_FASTER)},
            "within_gain": sum(within_gain(*p["ci"]) for p in measured)}


# ---- measuring ---------------------------------------------------------------------------------
def _buffers(region: str, point: Point, fill_seed: int) -> Tuple[np.ndarray, np.ndarray, Callable[[], None]]:
    """(dst, src, release): private copies on fresh numpy allocations (check.place), copies into
    or out of shared memory with that side in a new POSIX shared-memory mapping, the source
    starting at a page offset drawn as check.place draws it."""
    if region == "private":
        dst, src = place(point.size, point.offset, fill_seed, point.overlap)
        return dst, src, lambda: None
    from ..bench.engine import SizeMemory

    rng = np.random.default_rng(fill_seed)
    mem = SizeMemory(point.size, 1, shared=True)
    dst, src = mem.pairs(region, point.offset, backward=point.overlap, start=array_start(rng))[0]
    src[...] = rng.integers(0, 256, size=point.size, dtype=np.uint8)
    return dst, src, mem.close


def _forced(plan: Plan) -> Callable[[Any, Any], Any]:
    import fastcopy

    return fastcopy.kernel(plan[0], plan[1])


def measure_pair(region: str, point: Point, plan_a: Plan, plan_b: Plan, repeats: int, min_time: float,
                 rng: random.Random, loops: Optional[Dict[str, int]] = None) -> Dict[str, Any]:
    """Times both plans forced at one point on new buffers, interleaved; seconds per copy, one
    per repeat. Each plan first copies once and must give the source's bytes."""
    dst, src, release = _buffers(region, point, rng.randrange(1 << 30))
    try:
        fns = {A: _forced(plan_a), B: _forced(plan_b)}
        original = src.copy()
        for name, f in fns.items():
            if point.overlap:
                src[...] = original
            else:
                dst.fill(0)
            f(dst, src)
            if not np.array_equal(dst, original):
                raise RuntimeError(f"fastcopy compare: {name}'s plan {plan_words((plan_a, plan_b)[name == B])} "
                                   f"copied wrong bytes at {point.size} B, offset {point.offset}")
        if loops is None:
            loops = dict(zip(fns, loop_copies(list(fns.values()), dst, src, min_time)))
        samples: Dict[str, List[float]] = {A: [], B: []}
        order = [A, B]
        reruns = 0
        for _ in range(repeats):
            rng.shuffle(order)
            for name in order:
                seconds, again = _timed(fns[name], dst, src, loops[name])
                samples[name].append(seconds)
                reruns += again
        return {"seconds": samples, "iterations": loops, "reruns": reruns,
                "src_page_offset": src.ctypes.data % PAGE}
    finally:
        del dst, src
        release()


def _read_profile_text(spec: str) -> Tuple[str, str]:
    """(profile text for the core, its name for the report): a file's JSON, or a built-in name."""
    if os.path.exists(spec):
        import json

        from .profile import read_profile

        try:
            profile = read_profile(spec)
        except ValueError as e:
            raise ValueError(str(e) if str(e).startswith(spec) else f"{spec}: {e}") from None
        return json.dumps(profile), f"{profile.get('name', '?')} ({spec})"
    return spec, spec


def compare_profiles(a: str, b: str, points: int = DEFAULT_POINTS, seed: Optional[int] = None,
                     repeats: int = DEFAULT_REPEATS, min_time: float = DEFAULT_MIN_TIME, min_size: int = MIN_SIZE,
                     max_size: int = MAX_SIZE, confidence: float = CONFIDENCE,
                     progress: Optional[Callable[[int, int], None]] = None,
                     command: str = "fastcopy.tune.compare.compare_profiles()",
                     regions: Sequence[str] = REGIONS) -> Dict[str, Any]:
    """Measures profile ``a`` against profile ``b`` (each a profile file, as tune writes them, or
    a built-in profile's name) where they plan copies differently (see the module's description),
    in ``regions`` (default: all three). Returns a dict: ``config``, ``machine``, ``profiles``,
    ``candidates`` (drawn per region, and how many differ), ``points`` (each with its difference,
    both plans, medians, ratio = B's time / A's with its interval, verdict), ``summary``
    (summarize_groups) and ``report`` (format_compare's text). ``seed`` None draws one and
    records it. Raises ValueError for a bad argument or an unusable profile."""
    validate_settings("compare_profiles", points, repeats, min_time, min_size, max_size, confidence)
    text_a, name_a = _read_profile_text(a)
    text_b, name_b = _read_profile_text(b)
    return compare_texts(text_a, name_a, text_b, name_b, points, seed, repeats, min_time, min_size, max_size,
                         confidence, progress, command, regions)


def compare_texts(text_a: str, name_a: str, text_b: str, name_b: str, points: int = DEFAULT_POINTS,
                  seed: Optional[int] = None, repeats: int = DEFAULT_REPEATS, min_time: float = DEFAULT_MIN_TIME,
                  min_size: int = MIN_SIZE, max_size: int = MAX_SIZE, confidence: float = CONFIDENCE,
                  progress: Optional[Callable[[int, int], None]] = None,
                  command: str = "fastcopy.tune.compare.compare_texts()",
                  regions: Sequence[str] = REGIONS, per_region: int = CANDIDATES) -> Dict[str, Any]:
    """compare_profiles() of two profiles given as the core reads them (JSON text or a built-in
    name; ``name_a`` and ``name_b`` name them in the report): what tune's check of the shared
    regions runs on the profile it has just built. Each region's ``per_region`` candidates are
    drawn from the seed as compare_profiles() draws them, whichever regions are asked for."""
    import fastcopy

    validate_settings("compare_texts", points, repeats, min_time, min_size, max_size, confidence)
    unknown = [r for r in regions if r not in REGIONS]
    if unknown or not regions or len(set(regions)) != len(regions):
        raise ValueError(f"compare_texts: regions must be distinct names among {', '.join(REGIONS)}, got {list(regions)!r}")
    if isinstance(per_region, bool) or not isinstance(per_region, int) or not 1 <= per_region <= MAX_CANDIDATES:
        raise ValueError(f"compare_texts: per_region must be an int from 1 to {MAX_CANDIDATES}, got {per_region!r}")
    if seed is None:
        seed = random.SystemRandom().randrange(1, 1 << 31)
    candidates = {region: draw_points(per_region, seed + REGIONS.index(region), min_size, max_size)
                  for region in REGIONS if region in regions}
    plans_a = {region: plans_of(text_a, pts, region) for region, pts in candidates.items()}
    plans_b = {region: plans_of(text_b, pts, region) for region, pts in candidates.items()}
    groups = differing_points(candidates, plans_a, plans_b)
    total = sum(len(pts) for pts in candidates.values())
    shares = {key: len(items) / total for key, items in groups.items()}
    chosen = spread(groups, points)
    rng = random.Random(seed + len(REGIONS))
    t0 = time.monotonic()
    load_before = _load()
    shares_per_pass = [s for s in pass_repeats(repeats) if s]
    parts: List[List[Dict[str, Any]]] = [[] for _ in chosen]
    for k, share in enumerate(shares_per_pass):
        for i, (key, (point, pa, pb)) in enumerate(chosen):
            loops = parts[i][0]["iterations"] if parts[i] else None
            parts[i].append(measure_pair(key[0], point, pa, pb, share, min_time, rng, loops))
            if progress is not None:
                progress(k * len(chosen) + i + 1, len(shares_per_pass) * len(chosen))
    measured = []
    for i, ((key, (point, pa, pb)), got) in enumerate(zip(chosen, parts)):
        ta = [t for p in got for t in p["seconds"][A]]
        tb = [t for p in got for t in p["seconds"][B]]
        ratio, lo, hi = ratio_ci(ta, tb, confidence, seed=seed + i)
        measured.append({"region": key[0], "size": point.size, "offset": point.offset, "overlap": point.overlap,
                         "difference": list(key), "plan_a": plan_words(pa), "plan_b": plan_words(pb),
                         "median_seconds": {A: float(np.median(ta)), B: float(np.median(tb))},
                         "gbps": {A: point.size / float(np.median(ta)) / 1e9, B: point.size / float(np.median(tb)) / 1e9},
                         "ratio": ratio, "ci": [lo, hi], "verdict": verdict(lo, hi),
                         "src_page_offsets": [p["src_page_offset"] for p in got],
                         "reruns": sum(p["reruns"] for p in got), "seconds": {A: ta, B: tb}})
    result = {"config": {"points": points, "seed": seed, "repeats": repeats, "min_time": min_time,
                         "min_size": min_size, "max_size": max_size, "confidence": confidence,
                         "candidates_per_region": per_region, "regions": list(candidates), "command": command},
              "machine": _machine(), "profiles": {A: name_a, B: name_b}, "threads": fastcopy.get_threads(),
              "candidates": {"drawn": total, "differ": sum(len(v) for v in groups.values()),
                             "differ_per_region": {r: sum(len(v) for k, v in groups.items() if k[0] == r)
                                                   for r in candidates}},
              "load_before": load_before, "load_after": _load(), "elapsed_seconds": time.monotonic() - t0,
              "fastcopy_version": fastcopy.__version__, "points": measured,
              "summary": summarize_groups(measured, shares)}
    result["report"] = format_compare(result)
    return result


# ---- the report ----------------------------------------------------------------------------
def format_compare(result: Dict[str, Any]) -> str:
    """The comparison as text: the setting, one line per difference, one per point, the summary."""
    c, m, s, cand = result["config"], result["machine"], result["summary"], result["candidates"]
    pct = round(c["confidence"] * 100)
    per_region = ", ".join(f"{r} {n}" for r, n in cand["differ_per_region"].items())
    lines = [
        f"fastcopy {result['fastcopy_version']} profile comparison: A = {result['profiles'][A]}, "
        f"B = {result['profiles'][B]}",
        f"CPU {m['vendor']} family {m['family']} model {m['model']} ({m['arch']}), {m['cpus']} CPUs, "
        f"{result['threads']} threads set; {m['libc']}; load average {result['load_before']} before, "
        f"{result['load_after']} after",
        f"seed {c['seed']}: {cand['drawn']} candidate copies drawn as the held-out check draws them "
        f"({_size_words(c['min_size'])}-{_size_words(c['max_size'])}, {c['candidates_per_region']} per region); "
        f"the profiles plan {cand['differ']} of them differently ({cand['differ'] / cand['drawn']:.1%}: {per_region})",
    ]
    if not result["points"]:
        lines.append("nothing to measure: the two profiles plan every candidate copy the same way")
        return "\n".join(lines)
    lines += [
        f"{len(result['points'])} points measured, spread over the differences; both plans forced on the same "
        f"buffers, new ones in each of {PASSES} passes, {c['repeats']} interleaved repeats of >= "
        f"{c['min_time'] * 1e3:g} ms loops, medians; took {result['elapsed_seconds']:.0f} s",
        f"ratio = median time of B's plan / median time of A's (above 1: A's plan is faster), {pct}% bootstrap "
        f"intervals; a tie where the interval holds 1",
        "",
        "differences (share of the candidates; geometric mean of their points' ratios; verdicts):",
    ]
    for g in s["groups"]:
        region, cls, pa, pb = g["difference"]
        v = g["verdicts"]
        sizes = _size_words(g["sizes"][0]) if g["sizes"][0] == g["sizes"][1] else \
            f"{_size_words(g['sizes'][0])}-{_size_words(g['sizes'][1])}"
        lines.append(f"  {region} {cls}: A {pa}, B {pb}: {g['share']:.1%} of copies; {g['points']} points at "
                     f"{sizes}, {g['geomean']:.3f}; tie {v[TIE]}, A faster {v[A_FASTER]}, B faster {v[B_FASTER]}")
    lines += ["", f"{'region':>11} {'size':>9} {'offset':>6} {'class':>12} {'A plan':>13} {'B plan':>13} "
                  f"{'A GB/s':>8} {'B GB/s':>8} {'ratio':>6}  {pct}% CI"]
    for p in sorted(result["points"], key=lambda p: (p["region"], p["size"], p["offset"])):
        lines.append(f"{p['region']:>11} {p['size']:>9} {p['offset']:>6} {point_class(p):>12} {p['plan_a']:>13} "
                     f"{p['plan_b']:>13} {p['gbps'][A]:>8.2f} {p['gbps'][B]:>8.2f} {p['ratio']:>6.3f}  "
                     f"[{p['ci'][0]:.3f}, {p['ci'][1]:.3f}]  {p['verdict']}")
    v = s["verdicts"]
    lines += ["", f"geometric mean of the points {s['geomean']:.3f}; weighted by each difference's share of the "
                  f"candidates {s['weighted_geomean']:.3f}",
              f"ties {v[TIE]}, A's plan faster {v[A_FASTER]}, B's plan faster {v[B_FASTER]} "
              f"(of {len(result['points'])} points)",
              f"within {MIN_GAIN:.0%} either way (the interval inside [{1 / (1 + MIN_GAIN):.3f}, {1 + MIN_GAIN:.3f}]: "
              f"less than tune needs to change a band): {s['within_gain']} of {len(result['points'])} points"]
    return "\n".join(lines)


# ---- command line (python -m fastcopy tune --compare A B) -------------------------------------
def run_compare_cli(p: Any, args: Any, argv: List[str]) -> int:
    """Runs ``tune --compare A B`` (``p``: the tune parser, for errors)."""
    from ..bench.cli import check_outputs

    for option, given in (("--show", args.show), ("--reset", args.reset), ("--dry-run", args.dry_run),
                          ("--quick", args.quick), ("--grid", args.grid is not None),
                          ("--output", args.output is not None), ("--cold", args.cold), ("--check", args.check)):
        if given:
            p.error(f"argument --compare: {option} does not apply to a comparison")
    check_outputs(p, args)
    if args.repeats is not None and args.repeats < 2:
        p.error("argument --repeats: --compare needs at least 2 repeats")
    min_size = args.min_size if args.min_size is not None else MIN_SIZE
    max_size = args.max_size if args.max_size is not None else max(MAX_SIZE, min_size)
    if min_size < 1 or max_size < min_size:
        p.error(f"arguments --min-size/--max-size: need 1 <= min ({min_size}) <= max ({max_size})")
    for spec in args.compare:
        if os.path.isdir(spec):
            p.error(f"argument --compare: {spec} is a directory, not a profile")
    try:
        result = compare_profiles(args.compare[0], args.compare[1], points=args.points or DEFAULT_POINTS,
                                  seed=args.seed, repeats=args.repeats or DEFAULT_REPEATS,
                                  min_time=args.min_time or DEFAULT_MIN_TIME, min_size=min_size, max_size=max_size,
                                  progress=progress_on_terminal(),
                                  command="python -m fastcopy tune " + " ".join(argv[1:]))
    except ValueError as e:
        p.error(f"argument --compare: {e}")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return print_result(args, result)

