"""The decisions of ``python -m fastcopy tune``: measurements in, bands and thresholds out.

Pure functions of plain data: the measurement table (``fastcopy.tune.measure.measure``'s
result), the built-in profile's choices (``Builtin``) and the off-grid validation ratios. No
timing, no files, no state: fixed tables give a fixed profile (tests/profile/test_decide.py).

- ``decide_bands``: per region, address class and grid size, the kernel: the built-in one unless
  another wins beyond the larger of the two measured spreads (and ``MIN_GAIN``);
- ``placement_verdict``: the sequential sign test over buffer placements that resolves a cell
  (a win) or declares it a tie (a kernel that wins at some placements only changes nothing);
- ``apply_validation``: a changed band whose new kernel does not also win off the grid by more
  than ``MIN_GAIN``, and at enough placements there for the sign test, goes back to the
  built-in kernel;
- ``apply_check``: a changed band whose kernel loses to the built-in one, beyond the interval, at
  a point of the held-out check (``fastcopy.tune.check``) inside it goes back to the built-in kernel;
- ``decide_parallel``: the thread pool's threshold and thread count;
- ``apply_parallel_validation``: a changed pool threshold whose plan does not also win off the
  grid, in the sizes where it changes the plan, by more than ``MIN_GAIN`` gives way to the
  built-in rule;
- ``apply_pool_check``: a changed pool threshold whose plan loses to the built-in plan, beyond
  the interval, at a point of the held-out check inside the change gives way to the built-in rule;
- ``decide_nt``: per region, the non-temporal threshold, from the cold measurements;
- ``profile_body``: the profile's ``regions`` and ``parallel`` (docs/profile-format.md).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from .. import _core
from ..bench.units import human_size

REGIONS = ("private", "to_shared", "from_shared")
CLASSES = ("page_aligned", "near", "far", "backward")
# The pool is measured from this size up (below it one chunk of >= 16 KiB per thread would
# leave nothing to split on a machine of a few CPUs).
PARALLEL_MIN_GRID = 256 << 10
# The longest "why" the profile format takes (the loader's limit, read from C++).
MAX_WHY = _core.profile_limits()["max_why_chars"]

# {"gbps": geometric mean over placements of the medians, "spread": relative,
#  "placements": [median GB/s at each buffer placement, the same placements for every kernel of a cell]}
Stat = Dict[str, Any]


@dataclass
class Builtin:
    """What the built-in profile does, as data: its thresholds, the pool's threads, its kernel at
    each measured size (``kernels[region][class][size]``, never a streaming one) and its bands
    (``bands[region][class]``, as ``_core.base_profile()`` gives them)."""

    nt_threshold: Optional[int]
    parallel_threshold: Optional[int]
    threads: int
    kernels: Dict[str, Dict[str, Dict[int, str]]]
    bands: Dict[str, Dict[str, List[Dict[str, Any]]]]
    nt_kernel: Optional[str] = None  # the private region's NT kernel (None: it streams nowhere)

    def kernel(self, region: str, cls: str, size: int) -> str:
        """The band kernel for a copy of ``size`` bytes (a size of the measured grid)."""
        return self.kernels[region][cls][size]

    def uses_nt(self, size: int) -> bool:
        return self.nt_threshold is not None and size >= self.nt_threshold

    def uses_pool(self, size: int) -> bool:
        return self.parallel_threshold is not None and size >= self.parallel_threshold and self.threads > 1

    def pool_threshold(self) -> Optional[int]:
        """The size from which the built-in rule splits copies across the pool; None: never."""
        return self.parallel_threshold if self.threads > 1 else None


# A change needs at least this gain even when the spreads are tighter: below it a change buys
# nothing a user would notice and mostly follows noise (evidence: tune-min-gain).
MIN_GAIN = 0.03


# The sign test over placements: a kernel wins a cell only when it is faster than the incumbent at
# so many of the placements that a coin would do that as often as this at most (one-sided).
SIGN_ALPHA = 0.10


def sign_needed(n: int, alpha: float = SIGN_ALPHA) -> Optional[int]:
    """The fewest wins out of ``n`` paired placements that a fair coin reaches with probability
    at most ``alpha`` (P(Binomial(n, 1/2) >= k) <= alpha); None when even n out of n does not."""
    tail = 0
    for k in range(n, -1, -1):
        tail += math.comb(n, k)
        if tail / 2 ** n > alpha:
            return k + 1 if k < n else None
    return 0


def placement_verdict(ratios: List[float], max_placements: int, alpha: float = SIGN_ALPHA) -> str:
    """The sequential rule of a cell, from the paired ratios challenger / incumbent at each placement
    measured so far: "win" when the challenger is faster at ``sign_needed(len(ratios))`` of them;
    "tie" when it can no longer reach ``sign_needed(max_placements)`` even if it won every placement
    still to come (or none can be enough); "open" otherwise (measure another placement)."""
    n, wins = len(ratios), sum(r > 1 for r in ratios)
    k = sign_needed(n, alpha) if n else None
    if k is not None and wins >= k:
        return "win"
    k_max = sign_needed(max(max_placements, n), alpha)
    if k_max is None or wins + max(max_placements - n, 0) < k_max:
        return "tie"
    return "open"


def paired_ratios(w: Stat, inc: Stat) -> List[float]:
    """w / inc at each placement (empty when the cell was measured without placements)."""
    a, b = w.get("placements") or [], inc.get("placements") or []
    return [x / y for x, y in zip(a, b) if y > 0] if len(a) == len(b) else []


def _beats(w: Stat, inc: Stat) -> bool:
    """True when w is faster than inc by more than the larger of their spreads (and MIN_GAIN) and,
    when measured at several placements, the sign test calls it a win there (not a tie)."""
    if not w["gbps"] > inc["gbps"] * (1 + max(w["spread"], inc["spread"], MIN_GAIN)):
        return False
    ratios = paired_ratios(w, inc)
    return not ratios or placement_verdict(ratios, len(ratios)) == "win"


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
                if not stats:
                    continue
                inc = builtin.kernel(region, cls, size)
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
                    ratios = paired_ratios(stats[best], stats[inc])
                    faster = sum(x > 1 for x in ratios)
                    point["why"] = (f"built-in choice kept: fastest at {human_size(size)}" if best == inc else
                                    f"built-in choice kept: {best} {r:.2f}x but faster at {faster} of {len(ratios)} "
                                    f"placements only (a tie by the sign test)"
                                    if ratios and r > 1 + max(stats[best]["spread"], stats[inc]["spread"], MIN_GAIN)
                                    else f"built-in choice kept: {best} {r:.2f}x within the spread "
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


def bands_from_points(points: List[Dict[str, Any]], builtin_bands: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Bands from per-size decisions (a decision holds from its size to the next); the sizes
    below the grid keep the built-in bands, and so does the stretch after a grid size whose
    decision is the built-in kernel (a built-in boundary between two grid sizes stays where it
    is: the grid measured nothing there to move it); adjacent equal kernels merge."""
    first = points[0]["size"] if points else None
    bands: List[Dict[str, Any]] = [{"from": b["from"], "kernel": b["kernel"],
                                    "why": ("below the measured grid, the built-in choice: " + b.get("why", ""))[:MAX_WHY]}
                                   for b in builtin_bands if first is None or b["from"] < first]
    for n, p in enumerate(points):
        if p["kernel"] != bands[-1]["kernel"]:
            bands.append({"from": p["size"], "kernel": p["kernel"], "why": p["why"][:MAX_WHY]})
        if p["kernel"] == p["builtin"]:
            end = points[n + 1]["size"] if n + 1 < len(points) else None
            for b in builtin_bands:
                if b["from"] > p["size"] and (end is None or b["from"] < end) and b["kernel"] != bands[-1]["kernel"]:
                    bands.append({"from": b["from"], "kernel": b["kernel"],
                                  "why": ("between the grid sizes, the built-in choice: " + b.get("why", ""))[:MAX_WHY]})
    merged: List[Dict[str, Any]] = []
    for b in bands:
        if merged and merged[-1]["kernel"] == b["kernel"]:
            continue
        merged.append(b)
    return merged


