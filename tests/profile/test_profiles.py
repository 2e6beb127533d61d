"""Dispatch profiles: loading at import (FASTCOPY_PROFILE, the user cache), refusing corrupt and
hostile files, info() showing what runs, and the kernel that really runs."""
from __future__ import annotations

import concurrent.futures
import json
import os
import platform
import subprocess
import sys
from typing import Any, Dict, Tuple

import numpy as np
import pytest

import fastcopy
from fastcopy import _core, _profile

pytestmark = pytest.mark.kernels

X86 = platform.machine() in ("x86_64", "AMD64")
needs_subprocess = pytest.mark.skipif(os.environ.get("FASTCOPY_NO_SUBPROCESS") == "1",
                                      reason="FASTCOPY_NO_SUBPROCESS=1 (emulated interpreter)")
CLASSES = ("page_aligned", "near", "far", "backward")
REGIONS = ("private", "to_shared", "from_shared")

@pytest.fixture(autouse=True, scope="module")
def no_user_profile(tmp_path_factory):
    """The in-process tests start from the built-in profile whatever the user's cache or
    environment holds (a tuned profile cached for this machine would otherwise be the base of
    builtin_json() and what load_at_import() restores): the cache is an empty folder and
    FASTCOPY_PROFILE is unset."""
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


PROBE = """
import json, warnings, numpy as np
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import fastcopy
from fastcopy import _core
buf = np.zeros(1 << 20, dtype=np.uint8)
base = (buf.__array_interface__['data'][0] + 4095) // 4096 * 4096
chosen = {f"{off}@{n}": _core.chosen_kernel(base + (1 << 30) + off, base, n)
          for off in (0, 16, 31, 1024) for n in (64, 4096, 65536, 1 << 20, 64 << 20)}
src = np.arange(100_003, dtype=np.uint8)
dst = np.zeros_like(src)
fastcopy.copy(dst, src)
assert np.array_equal(dst, src)
info = fastcopy.info()
print(json.dumps({"warnings": [str(w.message) for w in caught], "chosen": chosen,
                  "source": info["profile_source"], "profile": info["profile"],
                  "usable": fastcopy.kernels(), "signature": __import__("fastcopy._profile").
                  _profile.signature()}))
"""


