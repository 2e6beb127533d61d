"""``python -m fastcopy bench`` and ``compare``: tiny sizes, 2 repeats, 1 ms loops, so they stay fast."""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import sys

import pytest

import fastcopy
from fastcopy.bench import engine, system, units

from _cli import NO_SUBPROCESS, SRC_DIR, cli

FAST = ("--repeats", "2", "--min-time", "0.001")
HAVE_MPL = importlib.util.find_spec("matplotlib") is not None
needs_mpl = pytest.mark.skipif(not HAVE_MPL, reason="matplotlib not installed (extra 'plot')")


@pytest.fixture(scope="module")
def run_json(tmp_path_factory):
    """One small run saved as JSON, shared by the tests that read it."""
    path = str(tmp_path_factory.mktemp("bench") / "run.json")
    r = cli("bench", "--sizes", "64,4K", *FAST, "--variants", "fastcopy,copyto,slice,kernels", "--json", path)
    assert r.returncode == 0, r.stderr
    with open(path) as f:
        return path, json.load(f), r.stdout


# ------------------------------------------------------------------ parsing (in-process)

@pytest.mark.parametrize("text, sizes", [
    ("4K,1M", [4096, 1 << 20]),
    ("64:256M:x4", [64 * 4 ** i for i in range(12)]),
    ("64:256", [64, 256]),
    ("1K:4K:+1K", [1024, 2048, 3072, 4096]),
    ("1M,4K,1M", [4096, 1 << 20]),
    ("100", [100]),
    ("2KiB,1MB", [2048, 1 << 20]),
])
def test_parse_sizes(text, sizes):
    assert units.parse_sizes(text) == sizes


@pytest.mark.parametrize("text", ["4Q", "", "1K:", "4K:1K", "1K:4K:x1", "1K:4K:y2", "0", "-4"])
def test_parse_sizes_rejects(text):
    with pytest.raises(ValueError):
        units.parse_sizes(text)


def test_parse_cpus_and_offsets():
    assert units.parse_cpus("0,2-3") == [0, 2, 3]
    assert units.format_cpus([0, 2, 3, 5]) == "0,2-3,5"
    assert units.parse_offsets("mixed") == units.MIXED_OFFSETS
    assert units.parse_offsets("0,16") == [0, 16]
    with pytest.raises(ValueError):
        units.parse_offsets("4096")


def test_buffers_placement():
    bufs = engine.Buffers(10000, [0, 16, 2064])
    assert bufs.src.ctypes.data % 4096 == 0
    for off, dst in bufs.dst.items():
        assert (dst.ctypes.data - bufs.src.ctypes.data) % 4096 == off
        assert dst.size == 10000


# ------------------------------------------------------------------ bench through the CLI

def test_table_printed(run_json):
    _, _, out = run_json
    assert "counted once" in out and "STREAM" in out
    assert "(dst - src) mod 4096 = 0" in out
    assert "NUMA:" in out and "energy:" in out
    for name in ["fastcopy", "np.copyto", "dst[...]=src"] + [f"fastcopy[{k}]" for k in fastcopy.kernels()]:
        assert name in out
    assert re.search(r"4 KiB\s+\S.*\d+\.\d\d\s+\[\d+\.\d\d - \d+\.\d\d\]\s+\d+\.\d\dx", out)
    assert "WRONG RESULT" not in out


def test_json_schema(run_json):
    _, doc, _ = run_json
    assert doc["schema"] == system.SCHEMA
    for key in ("fastcopy_version", "cpu", "cpu_brand", "libc", "numpy_version", "policy", "overrides", "threads",
                "date", "command_line", "offsets", "repeats", "energy", "numa", "config", "results"):
        assert key in doc, key
    assert doc["fastcopy_version"] == fastcopy.__version__
    assert doc["repeats"] == 2 and doc["offsets"] == [0]
    assert doc["libc"]["name"] is not None or doc["libc"]["confstr"] is not None or os.name != "posix"
    assert "bench" in doc["command_line"]
    assert doc["energy"]["available"] in (True, False)
    if not doc["energy"]["available"]:
        assert "unavailable" in doc["energy"]["reason"]
    variants = doc["config"]["variants"]
    assert len(doc["results"]) == 2 * len(variants)
    for r in doc["results"]:
        assert r["size"] in (64, 4096) and r["variant"] in variants and r["verified"]
        assert r["min_gbps"] <= r["median_gbps"] <= r["max_gbps"]
        assert len(r["samples"]) == 2
        for s in r["samples"]:
            assert set(s) >= {"repeat", "offset", "iterations", "seconds", "gbps"}
            assert s["gbps"] == pytest.approx(r["size"] * s["iterations"] / s["seconds"] / 1e9)
        if r["variant"] == "np.copyto":
            assert r["ratio_to_copyto"] == pytest.approx(1.0)
    # Each variant's ratio is its median over np.copyto's at the same size.
    copyto = {r["size"]: r["median_gbps"] for r in doc["results"] if r["variant"] == "np.copyto"}
    for r in doc["results"]:
        assert r["ratio_to_copyto"] == pytest.approx(r["median_gbps"] / copyto[r["size"]])