def threshold_from(flags: List[Tuple[int, bool]]) -> Optional[int]:
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
        thr = builtin.pool_threshold()
        return {"threshold": thr, "threads": 0, "why": "not measured (grid below "
                f"{human_size(PARALLEL_MIN_GRID)} or one CPU): the built-in rule", "changed": False}

    def score(t: int) -> float:
        rows = [r for r in per_t[t] if r[1]]
        return statistics.geometric_mean([r[2] for r in rows]) if rows else 0.0

    best_t = max(per_t, key=score)
    rows = per_t[best_t]
    thr = threshold_from([(s, u) for s, u, _, _ in rows])
    # Where the built-in rule uses the pool, a size keeps it unless one thread wins beyond the
    # spread; that must not leave the pool on for a range where it loses on average (evidence:
    # tune-pool-loses-on-average). Sizes are dropped from the bottom of the range until the pool gains.
    while thr is not None:
        kept = [g for s, _, g, _ in rows if s >= thr]
        if statistics.geometric_mean(kept) > 1.0:
            break
        larger = [s for s, _, _, _ in rows if s > thr]
        thr = larger[0] if larger else None
    builtin_thr = builtin.pool_threshold()
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
    changed = thr != builtin.pool_threshold() or threads != 0
    return {"threshold": thr, "threads": threads, "why": why[:MAX_WHY], "changed": changed, "rows": rows}


