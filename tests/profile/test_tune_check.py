"""tune's placements and its held-out check, end to end: a cell is measured over fresh buffer
placements of its class, ``tune --quick`` records the held-out check in the profile's provenance,
and a band the check contradicts is dropped from the profile tune writes. The kernels and the
check's verdicts are forced where a result would otherwise depend on the CPU."""
from __future__ import annotations

import contextlib
import json
import os
import random

import numpy as np
import pytest

import fastcopy
from fastcopy import _core, _profile
from fastcopy.bench.engine import Arena, SizeMemory, slot_bytes
from fastcopy.tune import decide, measure
from fastcopy.tune import profile as tune

from _cli import cli


@contextlib.contextmanager
def shared_size_memory(size):
    """tune's memory for copies of ``size`` bytes (one slot, shared memory too), closed after."""
    arena = Arena(slot_bytes(size))
    mem = SizeMemory(size, 1, shared=True, arena=arena)
    try:
        yield mem
    finally:
        mem.close()
        arena.close()


@pytest.fixture(autouse=True)
def builtin_profile(tmp_path, monkeypatch):
    """Each test starts from the built-in profile (an empty cache, FASTCOPY_PROFILE unset)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("FASTCOPY_PROFILE", raising=False)
    _profile.load_at_import()
    yield
    monkeypatch.undo()
    _profile.load_at_import()


@pytest.mark.parametrize("cls", ["page_aligned", "near", "far"])
def test_placements_draw_offsets_from_the_whole_class_on_fresh_buffers(cls):
    with shared_size_memory(4096) as mem:
        rng = random.Random(1)
        lo, hi = measure.CLASS_RANGES[cls]
        seen = set()
        for _ in range(40):
            off, pairs = measure._placement(mem, "private", cls, rng)
            (d, s), = pairs
            assert (d.ctypes.data - s.ctypes.data) % 4096 == off and lo <= off <= hi
            assert not np.shares_memory(d, mem.private) and not np.shares_memory(s, mem.private)  # fresh
            seen.add(off)
        assert len(seen) > 10 if cls != "page_aligned" else seen == {0}
        # shared regions stay in the mapping, at a drawn offset
        off, ((d, s),) = measure._placement(mem, "to_shared", cls, rng)
        assert (d.ctypes.data - s.ctypes.data) % 4096 == off and lo <= off <= hi


@pytest.mark.parametrize("region, cls", [("to_shared", "page_aligned"), ("from_shared", "far"),
                                         ("to_shared", "backward"), ("private", "backward")])
def test_placements_in_the_mapping_draw_where_the_source_starts_in_its_page(region, cls):
    """Placements that stay in tune's memory (shared regions, overlapping copies) start the source
    at a page offset drawn in steps of check.ARRAY_ALIGNMENT, as check.place does for fresh
    allocations: at one start every placement of a cell would be the same addresses, and the sign
    test over placements would count one placement many times."""
    from fastcopy.tune.check import ARRAY_ALIGNMENT

    size = 1200
    with shared_size_memory(size) as mem:
        rng = random.Random(6)
        starts = set()
        for _ in range(30):
            off, ((d, s),) = measure._placement(mem, region, cls, rng)
            assert d.size == s.size == size  # the slot holds both whole at every start
            if cls == "backward":
                assert d.ctypes.data - s.ctypes.data == off and np.shares_memory(d, s)
            else:
                assert (d.ctypes.data - s.ctypes.data) % 4096 == off
            starts.add(s.ctypes.data % 4096)
        assert len(starts) > 20 and all(x % ARRAY_ALIGNMENT == 0 for x in starts)


def test_backward_placements_draw_their_shift_as_the_check_does():
    """Backward cells overlap dst above src by a shift drawn per placement (check.backward_shift),
    not at one fixed distance; shared regions overlap inside the mapping."""
    size = 8192
    with shared_size_memory(size) as mem:
        rng = random.Random(4)
        shifts = set()
        for region in ("private", "to_shared", "from_shared") * 12:
            off, ((d, s),) = measure._placement(mem, region, "backward", rng)
            assert d.ctypes.data - s.ctypes.data == off and 0 < off < size and np.shares_memory(d, s)
            assert d.size == s.size == size
            shifts.add(off)
        assert len(shifts) > 20 and min(shifts) <= 255 and max(shifts) > 4096


def test_a_cell_measures_more_placements_only_while_the_leader_is_open():
    fast, slow = fastcopy.kernel("generic"), fastcopy.kernel("generic")
    with shared_size_memory(1024) as mem:
        # the incumbent is the only variant: the leader from the first placements, no more measured
        one = measure.measure_cell({"generic": fast}, mem, "private", "far", 2, 1e-5, random.Random(2), (3, 8),
                                   "generic")
        assert len(one["generic"]["placements"]) == 3
        # no incumbent: the first placements only; the score is the geometric mean of the medians
        two = measure.measure_cell({"a": fast, "b": slow}, mem, "private", "near", 2, 1e-5, random.Random(3), (2, 8))
        assert {len(v["placements"]) for v in two.values()} == {2}
        for v in two.values():
            a, b = v["placements"]
            assert v["gbps"] == pytest.approx((a * b) ** 0.5)


def test_tune_quick_records_the_held_out_check_in_the_profile(tmp_path):
    out = tmp_path / "tuned.json"
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "FASTCOPY_PROFILE": "off"}
    r = cli("tune", "--quick", "--grid", "256,4K", "--output", str(out), "--no-progress", env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    profile = json.loads(out.read_text())
    rec = profile["provenance"]["check"]
    assert rec["seed"] == measure.CHECK_SEED and rec["points"] == measure.SETTINGS["quick"]["check_points"]
    assert rec["sizes"] == [256, 4096] and rec["repeats"] == measure.SETTINGS["quick"]["check_repeats"]
    lo, hi = rec["geomean_ci"]
    assert 0 < lo <= rec["geomean"] <= hi
    assert rec["lowest"] and all(256 <= s <= 4096 and 0 <= o < 4096 and c[0] <= x <= c[1]
                                 for s, o, x, c in rec["lowest"])
    assert f"held-out check (seed {measure.CHECK_SEED}, {rec['points']} points" in r.stdout
    shown = cli("tune", "--show", "--output", str(out), env=env)
    assert shown.returncode == 0 and f"held-out check (seed {measure.CHECK_SEED}" in shown.stdout
    # the loader takes the profile with its check record (a new process, as a user runs it)
    got = cli("info", "--json", env={"XDG_CACHE_HOME": str(tmp_path / "cache"), "FASTCOPY_PROFILE": str(out)})
    assert got.returncode == 0, got.stderr
    assert str(out) in got.stdout


def fake_check_result(points, geomean, ci):
    """What ``tune.held_out_check`` returns, for ``points`` judged as given."""
    return {"points": points, "config": {"seed": 5, "repeats": 2, "min_size": 4096, "max_size": 4096},
            "summary": {"geomean": geomean, "geomean_ci": ci, "lowest": [], "below_0_90": 1},
            "elapsed_seconds": 0.1, "load_before": None, "load_after": None}


def test_tune_drops_a_band_the_held_out_check_contradicts(monkeypatch):
    size = 4096
    inc = tune.builtin_choices([size]).kernel("private", "page_aligned", size)
    assert _core.active_profile()["source"] == "built-in"
    other = next(k for k in fastcopy.kernels() if k != inc and not k.endswith("_nt"))
    real = decide.decide_bands

    def bands_with_a_change(m, builtin):  # the measurement "found" `other` faster at 4 KiB page-aligned
        out = real(m, builtin)
        p = out["private"]["page_aligned"][0]
        p["kernel"], p["gain"], p["why"] = other, 1.5, "forced by the test"
        return out

    checked = {}

    def check_says_it_loses(profile, sizes, cfg, builtin):
        checked["band"] = [b["kernel"] for b in profile["regions"]["private"]["page_aligned"] if b["from"] == size]
        pts = [{"size": 5000, "offset": 0, "picked": other,
                "vs_builtin": {"kernel": inc, "ratio": 0.8, "ci": [0.75, 0.85]}}]
        return fake_check_result(pts, 0.8, [0.75, 0.85])

    monkeypatch.setattr(decide, "decide_bands", bands_with_a_change)
    monkeypatch.setattr(tune, "held_out_check", check_says_it_loses)
    # shared bands the real grid changed on this CPU are not this test's: no comparison of them
    monkeypatch.setattr(tune, "shared_check", lambda *a, **k: None)
    monkeypatch.setattr(measure, "validation_ratios", lambda *a, **k: {})
    profile = tune.tune(quick=True, grid=[size], write=False, progress=False)
    assert checked["band"] == [other]  # the check ran on the profile with the band
    # the band went back: the class holds exactly the built-in bands again
    bands = profile["regions"]["private"]["page_aligned"]
    want = tune.builtin_choices([size]).bands["private"]["page_aligned"]
    assert [(b["from"], b["kernel"]) for b in bands] == [(b["from"], b["kernel"]) for b in want]
    assert profile["provenance"]["check"]["dropped"] == [f"private page_aligned from {size}: {other} -> {inc}"]
    tune.validate_profile(profile)
    assert _core.active_profile()["source"] == "built-in"


def test_tune_drops_a_pool_threshold_the_held_out_check_contradicts(monkeypatch):
    """A pool threshold measured while the host held the other vCPU back (one thread "won") that
    the check then finds losing to the built-in plan goes back to the built-in rule, and the
    profile's check record says so."""
    size = 4096
    b = tune.builtin_choices([size])
    old = b.pool_threshold()
    # the change: one thread everywhere where the built-in rule splits; or, where it never
    # splits (one usable CPU), the pool from 256 KiB
    new, picked = (None, "avx2") if old is not None else (256 << 10, "avx2 x2")
    at = (old or 0) + (1 << 20)

    def changed_pool(m, bands, builtin):
        return {"threshold": new, "threads": 0, "why": "forced by the test", "changed": True}

    def check_says_it_loses(profile, sizes, cfg, builtin):
        assert profile["parallel"]["threshold"] == new  # the check ran on the profile with the change
        pts = [{"size": at, "offset": 700, "picked": picked, "overlap": False,
                "vs_builtin_plan": {"variant": "avx2 x2" if old is not None else "avx2", "ratio": 0.62,
                                    "ci": [0.57, 0.69]}}]
        return fake_check_result(pts, 0.62, [0.57, 0.69])

    monkeypatch.setattr(decide, "decide_parallel", changed_pool)
    monkeypatch.setattr(tune, "held_out_check", check_says_it_loses)
    monkeypatch.setattr(tune, "shared_check", lambda *a, **k: None)  # shared bands are not this test's
    monkeypatch.setattr(measure, "validation_ratios", lambda *a, **k: {})
    monkeypatch.setattr(measure, "pool_validation_ratios", lambda *a, **k: [])
    profile = tune.tune(quick=True, grid=[size], write=False, progress=False)
    assert profile["parallel"]["threshold"] == old
    assert profile["parallel"]["why"].startswith("the built-in rule kept: ")
    assert "lost the held-out check" in profile["parallel"]["why"]
    assert profile["provenance"]["check"]["dropped"] == [f"parallel threshold: {new} -> the built-in rule"]
    tune.validate_profile(profile)
    assert _core.active_profile()["source"] == "built-in"


