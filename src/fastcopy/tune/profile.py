"""The profile ``python -m fastcopy tune`` writes: the built-in choices it is measured against,
the file it builds from the decisions, its text, its checks, and the tune itself (``tune()``).

There is one validator, the loader's (``_core.validate_profile``): a profile is checked as the
exact text that is written or was read, so tune, ``tune --show`` and ``import fastcopy`` never
judge a file differently. Files are read through ``fastcopy._profile.read_profile_text`` (a
regular file of at most the loader's limit) and written whole (readers never see half a file).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import _core
from .._profile import read_profile_text
from ..bench import engine
from ..bench.engine import BACKWARD_SHIFT
from ..bench.paths import output_problem, write_whole
from ..bench.system import cpu_model_name, cpu_moved_note
from ..bench.units import human_size
from . import decide, measure
from .decide import CLASSES, MAX_WHY, REGIONS, Builtin

# The profile format is defined once, in C++ (the loader): its name and version.
_LIMITS = _core.profile_limits()
PROFILE_FORMAT = _LIMITS["format"]
PROFILE_VERSION = _LIMITS["version"]
REGION_CODE = {"private": 0, "to_shared": 1, "from_shared": 2}


# ----------------------------------------------------------------------------- the built-in choices

def builtin_choices(sizes: Sequence[int]) -> Builtin:
    """What the active (built-in) profile does at ``sizes``, read from the running policy:
    ``_core.chosen_kernel`` on synthetic addresses of each class, so nothing is copied."""
    nt_threshold = _core.nt_threshold()
    streaming = {k["name"] for k in _core.kernel_table() if k.get("streaming")}

    def kernel(region: str, cls: str, size: int) -> str:
        n = size
        if nt_threshold is not None and n >= nt_threshold:
            n = max(nt_threshold - 1, 1)  # the band under the non-temporal switch
        base = 1 << 44
        if cls == "backward":
            src, dst = base, base + max(1, min(BACKWARD_SHIFT, n // 2))
        else:
            src, dst = base, base + (1 << 40) + measure.CLASS_OFFSETS[cls][0]
        name = _core.chosen_kernel(dst, src, n, REGION_CODE[region])
        return "generic" if name in streaming else str(name)  # a policy that streams below its threshold

    profile = _core.base_profile()["regions"]
    return Builtin(nt_threshold=nt_threshold, parallel_threshold=_core.parallel_threshold(),
                   threads=int(_core.default_threads()),
                   kernels={r: {c: {s: kernel(r, c, s) for s in sizes} for c in CLASSES} for r in REGIONS},
                   bands={r: {c: list(profile[r][c]) for c in CLASSES} for r in REGIONS},
                   nt_kernel=profile["private"]["nt"]["kernel"])


# ----------------------------------------------------------------------------- the profile

def machine_words(l3: int) -> str:
    """The machine in words, for the provenance: CPU model, family and model, CPUs, L3."""
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


def build_profile(m: Dict[str, Any], body: Dict[str, Any], command: str, note: Optional[str] = None
                  ) -> Dict[str, Any]:
    """The profile (docs/profile-format.md) from the measurements ``m`` and the decided ``body``
    (``decide.profile_body``). ``note``: appended to the method. Its ``notes`` (shown by info())
    say when the host moved the CPUs during the measurements."""
    from .._profile import signature

    method = (f"{command}: hot caches below the {human_size(m['l3'])} L3 (L2 {human_size(m['l2'])}), cold at and "
              f"above it (rotation of >= {engine.COLD_L3_FACTOR}x L3); {m['repeats']} interleaved repeats of "
              f">= {m['min_time'] * 1e3:g} ms loops per placement, medians, "
              f"{'-'.join(str(x) for x in m.get('placements', [1]))} placements (fresh buffers, offsets drawn "
              f"from the class); a band changes only beyond the spread, by a sign test over placements; "
              f"validated off the grid and by a held-out check; sizes {human_size(m['sizes'][0])} to {human_size(m['sizes'][-1])}"
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
        "regions": body["regions"],
        "parallel": body["parallel"],
    }
    moved = cpu_moved_note(m.get("cpu_distance"))
    if moved:
        profile["notes"] = [moved[:MAX_WHY]]
    return profile


def profile_text(profile: Any) -> str:
    """The profile as the file holds it (JSON, indented by one)."""
    try:
        return json.dumps(profile, indent=1) + "\n"
    except (TypeError, ValueError) as e:
        raise ValueError(f"profile: not JSON data: {e}") from None


def validate_text(text: str) -> None:
    """Checks a profile's text exactly as loading it would (docs/profile-format.md), against this
    machine's kernels: ValueError names the first problem."""
    try:
        _core.validate_profile(text)
    except ValueError as e:
        raise ValueError(f"profile: {e}") from None