def test_mixed_offsets(tmp_path):
    path = str(tmp_path / "m.json")
    r = cli("bench", "--sizes", "4K", *FAST, "--offsets", "mixed", "--variants", "fastcopy,copyto", "--json", path)
    assert r.returncode == 0, r.stderr
    assert "cycling per repeat over 0, 16, 64, 1024, 2064" in r.stdout
    doc = json.load(open(path))
    assert doc["offsets"] == units.MIXED_OFFSETS
    assert [s["offset"] for s in doc["results"][0]["samples"]] == [0, 16]


def test_offset_threads_and_cpus(tmp_path):
    path = str(tmp_path / "o.json")
    args = ["bench", "--sizes", "2K", *FAST, "--offset", "16", "--threads", "1", "--variants", "fastcopy", "--json", path]
    if not NO_SUBPROCESS and hasattr(os, "sched_setaffinity"):
        args += ["--cpus", str(min(os.sched_getaffinity(0)))]
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    assert "(dst - src) mod 4096 = 16" in r.stdout
    doc = json.load(open(path))
    assert doc["threads"] == 1 and doc["offsets"] == [16]
    assert [x["variant"] for x in doc["results"]] == ["fastcopy"]
    if "--cpus" in args:
        assert doc["cpus"] == [min(os.sched_getaffinity(0))]


