"""docs/reference/ is generated from the compiled core (tools/gen_reference.py): it must be
current, and it must cover every FASTCOPY_* variable the sources read and every built-in
profile."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fastcopy
from fastcopy import _core

from conftest import no_subprocess

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"

# A FASTCOPY_* name in a string literal is a variable read (getenv, os.environ) or named in a
# message; the FASTCOPY_* preprocessor macros are never quoted.
QUOTED_VARIABLE = re.compile(r"""["'](FASTCOPY_[A-Z0-9_]*[A-Z0-9])""")


def variables_in_sources() -> dict[str, str]:
    found: dict[str, str] = {}
    for top in ("src", "cpp"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in (".py", ".cpp", ".h") or not path.is_file():
                continue
            for name in QUOTED_VARIABLE.findall(path.read_text(errors="replace")):
                found.setdefault(name, str(path.relative_to(ROOT)))
    return found


@no_subprocess
def test_reference_is_current():
    """The committed pages equal what the generator writes from this build (it runs in a process
    of its own with the FASTCOPY_* variables unset, importing the fastcopy this test imports)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTCOPY_")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(fastcopy.__file__).parent.parent), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_reference.py"), "--check"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_environment_page_names_every_variable_the_sources_read():
    text = (REFERENCE / "environment.md").read_text()
    documented = set(re.findall(r"^\| `(FASTCOPY_[A-Z0-9_]+)` \|", text, flags=re.M))
    found = variables_in_sources()
    assert found, "no FASTCOPY_* variable found in src/ and cpp/: the scan is broken"
    missing = {name: where for name, where in found.items() if name not in documented}
    assert not missing, f"read in the sources but not in docs/reference/environment.md: {missing}"
    # info()'s overrides are the variables of the core's table
    assert {v["name"] for v in _core.override_variables()} == set(_core.overrides())
    assert set(_core.overrides()) <= documented


def test_builtin_profiles_page_names_every_profile():
    text = (REFERENCE / "builtin-profiles.md").read_text()
    sections = set(re.findall(r"^## `([a-z0-9-]+)`$", text, flags=re.M))
    names = {p["name"] for p in _core.builtin_profiles()}
    assert names and names == sections
    assert names == {p["name"] for p in _core.builtin_profile_table()}


def test_builtin_table_is_what_resolution_starts_from():
    """builtin_profile_table() shows the tables the resolved profiles come from: for this CPU's
    own profile (every kernel of its bands usable here, or named as the fallback), the bands
    of every region and class start at the same sizes."""
    table = {p["name"]: p for p in _core.builtin_profile_table()}
    for entry in _core.builtin_profiles():
        if not entry["matches"]:
            continue
        resolved = entry["profile"]["regions"]
        for region, classes in table[entry["name"]]["regions"].items():
            for cls, bands in classes.items():
                if cls.startswith("rep_movsb_on"):
                    continue
                written = [b["from"] for b in bands] + [table[entry["name"]]["sve_trap_min_from"]]
                got = [b["from"] for b in resolved[region][cls]]
                # resolution merges adjacent bands that end up with the same kernel
                assert set(got) <= set(written) and got[0] == 0, (entry["name"], region, cls, written, got)