def validate_profile(profile: Any) -> None:
    """Checks ``profile`` (a dict) as the text it would be written as (``validate_text``)."""
    validate_text(profile_text(profile))


def write_profile(path: str, profile: Dict[str, Any]) -> str:
    """Checks the profile's text and writes it whole to ``path`` (its folder made if missing);
    returns the text. ValueError: not a valid profile; OSError: the write failed."""
    text = profile_text(profile)
    validate_text(text)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_whole(path, text)  # readers never see half a file
    return text


def read_profile(path: str) -> Dict[str, Any]:
    """The profile in the file at ``path``, checked by the loader's validator; ValueError names
    the file's problem (unreadable, too large, not a regular file, not a valid profile)."""
    text = read_profile_text(path)
    validate_text(text)
    doc: Dict[str, Any] = json.loads(text)  # valid: the validator parsed it already
    return doc


def not_a_profile(path: str) -> Optional[str]:
    """Why the file at ``path`` is not a fastcopy profile (JSON whose "format" is the profile
    format's name, whatever its version or content), or None when it is one."""
    try:
        doc = json.loads(read_profile_text(path))
    except ValueError as e:  # ProfileFileError, json.JSONDecodeError: both ValueErrors
        return str(e) if str(e).startswith(path) else f"not JSON: {e}"
    if not isinstance(doc, dict) or doc.get("format") != PROFILE_FORMAT:
        return f'no "format": "{PROFILE_FORMAT}"'
    return None


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
                   builtin: Builtin, dropped: Sequence[Dict[str, Any]] = ()) -> str:
    lines = ["changes against the built-in profile:"]
    gone = {(c["region"], c["class"], c["from"]) for c in dropped}
    kept = [c for c in report if c["kept"] and (c["region"], c["class"], c["from"]) not in gone]
    for c in kept:
        v = (f", validated {c['validation_gain']:.2f}x off the grid" if c["validation_gain"] is not None
             else ", not validated (no size off the grid in the band)")
        lines.append(f"  {c['region']:<11} {c['class']:<13} {_range_words(c['from'], c['to']):<22} "
                     f"{c['builtin']} -> {c['new']}: {c['grid_gain']:.2f}x on the grid{v}")
    for c in report:
        if not c["kept"]:
            faster, placed = c["validation_placements"]
            at = f", faster at {faster} of {placed} placements" if placed else ""
            lines.append(f"  {c['region']:<11} {c['class']:<13} {_range_words(c['from'], c['to']):<22} "
                         f"{c['builtin']} kept: {c['new']} measured {c['grid_gain']:.2f}x on the grid but "
                         f"{c['validation_gain']:.2f}x off it{at}")
    for c in dropped:
        where = ", ".join(f"{s} B @ {o} {r:.2f}x" for s, o, r in c["points"])
        lines.append(f"  {c['region']:<11} {c['class']:<13} {_range_words(c['from'], c['to']):<22} "
                     f"{c['builtin']} kept: {c['new']} lost the held-out {c.get('by', 'check')} at {where}")
    for region in REGIONS:
        if nt[region].get("changed"):
            old = builtin.nt_threshold
            new = nt[region]["threshold"]
            lines.append(f"  {region:<11} non-temporal threshold {human_size(old) if old else 'never'} -> "
                         f"{human_size(new) if new else 'never'}: {nt[region]['why']}")
    if parallel.get("changed"):
        old = builtin.pool_threshold()
        lines.append(f"  parallel threshold {human_size(old) if old else 'never'} -> "
                     f"{human_size(parallel['threshold']) if parallel['threshold'] else 'never'}, threads "
                     f"{parallel['threads'] or 'all'}: {parallel['why']}")
    if len(lines) == 1:
        lines.append("  none: the built-in profile was as fast as anything measured, within the spread")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the held-out check