def test_the_held_out_check_times_each_point_on_the_built_in_plan_where_the_profile_differs():
    """Where the built-in rule splits a copy across the pool and the profile runs it on one
    thread, each (non-overlapping) point of the check is also judged against the profile's
    kernel on the pool: ``vs_builtin_plan``, what ``decide.apply_pool_check`` reads."""
    import dataclasses

    sizes = [256 << 10, 512 << 10]
    builtin = dataclasses.replace(tune.builtin_choices(sizes), parallel_threshold=64 << 10, threads=2)
    profile = json.loads(_core.base_profile_json())
    profile["parallel"] = {"threshold": None, "threads": 0, "why": "one thread: forced by the test"}
    fastcopy.set_threads(2)
    try:
        result = tune.held_out_check(profile, sizes, {"check_points": 4, "check_repeats": 3}, builtin)
    finally:
        fastcopy.set_threads(0)
    forward = [p for p in result["points"] if not p["overlap"]]
    assert forward, result["points"]
    for p in result["points"]:
        assert " x" not in p["picked"], p["picked"]  # the profile never splits
        if p["overlap"]:
            assert "vs_builtin_plan" not in p  # overlapping copies never split
            continue
        plan = p["vs_builtin_plan"]
        assert plan["variant"] == p["picked"] + " x2" and plan["variant"] in p["seconds"]
        assert plan["ci"][0] <= plan["ratio"] <= plan["ci"][1]
    assert _core.active_profile()["source"] == "built-in"


