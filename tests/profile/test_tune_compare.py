"""Two profiles measured against each other (``python -m fastcopy tune --compare A B``,
``fastcopy.tune.compare``): which copies they plan differently (the core's plans), how the
points are spread over the differences, the verdicts and summaries on synthetic figures, and the
comparison end to end with forced profiles (small settings), so nothing depends on the CPU."""
from __future__ import annotations

import json
import math

import pytest

import fastcopy
from fastcopy import _core
from fastcopy.tune import compare
from fastcopy.tune.check import Point

from _cli import cli
from conftest import generic_profile


def other_kernel() -> str:
    """A kernel besides the C library's, with cached stores, usable on this CPU."""
    names = [k["name"] for k in _core.kernel_table() if k["supported"] and not k["streaming"] and k["name"] != "generic"]
    if not names:
        pytest.skip("only the C library's kernel is usable here")
    return names[0]


def with_far_band(kernel: str, start: int) -> dict:
    """generic_profile with ``kernel`` for private far copies from ``start`` bytes."""
    p = generic_profile()
    p["name"] = "far-band"
    p["regions"]["private"]["far"].append({"from": start, "kernel": kernel, "why": "forced by the test"})
    return p


# ---- which copies differ: the core's plans ------------------------------------------------------

def test_plans_come_from_the_core_and_differ_only_where_the_profiles_do():
    k = other_kernel()
    a, b = json.dumps(generic_profile()), json.dumps(with_far_band(k, 1000))
    pts = [Point(999, 100), Point(1000, 100), Point(5000, 100), Point(5000, 0), Point(5000, 16),
           Point(5000, 100, True)]
    assert compare.plans_of(a, pts, "private") == [("generic", 1)] * len(pts)
    assert compare.plans_of(b, pts, "private") == [("generic", 1), (k, 1), (k, 1), ("generic", 1), ("generic", 1),
                                                   ("generic", 1)]
    # Each plan is the kernel choose_for names at the same synthetic addresses.
    for p, (kernel, _) in zip(pts, compare.plans_of(b, pts, "private")):
        assert _core.choose_for(b, *compare.plan_addresses(p), p.size) == kernel
    # The band is private: copies into and out of shared memory plan the same under both.
    for region in ("to_shared", "from_shared"):
        assert compare.plans_of(a, pts, region) == compare.plans_of(b, pts, region)
    with pytest.raises(ValueError, match="no built-in profile named"):
        compare.plans_of("no-such-profile", pts, "private")
    with pytest.raises(ValueError, match="region must be 0"):
        _core.copy_plans(a, [(0, 0, 1, 3)])


def test_a_parallel_threshold_plans_the_pool_from_it_for_copies_that_do_not_overlap():
    p = generic_profile()
    p["parallel"] = {"threshold": 1 << 20, "threads": 0, "why": "forced by the test"}
    text = json.dumps(p)
    pts = [Point((1 << 20) - 1, 100), Point(1 << 20, 100), Point(1 << 20, 100, True)]
    try:
        fastcopy.set_threads(2)
        assert compare.plans_of(text, pts, "private") == [("generic", 1), ("generic", 2), ("generic", 1)]
        fastcopy.set_threads(1)  # one thread: the pool is never used
        assert compare.plans_of(text, pts, "private") == [("generic", 1)] * 3
    finally:
        fastcopy.set_threads(0)


def test_differing_points_are_grouped_by_region_class_and_the_two_plans():
    cands = {"private": [Point(100, 5), Point(2000, 100), Point(3000, 200), Point(4000, 0), Point(500, 3, True)],
             "to_shared": [Point(2000, 100)]}
    pa = {"private": [("generic", 1)] * 5, "to_shared": [("generic", 1)]}
    pb = {"private": [("generic", 1), ("avx2", 1), ("avx2", 1), ("avx2", 2), ("erms", 1)],
          "to_shared": [("generic", 1)]}
    groups = compare.differing_points(cands, pa, pb)
    assert set(groups) == {("private", "far", "generic", "avx2"), ("private", "page_aligned", "generic", "avx2 x2"),
                           ("private", "backward", "generic", "erms")}
    assert [p for p, _, _ in groups[("private", "far", "generic", "avx2")]] == [Point(2000, 100), Point(3000, 200)]


def test_spread_gives_every_difference_a_point_before_any_gets_two():
    groups = {"big": list(range(10)), "mid": ["m1", "m2"], "rare": ["r1"]}
    assert compare.spread(groups, 3) == [("big", 0), ("mid", "m1"), ("rare", "r1")]
    assert compare.spread(groups, 6) == [("big", 0), ("mid", "m1"), ("rare", "r1"), ("big", 1), ("mid", "m2"),
                                         ("big", 2)]
    assert len(compare.spread(groups, 100)) == 13  # all of them, no more
    assert compare.spread({}, 5) == []


