"""python -m fastcopy tune, its profile validator and decisions, the measurement engine's cache
modes and shared buffers, and fastcopy.kernel(name, threads=N). The exact profiles the
decisions give for fixed measurement tables are in test_decide.py."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fastcopy
from fastcopy import _core, _profile
from fastcopy.bench import engine
from fastcopy.tune import decide
from fastcopy.tune import profile as tune

from _cli import SRC_DIR, cli

# A small grid keeps the end-to-end runs at a second or two (the whole grid is docs' business).
TEST_GRID = "256,4K,64K"


@pytest.fixture(autouse=True, scope="module")
def no_user_profile(tmp_path_factory):
    """The in-process tests start from the built-in profile whatever the user's cache or
    environment holds: the cache is an empty folder and FASTCOPY_PROFILE is unset."""
    saved = {k: os.environ.get(k) for k in ("XDG_CACHE_HOME", "FASTCOPY_PROFILE")}
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    os.environ.pop("FASTCOPY_PROFILE", None)
    _profile.load_at_import()
    assert _core.active_profile()["source"] == "built-in"
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    _profile.load_at_import()


@pytest.fixture(scope="module")
def quick_profile():
    """One measured profile for the checks that need one (no file written)."""
    return tune.tune(quick=True, grid=[256, 4096, 65536], write=False, progress=False)


def _kernels():
    return {k["name"]: k for k in _core.kernel_table() if k["supported"]}


# ------------------------------------------------------------------ the validator

def test_measured_profile_passes_the_validator(quick_profile):
    tune.validate_profile(quick_profile)
    p = quick_profile
    assert p["format"] == "fastcopy-profile" and p["version"] == 1 and p["name"] == "tuned"
    assert set(p["provenance"]) >= {"machine", "date", "libc", "method"}
    assert p["signature"] == _profile.signature()
    for region in ("private", "to_shared", "from_shared"):
        r = p["regions"][region]
        for cls in ("page_aligned", "near", "far", "backward"):
            froms = [b["from"] for b in r[cls]]
            assert froms[0] == 0 and froms == sorted(set(froms))
            assert all(b["kernel"] in fastcopy.kernels() for b in r[cls])
            # adjacent equal bands are merged
            assert all(a["kernel"] != b["kernel"] for a, b in zip(r[cls], r[cls][1:]))
        assert set(r["nt"]) == {"threshold", "kernel", "why"}
    assert set(p["parallel"]) == {"threshold", "threads", "why"}


def _break(profile, path, value):
    p = copy.deepcopy(profile)
    node = p
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return p


@pytest.mark.parametrize("path,value,words", [
    (("format",), "other", "format"),
    (("version",), 2, "version"),
    (("regions", "to_shared"), KeyError, 'regions: missing key "to_shared"'),
    (("regions", "private", "near"), KeyError, 'regions.private: missing key "near"'),
    (("regions", "private", "far"), [], "regions.private.far"),
    (("regions", "private", "far"), [{"from": 64, "kernel": "generic", "why": ""}], "start at 0"),
    (("regions", "private", "far"), [{"from": 0, "kernel": "generic", "why": ""},
                                     {"from": 0, "kernel": "generic", "why": ""}], "sorted"),
    (("regions", "private", "far"), [{"from": 0, "kernel": "no_such", "why": ""}], "unknown kernel 'no_such'"),
    (("regions", "private", "far"), [{"from": 0, "kernel": "generic", "why": "x" * 501}], "500"),
    (("regions", "private", "far"), [{"from": i, "kernel": "generic", "why": ""} for i in range(65)], "at most 64"),
    (("regions", "private", "nt", "threshold"), 100, "below the minimum of 4 KiB"),
    (("regions", "private", "nt"), {"threshold": None, "kernel": "generic", "why": ""}, "does not stream"),
    (("parallel", "threshold"), 1000, "below the minimum of 64 KiB"),
    (("parallel", "threads"), 2000, "more than 1024"),
    (("parallel", "threads"), True, "parallel.threads: must be a whole number, not a boolean"),
    (("provenance", "date"), 5, "provenance.date"),
    # Checks of the loader's validator beyond the shape of the file:
    (("regions", "bogus"), {}, 'unknown key "bogus"'),
    (("notes",), ["x"] * 33, "more than 32 notes"),
    (("regions", "private", "nt", "min_page_distance"), 5000, "min_page_distance"),
    (("regions", "private", "rep_movsb_on"), -1, "rep_movsb_on: -1 is negative"),
])
def test_validator_rejects(quick_profile, path, value, words):
    bad = _break(quick_profile, path, value)
    with pytest.raises(ValueError, match="profile: .*") as e:
        tune.validate_profile(bad)
    assert words in str(e.value)


def test_validator_rejects_streaming_kernels_in_bands(quick_profile):
    streaming = [k for k, v in _kernels().items() if v.get("streaming")]
    if not streaming:
        pytest.skip("no streaming kernel on this CPU")
    bad = _break(quick_profile, ("regions", "private", "near"), [{"from": 0, "kernel": streaming[0], "why": ""}])
    with pytest.raises(ValueError, match="uses non-temporal stores; it belongs in \"nt\""):
        tune.validate_profile(bad)
    bad = _break(quick_profile, ("regions", "private", "nt"), {"threshold": 1 << 20, "kernel": "generic", "why": ""})
    with pytest.raises(ValueError, match="does not stream"):
        tune.validate_profile(bad)


def test_validator_rejects_huge_profiles(quick_profile):
    bad = _break(quick_profile, ("notes",), ["x" * 400] * 3000)
    with pytest.raises(ValueError, match="more than the 1 MiB limit"):
        tune.validate_profile(bad)


@pytest.mark.parametrize("path,value", [
    (("name",), KeyError), (("provenance",), KeyError), (("regions", "private", "far", 0, "why"), KeyError)])
def test_validator_and_loader_agree_on_optional_fields(quick_profile, path, value):
    # name, provenance and a band's why are optional (docs/profile-format.md): tune's check is
    # the loader's, so a file the import loads is one tune --show accepts, and back.
    ok = _break(quick_profile, path, value)
    tune.validate_profile(ok)
    try:
        _core.load_profile(json.dumps(ok), "test")
    finally:
        _core.use_builtin_profile()
        _profile.load_at_import()


# ------------------------------------------------------------------ decisions on synthetic measurements

def FakeBuiltin(sizes=(1024, 4096, 8192, 16384, 32768, 256, 384, 512, 1 << 20, 16 << 20, 128 << 20, 256 << 20,
                       32 << 20, 64 << 20)):
    """Built-in choices as data: generic below 2 KiB, avx2 from there; NT from 16 MiB, the pool
    from 1 MiB on 2 threads."""
    kernels = {r: {c: {s: "generic" if s < 2048 else "avx2" for s in sizes} for c in decide.CLASSES}
               for r in decide.REGIONS}
    bands = {r: {c: [{"from": 0, "kernel": "generic", "why": "w"}, {"from": 2048, "kernel": "avx2", "why": "w"}]
                 for c in decide.CLASSES} for r in decide.REGIONS}
    return decide.Builtin(nt_threshold=16 << 20, parallel_threshold=1 << 20, threads=2, kernels=kernels, bands=bands)


def _fake_measurements(stats_at):
    sizes = sorted(stats_at)
    cells = {r: {c: {str(s): stats_at[s] for s in sizes} for c in decide.CLASSES} for r in decide.REGIONS}
    return {"sizes": sizes, "cells": cells, "cache": {str(s): "hot" for s in sizes}, "wide": {},
            "threads": [2], "streaming": ["avx2_nt"], "l3": 32 << 20}


def test_a_band_changes_only_beyond_the_spread():
    st = lambda g, sp=0.01: {"gbps": g, "spread": sp}  # noqa: E731
    m = _fake_measurements({
        1024: {"generic": st(10), "avx2": st(15)},                 # 1.5x: changes
        4096: {"generic": st(10), "avx2": st(10.5)},               # incumbent avx2, fastest: kept
        8192: {"generic": st(11, 0.2), "avx2": st(10, 0.2)},       # 1.1x but 20 % spread: kept
        16384: {"generic": st(10.2), "avx2": st(10)},              # 2 %: below MIN_GAIN, kept
        32768: {"generic": st(20), "avx2": st(10)},                # 2x: changes
    })
    bands = decide.decide_bands(m, FakeBuiltin())
    got = {p["size"]: p["kernel"] for p in bands["private"]["near"]}
    assert got == {1024: "avx2", 4096: "avx2", 8192: "avx2", 16384: "avx2", 32768: "generic"}
    assert "2.00x avx2" in bands["private"]["near"][-1]["why"]
    assert "within the spread" in bands["private"]["near"][2]["why"]
    merged = decide.bands_from_points(bands["private"]["near"], [{"from": 0, "kernel": "generic", "why": "w"}])
    assert [(b["from"], b["kernel"]) for b in merged] == [(0, "generic"), (1024, "avx2"), (32768, "generic")]
    # Below the grid the built-in bands stand as they are (not the kernel of the first grid size).
    below = [{"from": 0, "kernel": "generic", "why": "a"}, {"from": 128, "kernel": "avx2", "why": "b"}]
    merged = decide.bands_from_points(bands["private"]["near"], below)
    assert [(b["from"], b["kernel"]) for b in merged] == [(0, "generic"), (128, "avx2"), (32768, "generic")]


def test_a_gap_between_two_equal_changes_is_filled_only_by_the_fastest():
    st = lambda g, sp=0.01: {"gbps": g, "spread": sp}  # noqa: E731
    sizes = {256: (15, 10), 384: (10.5, 10), 512: (15, 10)}  # avx2, generic; 384 B: avx2 within the spread
    m = _fake_measurements({s: {"avx2": st(a), "generic": st(g, 0.1)} for s, (a, g) in sizes.items()})
    got = [p["kernel"] for p in decide.decide_bands(m, FakeBuiltin())["private"]["far"]]
    assert got == ["avx2", "avx2", "avx2"]
    sizes[384] = (9.8, 10)  # generic fastest at the gap: it stays
    m = _fake_measurements({s: {"avx2": st(a), "generic": st(g, 0.1)} for s, (a, g) in sizes.items()})
    got = [p["kernel"] for p in decide.decide_bands(m, FakeBuiltin())["private"]["far"]]
    assert got == ["avx2", "generic", "avx2"]


def test_thresholds_need_every_larger_size():
    assert decide.threshold_from([(1, False), (2, True), (3, True)]) == 2
    assert decide.threshold_from([(1, True), (2, False), (3, True)]) == 3
    assert decide.threshold_from([(1, True), (2, True), (3, False)]) is None


def _pool_measurements(one_many):
    st = lambda g, sp: {"gbps": g, "spread": sp}  # noqa: E731
    sizes = sorted(one_many)
    m = _fake_measurements({s: {"generic": st(5, 0.01), "avx2": st(6, 0.01)} for s in sizes})
    m["wide"] = {"private": {}}
    for s, (one, many, spread) in one_many.items():
        m["wide"]["private"][f"{s}:avx2"] = st(one, spread)
        m["wide"]["private"][f"{s}:avx2@2"] = st(many, spread)
    return m


def test_pool_is_not_kept_where_it_loses_on_average():
    # The built-in pool starts at 1 MiB; one thread wins beyond the spread up to 128 MiB and
    # at 256 MiB the pool loses 0.87x within a wide spread: the pool is off, not "from 256 MiB".
    m = _pool_measurements({1 << 20: (10, 7, 0.02), 16 << 20: (10, 8, 0.02), 128 << 20: (10, 8, 0.02),
                            256 << 20: (10, 8.7, 0.2)})
    par = decide.decide_parallel(m, decide.decide_bands(m, FakeBuiltin()), FakeBuiltin())
    assert par["threshold"] is None and par["changed"]
    assert "never beat one thread" in par["why"]


def test_pool_threshold_where_it_wins():
    m = _pool_measurements({1 << 20: (10, 7, 0.02), 16 << 20: (10, 15, 0.02), 128 << 20: (10, 16, 0.02),
                            256 << 20: (10, 9.8, 0.05)})  # within the spread at the top: kept, gains on average
    par = decide.decide_parallel(m, decide.decide_bands(m, FakeBuiltin()), FakeBuiltin())
    assert par["threshold"] == 16 << 20 and "2 threads" in par["why"]


def test_a_pool_threshold_is_kept_only_where_it_also_wins_off_the_grid():
    """The built-in pool starts at 1 MiB. A tuned threshold of 256 KiB stays when the pool also
    beat one thread off the grid by more than MIN_GAIN; a win within MIN_GAIN, or a loss, brings
    the built-in rule back; one measured at no size off the grid stays; one thread from 16 MiB
    (a higher threshold) is judged the other way round."""
    b = FakeBuiltin()
    lower = {"threshold": 256 << 10, "threads": 0, "why": "2 threads 1.20x", "changed": True}
    assert decide.pool_change(lower, b) == decide.PoolChange(256 << 10, 1 << 20, True)
    kept = decide.apply_parallel_validation(lower, b, [(312 << 10, 1.10), (468 << 10, 1.06)])
    assert kept["threshold"] == 256 << 10 and kept["changed"] and "validated" in kept["why"]
    for ratios in ([(312 << 10, 1.04), (468 << 10, 1.01)], [(312 << 10, 0.90), (468 << 10, 1.10)]):
        back = decide.apply_parallel_validation(lower, b, ratios)
        assert (back["threshold"], back["threads"], back["changed"]) == (1 << 20, 0, False), ratios
        assert back["why"].startswith("the built-in rule kept: the pool from 256 KiB lost the validation")
        assert back["validation"] == ratios
    assert decide.apply_parallel_validation(lower, b, [])["threshold"] == 256 << 10

    higher = {"threshold": 16 << 20, "threads": 0, "why": "w", "changed": True}
    assert decide.pool_change(higher, b) == decide.PoolChange(1 << 20, 16 << 20, False)
    never = {"threshold": None, "threads": 0, "why": "w", "changed": True}
    assert decide.pool_change(never, b) == decide.PoolChange(1 << 20, None, False)
    back = decide.apply_parallel_validation(never, b, [(1282 << 10, 0.98)])  # one thread lost: the pool comes back
    assert back["threshold"] == 1 << 20 and back["why"].startswith("the built-in rule kept: one thread from 1 MiB")
    assert decide.apply_parallel_validation(higher, b, [(1282 << 10, 1.2)])["threshold"] == 16 << 20

    same = {"threshold": 1 << 20, "threads": 0, "why": "w", "changed": False}
    assert decide.pool_change(same, b) is None
    assert decide.apply_parallel_validation(same, b, [(1 << 20, 0.5)])["threshold"] == 1 << 20


def _pool_point(size, picked, ratio, lo, hi, overlap=False, offset=700):
    variant = picked.split(" x")[0] + ("" if " x" in picked else " x2")
    return {"size": size, "offset": offset, "picked": picked, "overlap": overlap,
            "vs_builtin_plan": {"variant": variant, "ratio": ratio, "ci": [lo, hi]}}


def test_a_pool_threshold_the_held_out_check_contradicts_gives_way_to_the_built_in_rule():
    """The built-in pool starts at 1 MiB. A tuned threshold of 4 MiB (one thread at 1-4 MiB) that
    the check finds losing to the pool at a point inside 1-4 MiB, beyond the interval, gives way;
    a loss whose interval reaches 1, a point outside the change, an overlapping point or one where
    the profile did not run the change's plan has no say; a lower threshold is judged the other
    way round."""
    b = FakeBuiltin()
    higher = {"threshold": 4 << 20, "threads": 0, "why": "2 threads 1.07x from 4 MiB", "changed": True}
    no_say = [_pool_point(2 << 20, "avx2", 0.97, 0.90, 1.02),              # within the interval
              _pool_point(8 << 20, "avx2", 0.60, 0.55, 0.65),              # outside the change
              _pool_point(2 << 20, "avx2", 0.60, 0.55, 0.65, overlap=True),  # never splits
              _pool_point(3 << 20, "avx2 x2", 0.60, 0.55, 0.65),           # not the change's plan
              {"size": 2 << 20, "offset": 5, "picked": "avx2"}]            # no plan measured
    assert decide.apply_pool_check(higher, b, no_say) is higher
    lost = _pool_point(1700 << 10, "avx2", 0.62, 0.57, 0.69, offset=162)
    back = decide.apply_pool_check(higher, b, no_say + [lost])
    assert (back["threshold"], back["threads"], back["changed"]) == (1 << 20, 0, False)
    assert back["check_dropped"] == [(1700 << 10, 162, 0.62)]
    assert back["why"] == ("the built-in rule kept: one thread from 1 MiB lost the held-out check to the pool at "
                           "1740800 B @ 162 0.62x [0.57, 0.69]")
    lower = {"threshold": 256 << 10, "threads": 0, "why": "w", "changed": True}
    assert decide.apply_pool_check(lower, b, [lost]) is lower  # ran one thread: not the change's plan
    split_lost = _pool_point(512 << 10, "avx2 x2", 0.8, 0.7, 0.9)
    back = decide.apply_pool_check(lower, b, [split_lost])
    assert back["threshold"] == 1 << 20 and back["why"].startswith(
        "the built-in rule kept: the pool from 256 KiB lost the held-out check to one thread at 524288 B")
    same = {"threshold": 1 << 20, "threads": 0, "why": "w", "changed": False}
    assert decide.apply_pool_check(same, b, [lost, split_lost]) is same


def test_non_temporal_threshold_follows_cold_measurements():
    st = lambda g: {"gbps": g, "spread": 0.01}  # noqa: E731
    sizes = [32 << 20, 64 << 20, 128 << 20]
    m = _fake_measurements({s: {"generic": st(5), "avx2": st(6)} for s in sizes})
    m["cache"] = {str(s): "cold" for s in sizes}
    # NT loses at 32 MiB, wins beyond the spread from 64 MiB
    m["wide"] = {r: {f"{sizes[0]}:avx2": st(6), f"{sizes[0]}:avx2_nt": st(5),
                     f"{sizes[1]}:avx2": st(6), f"{sizes[1]}:avx2_nt": st(8),
                     f"{sizes[2]}:avx2": st(6), f"{sizes[2]}:avx2_nt": st(8)} for r in decide.REGIONS}
    bands = decide.decide_bands(m, FakeBuiltin())
    nt = decide.decide_nt(m, bands, {"threshold": None, "threads": 0}, FakeBuiltin())
    assert nt["private"]["threshold"] == 64 << 20 and nt["private"]["kernel"] == "avx2_nt"
    assert nt["private"]["changed"]


def test_the_non_temporal_kernel_is_the_built_in_profiles_where_this_cpu_has_it():
    st = lambda g: {"gbps": g, "spread": 0.01}  # noqa: E731
    sizes = [32 << 20, 64 << 20]
    m = _fake_measurements({s: {"generic": st(5), "avx2": st(6)} for s in sizes})
    m["streaming"] = ["avx2_nt", "avx512_nt"]
    builtin = FakeBuiltin()
    builtin.nt_kernel = "avx512_nt"
    # Not measured cold: the built-in threshold, with the built-in kernel, not the first one listed.
    nt = decide.decide_nt(m, decide.decide_bands(m, builtin), {"threshold": None, "threads": 0}, builtin)
    assert nt["private"]["kernel"] == "avx512_nt" and nt["private"]["threshold"] == builtin.nt_threshold
    # Measured cold: the threshold is decided for that kernel's cells.
    m["cache"] = {str(s): "cold" for s in sizes}
    m["wide"] = {r: {f"{sizes[0]}:avx2": st(6), f"{sizes[0]}:avx2_nt": st(9), f"{sizes[0]}:avx512_nt": st(5),
                     f"{sizes[1]}:avx2": st(6), f"{sizes[1]}:avx2_nt": st(9), f"{sizes[1]}:avx512_nt": st(8)}
                 for r in decide.REGIONS}
    nt = decide.decide_nt(m, decide.decide_bands(m, builtin), {"threshold": None, "threads": 0}, builtin)
    assert nt["private"]["kernel"] == "avx512_nt" and nt["private"]["threshold"] == 64 << 20
    # A built-in NT kernel this CPU lacks: the first streaming kernel measured.
    builtin.nt_kernel = "sve_nt"
    nt = decide.decide_nt(m, decide.decide_bands(m, builtin), {"threshold": None, "threads": 0}, builtin)
    assert nt["private"]["kernel"] == "avx2_nt"


# ------------------------------------------------------------------ the command line

def _env(tmp_path):
    return {"XDG_CACHE_HOME": str(tmp_path / "cache")}


def _expected_cache_path(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return _profile.cache_path()


def test_tune_quick_end_to_end_writes_the_user_cache(tmp_path, monkeypatch):
    path = _expected_cache_path(tmp_path, monkeypatch)
    assert path.startswith(str(tmp_path / "cache" / "fastcopy" / "profile-")) and path.endswith(".json")
    r = cli("tune", "--quick", "--grid", TEST_GRID, env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "changes against the built-in profile" in r.stdout and f"profile written to {path}" in r.stdout
    assert "private:" in r.stdout and "page_aligned" in r.stdout and "parallel:" in r.stdout
    with open(path) as f:
        profile = json.load(f)
    tune.validate_profile(profile)
    assert "--quick" in profile["provenance"]["method"]
    # What was printed is what was written: the table of the file, band by band.
    assert tune.format_profile(profile) in r.stdout
    changes = r.stdout[r.stdout.index("changes against the built-in profile:"):]
    none = "  none: the built-in profile was as fast as anything measured, within the spread" in changes
    assert none != any(" -> " in line or " kept: " in line for line in changes.splitlines())
    assert not [n for n in os.listdir(os.path.dirname(path)) if ".tmp" in n]  # no half-written file left


def test_tune_output_show_and_reset(tmp_path, monkeypatch):
    cached = _expected_cache_path(tmp_path, monkeypatch)
    out = tmp_path / "mine.json"
    r = cli("tune", "--quick", "--grid", "4K", "--output", str(out), env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert out.exists() and not os.path.exists(cached)
    tune.validate_profile(json.loads(out.read_text()))

    r = cli("tune", "--show", "--output", str(out), env=_env(tmp_path))
    assert r.returncode == 0 and f"tuned profile {out}" in r.stdout
    assert tune.format_profile(json.loads(out.read_text())) in r.stdout
    # The active profile of that process: the built-in one (its cache is empty), printed whole.
    active = json.loads(r.stdout[r.stdout.index("active profile:\n") + len("active profile:\n"):])
    assert active["source"] == "built-in" and active["name"] == _core.base_profile()["name"]

    r = cli("tune", "--show", env=_env(tmp_path))
    assert r.returncode == 0 and f"no tuned profile at {cached}" in r.stdout

    r = cli("tune", "--reset", "--output", str(out), env=_env(tmp_path))
    assert r.returncode == 0 and f"removed {out}" in r.stdout and not out.exists()
    r = cli("tune", "--reset", "--output", str(out), env=_env(tmp_path))
    assert r.returncode == 0 and "nothing to remove" in r.stdout


def test_tune_show_reports_a_corrupt_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = cli("tune", "--show", "--output", str(bad), env=_env(tmp_path))
    assert r.returncode == 0 and "unusable profile" in r.stdout


def test_tune_show_checks_a_profile_with_the_loaders_validator(tmp_path, quick_profile):
    # Valid JSON, a fastcopy profile, but a kernel no CPU has: unusable, with the loader's words.
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_break(quick_profile, ("regions", "private", "far"),
                                     [{"from": 0, "kernel": "no_such", "why": ""}])))
    r = cli("tune", "--show", "--output", str(bad), env=_env(tmp_path))
    assert r.returncode == 0 and f"{bad}: unusable profile: profile: " in r.stdout
    assert "unknown kernel 'no_such'" in r.stdout and f"tuned profile {bad}" not in r.stdout
    with pytest.raises(ValueError, match="unknown kernel 'no_such'"):
        tune.read_profile(str(bad))
    assert tune.read_profile(str(_write(tmp_path / "good.json", quick_profile))) == quick_profile


def test_write_profile_writes_only_a_valid_profile(tmp_path, quick_profile):
    bad = _break(quick_profile, ("parallel", "threads"), 2000)
    target = tmp_path / "p.json"
    with pytest.raises(ValueError, match="more than 1024"):
        tune.write_profile(str(target), bad)
    assert not target.exists()
    text = tune.write_profile(str(target), quick_profile)
    assert target.read_text() == text and json.loads(text) == quick_profile


def _write(path, doc):
    path.write_text(json.dumps(doc))
    return path


def test_tune_rejects_bad_arguments(tmp_path):
    r = cli("tune", "--output", str(tmp_path / "missing" / "p.json"), env=_env(tmp_path))
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = cli("tune", "--grid", "abc", env=_env(tmp_path))
    assert r.returncode == 2 and "--grid" in r.stderr
    r = cli("tune", "--show", "--reset", env=_env(tmp_path))
    assert r.returncode == 2


def test_tune_dry_run_writes_nothing(tmp_path, monkeypatch):
    cached = _expected_cache_path(tmp_path, monkeypatch)
    r = cli("tune", "--quick", "--grid", "4K", "--dry-run", env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "changes against the built-in profile" in r.stdout and not os.path.exists(cached)


@pytest.mark.skipif(os.environ.get("FASTCOPY_NO_SUBPROCESS") == "1",
                    reason="FASTCOPY_NO_SUBPROCESS=1: needs a fresh interpreter to see what import loads")
def test_tune_makes_its_profile_the_one_a_new_process_runs(tmp_path):
    """After tune, a new process (same HOME and cache) runs the tuned profile: info() names it,
    its provenance is tune's, and its source is the cache file tune wrote."""
    env = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    code = ("import fastcopy, json; i = fastcopy.info(); "
            "print(json.dumps({'profile': i['profile'], 'source': i['profile_source']}))")
    before = subprocess.run([sys.executable, "-c", code], env=_clean_env(env), capture_output=True, text=True,
                            timeout=120)
    assert before.returncode == 0, before.stderr
    assert json.loads(before.stdout)["source"]["source"] == "built-in"
    r = cli("tune", "--quick", "--grid", "4K", "--no-progress", env=env)
    assert r.returncode == 0, r.stderr
    written_at = r.stdout.split("profile written to ")[1].strip()
    assert written_at.startswith(str(tmp_path / "cache" / "fastcopy" / "profile-"))
    after = subprocess.run([sys.executable, "-c", code], env=_clean_env(env), capture_output=True, text=True,
                           timeout=120)
    assert after.returncode == 0, after.stderr
    got = json.loads(after.stdout)
    with open(written_at) as f:
        written = json.load(f)
    assert got["source"]["source"] == "cache" and got["source"]["path"] == written_at
    assert got["profile"]["name"] == "tuned" == written["name"]
    # the loader keeps the provenance's text fields; the held-out check's record stays in the file
    assert got["profile"]["provenance"] == {k: v for k, v in written["provenance"].items() if k != "check"}
    assert got["profile"]["provenance"]["method"].startswith("python -m fastcopy tune --quick: ")
    for region in decide.REGIONS:  # what runs is the file's bands
        for cls in decide.CLASSES:
            assert [(b["from"], b["kernel"]) for b in got["profile"]["regions"][region][cls]] == \
                [(b["from"], b["kernel"]) for b in written["regions"][region][cls]]