def builtin_band_kernel(builtin: Builtin, region: str, cls: str, size: int) -> str:
    """The built-in band kernel for a copy of ``size`` bytes (any size, not only the grid's)."""
    return [b for b in builtin.bands[region][cls] if b["from"] <= size][-1]["kernel"]


def check_sizes(sizes: Sequence[int]) -> Tuple[int, int]:
    """(smallest, largest) size the checks at the end of tune draw: the grid's range, within the
    held-out check's own (``check.MIN_SIZE`` to ``check.MAX_SIZE``)."""
    from . import check

    lo = min(max(check.MIN_SIZE, sizes[0]), check.MAX_SIZE)
    return lo, max(lo, min(check.MAX_SIZE, sizes[-1]))


def held_out_check(profile: Dict[str, Any], sizes: Sequence[int], cfg: Dict[str, Any], builtin: Builtin
                   ) -> Dict[str, Any]:
    """Runs ``fastcopy.tune.check`` with ``profile`` active at ``measure.CHECK_SEED``'s points
    (sizes within the grid's range), then puts the built-in profile back. Each point gets
    ``vs_builtin``: the profile's speed relative to the built-in band kernel forced (on the pool
    when the profile's pick is), with its bootstrap interval, for ``decide.apply_check``; and
    where the built-in rule splits a copy the profile runs on one thread, or the other way round,
    ``vs_builtin_plan``: relative to the profile's kernel forced on the built-in plan, for
    ``decide.apply_pool_check``."""
    from . import check

    lo, hi = check_sizes(sizes)
    _core.load_profile(profile_text(profile), "tune (held-out check)")
    try:
        result = check.check_dispatch(points=int(cfg["check_points"]), seed=measure.CHECK_SEED,
                                      repeats=int(cfg["check_repeats"]), min_time=check.DEFAULT_MIN_TIME,
                                      min_size=lo, max_size=hi,
                                      command="python -m fastcopy tune (held-out check)")
    finally:
        _core.use_builtin_profile("")
    for i, p in enumerate(result["points"]):
        old = builtin_band_kernel(builtin, "private", decide.point_class(p), p["size"])
        suffix = p["picked"][len(p["picked"].split(" x")[0]):]
        name = old + suffix if old + suffix in p["seconds"] else old
        if name in p["seconds"]:
            r, r_lo, r_hi = check.ratio_ci(p["seconds"][check.AUTO], p["seconds"][name], seed=measure.CHECK_SEED + i)
            p["vs_builtin"] = {"kernel": old, "ratio": r, "ci": [r_lo, r_hi]}
        kernel, split = p["picked"].split(" x")[0], " x" in p["picked"]
        if not p["overlap"] and builtin.uses_pool(p["size"]) != split:
            plan = [n for n in p["seconds"] if n.startswith(kernel + " x")] if not split else [kernel]
            if plan and plan[0] in p["seconds"]:
                ratio, low, high = check.ratio_ci(p["seconds"][check.AUTO], p["seconds"][plan[0]],
                                                  seed=measure.CHECK_SEED + i)
                p["vs_builtin_plan"] = {"variant": plan[0], "ratio": ratio, "ci": [low, high]}
    return result


# Candidate copies the shared regions' comparison draws per region: a changed band covering
# 0.1 % of them still comes up about 20 times (a page-aligned band of 384-512 B, 10 % of the
# offsets and 3 % of the sizes from 256 B to 4 MiB, about 60 times); a plan costs the core about
# 1 us, so the candidates of both regions take about 0.1 s (evidence: tune-shared-check).
SHARED_CHECK_CANDIDATES = 20000