def run_probe(tmp_path, **env: str) -> Dict[str, Any]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("FASTCOPY_")}
    full["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    full.update(env)
    r = subprocess.run([sys.executable, "-c", PROBE], env=full, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def builtin_json() -> Dict[str, Any]:
    """The active profile in the file format (the base of the test profiles)."""
    return json.loads(_core.active_profile_json())


def tuned_profile(name: str = "mine", signature: Dict[str, Any] | None = None) -> Dict[str, Any]:
    """A valid profile that differs from the built-in one: generic everywhere in private copies."""
    p = builtin_json()
    p["name"] = name
    p["provenance"] = {"machine": "test machine", "date": "2026-11-30", "libc": "test", "method": "by hand"}
    for cls in CLASSES:
        p["regions"]["private"][cls] = [{"from": 0, "kernel": "generic", "why": "test: the C library"}]
    p["regions"]["private"]["nt"] = {"threshold": None, "kernel": None, "why": "test: never"}
    if signature is not None:
        p["signature"] = signature
    return p


def write(path, data) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def cache_file(tmp_path) -> str:
    """Where the cached profile for this machine lives when XDG_CACHE_HOME is tmp_path/cache."""
    key = _profile.signature_key()
    return str(tmp_path / "cache" / "fastcopy" / f"profile-{key}.json")


# ---- import-time loading ----------------------------------------------------------------

@needs_subprocess
def test_builtin_without_any_profile(tmp_path):
    out = run_probe(tmp_path)
    assert out["warnings"] == []
    assert out["source"]["source"] == "built-in"
    assert out["profile"]["source"] == "built-in" and out["profile"]["matched"]


@needs_subprocess
def test_profile_from_env_is_loaded_and_reported(tmp_path):
    path = write(tmp_path / "shared" / "mine.json", tuned_profile("mine"))
    out = run_probe(tmp_path, FASTCOPY_PROFILE=path)
    assert out["warnings"] == []
    assert out["profile"]["name"] == "mine" and out["profile"]["source"] == path
    assert out["source"]["source"] == "file" and out["source"]["path"] == path
    assert out["source"]["date"] == "2026-11-30"
    # What runs is the file: generic everywhere in private copies, no NT.
    assert set(out["chosen"].values()) == {"generic"}


@needs_subprocess
def test_profile_env_shown_by_cli_info(tmp_path):
    path = write(tmp_path / "mine.json", tuned_profile("mine"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTCOPY_")}
    env.update(FASTCOPY_PROFILE=path, XDG_CACHE_HOME=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-m", "fastcopy", "info", "--verbose"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Dispatch profile: mine" in r.stdout and path in r.stdout
    assert "test: the C library" in r.stdout  # the band reasons of the file, as they run
    assert "test machine" in r.stdout and "2026-11-30" in r.stdout


@needs_subprocess
def test_profile_off_ignores_the_cache(tmp_path):
    write(tmp_path / "x", "")
    write(type(tmp_path)(cache_file(tmp_path)), tuned_profile("cached", _profile.signature()))
    on = run_probe(tmp_path)
    assert on["profile"]["name"] == "cached" and on["source"]["source"] == "cache"
    off = run_probe(tmp_path, FASTCOPY_PROFILE="off")
    assert off["source"]["source"] == "built-in" and "FASTCOPY_PROFILE=off" in off["source"]["detail"]
    assert off["profile"]["name"] != "cached" and off["warnings"] == []


@needs_subprocess
def test_cached_profile_with_matching_signature_is_loaded(tmp_path):
    sig = run_probe(tmp_path)["signature"]  # the signature as the child computes it
    write(type(tmp_path)(cache_file(tmp_path)), tuned_profile("cached", sig))
    out = run_probe(tmp_path)
    assert out["warnings"] == []
    assert out["profile"]["name"] == "cached" and out["profile"]["signature"] == sig
    assert out["source"]["source"] == "cache" and out["source"]["path"] == cache_file(tmp_path)


@needs_subprocess
def test_signature_mismatch_is_ignored_and_reported(tmp_path):
    sig = dict(_profile.signature(), model=9999, l3_bytes=1)
    path = write(type(tmp_path)(cache_file(tmp_path)), tuned_profile("other-machine", sig))
    out = run_probe(tmp_path)
    assert out["warnings"] == []  # not corrupt, just another machine's
    assert out["profile"]["name"] != "other-machine" and out["source"]["source"] == "built-in"
    assert path in out["source"]["ignored"]
    assert "another machine" in out["source"]["detail"]
    assert "model" in out["source"]["detail"] and "l3_bytes" in out["source"]["detail"]


@needs_subprocess
def test_other_machines_cached_profiles_are_reported(tmp_path):
    other = write(tmp_path / "cache" / "fastcopy" / "profile-0123456789abcdef.json",
                  tuned_profile("elsewhere", dict(_profile.signature(), vendor="Elsewhere")))
    out = run_probe(tmp_path)
    assert out["source"]["source"] == "built-in" and out["source"]["ignored"] == [other]
    assert "other machines ignored" in out["source"]["detail"]


def _hostile_files(tmp_path):
    """(label, path) of files that must not be used (with this machine's signature, so that the
    cache would take them if they were valid)."""
    good = tuned_profile("bad", _profile.signature())
    files = {}
    files["bad json"] = write(tmp_path / "bad.json", '{"format": "fastcopy-profile", "version": 1,')
    p = json.loads(json.dumps(good))
    p["regions"]["private"]["near"][0]["kernel"] = "warp_drive"
    files["unknown kernel"] = write(tmp_path / "unknown.json", p)
    p = json.loads(json.dumps(good))
    p["regions"]["to_shared"]["far"] = [{"from": 4096, "kernel": "generic"}, {"from": 0, "kernel": "generic"}]
    files["unsorted bands"] = write(tmp_path / "unsorted.json", p)
    p = json.loads(json.dumps(good))
    p["parallel"]["threshold"] = 1 << 60
    files["absurd threshold"] = write(tmp_path / "absurd.json", p)
    p = json.loads(json.dumps(good))
    p["regions"]["private"]["nt"] = {"threshold": 10, "kernel": "generic"}
    files["tiny NT threshold"] = write(tmp_path / "tiny.json", p)
    files["huge file"] = write(tmp_path / "huge.json", json.dumps(good) + " " * (1 << 20))
    files["not UTF-8"] = str(tmp_path / "latin1.json")
    (tmp_path / "latin1.json").write_bytes(b'{"name": "\xe9"}')
    loop = tmp_path / "loop.json"
    os.symlink(str(loop), str(loop))
    files["symlink loop"] = str(loop)
    (tmp_path / "adir").mkdir()
    files["directory"] = str(tmp_path / "adir")
    files["missing"] = str(tmp_path / "nothing-here.json")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(str(fifo))
    files["fifo"] = str(fifo)
    unsupported = [k["name"] for k in _core.kernel_table() if not k["supported"] and not k["streaming"]]
    if unsupported:
        p = json.loads(json.dumps(good))
        p["regions"]["private"]["far"] = [{"from": 0, "kernel": unsupported[0]}]
        files["unsupported kernel"] = write(tmp_path / "unsupported.json", p)
    return files


def run_probes(jobs: Dict[str, Tuple[Any, Dict[str, str]]]) -> Dict[str, Dict[str, Any]]:
    """run_probe for each label's (tmp_path, env), two at a time per CPU: the cases are
    independent processes, and one after the other they took 17-19 s of the suite."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=2 * (os.cpu_count() or 1)) as pool:
        futures = {label: pool.submit(run_probe, where, **env) for label, (where, env) in jobs.items()}
        return {label: f.result() for label, f in futures.items()}


@needs_subprocess
def test_hostile_profiles_from_env_warn_once_and_use_builtin(tmp_path):
    builtin = run_probe(tmp_path, FASTCOPY_PROFILE="off")
    files = _hostile_files(tmp_path)
    outs = run_probes({label: (tmp_path, {"FASTCOPY_PROFILE": path}) for label, path in files.items()})
    assert list(outs) == list(files) and len(files) >= 10  # every case ran
    for label, out in outs.items():
        assert len(out["warnings"]) == 1, (label, out["warnings"])
        assert "built-in" in out["warnings"][0], label
        assert out["source"]["source"] == "built-in", label
        assert out["profile"]["name"] == builtin["profile"]["name"], label
        assert out["chosen"] == builtin["chosen"], label
        assert set(out["chosen"].values()) <= set(out["usable"]), label


@needs_subprocess
def test_hostile_cached_profiles_warn_once_and_use_builtin(tmp_path):
    jobs = {}
    for i, (label, path) in enumerate(_hostile_files(tmp_path / "src").items()):
        home = tmp_path / f"case{i}"  # each case its own cache directory, so they run side by side
        target = cache_file(home)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if label in ("symlink loop", "fifo", "missing", "directory"):
            os.symlink(path, target)
        else:
            with open(path, "rb") as f:
                data = f.read()
            with open(target, "wb") as f:
                f.write(data)
        jobs[label] = (home, {})
    outs = run_probes(jobs)
    assert list(outs) == list(jobs) and len(jobs) >= 10  # every case ran
    for label, out in outs.items():
        if label == "missing":  # a dangling link: still a file that cannot be read
            assert len(out["warnings"]) == 1, (label, out)
        else:
            assert len(out["warnings"]) == 1, (label, out["warnings"])
        assert out["source"]["source"] == "built-in", label
        assert set(out["chosen"].values()) <= set(out["usable"]), label


@needs_subprocess
def test_unreadable_profile(tmp_path):
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        pytest.skip("running as root: a mode-000 file stays readable, so this case cannot be built here")
    path = write(tmp_path / "secret.json", tuned_profile())
    os.chmod(path, 0)
    out = run_probe(tmp_path, FASTCOPY_PROFILE=path)
    assert len(out["warnings"]) == 1 and "cannot read" in out["warnings"][0]


# ---- in-process: load_profile, active_profile, choose_for --------------------------------

@pytest.fixture
def restore_profile():
    yield
    _core.use_builtin_profile()
    _profile.load_at_import()


def test_load_profile_errors_name_the_problem_and_change_nothing(restore_profile):
    before = _core.active_profile()
    p = tuned_profile()
    p["regions"]["private"]["far"][0]["from"] = 64
    with pytest.raises(ValueError, match=r"regions\.private\.far\[0\]\.from: the first band must start at 0"):
        _core.load_profile(json.dumps(p), "test")
    with pytest.raises(ValueError, match="bad JSON at line 1"):
        _core.load_profile("{", "test")
    # The core enforces the 1 MiB limit itself, not only the Python file reader: a valid
    # profile padded with spaces to 1 MiB + 1 byte is refused.
    text = json.dumps(tuned_profile("padded"))
    with pytest.raises(ValueError, match="more than the 1 MiB limit"):
        _core.load_profile(text + " " * ((1 << 20) + 1 - len(text)), "test")
    assert _core.active_profile() == before
    _core.load_profile(text + " " * ((1 << 20) - len(text)), "test")  # exactly 1 MiB is fine
    assert _core.active_profile()["name"] == "padded"


def test_active_profile_is_what_runs(restore_profile):
    _core.load_profile(json.dumps(tuned_profile("in-process")), "test")
    active = _core.active_profile()
    assert active["name"] == "in-process" and active["source"] == "test"
    buf = np.zeros(1 << 16, dtype=np.uint8)
    base = (buf.ctypes.data + 4095) // 4096 * 4096
    for off in (0, 16, 1024):
        assert _core.chosen_kernel(base + (1 << 30) + off, base, 65536) == "generic"
    # info() prints the same dict, and its flat rows are the same bands.
    info = fastcopy.info()
    assert info["profile"] == active
    rows = [r for r in info["policy"] if r["region"] == "private"]
    assert {r["kernel"] for r in rows} == {"generic"}
    # The JSON form round-trips: loading it gives the same profile.
    _core.load_profile(_core.active_profile_json(), "test")
    assert _core.active_profile() == active


def test_builtin_profiles_have_provenance():
    names = [b["name"] for b in _core.builtin_profiles()]
    assert len(names) == len(set(names)) >= 9
    matching = [b for b in _core.builtin_profiles() if b["matches"]]
    best = max(matching, key=lambda b: b["specificity"])
    try:
        _core.use_builtin_profile()  # the one this CPU gets, whatever the import loaded
        assert best["name"] == _core.base_profile()["name"]
    finally:
        _profile.load_at_import()
    for b in _core.builtin_profiles():
        prov = b["profile"]["provenance"]
        assert prov["machine"] and prov["date"] and prov["method"], b["name"]
        for region in REGIONS:
            for cls in CLASSES:
                for band in b["profile"]["regions"][region][cls]:
                    assert band["why"], (b["name"], region, cls)


def test_choose_for_evaluates_a_profile_on_synthetic_addresses():
    p = tuned_profile()
    p["regions"]["private"]["far"] = [{"from": 0, "kernel": "generic"}]
    if "avx2" in fastcopy.kernels():
        p["regions"]["private"]["far"].append({"from": 1000, "kernel": "avx2"})
        text = json.dumps(p)
        base = 1 << 40
        assert _core.choose_for(text, base + 4096 * 7 + 64, base, 999) == "generic"
        assert _core.choose_for(text, base + 4096 * 7 + 64, base, 1000) == "avx2"
        assert _core.choose_for(text, base + 4096 * 7 + 16, base, 1000) == "generic"  # near
    with pytest.raises(ValueError, match="no built-in profile named"):
        _core.choose_for("no-such-profile", 0, 0, 1)


# ---- the 4K-aliasing guard of rep movsb --------------------------------------------------------

@pytest.mark.skipif(not X86, reason="rep movsb is x86 only")
@pytest.mark.parametrize("rep_movsb", ["auto", "on"])
def test_near_class_never_gets_erms_under_any_builtin_profile(rep_movsb, restore_profile):
    """Under every built-in profile (resolved for this CPU) and FASTCOPY_REP_MOVSB=auto/on,
    (dst - src) mod 4096 in 1..63 never runs rep movsb. Not vacuous: erms is chosen in the far
    class by some profile here (Intel's by default, every one that allows it with =on)."""
    buf = np.zeros(1 << 16, dtype=np.uint8)
    base = (buf.ctypes.data + 4095) // 4096 * 4096
    far_erms = 0
    saved = os.environ.get("FASTCOPY_REP_MOVSB")
    os.environ["FASTCOPY_REP_MOVSB"] = rep_movsb
    try:
        _core.init_policy()
        for b in _core.builtin_profiles():
            _core.use_builtin_profile(b["name"])
            for region in range(3):
                for n in (2112, 4096, 65536, 1 << 20, 8 << 20):
                    for off in list(range(1, 64)) + [4096 + 16, 8192 + 31]:
                        got = _core.chosen_kernel(base + (1 << 30) + off, base, n, region)
                        assert got != "erms", (b["name"], region, n, off)
                    far_erms += _core.chosen_kernel(base + (1 << 30) + 2080, base, n, region) == "erms"
    finally:
        if saved is None:
            os.environ.pop("FASTCOPY_REP_MOVSB", None)
        else:
            os.environ["FASTCOPY_REP_MOVSB"] = saved
        _core.init_policy()
    assert far_erms > 0


@needs_subprocess
@pytest.mark.skipif(not X86, reason="rep movsb is x86 only")
def test_rep_movsb_on_runs_far_but_not_near(tmp_path):
    """FASTCOPY_REP_MOVSB=on: a copy at distance 16 or 31 runs another kernel (the one that ran,
    read from the kernel-identity hook), a copy at distance 2080 runs erms."""
    code = """
import json, numpy as np, fastcopy
from fastcopy import _core
buf = np.zeros(3 << 20, dtype=np.uint8)
base = (buf.ctypes.data + 4095) // 4096 * 4096 - buf.ctypes.data
ran = {}
for off in (16, 31, 2080):
    src = buf[base: base + 65536]
    dst = buf[base + (1 << 20) + off: base + (1 << 20) + off + 65536]
    _core.reset_last_kernel()
    fastcopy.copy(dst, src)
    ran[off] = _core.last_kernel()
print(json.dumps(ran))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTCOPY_")}
    env["FASTCOPY_REP_MOVSB"] = "on"
    env["FASTCOPY_PROFILE"] = "off"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    ran = json.loads(r.stdout)
    assert ran["16"] != "erms" and ran["31"] != "erms" and ran["16"] is not None
    allows = _core.active_profile()["regions"]["private"]["rep_movsb_on"] is not None
    if allows:
        assert ran["2080"] == "erms"


# ---- a forced kernel really runs -----------------------------------------------------------

@pytest.mark.parametrize("name", fastcopy.kernels())
def test_forced_kernel_callable_runs_that_kernel(name):
    src = np.arange(16384, dtype=np.uint8)
    for dst, s in ((np.zeros_like(src), src), (bytearray(16384), bytes(src)), (np.zeros(4096, np.uint32), src.view(np.uint32))):
        _core.reset_last_kernel()
        fastcopy.kernel(name)(dst, s)
        assert _core.last_kernel() == name, type(dst)
        assert bytes(memoryview(dst).cast("B")) == bytes(memoryview(s).cast("B"))


@pytest.mark.parametrize("name", fastcopy.kernels())
def test_fastcopy_kernel_env_runs_that_kernel(name):
    saved = os.environ.get("FASTCOPY_KERNEL")
    os.environ["FASTCOPY_KERNEL"] = name
    try:
        _core.init_policy()
        for n in (8, 16384, 3 << 20):
            src = np.arange(n, dtype=np.uint8)
            dst = np.zeros_like(src)
            _core.reset_last_kernel()
            fastcopy.copy(dst, src)
            assert _core.last_kernel() == name, n
            assert np.array_equal(dst, src)
    finally:
        if saved is None:
            os.environ.pop("FASTCOPY_KERNEL", None)
        else:
            os.environ["FASTCOPY_KERNEL"] = saved
        _core.init_policy()


def test_automatic_copy_runs_the_chosen_kernel():
    buf = np.zeros(1 << 20, dtype=np.uint8)
    for n, off in ((64, 0), (4096, 16), (65536, 1024), (200_000, 0)):
        src, dst = buf[:n], buf[(512 << 10) + off: (512 << 10) + off + n]
        _core.reset_last_kernel()
        fastcopy.copy(dst, src)
        assert _core.last_kernel() == _core.chosen_kernel(dst.ctypes.data, src.ctypes.data, n)


@needs_subprocess
@pytest.mark.parametrize("name", fastcopy.kernels())
def test_fastcopy_kernel_env_runs_that_kernel_at_import(name, tmp_path):
    code = ("import numpy as np, fastcopy; from fastcopy import _core; s = np.arange(16384, dtype=np.uint8); "
            "d = np.zeros_like(s); _core.reset_last_kernel(); fastcopy.copy(d, s); print(_core.last_kernel())")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTCOPY_")}
    env["FASTCOPY_KERNEL"] = name
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == name


# ---- tune end to end: write to the cache, the next import runs it ---------------------------

@needs_subprocess
def test_tune_quick_then_import_picks_the_profile_up(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTCOPY_")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    r = subprocess.run([sys.executable, "-m", "fastcopy", "tune", "--quick"], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert os.path.exists(cache_file(tmp_path)), r.stdout
    out = run_probe(tmp_path)
    assert out["warnings"] == []
    assert out["source"]["source"] == "cache" and out["source"]["path"] == cache_file(tmp_path)
    assert out["profile"]["signature"] == out["signature"]
    with open(cache_file(tmp_path)) as f:
        written = json.load(f)
    assert out["profile"]["name"] == written["name"]
    for region in REGIONS:  # what runs is the file's bands
        for cls in CLASSES:
            assert [(b["from"], b["kernel"]) for b in out["profile"]["regions"][region][cls]] == \
                [(b["from"], b["kernel"]) for b in written["regions"][region][cls]]
    r = subprocess.run([sys.executable, "-m", "fastcopy", "info"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and cache_file(tmp_path) in r.stdout