def _clean_env(extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTCOPY_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC_DIR, os.environ.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def test_fastcopy_tune_writes_and_returns_the_profile(tmp_path):
    # The package fastcopy.tune is imported by now (it takes the function's name in fastcopy):
    # fastcopy.tune() still runs a tune.
    assert sys.modules["fastcopy.tune"] is fastcopy.tune and callable(fastcopy.tune)
    out = tmp_path / "p.json"
    profile = fastcopy.tune(quick=True, grid=[4096], output=str(out), progress=False)
    tune.validate_profile(profile)
    assert json.loads(out.read_text()) == profile
    assert "fastcopy.tune()" in profile["provenance"]["method"]


def test_a_tune_during_which_the_host_moved_the_cpus_says_so_in_the_profile(monkeypatch, tmp_path):
    from fastcopy.bench import system

    monkeypatch.setattr(system, "cpu_pair", lambda: (0, 1))
    probes = iter([110.0, 480.0, 105.0])  # one probe per size: near, far apart, near
    monkeypatch.setattr(system, "cache_line_round_trip", lambda pair: next(probes))
    profile = tune.tune(quick=True, grid=[4096, 65536, 1 << 20], write=False, progress=False)
    tune.validate_profile(profile)
    (note,) = profile["notes"]
    assert note.startswith("the host moved CPUs 0 and 1 during tuning (a cache line's round trip took 105-480 ns, "
                           "1 of 3 probes above 2x the lowest)")
    assert "rerun tune" in note
    # The loader takes it, and info() shows it while the profile is active.
    path = tmp_path / "moved.json"
    path.write_text(json.dumps(profile))
    try:
        _core.load_profile(path.read_text(), str(path))
        assert any(note in words for words in fastcopy.info()["notes"])
    finally:
        _core.use_builtin_profile("")


def test_a_tune_with_the_cpus_in_one_place_has_no_note(monkeypatch):
    from fastcopy.bench import system

    monkeypatch.setattr(system, "cpu_pair", lambda: (0, 1))
    monkeypatch.setattr(system, "cache_line_round_trip", lambda pair: 110.0)
    profile = tune.tune(quick=True, grid=[4096], write=False, progress=False)
    assert "notes" not in profile


@pytest.mark.skipif(os.environ.get("FASTCOPY_NO_SUBPROCESS") == "1",
                    reason="FASTCOPY_NO_SUBPROCESS=1: needs a fresh interpreter (a subprocess) to see what import loads")
def test_import_does_not_load_the_measurement_code():
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTCOPY_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC_DIR, os.environ.get("PYTHONPATH")) if p)
    code = ("import sys, fastcopy; print(sorted(m for m in sys.modules if m.startswith(('fastcopy.bench', "
            "'fastcopy.tune')))); print(callable(fastcopy.tune))")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:2] == ["[]", "True"]