def shared_check(profile: Dict[str, Any], bands: Dict[str, Any], sizes: Sequence[int], cfg: Dict[str, Any]
                 ) -> Optional[Dict[str, Any]]:
    """Where tune changed a band of a shared region (``bands``, as ``decide`` leaves them), times
    ``profile``'s plans against the built-in profile's where they differ for copies into and out
    of shared memory (``compare.compare_texts``: A the built-in profile, B ``profile``), at
    ``cfg["shared_check_points"]`` points drawn from ``measure.CHECK_SEED`` as the held-out check
    draws its points (sizes within the grid's range), for ``decide.apply_shared_check``. None
    where no shared band changed: nothing to judge, nothing measured."""
    from . import check, compare

    if not any(decide.changed_runs(bands[region][cls]) for region in decide.SHARED_REGIONS for cls in decide.CLASSES):
        return None
    lo, hi = check_sizes(sizes)
    return compare.compare_texts(_core.base_profile_json(), "built-in", profile_text(profile), "tuned",
                                 points=int(cfg["shared_check_points"]), seed=measure.CHECK_SEED,
                                 repeats=int(cfg["check_repeats"]), min_time=check.DEFAULT_MIN_TIME,
                                 min_size=lo, max_size=hi, command="python -m fastcopy tune (shared regions)",
                                 regions=decide.SHARED_REGIONS, per_region=SHARED_CHECK_CANDIDATES)


