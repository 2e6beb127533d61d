"""``python -m fastcopy info [--json]``."""
from __future__ import annotations

import json

import fastcopy

from _cli import cli


def test_info_text():
    r = cli("info")
    assert r.returncode == 0, r.stderr
    assert f"fastcopy {fastcopy.__version__}" in r.stdout
    assert "CPU detected:" in r.stdout and "Kernels:" in r.stdout
    for name in fastcopy.kernels():
        assert name in r.stdout


def test_info_json():
    r = cli("info", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["version"] == fastcopy.__version__
    assert data["usable_kernels"] == fastcopy.kernels()
    assert {"cpu", "kernels", "policy", "thresholds", "threads", "overrides"} <= set(data)
    assert data["cpu"]["arch"] in ("x86_64", "aarch64", "unknown")


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