def decide_nt(m: Dict[str, Any], bands: Dict[str, Any], parallel: Dict[str, Any],
              builtin: Builtin) -> Dict[str, Dict[str, Any]]:
    """Per region: the non-temporal threshold from the cold page-aligned measurements, with the
    thread count the dispatcher would use at each size, for the built-in profile's NT kernel where
    this CPU has it (its choice cites its evidence; tune decides where to stream, not with what:
    evidence: tune-two-runs-compared-intel), else the first streaming kernel measured."""
    out: Dict[str, Dict[str, Any]] = {}
    nt_kernel = builtin.nt_kernel if builtin.nt_kernel in m["streaming"] else (
        m["streaming"][0] if m["streaming"] else None)
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
        thr = threshold_from([(s, u) for s, u, _ in rows])
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


# ----------------------------------------------------------------------------- validation

class ChangedRun(NamedTuple):
    """A run of consecutive grid points whose kernel differs from the built-in one: indexes
    ``first``..``last``, the sizes it covers [``lo``, ``hi``) (``hi`` None: to the end of the
    grid), its ``kernel`` and the ``builtin`` one it replaces."""
    first: int
    last: int
    lo: int
    hi: Optional[int]
    kernel: str
    builtin: str


def changed_runs(points: List[Dict[str, Any]]) -> List[ChangedRun]:
    """The runs of ``points`` (one class's grid points, each with ``size``, ``kernel`` and
    ``builtin``) whose kernel differs from the built-in one."""
    runs, i = [], 0
    while i < len(points):
        if points[i]["kernel"] != points[i]["builtin"]:
            j = i
            while j + 1 < len(points) and points[j + 1]["kernel"] == points[i]["kernel"] \
                    and points[j + 1]["builtin"] != points[j + 1]["kernel"]:
                j += 1
            hi = points[j + 1]["size"] if j + 1 < len(points) else None
            runs.append(ChangedRun(i, j, points[i]["size"], hi, points[i]["kernel"], points[i]["builtin"]))
            i = j + 1
        else:
            i += 1
    return runs


class Validation(NamedTuple):
    """A changed run timed at one size off the grid: ``ratio`` = the new kernel's speed over the
    built-in one's there (over all its placements), ``placements`` the ratio at each placement
    (empty where it was timed at too few placements for the sign test: cold sizes)."""

    size: int
    ratio: float
    placements: Tuple[float, ...] = ()


# (region, class, index of the run's first point) -> its Validations, or (size, ratio) pairs
Ratios = Dict[Tuple[str, str, int], List[Any]]