def test_tune_measures_against_the_builtin_profile_and_restores_the_active_one(quick_profile, tmp_path):
    """A tuned profile loaded at import must not become tune's baseline (a second run would
    compare with the first one's result), and tune leaves the caller's profile active."""
    base = _core.base_profile()["regions"]["private"]["page_aligned"][0]
    odd = copy.deepcopy(quick_profile)
    odd["name"] = "odd"
    for region in odd["regions"].values():
        for cls in ("page_aligned", "near", "far", "backward"):
            region[cls] = [{"from": 0, "kernel": base["kernel"], "why": "test: the odd profile"}]
    try:
        _core.load_profile(json.dumps(odd), "test-odd")
        assert _core.active_profile()["regions"]["private"]["page_aligned"][0]["why"] == "test: the odd profile"
        profile = fastcopy.tune(quick=True, grid=[4096], write=False, progress=False)
        # below the grid: the built-in bands, not the loaded profile's
        first = profile["regions"]["private"]["page_aligned"][0]
        assert first["kernel"] == base["kernel"]
        assert first["why"] == ("below the measured grid, the built-in choice: " + base["why"])[:decide.MAX_WHY]
        assert _core.active_profile()["name"] == "odd" and _core.active_profile()["source"] == "test-odd"
    finally:
        _core.use_builtin_profile()
        _profile.load_at_import()