def test_validation_times_a_split_copy_on_the_pool_as_it_runs(monkeypatch):
    """evidence: tune-validate-split-copies-split. A changed band where the built-in profile
    splits copies is validated with both kernels on its threads; overlapping copies (never
    split) and copies below the threshold on one thread."""
    m = {"sizes": [1 << 20], "l3": 1 << 40}
    bands = {region: {cls: [] for cls in measure.CLASSES} for region in measure.REGIONS}
    for cls in ("far", "backward"):
        bands["private"][cls] = [{"size": 1 << 20, "kernel": "new", "builtin": "old"}]
    timed = []

    def kernel(name, threads=1):
        def copy(dst, src):
            pass
        copy.threads = threads
        return copy

    def measure_cell(variants, memory, region, cls, *args, **kwargs):
        timed.append((cls, sorted((name, f.threads) for name, f in variants.items())))
        return {name: {"gbps": 1.0, "placements": [1.0] * 4} for name in variants}

    monkeypatch.setattr(fastcopy, "kernel", kernel)
    monkeypatch.setattr(measure, "measure_cell", measure_cell)

    def threads_used(parallel_threshold):
        timed.clear()
        builtin = None if parallel_threshold is None else decide.Builtin(
            nt_threshold=None, parallel_threshold=parallel_threshold, threads=2, kernels={}, bands={})
        measure.validation_ratios(m, bands, 2, 0.001, builtin=builtin)
        assert {cls for cls, _ in timed} == {"far", "backward"}
        out = {}
        for cls, variants in timed:
            assert len({t for _, t in variants}) == 1 and [n for n, _ in variants] == ["new", "old"], variants
            out.setdefault(cls, set()).add(variants[0][1])
        return out

    assert threads_used(512 << 10) == {"far": {2}, "backward": {1}}  # the far copies split; overlapping never
    assert threads_used(4 << 20) == {"far": {1}, "backward": {1}}    # below the threshold
    assert threads_used(None) == {"far": {1}, "backward": {1}}       # no built-in rule given


