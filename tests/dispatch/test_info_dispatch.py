"""Detection and policy: info() agrees with the OS, overrides behave as documented."""
from __future__ import annotations

import json
import re
import os
import platform
import subprocess
import sys

import numpy as np
import pytest

import fastcopy
from conftest import streaming_kernels
from fastcopy import _core

pytestmark = pytest.mark.kernels

X86 = platform.machine() in ("x86_64", "AMD64")
NO_SUBPROCESS = os.environ.get("FASTCOPY_NO_SUBPROCESS") == "1"
needs_subprocess = pytest.mark.skipif(NO_SUBPROCESS, reason="FASTCOPY_NO_SUBPROCESS=1 (emulated interpreter)")


def proc_cpuinfo():
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if ":" in line:
                    key, _, value = line.partition(":")
                    fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


# FASTCOPY_TEST_EMULATOR (e.g. "qemu-x86_64-static -cpu Nehalem"): children run under it too,
# so they see the same emulated CPU as this process (.ci/emulated_cpu_pytest.sh).
EMULATOR = os.environ.get("FASTCOPY_TEST_EMULATOR", "").split()
ALL_SUPPORTED = ("every compiled kernel is supported on this CPU; CI runs this test on an emulated CPU "
                 "without AVX2 (.ci/emulated_cpu_pytest.sh)")