def test_the_loader_accepts_a_tuned_profile(quick_profile):
    from fastcopy import _profile

    try:
        _core.load_profile(json.dumps(quick_profile), "test")
        active = _core.active_profile()
        assert active["source"] == "test" and active["name"] == quick_profile["name"], active["source"]
        assert active["regions"]["private"]["far"][0]["kernel"] == quick_profile["regions"]["private"]["far"][0]["kernel"]
    finally:  # back to what the import chose, for the tests that follow
        _core.use_builtin_profile()
        _profile.load_at_import()


# ------------------------------------------------------------------ engine: cache modes and shared memory

def test_cold_buffers_rotate_through_more_than_the_l3():
    l3 = 1 << 20  # a small pretend L3 keeps the test light
    bufs = engine.Buffers(64 << 10, [0, 16], cache="cold", l3=l3)
    assert bufs.count == 2 * l3 // (64 << 10) and bufs.rotation_bytes >= 2 * l3
    addresses = {s.ctypes.data for s in bufs.srcs}
    assert len(addresses) == bufs.count
    for off in (0, 16):
        for d, s in bufs.pairs(off):
            assert (d.ctypes.data - s.ctypes.data) % 4096 == off and d.size == s.size == 64 << 10
    ranges = sorted((a.ctypes.data, a.ctypes.data + a.size) for a in bufs.srcs + bufs.dsts[16])
    assert all(hi <= lo2 for (_, hi), (lo2, _) in zip(ranges, ranges[1:]))  # nothing overlaps