def test_validation_measures_hot_sizes_at_placements_for_the_sign_test(monkeypatch):
    """A hot size off the grid is timed at the placements given (first, most) with the built-in
    kernel as the incumbent of the sequential rule, and its ratio per placement comes back for
    decide.apply_validation's sign test; a cold size at the cold placements, judged by its mean."""
    m = {"sizes": [4096, 64 << 10, 128 << 10], "l3": 100 << 10}
    bands = {region: {cls: [] for cls in measure.CLASSES} for region in measure.REGIONS}
    bands["to_shared"]["far"] = [{"size": s, "kernel": "old" if s == 64 << 10 else "new", "builtin": "old"}
                                 for s in m["sizes"]]  # two changed runs: 4 KiB hot, 128 KiB cold
    calls = []

    def measure_cell(variants, memory, region, cls, repeats, min_time, rng, placements, incumbent=None):
        calls.append((memory.size, placements, incumbent))
        n = placements[1]
        return {"new": {"gbps": 2.0, "placements": [2.0, 3.0, 1.0, 2.0, 2.0, 2.0][:n]},
                "old": {"gbps": 1.0, "placements": [1.0, 1.0, 2.0, 1.0, 1.0, 1.0][:n]}}

    monkeypatch.setattr(measure, "measure_cell", measure_cell)
    monkeypatch.setattr(measure.engine, "cold_rotation_count", lambda size, l3: 1)
    monkeypatch.setattr(fastcopy, "kernel", lambda name, threads=1: name)
    got = measure.validation_ratios(m, bands, 2, 0.001, placements=(4, 6), cold_placements=(2, 2))
    assert len(got) == 2
    ratios = [v for run in got.values() for v in run]
    hot = [v for v in ratios if v.size < m["l3"]]
    cold = [v for v in ratios if v.size >= m["l3"]]
    assert hot and cold and len(calls) == len(ratios)
    assert all(v.placements == (2.0, 3.0, 0.5, 2.0, 2.0, 2.0) and v.ratio == 2.0 for v in hot)
    assert all(v.placements == () and v.ratio == 2.0 for v in cold)
    assert {(p, inc) for s, p, inc in calls if s < m["l3"]} == {((4, 6), "old")}
    assert {(p, inc) for s, p, inc in calls if s >= m["l3"]} == {((2, 2), "old")}