def test_fake_rapl_counters(tmp_path):
    dom = tmp_path / "intel-rapl:0"
    dom.mkdir()
    (dom / "energy_uj").write_text("1000\n")
    (dom / "max_energy_range_uj").write_text("262143328850\n")
    (dom / "name").write_text("package-0\n")
    path = str(tmp_path / "e.json")
    r = cli("bench", "--sizes", "64", *FAST, "--variants", "fastcopy", "--json", path,
            env={"FASTCOPY_RAPL_ROOT": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "RAPL package-0" in r.stdout and "GB/J" in r.stdout
    doc = json.load(open(path))
    assert doc["energy"]["available"] is True
    assert doc["results"][0]["joules"] == 0.0  # the fake counter never moves


def test_ucx_format():
    r = cli("bench", "--format", "ucx", "--sizes", "4K,8K", *FAST)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "# Memcpy bandwidth:"
    # ucx_info: printf("#     %10zu bytes: %.3f MB/s\n", size, bandwidth / UCS_MBYTE)
    assert re.fullmatch(r"#           4096 bytes: \d+\.\d{3} MB/s", lines[1])
    assert re.fullmatch(r"#           8192 bytes: \d+\.\d{3} MB/s", lines[2])
    assert len(lines) == 3


@pytest.mark.parametrize("args, named", [
    (["--sizes", "4Q"], "--sizes: cannot parse '4Q'"),
    (["--sizes", "1K:4K:y2"], "--sizes"),
    (["--repeats", "0"], "--repeats"),
    (["--min-time", "abc"], "--min-time"),
    (["--min-time", "0"], "--min-time: must be positive"),
    (["--offset", "4096"], "--offset"),
    (["--offset", "-1"], "--offset"),
    (["--offsets", "sometimes"], "--offsets"),
    (["--offset", "0", "--offsets", "mixed"], "--offsets"),
    (["--cpus", "1-x"], "--cpus"),
    (["--cpus", "100000"], "--cpus"),
    (["--variants", "nosuch"], "--variants"),
    (["--format", "csv"], "--format"),
    (["--threads", "-1"], "--threads"),
    (["--json", "/nonexistent-dir/x.json"], "--json"),
])
def test_bad_arguments(args, named):
    r = cli("bench", "--sizes", "64", *FAST, *args) if args[0] != "--sizes" else cli("bench", *FAST, *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert named in r.stderr


# ------------------------------------------------------------------ compare

def _shifted(doc, factor, drop_last=False):
    new = copy.deepcopy(doc)
    for r in new["results"]:
        for k in ("median_gbps", "min_gbps", "max_gbps"):
            r[k] *= factor
    if drop_last:
        new["results"].pop()
    return new


def test_compare(run_json, tmp_path):
    base_path, doc, _ = run_json
    doc = copy.deepcopy(doc)
    for r in doc["results"]:  # make the spread narrow so a 1.5x change is beyond it
        r["min_gbps"] = r["max_gbps"] = r["median_gbps"]
    base = tmp_path / "base.json"
    base.write_text(json.dumps(doc))
    new = tmp_path / "new.json"
    new.write_text(json.dumps(_shifted(doc, 1.5, drop_last=True)))
    r = cli("compare", str(base), str(new))
    assert r.returncode == 0, r.stderr
    assert "+50.0 % *" in r.stdout
    assert "only in base (1)" in r.stdout
    assert re.search(r"geometric mean change: \+50\.0 % over \d+ common rows", r.stdout)
    r2 = cli("compare", str(base), str(base))
    assert "+0.0 %" in r2.stdout and "+0.0 % *" not in r2.stdout
    assert "geometric mean change: +0.0 %" in r2.stdout


def test_compare_bad_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    r = cli("compare", str(bad), str(bad))
    assert r.returncode == 2 and "bad.json" in r.stderr


# ------------------------------------------------------------------ plots and IPC

@needs_mpl
def test_plot(tmp_path, run_json):
    png = tmp_path / "bench.png"
    r = cli("bench", "--sizes", "64,1K", *FAST, "--variants", "fastcopy,copyto", "--plot", str(png))
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cpng = tmp_path / "compare.png"
    r = cli("compare", run_json[0], run_json[0], "--plot", str(cpng))
    assert r.returncode == 0, r.stderr
    assert cpng.read_bytes()[:4] == b"\x89PNG"


def hide_modules(monkeypatch, tmp_path, *names):
    """Makes `import name` fail, in this process (for in-process CLI runs) and in children
    started by cli() (a sitecustomize on PYTHONPATH), whether or not the module is installed."""
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)
    site = tmp_path / "hide_modules"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{n!r}] = None\n" for n in names))
    path = os.pathsep.join(p for p in (str(site), SRC_DIR, os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path}


def test_plot_without_matplotlib(tmp_path, monkeypatch):
    env = hide_modules(monkeypatch, tmp_path, "matplotlib")
    r = cli("bench", "--sizes", "64", *FAST, "--plot", str(tmp_path / "x.png"), env=env)
    assert r.returncode == 2 and "--plot" in r.stderr and "matplotlib" in r.stderr
    assert not (tmp_path / "x.png").exists()


@pytest.mark.skipif(NO_SUBPROCESS, reason="the IPC benchmark starts a second interpreter")
def test_ipc(tmp_path):
    path = str(tmp_path / "ipc.json")
    r = cli("bench", "--ipc", "--sizes", "4K", *FAST, "--variants", "channel,pipe", "--json", path, timeout=90)
    assert r.returncode == 0, r.stderr
    assert "channel" in r.stdout and "pipe" in r.stdout
    doc = json.load(open(path))
    assert doc["kind"] == "ipc" and doc["schema"] == system.SCHEMA
    assert {row["transport"] for row in doc["results"]} == {"channel", "pipe"}
    assert all(row["size"] == 4096 for row in doc["results"])


@pytest.mark.skipif(NO_SUBPROCESS, reason="the topic benchmark starts receiver processes")
def test_ipc_topic_runs_copies_and_views_with_the_fill_asked_for(tmp_path):
    path = str(tmp_path / "topic.json")
    r = cli("bench", "--ipc", "--variants", "topic", "--sizes", "64K", *FAST, "--view-fill", "fastcopy",
            "--json", path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "topic2_view" in r.stdout and "loans filled with fastcopy.copy" in r.stdout
    doc = json.load(open(path))
    assert doc["kind"] == "ipc_topic" and doc["config"]["view_fill"] == "fastcopy"
    assert {row["config"] for row in doc["results"]} == {"channel", "topic1", "topic2", "channel_view",
                                                         "topic1_view", "topic2_view"}


def test_ipc_rejects_copy_only_options():
    r = cli("bench", "--ipc", "--offset", "16", *FAST)
    assert r.returncode == 2 and "--ipc" in r.stderr and "--offset" in r.stderr


def test_view_fill_only_with_ipc():
    r = cli("bench", "--view-fill", "fastcopy", *FAST)
    assert r.returncode == 2 and "--view-fill" in r.stderr and "--ipc" in r.stderr


# ------------------------------------------------------------------ helpers (in-process)

@pytest.mark.skipif(not os.path.exists("/proc/self/numa_maps"), reason="no /proc/self/numa_maps")
def test_buffer_numa_pages():
    buf = engine.aligned_buffer(4 << 20)
    buf.fill(1)
    pages = system.buffer_numa_pages(buf.ctypes.data)
    assert pages is not None and sum(pages.values()) > 0
    assert all(re.fullmatch(r"N\d+", k) for k in pages)
    rep = system.numa_report()
    assert rep["nodes"] == system.numa_nodes() and rep["multi_node"] == (len(rep["nodes"]) > 1)


def test_progress_bar(capsys):
    p = engine.Progress(4, enabled=True, delay=0)
    for i in range(4):
        p.step(f"step {i}")
    p.close()
    err = capsys.readouterr().err
    assert "100%" in err and "[" + "#" * 30 + "]" in err


def test_progress_bar_off_when_not_a_tty(capsys):
    p = engine.Progress(4, delay=0)  # stderr is captured, not a terminal
    p.step("x")
    p.close()
    assert capsys.readouterr().err == ""


def test_quick_defaults_and_explicit_options_win(tmp_path):
    path = str(tmp_path / "q.json")
    r = cli("bench", "--quick", "--sizes", "64", "--min-time", "0.001", "--variants", "fastcopy", "--json", path)
    assert r.returncode == 0, r.stderr
    doc = json.load(open(path))
    assert doc["repeats"] == 3 and doc["config"]["sizes"] == [64] and doc["config"]["min_time"] == 0.001