# ---- verdicts and summaries on synthetic figures ------------------------------------------------

def test_a_tie_is_an_interval_that_holds_one():
    assert compare.verdict(0.97, 1.04) == compare.TIE
    assert compare.verdict(1.0, 1.2) == compare.TIE
    assert compare.verdict(1.01, 1.2) == compare.A_FASTER
    assert compare.verdict(0.8, 0.99) == compare.B_FASTER


def test_within_gain_is_an_interval_inside_tune_s_margin_either_way():
    g = compare.MIN_GAIN
    assert compare.within_gain(1.002, 1.022)  # A faster, by less than tune resolves
    assert compare.within_gain(1 / (1 + g), 1 + g)
    assert not compare.within_gain(1.0, 1 + g + 0.001)
    assert not compare.within_gain(1 / (1 + g) - 0.001, 1.0)
    assert not compare.within_gain(0.8, 1.2)  # a tie too wide to say


def test_the_summary_weights_each_difference_by_its_share_of_the_copies():
    far, pool = ("private", "far", "generic", "avx2"), ("private", "page_aligned", "generic", "generic x2")
    pts = [{"difference": list(far), "size": 2000, "ratio": 1.10, "verdict": compare.A_FASTER, "ci": [1.05, 1.15]},
           {"difference": list(far), "size": 3000, "ratio": 1.00, "verdict": compare.TIE, "ci": [0.99, 1.01]},
           {"difference": list(pool), "size": 2 << 20, "ratio": 0.80, "verdict": compare.B_FASTER, "ci": [0.7, 0.9]}]
    s = compare.summarize_groups(pts, {far: 0.09, pool: 0.01})
    assert [g["difference"] for g in s["groups"]] == [list(far), list(pool)]  # the commonest first
    assert s["groups"][0]["points"] == 2 and s["groups"][0]["sizes"] == [2000, 3000]
    assert s["groups"][0]["geomean"] == pytest.approx(math.sqrt(1.10))
    assert s["groups"][0]["verdicts"] == {compare.TIE: 1, compare.A_FASTER: 1, compare.B_FASTER: 0}
    assert s["geomean"] == pytest.approx((1.10 * 1.00 * 0.80) ** (1 / 3))
    weighted = math.exp((0.09 * math.log(math.sqrt(1.10)) + 0.01 * math.log(0.80)) / 0.10)
    assert s["weighted_geomean"] == pytest.approx(weighted)
    assert s["verdicts"] == {compare.TIE: 1, compare.A_FASTER: 1, compare.B_FASTER: 1}
    assert s["within_gain"] == 1


# ---- end to end -----------------------------------------------------------------------------------