def test_cold_rotation_is_capped_for_tiny_sizes():
    assert engine.cold_rotation_count(64, 32 << 20) == engine.COLD_MAX_BUFFERS
    assert engine.cold_rotation_count(256 << 20, 32 << 20) == 1
    with pytest.raises(ValueError, match="cache"):
        engine.Buffers(64, [0], cache="lukewarm")


def test_shared_buffer_is_a_posix_shared_memory_mapping():
    sb = engine.SharedBuffer(1 << 16)
    try:
        assert sb.array is not None and sb.array.ctypes.data % 4096 == 0 and sb.array.flags.writeable
        address = sb.array.ctypes.data
        mapped = []
        with open("/proc/self/maps") as maps:
            for line in maps:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if lo <= address < hi:
                    mapped.append(line)
        # A shared mapping (rw-s) of the segment, whose name is gone already: nothing to leak.
        assert len(mapped) == 1 and " rw-s " in mapped[0], mapped
        assert "/dev/shm" + sb.name + " (deleted)" in mapped[0], mapped
        assert not os.path.exists("/dev/shm" + sb.name)
        src = np.arange(1 << 16, dtype=np.uint8)
        fastcopy.kernel("generic")(sb.array, src)
        assert np.array_equal(sb.array, src)
    finally:
        sb.close()
    assert sb.array is None
    sb.close()                                          # twice is harmless