def test_pool_validation_times_the_changed_plans_off_the_grid(monkeypatch):
    """A lower pool threshold is validated at sizes off the grid between it and the built-in one,
    the private far band kernel split across the pool against it on one thread, at far offsets;
    the ratio is the new plan's speed over the built-in plan's, either way round."""
    m = {"sizes": [256 << 10, 512 << 10, 1 << 20, 4 << 20], "l3": 1 << 40}
    bands = {region: {cls: [] for cls in measure.CLASSES} for region in measure.REGIONS}
    bands["private"]["far"] = [{"size": s, "kernel": f"k{s >> 10}", "builtin": "b"} for s in m["sizes"]]
    builtin = decide.Builtin(nt_threshold=None, parallel_threshold=1 << 20, threads=2, kernels={}, bands={})
    timed = []

    def kernel(name, threads=1):
        def copy(dst, src):
            pass
        copy.kernel, copy.threads = name, threads
        return copy

    def measure_cell(variants, memory, region, cls, *args, **kwargs):
        timed.append((memory.size, region, cls, {n: (f.kernel, f.threads) for n, f in variants.items()}))
        return {"split": {"gbps": 2.0}, "one": {"gbps": 1.0}}

    monkeypatch.setattr(fastcopy, "kernel", kernel)
    monkeypatch.setattr(measure, "measure_cell", measure_cell)
    lower = {"threshold": 256 << 10, "threads": 0}
    got = measure.pool_validation_ratios(m, bands, lower, builtin, 2, 0.001)
    assert len(got) == 2 and all(r == 2.0 for _, r in got)
    for size, region, cls, plans in timed:
        assert 256 << 10 < size < 1 << 20 and size not in m["sizes"] and (region, cls) == ("private", "far")
        kern = [p["kernel"] for p in bands["private"]["far"] if p["size"] <= size][-1]
        assert plans == {"split": (kern, 2), "one": (kern, 1)}
    timed.clear()
    never = {"threshold": None, "threads": 0}
    got = measure.pool_validation_ratios(m, bands, never, builtin, 2, 0.001)
    assert got and all(r == 0.5 for _, r in got) and all(s > 1 << 20 for s, *_ in timed)
    assert measure.pool_validation_ratios(m, bands, {"threshold": 1 << 20, "threads": 0}, builtin, 2, 0.001) == []


# ---- copies into and out of shared memory: the comparison at held-out points ------------------

def shared_point(size, offset, plan_a, plan_b, ci, region="to_shared", overlap=False):
    """A point of the shared regions' comparison as ``compare.compare_texts`` gives it (A the
    built-in profile, B the tuned one; ratio = B's time / A's)."""
    ratio = (ci[0] * ci[1]) ** 0.5
    return {"region": region, "size": size, "offset": offset, "overlap": overlap, "plan_a": plan_a,
            "plan_b": plan_b, "ratio": ratio, "ci": list(ci)}