def apply_validation(bands: Dict[str, Any], ratios: Ratios) -> List[Dict[str, Any]]:
    """Keeps each changed run of ``bands`` (``changed_runs``) only when its new kernel also beat
    the built-in one off the grid, by more than MIN_GAIN on the geometric mean of ``ratios``
    (noise alone rarely wins twice) and, where timed at several placements, at enough of them
    all together for the sign test (``placement_verdict``) to call it a win: a kernel faster at
    some placements only is a tie, whatever its mean. Else puts the built-in kernel back; a run
    measured at no size off the grid is kept. Updates ``bands`` in place; returns the report,
    one entry per run."""
    report = []
    for region in REGIONS:
        for cls in CLASSES:
            points = bands[region][cls]
            for i, j, lo, hi, new, old in changed_runs(points):
                got = [Validation(*v) for v in ratios.get((region, cls, i), [])]
                gain = statistics.geometric_mean([v.ratio for v in got]) if got else None
                placed = [r for v in got for r in v.placements]
                faster = sum(r > 1 for r in placed)
                tie = bool(placed) and placement_verdict(placed, len(placed)) != "win"
                keep = gain is None or (gain > 1 + MIN_GAIN and not tie)
                words = ", ".join(f"{v.size} B {v.ratio:.2f}x" for v in got)
                if placed:
                    words += f" (faster at {faster} of {len(placed)} placements)"
                for p in points[i:j + 1]:
                    if not keep:
                        p["kernel"] = p["builtin"]
                        p["why"] = (f"built-in choice kept: {new} {words}: a tie by the sign test"
                                    if gain is not None and gain > 1 + MIN_GAIN else
                                    f"built-in choice kept: {new} lost the validation at {words}")[:MAX_WHY]
                    elif got:
                        p["why"] = (p["why"] + "; validated " + words)[:MAX_WHY]
                grid_gain = statistics.geometric_mean([p["gain"] for p in points[i:j + 1]])
                report.append({"region": region, "class": cls, "from": lo, "to": hi, "builtin": old, "new": new,
                               "grid_gain": grid_gain, "validation": got, "validation_gain": gain,
                               "validation_placements": (faster, len(placed)), "kept": keep})
    return report


def offset_class(offset: int) -> str:
    """The address class of a forward copy at (dst - src) mod 4096 = ``offset`` (docs/profile-format.md)."""
    return "page_aligned" if offset == 0 else ("near" if offset < 64 else "far")


def point_class(point: Dict[str, Any]) -> str:
    """The address class of a point of the held-out check: ``backward`` for an overlapping copy
    (``overlap``: dst = src + offset inside the source), else ``offset_class``."""
    return "backward" if point.get("overlap") else offset_class(point["offset"])


class HeldOutPoint(NamedTuple):
    """A point where a changed band's kernel and the built-in one were both timed, off the grid:
    ``speed`` = the built-in plan's median time / the changed one's, with its interval [``low``,
    ``high``]."""

    region: str
    cls: str
    size: int
    offset: int
    new: str  # the kernel the tuned profile ran there
    old: str  # the built-in kernel it was timed against
    speed: float
    low: float
    high: float


def drop_contradicted_runs(bands: Dict[str, Any], regions: Sequence[str], points: Sequence[HeldOutPoint],
                           by: str) -> List[Dict[str, Any]]:
    """Drops each changed run of ``bands``' ``regions`` (``changed_runs``) that a held-out point
    contradicts: one inside the run's sizes and class where the run's kernel ran, timed against
    the built-in kernel, and lost beyond the interval (``high`` below 1). The built-in kernel
    takes the run back; ``by`` names the measurement in its ``why``. Updates ``bands`` in place;
    returns one entry per dropped run."""
    dropped = []
    for region in regions:
        for cls in CLASSES:
            rows = bands[region][cls]
            for i, j, lo, hi, new, old in changed_runs(rows):
                against = [p for p in points
                           if p.region == region and p.cls == cls and lo <= p.size and (hi is None or p.size < hi)
                           and p.new == new and p.old == old and p.high < 1.0]
                if not against:
                    continue
                words = ", ".join(f"{p.size} B @ {p.offset} {p.speed:.2f}x [{p.low:.2f}, {p.high:.2f}]" for p in against)
                for p in rows[i:j + 1]:
                    p["kernel"] = p["builtin"]
                    p["why"] = f"built-in choice kept: {new} lost the held-out {by} to {old} at {words}"[:MAX_WHY]
                dropped.append({"region": region, "class": cls, "from": lo, "to": hi, "builtin": old, "new": new,
                                "points": [(p.size, p.offset, p.speed) for p in against], "by": by})
    return dropped