def test_bench_cold_cache_runs(tmp_path):
    out = tmp_path / "cold.json"
    r = cli("bench", "--cache", "cold", "--sizes", "64K", "--variants", "fastcopy,copyto", "--repeats", "2",
            "--min-time", "0.002", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "caches are cold" in r.stdout and "WRONG RESULT" not in r.stdout
    doc = json.loads(out.read_text())
    assert doc["config"]["cache"] == "cold"
    for res in doc["results"]:
        assert res["cache"] == "cold" and res["verified"] and res["rotation_buffers"] > 1
        assert res["rotation_bytes"] == res["rotation_buffers"] * 65536


def test_bench_cold_cache_refused_with_ipc():
    r = cli("bench", "--ipc", "--cache", "cold")
    assert r.returncode == 2 and "--cache cold" in r.stderr


# ------------------------------------------------------------------ fastcopy.kernel(name, threads=N)

@pytest.mark.parametrize("name", fastcopy.kernels())
def test_forced_kernel_on_the_pool_copies_right(name):
    src = np.random.default_rng(1).integers(0, 256, (4 << 20) + 77, dtype=np.uint8)
    dst = np.zeros_like(src)
    fastcopy.kernel(name, threads=2)(dst, src)
    assert np.array_equal(dst, src)
    # overlapping ranges never go to the pool: memmove's result
    buf = np.arange(1 << 20, dtype=np.uint8)
    expect = buf[:-4160].copy()
    fastcopy.kernel(name, threads=2)(buf[4160:], buf[:-4160])
    assert np.array_equal(buf[4160:], expect)


def test_forced_kernel_threads_must_be_in_range():
    for bad in (0, -1, 1025):
        with pytest.raises(ValueError, match="threads must be 1 to 1024"):
            fastcopy.kernel("generic", threads=bad)


def test_kernel_table_says_which_kernels_stream():
    rows = _core.kernel_table()
    assert all(isinstance(k["streaming"], bool) for k in rows)
    for k in rows:
        if k["twin"] is not None:
            twin = next(t for t in rows if t["name"] == k["twin"])
            assert twin["streaming"] != k["streaming"] and twin["twin"] == k["name"]
    assert not next(k for k in rows if k["name"] == "generic")["streaming"]