def bands_with_shared_run(region="to_shared", cls="far", new="avx2", old="generic"):
    """decide's bands for three grid sizes, 4 KiB-16 KiB, every class and region on ``old`` but
    ``region``/``cls`` from 8 KiB on ``new``."""
    sizes = [4096, 8192, 16384]
    bands = {r: {c: [{"size": s, "kernel": old, "builtin": old, "why": "measured"} for s in sizes]
                 for c in decide.CLASSES} for r in decide.REGIONS}
    for p in bands[region][cls][1:]:
        p["kernel"] = new
    return bands


@pytest.mark.parametrize("case, dropped", [
    ("built-in faster", True),
    ("a tie", False),
    ("tuned faster", False),
    ("below the run", False),
    ("another class", False),
    ("another region", False),
    ("other kernels", False),
    ("on the pool", True),
])
def test_a_shared_band_goes_back_only_where_the_built_in_plan_won_beyond_the_interval(case, dropped):
    bands = bands_with_shared_run()
    size, offset, region, plan_a, plan_b, ci = 10000, 700, "to_shared", "generic", "avx2", (1.08, 1.20)
    if case == "a tie":
        ci = (0.97, 1.12)
    elif case == "tuned faster":
        ci = (0.80, 0.90)
    elif case == "below the run":
        size = 5000
    elif case == "another class":
        offset = 17
    elif case == "another region":
        region = "from_shared"
    elif case == "other kernels":
        plan_a, plan_b = "erms", "avx512"
    elif case == "on the pool":
        plan_a, plan_b = "generic x2", "avx2 x2"
    got = decide.apply_shared_check(bands, [shared_point(size, offset, plan_a, plan_b, ci, region)])
    run = [p["kernel"] for p in bands["to_shared"]["far"]]
    if dropped:
        assert run == ["generic"] * 3
        assert "built-in choice kept: avx2 lost the held-out comparison to generic at 10000 B @ 700" \
            in bands["to_shared"]["far"][1]["why"]
        assert [(d["region"], d["class"], d["from"], d["to"], d["new"], d["builtin"], d["by"]) for d in got] == \
            [("to_shared", "far", 8192, None, "avx2", "generic", "comparison")]
        assert 1 / 1.20 <= got[0]["points"][0][2] <= 1 / 1.08  # the tuned plan's speed over the built-in one's
    else:
        assert run == ["generic", "avx2", "avx2"] and got == []


def test_the_shared_check_never_touches_private_bands():
    bands = bands_with_shared_run(region="private")
    got = decide.apply_shared_check(bands, [shared_point(10000, 700, "generic", "avx2", (1.1, 1.3), "private")])
    assert got == [] and [p["kernel"] for p in bands["private"]["far"]] == ["generic", "avx2", "avx2"]


def test_the_shared_check_measures_nothing_where_no_shared_band_changed(monkeypatch):
    from fastcopy.tune import compare

    def must_not_run(*a, **k):
        raise AssertionError("compared although no shared band changed")

    monkeypatch.setattr(compare, "compare_texts", must_not_run)
    bands = bands_with_shared_run(region="private")
    assert tune.shared_check(json.loads(_core.base_profile_json()), bands, [4096, 16384],
                             measure.SETTINGS["quick"]) is None