def test_compare_measures_both_plans_where_the_profiles_differ(tmp_path):
    k = other_kernel()
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(generic_profile()))
    b.write_text(json.dumps(with_far_band(k, 1024)))
    out = tmp_path / "out.json"
    r = cli("tune", "--compare", str(a), str(b), "--points", "4", "--seed", "3", "--repeats", "3",
            "--min-time", "0.0001", "--max-size", "64K", "--json", str(out), timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["config"]["seed"] == 3 and len(res["points"]) == 4
    assert res["candidates"]["differ"] == res["candidates"]["differ_per_region"]["private"] > 0
    for p in res["points"]:
        assert p["region"] == "private" and p["size"] >= 1024 and not p["overlap"] and 64 <= p["offset"] < 4096
        assert (p["plan_a"], p["plan_b"]) == ("generic", k)
        assert len(p["seconds"]["A"]) == len(p["seconds"]["B"]) == 3 and min(p["seconds"]["A"] + p["seconds"]["B"]) > 0
        assert p["ci"][0] <= p["ratio"] <= p["ci"][1]
        assert p["verdict"] == compare.verdict(*p["ci"])
    assert f"private far: A generic, B {k}" in r.stdout
    assert "a tie where the interval holds 1" in r.stdout and "weighted by each difference's share" in r.stdout
    assert res["summary"]["within_gain"] == sum(compare.within_gain(*p["ci"]) for p in res["points"])
    assert f"less than tune needs to change a band): {res['summary']['within_gain']} of 4 points" in r.stdout
    # The same profile twice: nothing differs, nothing is timed.
    r = cli("tune", "--compare", str(a), str(a), "--seed", "3", "--max-size", "64K", timeout=300)
    assert r.returncode == 0 and "plan every candidate copy the same way" in r.stdout, r.stderr


@pytest.mark.parametrize("region, overlap", [("to_shared", False), ("from_shared", False), ("to_shared", True)])
def test_shared_memory_points_start_the_source_where_an_array_may_start(region, overlap):
    """A point in shared memory starts its source at a page offset drawn from the fill seed in
    steps of check.ARRAY_ALIGNMENT, as check.place does for private copies: the two plans are
    compared where users' arrays lie, not only at the start of a page."""
    from fastcopy.tune.check import ARRAY_ALIGNMENT

    size, offset = 1200, 300 if overlap else 0
    starts = set()
    for seed in range(30):
        dst, src, release = compare._buffers(region, Point(size, offset, overlap), seed)
        try:
            assert dst.size == src.size == size
            assert (dst.ctypes.data - src.ctypes.data) == offset if overlap else \
                (dst.ctypes.data - src.ctypes.data) % 4096 == offset
            starts.add(src.ctypes.data % 4096)
        finally:
            del dst, src
            release()
    assert len(starts) > 20 and all(x % ARRAY_ALIGNMENT == 0 for x in starts)


def test_compare_refuses_what_it_cannot_use(tmp_path):
    good = tmp_path / "a.json"
    good.write_text(json.dumps(generic_profile()))
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    for args, error in ((["--compare", str(good), "no-such-profile"], "no built-in profile named"),
                        (["--compare", str(good), str(bad)], str(bad)),
                        (["--compare", str(good), str(tmp_path)], "is a directory"),
                        (["--compare", str(good), str(good), "--cold"], "--cold does not apply"),
                        (["--compare", str(good), str(good), "--repeats", "1"], "at least 2 repeats"),
                        (["--compare", str(good)], "--compare: expected 2 arguments")):
        r = cli("tune", *args)
        assert r.returncode == 2 and error in r.stderr, (args, r.stderr)


def test_compare_profiles_names_a_bad_setting():
    text = json.dumps(generic_profile())
    for kwargs, error in (({"points": 0}, "compare_profiles: points must be an int of at least 1"),
                          ({"repeats": 1}, "compare_profiles: repeats must be an int of at least 2"),
                          ({"min_size": 4096, "max_size": 64}, "compare_profiles: max_size must be"),
                          ({"min_time": 0}, "compare_profiles: min_time must be above 0"),
                          ({"confidence": 1.0}, "compare_profiles: confidence must be between 0 and 1")):
        with pytest.raises(ValueError, match=error):
            compare.compare_profiles(text, text, **kwargs)


def test_a_comparison_of_some_regions_draws_candidates_in_those_only():
    """compare_texts with ``regions``: the candidates of the others are not drawn (nothing there
    is timed), and each region's candidates are those compare_profiles draws from the seed."""
    k = other_kernel()
    shared = generic_profile()
    shared["name"] = "shared-band"
    for region in ("private", "from_shared"):
        shared["regions"][region]["far"].append({"from": 1024, "kernel": k, "why": "forced by the test"})
    a, b = json.dumps(generic_profile()), json.dumps(shared)
    got = compare.compare_texts(a, "A", b, "B", points=2, seed=3, repeats=2, min_time=0.0001, max_size=16384,
                                regions=("from_shared",))
    assert got["config"]["regions"] == ["from_shared"] and list(got["candidates"]["differ_per_region"]) == ["from_shared"]
    assert got["points"] and all(p["region"] == "from_shared" for p in got["points"])
    every = compare.compare_texts(a, "A", b, "B", points=1, seed=3, repeats=2, min_time=0.0001, max_size=16384)
    assert every["candidates"]["differ_per_region"]["from_shared"] == got["candidates"]["differ_per_region"]["from_shared"]
    for bad in ((), ("shared",), ("to_shared", "to_shared")):
        with pytest.raises(ValueError, match="regions must be distinct names among private, to_shared, from_shared"):
            compare.compare_texts(a, "A", b, "B", regions=bad)
    more = compare.compare_texts(a, "A", b, "B", points=1, seed=3, repeats=2, min_time=0.0001, max_size=16384,
                                 regions=("from_shared",), per_region=8000)
    assert more["config"]["candidates_per_region"] == 8000
    assert more["candidates"]["drawn"] == 8000 and more["candidates"]["differ"] > got["candidates"]["differ"]
    for bad in (0, compare.MAX_CANDIDATES + 1, 2.0, True):
        with pytest.raises(ValueError, match="per_region must be an int from 1 to"):
            compare.compare_texts(a, "A", b, "B", per_region=bad)