def run_python(code: str, **env_overrides: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTCOPY_")}
    env.update(env_overrides)
    return subprocess.run([*EMULATOR, sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


def test_info_structure():
    data = fastcopy.info()
    for key in ("version", "cpu", "kernels", "policy", "thresholds", "threads", "overrides", "notes"):
        assert key in data
    names = [k["name"] for k in data["kernels"]]
    assert "generic" in names
    assert fastcopy.kernels() == [k["name"] for k in data["kernels"] if k["supported"]]
    for rule in data["policy"]:
        assert rule["region"] in ("private", "to_shared", "from_shared")
        assert rule["class"] in ("page_aligned", "near", "far", "backward")
        assert rule["kernel"] in names
        assert rule["reason"], rule
        assert rule["max_bytes"] is None or rule["max_bytes"] > rule["min_bytes"]
    # Every region's bands tile [0, inf) without gaps, in every address class.
    for region in ("private", "to_shared", "from_shared"):
        for cls in ("page_aligned", "near", "far", "backward"):
            bands = [r for r in data["policy"] if r["region"] == region and r["class"] == cls]
            assert bands[0]["min_bytes"] == 0 and bands[-1]["max_bytes"] is None
            for a, b in zip(bands, bands[1:]):
                assert a["max_bytes"] == b["min_bytes"]
            # The flat rows are the active profile's bands, not a reconstruction.
            prof = data["profile"]["regions"][region][cls]
            assert [(b["from"], b["kernel"]) for b in prof] == [(r["min_bytes"], r["kernel"]) for r in bands]
    json.dumps(data)  # serialisable


@pytest.mark.skipif(not X86 or not os.path.exists("/proc/cpuinfo"), reason="x86 Linux only")
def test_x86_facts_agree_with_proc_cpuinfo():
    cpu = fastcopy.info()["cpu"]
    info = proc_cpuinfo()
    flags = set(info.get("flags", "").split())
    assert cpu["vendor"] == info["vendor_id"]
    assert cpu["family"] == int(info["cpu family"])
    assert cpu["model"] == int(info["model"])
    assert cpu["stepping"] == int(info["stepping"])
    for flag in ("erms", "fsrm", "avx2", "avx512f", "avx512bw", "avx512vl"):
        assert cpu["flags"][flag] == (flag in flags), flag
    assert cpu["hypervisor"] == ("hypervisor" in flags)


@pytest.mark.skipif(not X86, reason="x86 only")
def test_x86_vector_kernels_follow_the_flags():
    # The registry's needs: avx2 kernels with AVX2, avx512 kernels with AVX-512 F+BW+VL (and
    # AVX2); the flags already include the OS state check (XCR0), which /proc/cpuinfo mirrors.
    flags = fastcopy.info()["cpu"]["flags"]
    table = {k["name"]: k for k in _core.kernel_table()}
    avx512 = flags["avx512f"] and flags["avx512bw"] and flags["avx512vl"] and flags["avx2"]
    for name, usable in (("avx2", flags["avx2"]), ("avx2_nt", flags["avx2"]),
                         ("avx512", avx512), ("avx512_nt", avx512)):
        assert table[name]["supported"] == usable, name
        assert (table[name]["why_not"] == "") == usable, name
    if flags["avx2"] and not avx512:
        assert "lacks AVX-512" in table["avx512"]["why_not"]


@pytest.mark.skipif(not X86, reason="x86 only")
def test_x86_flags_agree_with_py_cpuinfo():
    cpuinfo = pytest.importorskip("cpuinfo")
    flags = set(cpuinfo.get_cpu_info().get("flags", []))
    cpu = fastcopy.info()["cpu"]
    for flag in ("erms", "avx2", "avx512f", "avx512bw", "avx512vl"):
        assert cpu["flags"][flag] == (flag in flags), flag


@pytest.mark.skipif(platform.machine() != "aarch64", reason="aarch64 only")
def test_arm_facts_agree_with_proc_cpuinfo():
    cpu = fastcopy.info()["cpu"]
    feats = set(proc_cpuinfo().get("Features", "").split())
    if feats:
        assert cpu["flags"]["asimd"] == ("asimd" in feats)
        assert cpu["flags"]["sve"] == ("sve" in feats)
    assert ("sve" in fastcopy.kernels()) == cpu["flags"]["sve"]
    if cpu["flags"]["sve"]:
        assert cpu["sve_vector_bytes"] in range(16, 257, 16)


def test_cache_sizes_prefer_sysfs():
    cpu = fastcopy.info()["cpu"]
    path = "/sys/devices/system/cpu/cpu0/cache/index3/size"
    if os.path.exists(path):
        text = open(path).read().strip()
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
        expected = int(text.rstrip("KMG")) * mult
        assert cpu["l3_sysfs_bytes"] == expected
        assert cpu["l3_bytes"] == expected
        assert cpu["cache_source"] == "sysfs"
    else:  # no sysfs L3 (containers, some VMs): the size comes from CPUID or is unknown, never "sysfs"
        assert not cpu["l3_sysfs_bytes"]
        assert cpu["cache_source"] != "sysfs"
        assert (cpu["l3_bytes"] or 0) == (cpu["l3_cpuid_bytes"] or 0)


def addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_chosen_kernel_rules():
    buf = np.zeros(4 << 20, dtype=np.uint8)
    base = (addr(buf) + 4095) // 4096 * 4096
    # Far copies (distance 2 MiB + 128 B) run what the active profile's far band names at their
    # size, whichever kernel that is on this CPU.
    far = _core.active_profile()["regions"]["private"]["far"]
    for n in (0, 1, 64, 300, 4096, 65536, 1 << 20):
        band = next(b for b in far if b["from"] <= n and (b["to"] is None or n < b["to"]))  # None: no end
        assert _core.chosen_kernel(base + (2 << 20) + 128, base, n) == band["kernel"], n
    # rep movsb is never chosen for 4K-aliasing distances nor for backward (overlapping) copies.
    for n in (4096, 65536, 512 << 10):
        for off in list(range(1, 64)) + [4096 + 5, 8192 + 63]:
            assert _core.chosen_kernel(base + (2 << 20) + off, base, n) != "erms"
        assert _core.chosen_kernel(base + 128, base, n) != "erms"  # dst inside (src, src+n)


def test_every_usable_kernel_copies_correctly(kernel):
    rng = np.random.default_rng(1)
    k = fastcopy.kernel(kernel)
    for n in (0, 1, 31, 33, 255, 4097, 100_003):
        src = rng.integers(0, 256, n, dtype=np.uint8)
        dst = np.zeros(n, dtype=np.uint8)
        k(dst, src)
        assert np.array_equal(dst, src), n


def test_kernel_table_streaming_and_twins():
    # The registry (cpp/kernels/registry.cpp) as Python sees it: a twin is a kernel with the
    # same needs and the other streaming flag that names this one back.
    table = {k["name"]: k for k in _core.kernel_table()}
    assert list(table) == [k["name"] for k in _core.kernel_table()]  # names are unique
    for k in table.values():
        assert isinstance(k["streaming"], bool)
        if k["twin"] is None:
            continue
        twin = table[k["twin"]]
        assert twin["twin"] == k["name"] and twin["streaming"] != k["streaming"], k
        assert twin["supported"] == k["supported"] and twin["why_not"] == k["why_not"], k
    assert streaming_kernels() <= set(fastcopy.kernels())


@needs_subprocess
def test_import_does_not_import_cpuinfo():
    r = run_python("import sys, fastcopy; print('cpuinfo' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


@needs_subprocess
@pytest.mark.parametrize("var,value", [
    ("FASTCOPY_KERNEL", "no_such_kernel"),
    ("FASTCOPY_REP_MOVSB", "sometimes"),
    ("FASTCOPY_NT_THRESHOLD", "12Q"),
    ("FASTCOPY_NT_LEARN_FROM", "64K"),  # below the 256 KiB a timed copy needs
    ("FASTCOPY_SPLIT_LEARN_FROM", "64K"),
    ("FASTCOPY_THREADS", "zero"),
    ("FASTCOPY_THREADS", "-1"),  # 0 is the default, as set_threads(0)
])
def test_bad_override_fails_import(var, value):
    r = run_python("import fastcopy", **{var: value})
    assert r.returncode != 0
    assert "ImportError" in r.stderr
    assert var in r.stderr and value in r.stderr


@needs_subprocess
def test_bad_kernel_lists_valid_names():
    r = run_python("import fastcopy", FASTCOPY_KERNEL="no_such_kernel")
    for name in fastcopy.kernels():
        assert name in r.stderr


@pytest.mark.emulated_cpu
@needs_subprocess
def test_unsupported_kernel_fails_import():
    unsupported = [k["name"] for k in fastcopy.info()["kernels"] if not k["supported"]]
    if not unsupported:
        pytest.skip(ALL_SUPPORTED)
    r = run_python("import fastcopy", FASTCOPY_KERNEL=unsupported[0])
    assert r.returncode != 0 and "not supported" in r.stderr


PROBE = """
import json, numpy as np, fastcopy
from fastcopy import _core
buf = np.zeros(8 << 20, dtype=np.uint8)
base = (buf.__array_interface__['data'][0] + 4095) // 4096 * 4096
far = base + (4 << 20) + 1024  # far class, and past the Zen 3 NT distance guard (512)
out = {n: _core.chosen_kernel(far, base, n) for n in (64, 4096, 65536, 1 << 20, 3 << 20)}
src = np.arange(3 << 20, dtype=np.uint32).view(np.uint8)[: 3 << 20]
dst = np.zeros_like(src)
fastcopy.copy(dst, src)
assert np.array_equal(dst, src)
print(json.dumps({"chosen": out, "info": fastcopy.info()}))
"""


def probe(**env) -> dict:
    r = run_python(PROBE, **env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@needs_subprocess
def test_forced_kernel(kernel):
    out = probe(FASTCOPY_KERNEL=kernel)
    assert set(out["chosen"].values()) == {kernel}
    assert out["info"]["overrides"]["FASTCOPY_KERNEL"] == kernel
    assert all(r["kernel"] == kernel for r in out["info"]["policy"])


@needs_subprocess
@pytest.mark.skipif(not X86, reason="rep movsb is x86 only")
def test_rep_movsb_on_and_off():
    on = probe(FASTCOPY_REP_MOVSB="on", FASTCOPY_NT_THRESHOLD="2M")
    assert on["chosen"]["65536"] == "erms" and on["chosen"]["4096"] == "erms"
    assert on["chosen"]["64"] != "erms"  # below the rep movsb threshold
    assert on["chosen"]["3145728"] != "erms"  # above the non-temporal threshold
    off = probe(FASTCOPY_REP_MOVSB="off")
    assert "erms" not in off["chosen"].values()
    assert all(r["kernel"] != "erms" for r in off["info"]["policy"])
    assert off["info"]["overrides"]["FASTCOPY_REP_MOVSB"] == "off"


@needs_subprocess
def test_nt_threshold_off_is_reported_as_off_and_unset_as_none():
    """overrides() tells the three states apart: unset (None), "off", a size."""
    off = probe(FASTCOPY_NT_THRESHOLD="off")
    assert off["info"]["overrides"]["FASTCOPY_NT_THRESHOLD"] == "off"
    assert off["info"]["thresholds"]["non_temporal_bytes"] is None
    assert probe()["info"]["overrides"]["FASTCOPY_NT_THRESHOLD"] is None  # run_python drops FASTCOPY_*


@needs_subprocess
@pytest.mark.parametrize("text,value", [("64K", 64 << 10), ("8M", 8 << 20), ("1G", 1 << 30), ("123456", 123456)])
def test_nt_threshold_override(text, value):
    out = probe(FASTCOPY_NT_THRESHOLD=text)
    assert out["info"]["overrides"]["FASTCOPY_NT_THRESHOLD"] == value
    streaming = streaming_kernels()
    if streaming:
        assert out["info"]["thresholds"]["non_temporal_bytes"] == value
        if value <= 65536:
            assert out["chosen"]["65536"] in streaming and out["chosen"]["1048576"] in streaming
        if value >= 8 << 20:
            assert not streaming & set(out["chosen"].values())


@needs_subprocess
def test_nt_threshold_off():
    out = probe(FASTCOPY_NT_THRESHOLD="off")
    assert out["info"]["thresholds"]["non_temporal_bytes"] is None
    assert all(r["kernel"] not in streaming_kernels() for r in out["info"]["policy"])
    for region in out["info"]["profile"]["regions"].values():
        assert region["nt"]["threshold"] is None and region["nt"]["kernel"] is None
    assert not any(k in streaming_kernels() for k in out["chosen"].values())


@needs_subprocess
def test_threads_override():
    out = probe(FASTCOPY_THREADS="1")
    assert out["info"]["threads"]["count"] == 1
    assert out["info"]["overrides"]["FASTCOPY_THREADS"] == 1


def test_set_threads_roundtrip():
    before = fastcopy.get_threads()
    try:
        fastcopy.set_threads(1)
        assert fastcopy.get_threads() == 1
        with pytest.raises(ValueError, match="set_threads"):
            fastcopy.set_threads(-1)
    finally:
        fastcopy.set_threads(0)
    assert fastcopy.get_threads() == before  # set_threads(0) goes back to FASTCOPY_THREADS or the default


# The same overrides in-process (re-reading the environment with _core.init_policy()), so they
# are also checked where subprocesses cannot start (emulated aarch64 in CI).
OVERRIDE_VARS = ("FASTCOPY_KERNEL", "FASTCOPY_REP_MOVSB", "FASTCOPY_NT_THRESHOLD", "FASTCOPY_NT_LEARN_FROM",
                 "FASTCOPY_SPLIT_LEARN_FROM", "FASTCOPY_THREADS")


class policy_env:
    def __init__(self, **env: str):
        self.env = env

    def __enter__(self):
        self.saved = {k: os.environ.pop(k, None) for k in OVERRIDE_VARS}
        os.environ.update(self.env)
        try:
            _core.init_policy()
        except BaseException:
            self.__exit__()  # __exit__ is not called when __enter__ raises
            raise

    def __exit__(self, *exc):
        for k in OVERRIDE_VARS:
            os.environ.pop(k, None)
            if self.saved[k] is not None:
                os.environ[k] = self.saved[k]
        _core.init_policy()


def test_forced_kernel_in_process(kernel):
    buf = np.zeros(2 << 20, dtype=np.uint8)
    base = (addr(buf) + 4095) // 4096 * 4096
    with policy_env(FASTCOPY_KERNEL=kernel):
        for n in (0, 64, 4096, 1 << 20):
            assert _core.chosen_kernel(base + (1 << 20), base, n) == kernel
        src = np.arange(100_003, dtype=np.uint8)
        dst = np.zeros_like(src)
        fastcopy.copy(dst, src)
        assert np.array_equal(dst, src)
    assert _core.overrides()["FASTCOPY_KERNEL"] is None


@pytest.mark.parametrize("var,value", [
    ("FASTCOPY_KERNEL", "no_such_kernel"),
    ("FASTCOPY_REP_MOVSB", "sometimes"),
    ("FASTCOPY_NT_THRESHOLD", "12Q"),
    ("FASTCOPY_NT_LEARN_FROM", "soon"),
    ("FASTCOPY_SPLIT_LEARN_FROM", "later"),
    ("FASTCOPY_THREADS", "1025"),
])
def test_bad_override_in_process_keeps_policy(var, value):
    before = _core.policy_table()
    with pytest.raises(ValueError) as err:
        with policy_env(**{var: value}):
            pass
    assert var in str(err.value) and value in str(err.value)
    assert _core.policy_table() == before


@pytest.mark.emulated_cpu
def test_unsupported_kernel_in_process():
    unsupported = [k["name"] for k in fastcopy.info()["kernels"] if not k["supported"]]
    if not unsupported:
        pytest.skip(ALL_SUPPORTED)
    with pytest.raises(ValueError, match="not supported"):
        with policy_env(FASTCOPY_KERNEL=unsupported[0]):
            pass


def test_nt_threshold_in_process():
    with policy_env(FASTCOPY_NT_THRESHOLD="64K"):
        nt = _core.nt_threshold()
        if streaming_kernels():
            assert nt == 64 << 10
        else:
            assert nt is None  # no non-temporal kernel on this CPU: the override has nothing to move


def test_verbose_info_prints_the_evidence_its_reasons_cite():
    """info()["evidence"] holds every entry the active profile and rules cite, and
    `info --verbose` prints each with its claim, figures, machine, date and command. The
    built-in Zen 4 table is forced (by name), so the test does not depend on this CPU."""
    from fastcopy._report import collect_info, format_info

    before = _core.active_profile()
    before_json = _core.base_profile_json()
    _core.use_builtin_profile("amd-zen4")
    try:
        data = collect_info(brand=False)
    finally:
        if before["source"] == "built-in":
            _core.use_builtin_profile(before["name"])
        else:
            _core.load_profile(before_json, before["source"])
    evidence = data["evidence"]
    # Every id the reasons cite (which bands stand, and so which ids, depends on the kernels this
    # CPU has: on aarch64 the Zen 4 bands fall back), read here from the text itself.
    text_without = json.dumps({k: v for k, v in data.items() if k != "evidence"})
    cited = set()
    for group in re.findall(r"evidence: ([a-z0-9-]+(?:, [a-z0-9-]+)*)", text_without):
        cited.update(group.split(", "))
    assert len(cited) >= 3, cited
    assert cited <= set(evidence), (cited, sorted(evidence))
    assert all(entry is not None for entry in evidence.values()), evidence
    text = format_info(data, verbose=True)
    evidence_part = text[text.index("Evidence cited above"):]
    for ident, entry in evidence.items():
        block = evidence_part[evidence_part.index(f"[{ident}]"):]
        block = block[:block.find("\n\n  [") % (len(block) + 1)]  # up to the next entry
        words = " ".join(block.split())
        for field in ("claim", "figures", "machine", "date", "command"):
            first_line = " ".join(entry[field].split("\n")[0].split())
            assert first_line in words, (ident, field)
    # The summary stays short: no evidence there.
    assert "Evidence cited above" not in format_info(data)
