"""``python -m fastcopy info [--json]``."""
from __future__ import annotations

import copy
import json
import re

import fastcopy
from fastcopy import _core

from _cli import cli


def test_info_text():
    r = cli("info")
    assert r.returncode == 0, r.stderr
    assert f"fastcopy {fastcopy.__version__}" in r.stdout
    assert "CPU detected:" in r.stdout and "Kernels:" in r.stdout
    for name in fastcopy.kernels():
        assert name in r.stdout


def test_info_fits_one_screen_and_verbose_says_why():
    short = cli("info").stdout.splitlines()
    assert len(short) <= 40 and max(map(len, short)) <= 100, "\n".join(short)
    text = "\n".join(short)
    profile = _core.active_profile()
    assert f"Dispatch profile: {profile['name']}" in text
    for bands in profile["regions"]["private"].values():  # each kernel that runs is named
        if isinstance(bands, list):
            assert all(b["kernel"] in text for b in bands)
    assert "info --verbose" in text
    assert not any(b["why"] and b["why"] in text for b in profile["regions"]["private"]["far"])
    verbose = cli("info", "--verbose").stdout
    assert all(b["why"] in verbose for b in profile["regions"]["private"]["far"])
    assert len(verbose.splitlines()) > len(short)


def test_info_json():
    r = cli("info", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["version"] == fastcopy.__version__
    assert data["usable_kernels"] == fastcopy.kernels()
    assert {"cpu", "kernels", "policy", "thresholds", "threads", "overrides"} <= set(data)
    assert data["cpu"]["arch"] in ("x86_64", "aarch64", "unknown")


SHM_RULE_NAMES = ["page_aligned_loan_bytes", "early_wrap_bytes", "topic_default_bytes", "pipelined_send_bytes",
                  "release_gil_bytes", "timed_write_bytes",
                  "spin_max_seconds", "spin_min_seconds", "spin_mid_message_seconds"]


def test_info_reports_the_shared_memory_rules():
    """info() shows fastcopy.shm's size and time rules as the C++ core runs them, each with
    what it does and the measurement behind it; the text report lists them too."""
    rules = fastcopy.info()["shm"]
    assert [rule["name"] for rule in rules] == SHM_RULE_NAMES
    assert rules == list(_core._shm_rules())
    for rule in rules:
        if rule["unit"] == "bytes":
            assert isinstance(rule["value"], int) and rule["value"] >= 4096, rule
        else:
            assert rule["unit"] == "seconds" and 0 < rule["value"] < 1, rule
        assert len(rule["rule"]) > 20, rule
        assert re.search(r"Zen \d", rule["why"]) and any(c.isdigit() for c in rule["why"]), rule  # machine and figures
    text = cli("info", "--verbose").stdout
    assert "Shared memory (fastcopy.shm):" in text
    for rule in rules:
        assert f"  {rule['name']} = " in text
        assert rule["why"] in text


def test_info_reports_the_spin_limits_in_force():
    """_shm_set_spin changes the limits in this process; info() reports the new ones."""
    def spins() -> dict:
        return {r["name"]: r["value"] for r in fastcopy.info()["shm"] if r["unit"] == "seconds"}

    before = spins()
    try:
        _core._shm_set_spin(0.002, 5e-6)
        assert spins() == {"spin_max_seconds": 0.002, "spin_min_seconds": before["spin_min_seconds"],
                           "spin_mid_message_seconds": 5e-6}
        _core._shm_set_spin(1e-4, 5e-6)                  # the floor never exceeds the cap
        assert spins()["spin_min_seconds"] == 1e-4
    finally:
        _core._shm_set_spin(before["spin_max_seconds"], before["spin_mid_message_seconds"])
    assert spins() == before


def test_no_command_is_an_error():
    r = cli()
    assert r.returncode == 2
    assert "command" in r.stderr


def test_info_profile_prints_a_loadable_profile(tmp_path):
    r = cli("info", "--profile")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["format"] == "fastcopy-profile" and data["version"] == 1
    assert set(data["regions"]) == {"private", "to_shared", "from_shared"}
    from fastcopy import _core

    try:
        _core.load_profile(r.stdout, "cli output")  # what it prints is a valid profile here
        loaded = _core.active_profile()["regions"]
        for region, classes in data["regions"].items():
            for cls in ("page_aligned", "near", "far", "backward"):
                assert [(b["from"], b["kernel"]) for b in loaded[region][cls]] == \
                    [(b["from"], b["kernel"]) for b in classes[cls]]
    finally:
        _core.use_builtin_profile()
        from fastcopy import _profile

        _profile.load_at_import()


def test_the_summary_says_each_region_once():
    """Copies into and out of shared memory are said together where their rules match, as
    "same as ordinary copies" where everything matches, and with only their NT rule where only
    that differs from ordinary copies."""
    from fastcopy._report import _regions_summary

    regions = copy.deepcopy(_core.active_profile()["regions"])
    # Ordinary copies stream from 16 MiB whatever this CPU's profile says, so that the 64 MiB
    # rule given to shared memory below differs from theirs on every CPU.
    nt = {"kernel": "avx2_nt", "min_page_distance": 0, "min_page_distance_below": None,
          "learn_from": None, "why": "test"}
    regions["private"]["nt"] = {**nt, "threshold": 16 << 20}
    for key in ("to_shared", "from_shared"):
        regions[key] = copy.deepcopy(regions["private"])
    lines = _regions_summary(regions, None)
    assert lines[-1] == "Copies into and out of shared memory: same as ordinary copies"
    for key in ("to_shared", "from_shared"):
        regions[key]["nt"] = {**nt, "threshold": 64 << 20}
    lines = _regions_summary(regions, None)
    assert lines[-1] == ("Copies into and out of shared memory: the bands of ordinary copies; "
                         "non-temporal stores (avx2_nt) from 64 MiB")
    regions["from_shared"]["far"] = [{"from": 0, "kernel": "erms", "fallback": None, "why": "test"}]
    lines = _regions_summary(regions, None)
    assert "Copies into shared memory: the bands of ordinary copies; non-temporal stores (avx2_nt) from 64 MiB" \
        in lines
    at = lines.index("Copies out of shared memory:")
    assert lines[at + 1:] == [line for line in lines[at + 1:] if line.startswith("  ")]
    assert any("erms" in line for line in lines[at + 1:])