def apply_check(bands: Dict[str, Any], points: List[Dict[str, Any]], region: str = "private") -> List[Dict[str, Any]]:
    """Drops each changed run of ``bands[region]`` (``changed_runs``) that the held-out check
    contradicts: a point inside the run's sizes and class where the profile picked the run's kernel
    and the built-in kernel, forced, was faster beyond the interval (``vs_builtin``'s upper bound
    below 1). ``points``: the check's points, each with ``size``, ``offset``, ``picked`` and
    ``vs_builtin`` = {"kernel", "ratio": the built-in kernel's median time / the profile's (its speed
    relative to the built-in kernel), "ci": [low, high]}. Updates ``bands`` in place; returns one entry per dropped run."""
    held_out = [HeldOutPoint(region, point_class(p), p["size"], p["offset"], p["picked"].split(" x")[0],
                             p["vs_builtin"]["kernel"], p["vs_builtin"]["ratio"], *p["vs_builtin"]["ci"])
                for p in points if p.get("vs_builtin")]
    return drop_contradicted_runs(bands, [region], held_out, "check")


SHARED_REGIONS = ("to_shared", "from_shared")


def apply_shared_check(bands: Dict[str, Any], points: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Drops each changed run of ``bands``' shared regions that the comparison at held-out points
    contradicts: a point of that region inside the run's sizes and class where the tuned plan ran
    the run's kernel, the built-in plan the built-in kernel, and the built-in plan was faster
    beyond the interval. The held-out check (``apply_check``) times private copies only; copies
    into and out of shared memory are judged here, at points drawn the same way with the shared
    side in a POSIX shared-memory mapping (evidence: tune-shared-check). ``points``: the
    comparison's points (``compare.compare_texts`` with A the built-in profile, B the tuned one),
    each with ``region``, ``size``, ``offset``, ``overlap``, ``plan_a``, ``plan_b`` (a kernel, with
    " xN" on the pool) and ``ci`` of ratio = B's time / A's (low end above 1: the built-in plan is
    faster beyond the interval). Updates ``bands`` in place; returns one entry per dropped run."""
    held_out = [HeldOutPoint(p["region"], point_class(p), p["size"], p["offset"], p["plan_b"].split(" x")[0],
                             p["plan_a"].split(" x")[0], 1 / p["ratio"], 1 / p["ci"][1], 1 / p["ci"][0])
                for p in points]
    return drop_contradicted_runs(bands, SHARED_REGIONS, held_out, "comparison")


def profile_body(m: Dict[str, Any], bands: Dict[str, Any], nt: Dict[str, Any], parallel: Dict[str, Any],
                 builtin: Builtin) -> Dict[str, Any]:
    """The profile's ``regions`` and ``parallel`` from the decisions: per region and class the
    bands (below the first measured size the built-in bands), per region the non-temporal rule."""
    regions: Dict[str, Any] = {}
    for region in REGIONS:
        r: Dict[str, Any] = {}
        for cls in CLASSES:
            r[cls] = bands_from_points(bands[region][cls], builtin.bands[region][cls])
        r["nt"] = {"threshold": nt[region]["threshold"], "kernel": nt[region]["kernel"], "why": nt[region]["why"]}
        regions[region] = r
    return {"regions": regions,
            "parallel": {"threshold": parallel["threshold"], "threads": parallel["threads"], "why": parallel["why"]}}


class PoolChange(NamedTuple):
    """Sizes [lo, hi) (hi None: every size from lo) where a pool rule splits copies across the
    pool (``pool``) and the built-in rule runs them on one thread, or the other way round."""
    lo: int
    hi: Optional[int]
    pool: bool


def pool_change(parallel: Dict[str, Any], builtin: Builtin) -> Optional[PoolChange]:
    """Where ``parallel`` (``decide_parallel``'s) changes the built-in plan; None where it does not."""
    new = parallel["threshold"]
    old = builtin.pool_threshold()
    if new == old:
        return None
    if new is not None and (old is None or new < old):
        return PoolChange(new, old, True)
    assert old is not None  # new is None or above old
    return PoolChange(old, new, False)


def apply_parallel_validation(parallel: Dict[str, Any], builtin: Builtin,
                              ratios: List[Tuple[int, float]]) -> Dict[str, Any]:
    """Keeps a pool threshold that changes the built-in plan (``pool_change``) only when its plan
    also beat the built-in plan off the grid, at sizes inside the change, by more than MIN_GAIN
    on the geometric mean of ``ratios`` ((size, the new plan's speed / the built-in plan's));
    else the built-in threshold and threads come back. A change measured at no size off the
    grid is kept. Returns the pool decision, with "validation": ``ratios``."""
    change = pool_change(parallel, builtin)
    if change is None or not ratios:
        return dict(parallel, validation=list(ratios))
    gain = statistics.geometric_mean([r for _, r in ratios])
    words = ", ".join(f"{human_size(s)} {r:.2f}x" for s, r in ratios)
    if gain > 1 + MIN_GAIN:
        return dict(parallel, validation=list(ratios), why=f"{parallel['why']}; validated {words}"[:MAX_WHY])
    old = builtin.pool_threshold()
    plan = "the pool" if change.pool else "one thread"
    return dict(parallel, threshold=old, threads=0, changed=False, validation=list(ratios),
                why=(f"the built-in rule kept: {plan} from {human_size(change.lo)} lost the validation "
                     f"off the grid at {words}")[:MAX_WHY])


def apply_pool_check(parallel: Dict[str, Any], builtin: Builtin,
                     points: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The pool decision after the held-out check: a pool threshold that changes the built-in plan
    (``pool_change``) gives way to the built-in rule where the check contradicts it, at a point
    inside the change (not overlapping: those never split) where the profile ran the change's plan
    and the built-in plan, forced (the same kernel, split or on one thread), was faster beyond the
    interval (``vs_builtin_plan``'s upper bound below 1). ``points``: the check's points, each with
    ``size``, ``offset``, ``picked`` and, where the two plans differ, ``vs_builtin_plan`` =
    {"variant", "ratio": the built-in plan's median time / the profile's, "ci": [low, high]}.
    Returns ``parallel`` itself where nothing contradicts it, else the built-in threshold and
    threads with "check_dropped": the points. A threshold measured while the host held the
    other vCPU back passes the grid and the validation alike (evidence: tune-check-pool-threshold)."""
    change = pool_change(parallel, builtin)
    if change is None:
        return parallel
    against = [p for p in points
               if not p.get("overlap") and change.lo <= p["size"] and (change.hi is None or p["size"] < change.hi)
               and (" x" in p["picked"]) == change.pool and p.get("vs_builtin_plan")
               and p["vs_builtin_plan"]["ci"][1] < 1.0]
    if not against:
        return parallel
    words = ", ".join(f"{p['size']} B @ {p['offset']} {p['vs_builtin_plan']['ratio']:.2f}x "
                      f"[{p['vs_builtin_plan']['ci'][0]:.2f}, {p['vs_builtin_plan']['ci'][1]:.2f}]" for p in against)
    plan, other = ("the pool", "one thread") if change.pool else ("one thread", "the pool")
    return dict(parallel, threshold=builtin.pool_threshold(), threads=0, changed=False,
                check_dropped=[(p["size"], p["offset"], p["vs_builtin_plan"]["ratio"]) for p in against],
                why=(f"the built-in rule kept: {plan} from {human_size(change.lo)} lost the held-out check "
                     f"to {other} at {words}")[:MAX_WHY])


def settle(m: Dict[str, Any], builtin: Builtin, bands: Dict[str, Any],
           ratios: Ratios) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """The decisions after ``decide_bands`` up to the pool: the validation of the bands
    (``ratios``, measured for the runs ``decide_bands`` changed; ``bands`` updated in place) and
    the pool's rule from the validated bands. Returns (the validation report, the pool decision)."""
    report = apply_validation(bands, ratios)
    return report, decide_parallel(m, bands, builtin)


def finish(m: Dict[str, Any], builtin: Builtin, bands: Dict[str, Any], report: List[Dict[str, Any]],
           parallel: Dict[str, Any]) -> Dict[str, Any]:
    """The decisions after the pool's (``settle``, ``apply_parallel_validation``): the
    non-temporal thresholds and the profile's body. Returns {"bands", "report", "parallel",
    "nt", "body"}."""
    nt = decide_nt(m, bands, parallel, builtin)
    return {"bands": bands, "report": report, "parallel": parallel, "nt": nt,
            "body": profile_body(m, bands, nt, parallel, builtin)}


def decide(m: Dict[str, Any], builtin: Builtin, ratios: Ratios,
           pool_ratios: Tuple[Tuple[int, float], ...] = ()) -> Dict[str, Any]:
    """Every decision from the measurements ``m``, the built-in choices and the validation ratios
    (``pool_ratios``: the pool threshold's, for ``apply_parallel_validation``)."""
    bands = decide_bands(m, builtin)
    report, parallel = settle(m, builtin, bands, ratios)
    return finish(m, builtin, bands, report, apply_parallel_validation(parallel, builtin, list(pool_ratios)))