def test_the_shared_check_times_the_tuned_plans_against_the_built_in_ones_in_shared_memory():
    """End to end on forced kernels: a profile whose copies into shared memory run another
    kernel than the built-in profile's from 1 KiB: the comparison measures points of that
    region only, each with the built-in plan as A and the changed kernel as B."""
    builtin = json.loads(_core.base_profile_json())
    sizes = [1024, 65536]
    bands = {r: {c: [{"size": s, "kernel": "x", "builtin": "x", "why": ""} for s in sizes] for c in decide.CLASSES}
             for r in decide.REGIONS}
    profile = json.loads(_core.base_profile_json())
    far = profile["regions"]["to_shared"]["far"]
    old = [b for b in far if b["from"] <= 1024][-1]["kernel"]
    new = next(k for k in fastcopy.kernels() if k != old and not k.endswith("_nt"))
    profile["regions"]["to_shared"]["far"] = [b for b in far if b["from"] < 1024] + \
        [{"from": 1024, "kernel": new, "why": "forced by the test"}]
    profile["regions"]["to_shared"]["far"] += [b for b in far if b["from"] > 65536 * 4]
    bands["to_shared"]["far"][0]["kernel"] = new  # a changed run: the check runs
    cfg = {"shared_check_points": 3, "check_repeats": 3}
    got = tune.shared_check(profile, bands, sizes, cfg)
    assert got is not None and got["config"]["regions"] == ["to_shared", "from_shared"]
    assert got["config"]["candidates_per_region"] == tune.SHARED_CHECK_CANDIDATES
    assert got["profiles"] == {"A": "built-in", "B": "tuned"} and json.loads(_core.base_profile_json()) == builtin
    assert got["candidates"]["differ_per_region"]["to_shared"] > 0 and len(got["points"]) == 3
    for p in got["points"]:
        assert p["region"] == "to_shared" and 1024 <= p["size"] <= 65536 and decide.point_class(p) == "far"
        assert p["plan_b"].split(" x")[0] == new and p["plan_a"].split(" x")[0] != new
        assert len(p["seconds"]["A"]) == len(p["seconds"]["B"]) == 3 and p["ci"][0] <= p["ratio"] <= p["ci"][1]


def test_tune_drops_a_shared_band_the_comparison_contradicts(monkeypatch, capsys):
    size = 4096
    inc = tune.builtin_choices([size]).kernel("to_shared", "far", size)
    other = next(k for k in fastcopy.kernels() if k != inc and not k.endswith("_nt"))
    real = decide.decide_bands

    def bands_with_a_change(m, builtin):  # the measurement "found" `other` faster into shared memory
        out = real(m, builtin)
        for rows in (rows for region in out.values() for rows in region.values()):
            for p in rows:  # no other change: what the real grid found on this CPU is not this test's
                p["kernel"] = p["builtin"]
        p = out["to_shared"]["far"][0]
        p["kernel"], p["gain"], p["why"] = other, 1.5, "forced by the test"
        return out

    def check_finds_nothing(profile, sizes, cfg, builtin):
        return fake_check_result([], 1.0, [0.99, 1.01])

    compared = {}

    def comparison_says_it_loses(profile, bands, sizes, cfg):
        compared["band"] = [b["kernel"] for b in profile["regions"]["to_shared"]["far"] if b["from"] <= size][-1]
        return {"points": [shared_point(size + 300, 900, inc, other, (1.1, 1.2)),
                           shared_point(size + 500, 0, inc, other, (1.1, 1.2))],
                "elapsed_seconds": 0.4}

    monkeypatch.setattr(decide, "decide_bands", bands_with_a_change)
    monkeypatch.setattr(tune, "held_out_check", check_finds_nothing)
    monkeypatch.setattr(tune, "shared_check", comparison_says_it_loses)
    monkeypatch.setattr(measure, "validation_ratios", lambda *a, **k: {})
    profile = tune.tune(quick=True, grid=[size], write=False, progress=False, verbose=True)
    out = capsys.readouterr().out
    assert f"{inc} kept: {other} lost the held-out comparison at {size + 300} B @ 900 0.87x" in out, out
    assert compared["band"] == other  # the comparison ran on the profile with the band
    bands = profile["regions"]["to_shared"]["far"]
    want = tune.builtin_choices([size]).bands["to_shared"]["far"]
    assert [(b["from"], b["kernel"]) for b in bands] == [(b["from"], b["kernel"]) for b in want]
    rec = profile["provenance"]["check"]
    assert rec["dropped"] == [f"to_shared far from {size}: {other} -> {inc}"]
    # one point of the far class, one page-aligned (not in the run's class): both verdicts counted
    assert rec["shared"] == {"points": 2, "seconds": 0.4, "builtin_faster": 2, "tuned_faster": 0, "ties": 0}
    assert "copies into and out of shared memory, 2 points where the plans differ" in tune.check_words(rec)
    tune.validate_profile(profile)
    assert _core.active_profile()["source"] == "built-in"