def check_record(result: Dict[str, Any], dropped: Sequence[Dict[str, Any]],
                 pool_dropped: Optional[Dict[str, Any]] = None,
                 compared: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The held-out check as the profile's provenance keeps it: seed, points, geometric mean with its
    interval, the lowest points, the bands it dropped and the pool threshold it dropped
    (``pool_dropped``: the pool decision before, from ``decide.apply_pool_check``'s input), its
    figures those of the profile before; ``shared``: the comparison of the shared regions
    (``shared_check``; None where it did not run): its points and their verdicts."""
    s, pts = result["summary"], result["points"]
    shared = None
    if compared is not None:
        from .compare import A_FASTER, B_FASTER, TIE, verdict  # A: the built-in profile, B: the tuned one

        verdicts = [verdict(*p["ci"]) for p in compared["points"]]
        shared = {"points": len(verdicts), "seconds": round(compared["elapsed_seconds"], 1),
                  "builtin_faster": verdicts.count(A_FASTER), "tuned_faster": verdicts.count(B_FASTER),
                  "ties": verdicts.count(TIE)}
    return {"shared": shared, "seed": result["config"]["seed"], "points": len(pts), "repeats": result["config"]["repeats"],
            "sizes": [result["config"]["min_size"], result["config"]["max_size"]],
            "geomean": round(s["geomean"], 4), "geomean_ci": [round(x, 4) for x in s["geomean_ci"]],
            "lowest": [[pts[i]["size"], pts[i]["offset"], round(pts[i]["ratio"], 4),
                        [round(x, 4) for x in pts[i]["ci"]]] for i in s["lowest"]],
            "below_0_90": s["below_0_90"], "seconds": round(result["elapsed_seconds"], 1),
            "load": [result["load_before"], result["load_after"]],
            "dropped": [f"{c['region']} {c['class']} from {c['from']}: {c['new']} -> {c['builtin']}" for c in dropped]
            + ([f"parallel threshold: {pool_dropped['threshold']} -> the built-in rule"] if pool_dropped else [])}


def check_words(rec: Dict[str, Any]) -> str:
    """The provenance's check record in one paragraph."""
    lo, hi = rec["geomean_ci"]
    low = "; ".join(f"{r:.3f} [{c[0]:.3f}, {c[1]:.3f}] at {s} B @ {o}" for s, o, r, c in rec["lowest"][:3])
    drop = "; ".join(rec["dropped"]) or "none"
    sh = rec.get("shared")
    shared = "" if not sh else (f"; copies into and out of shared memory, {sh['points']} points where the plans differ "
                                f"({sh['seconds']} s): built-in plan faster at {sh['builtin_faster']}, tuned plan "
                                f"faster at {sh['tuned_faster']}, ties {sh['ties']}")
    return (f"held-out check (seed {rec['seed']}, {rec['points']} points {rec['sizes'][0]} B to {rec['sizes'][1]} B, "
            f"{rec['seconds']} s): geometric mean {rec['geomean']:.3f} [{lo:.3f}, {hi:.3f}] of the best other "
            f"variant; lowest {low}{shared}; dropped: {drop}")


# ----------------------------------------------------------------------------- entry points


def busy_warning() -> Optional[str]:
    """Words on other load when the 1-minute load average exceeds half the usable CPUs, else None:
    then the pool and large copies measure contention, not the machine."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    from ..bench.system import usable_cpu_count

    cpus = usable_cpu_count()
    if load > cpus / 2:
        return (f"load average {load:.1f} on {cpus} CPUs before measuring: other work shares the machine, "
                "so thread-pool and large-copy figures reflect it; tune on an idle machine for a profile to keep")
    return None


def default_output() -> str:
    from .._profile import cache_path

    return cache_path()


# ----------------------------------------------------------------------------- tune()

def tune(quick: bool = False, output: Optional[str] = None, grid: Optional[Sequence[int]] = None,
         repeats: Optional[int] = None, min_time: Optional[float] = None, progress: Optional[bool] = None,
         write: bool = True, verbose: bool = False, command: str = "fastcopy.tune()") -> Dict[str, Any]:
    """Measures this machine and returns the profile (docs/profile-format.md); with ``write``, saves
    it to ``output`` (default: the user cache, ``fastcopy._profile.cache_path()``). ``grid``:
    sizes to measure instead of the default grid (for tests and focused runs). ``verbose``:
    print the table and the changes against the built-in profile."""
    # Measure against the built-in profile, not a tuned one loaded at import (a second tune run
    # would otherwise compare with the first one's result); the caller's profile comes back after.
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
    sizes = sorted(set(grid)) if grid else measure.size_grid(quick)
    builtin = builtin_choices(sizes)
    load = busy_warning()
    if load and verbose:
        print(f"warning: {load}", file=sys.stderr)
    cfg = measure.SETTINGS["quick" if quick else "default"]
    bar = engine.Progress(measure.cell_count(sizes) + 10, enabled=progress, delay=0.5)
    t0 = time.monotonic()
    try:
        m = measure.measure(quick=quick, grid=sizes, repeats=repeats, min_time=min_time, progress=bar, builtin=builtin)
        bands = decide.decide_bands(m, builtin)
        ratios = measure.validation_ratios(m, bands, repeats or int(cfg["repeats"]), min_time or cfg["min_time"],
                                           bar, int(cfg["cold_repeats"]), cfg["cold_min_time"], builtin,
                                           tuple(cfg["placements"]), tuple(cfg["cold_placements"]))
        report, parallel = decide.settle(m, builtin, bands, ratios)
        pool_ratios = measure.pool_validation_ratios(m, bands, parallel, builtin, repeats or int(cfg["repeats"]),
                                                     min_time or cfg["min_time"], bar)
        d = decide.finish(m, builtin, bands, report, decide.apply_parallel_validation(parallel, builtin, pool_ratios))
    finally:
        bar.close()
    note = load.split(":")[0] + ": the pool and large copies measured other work too" if load else None
    profile = build_profile(m, d["body"], command, note)
    validate_profile(profile)
    checked = held_out_check(profile, sizes, cfg, builtin)
    dropped = decide.apply_check(d["bands"], checked["points"])
    compared = shared_check(profile, d["bands"], sizes, cfg)
    if compared is not None:
        dropped += decide.apply_shared_check(d["bands"], compared["points"])
    pool = decide.apply_pool_check(d["parallel"], builtin, checked["points"])
    pool_dropped = d["parallel"] if pool is not d["parallel"] else None
    if dropped or pool_dropped:
        # the NT thresholds follow the pool's rule (decide_nt)
        d = decide.finish(m, builtin, d["bands"], d["report"], pool)
        profile = build_profile(m, d["body"], command, note)
    profile["provenance"]["check"] = check_record(checked, dropped, pool_dropped, compared)
    validate_profile(profile)
    if verbose:
        for words in profile.get("notes", []):
            print(f"warning: {words}", file=sys.stderr)
        print(format_profile(profile))
        print()
        print(format_changes(d["report"], d["nt"], d["parallel"], builtin, dropped))
        print()
        print(check_words(profile["provenance"]["check"]))
        print(f"\nmeasured in {time.monotonic() - t0:.1f} s")
    if write:
        path = output if output is not None else default_output()
        write_profile(path, profile)
        if verbose:
            print(f"profile written to {path}")
    return profile
