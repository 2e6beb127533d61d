"""The docs match the code and the stored measurements.

Figures quoted in prose carry a marker, an HTML comment that renders as nothing, right before
the figure: ``<!--fig FILE METRIC VARIANT [VARIANT] SIZES-->6.0-8.3x``. FILE is a stored
benchmark run in docs/bench/ (``results``, ``aliasing`` or ``aliasing-zen3``); METRIC is one of

* ``ratio A B``: median GB/s of variant A over that of variant B, at each size;
* ``ns V`` / ``us V``: time per call of variant V (size / median GB/s);
* ``gbps V``: median GB/s of V;
* ``slowdown V``: percent lost at the slowest offset, 100 * (1 - min / median);
* ``offsetratio V A B``: median GB/s of V's samples at offset A over those at offset B;

SIZES is ``64``, ``4K``, ``64..4K`` (every stored size in between) or ``64K,1M``. A range
``a-b`` must be the smallest and largest value over the sizes, a single number the value at
one size or the largest over several ("at most"), each to the precision written. Regenerating
the results (tools/regen_benchmarks.sh) therefore fails this test until the prose is updated.

``<!--fig collapse-->`` marks the rep movsb 4K-aliasing factor quoted outside docs/dispatch.md:
it must follow from the GB/s figures docs/dispatch.md gives (``<!--fig collapse-source-->``).

Documented behaviours (errors, limits, environment variables) are executed below.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fastcopy

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"<!--fig ([^>]*?)-->\s*(about\s+|~)?(\d+(?:\.\d+)?)(?:-(\d+(?:\.\d+)?))?\s*(x|%|ns|us|GB/s)?")
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def load(name: str) -> dict:
    with open(ROOT / "docs" / "bench" / f"{name}.json") as f:
        return json.load(f)


def rows(doc: dict):
    return {(r["size"], r["variant"]): r for r in doc["results"]}


def sizes_of(spec: str, available) -> list:
    if ".." in spec:
        lo, hi = (parse_size(p) for p in spec.split(".."))
        chosen = [s for s in sorted(available) if lo <= s <= hi]
    else:
        chosen = [parse_size(p) for p in spec.split(",")]
    assert chosen and all(s in available for s in chosen), f"sizes {spec}: not all in the stored run"
    return chosen


def metric_values(args: list) -> list:
    name, metric, *rest = args
    table = rows(load(name))
    available = {s for s, _ in table}
    if metric == "ratio":
        a, b, spec = rest
        return [table[(s, a)]["median_gbps"] / table[(s, b)]["median_gbps"] for s in sizes_of(spec, available)]
    if metric == "offsetratio":  # one variant: median GB/s of the samples at offset A over those at offset B
        variant, off_a, off_b, spec = rest
        values = []
        for s in sizes_of(spec, available):
            samples = table[(s, variant)]["samples"]
            at = {o: statistics.median(x["gbps"] for x in samples if x["offset"] == o) for o in (int(off_a), int(off_b))}
            values.append(at[int(off_a)] / at[int(off_b)])
        return values
    variant, spec = rest
    values = []
    for s in sizes_of(spec, available):
        r = table[(s, variant)]
        if metric == "ns":
            values.append(s / r["median_gbps"])
        elif metric == "us":
            values.append(s / r["median_gbps"] / 1000)
        elif metric == "gbps":
            values.append(r["median_gbps"])
        elif metric == "slowdown":
            values.append(100 * (1 - r["min_gbps"] / r["median_gbps"]))
        else:
            raise AssertionError(f"unknown metric {metric}")
    return values


def matches(written: str, value: float, about: bool = False) -> bool:
    """`written` is `value` to the precision written; "about N" allows 3 % besides."""
    decimals = len(written.split(".")[1]) if "." in written else 0
    slack = 0.5 * 10 ** -decimals + 1e-9
    return abs(float(written) - value) <= max(slack, 0.03 * value if about else 0)


def figures():
    out = []
    for path in DOCS:
        for m in MARKER.finditer(path.read_text()):
            out.append(pytest.param(path.name, m.group(1).split(), m.group(3), m.group(4), m.group(5),
                                    bool(m.group(2)), id=f"{path.name}:{m.group(1)}"))
    return out


FIGURES = figures()


def test_markers_are_parsed():
    """Every marker in the docs is followed by a figure the test can read."""
    count = sum(path.read_text().count("<!--fig ") for path in DOCS)
    assert count == len(FIGURES) and count >= 20


@pytest.mark.parametrize("doc,args,low,high,unit,about", [p for p in FIGURES if p.values[1][0] not in
                                                         ("collapse", "collapse-source")])
def test_quoted_figure_matches_stored_results(doc, args, low, high, unit, about):
    values = metric_values(args)
    if high is not None:
        assert matches(low, min(values), about) and matches(high, max(values), about), \
            f"{doc}: '{low}-{high}{unit or ''}' but the stored results give {min(values):.4g}-{max(values):.4g}"
    else:
        assert matches(low, max(values), about), \
            f"{doc}: '{low}{unit or ''}' but the stored results give {max(values):.4g}"


def test_aliasing_collapse_factor_follows_dispatch_md():
    source = [p for p in FIGURES if p.values[1] == ["collapse-source"]]
    assert len(source) == 1
    text = (ROOT / "docs" / "dispatch.md").read_text()
    m = re.search(r"<!--fig collapse-source-->(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?) GB/s \(from about (\d+)\)", text)
    assert m, "docs/dispatch.md: the rep movsb collapse figures moved"
    worst, best, normal = float(m.group(1)), float(m.group(2)), float(m.group(3))
    lo, hi = round(normal / best), round(normal / worst)
    quoted = [p for p in FIGURES if p.values[1] == ["collapse"]]
    assert len(quoted) >= 2
    for p in quoted:
        doc, _, low, high, unit, _ = p.values
        # Rounded to 5x: the source figures are ranges from repeated runs.
        assert (int(low), int(high)) == (5 * round(lo / 5), 5 * round(hi / 5)) and unit == "x", \
            f"{doc}: {low}-{high}{unit} but docs/dispatch.md gives {normal}/{best}-{normal}/{worst} = {lo}-{hi}x"


# ---------------------------------------------------------------- documented behaviours

def test_threads_md_limits():
    """docs/threads.md: 1..1024 threads; above is refused (set_threads and FASTCOPY_THREADS)."""
    before = fastcopy.get_threads()
    try:
        fastcopy.set_threads(1024)
        assert fastcopy.get_threads() == 1024
        with pytest.raises(ValueError, match="1024"):
            fastcopy.set_threads(2000)
        assert fastcopy.get_threads() == 1024
    finally:
        fastcopy.set_threads(0)
    assert fastcopy.get_threads() == before


@pytest.mark.skipif(os.environ.get("FASTCOPY_NO_SUBPROCESS") == "1",
                    reason="FASTCOPY_NO_SUBPROCESS=1: the import check starts an interpreter")
def test_threads_env_above_limit_fails_import():
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTCOPY_")}
    env["FASTCOPY_THREADS"] = "2000"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(fastcopy.__file__).parent.parent),
                                                    os.environ.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-c", "import fastcopy"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "ImportError" in r.stderr and "FASTCOPY_THREADS" in r.stderr


def test_shm_md_out_errors():
    """docs/shm.md: a wrong `out` raises ValueError (layout) or TypeError (not a writable
    C-contiguous buffer), and the message stays in the channel either way."""
    from fastcopy.shm import Channel

    with Channel.create(capacity=1 << 16) as tx, Channel.attach(tx.name) as rx:
        a = np.arange(12, dtype=np.int32).reshape(3, 4)
        tx.send(a)
        ro = np.empty((3, 4), np.int32)
        ro.flags.writeable = False
        for out in (np.empty((4, 3), np.int32), np.empty((3, 4), np.int64), bytearray(47), ro,
                    np.empty((4, 3), np.int32).T):
            with pytest.raises(ValueError):
                rx.recv(out=out, timeout=0)
        for out in (b"x" * 48, memoryview(bytearray(96))[::2]):
            with pytest.raises(TypeError):
                rx.recv(out=out, timeout=0)
        out = bytearray(48)
        assert rx.recv(out=out, timeout=0) is out and bytes(out) == a.tobytes()


def test_usage_md_error_table():
    """docs/usage.md's error table, row by row (each leaves dst unchanged)."""
    import mmap

    cases = [
        (ValueError, "shape mismatch", np.full(3, 7.0), np.zeros(4)),
        (TypeError, "dtype mismatch", np.full(3, 7.0), np.zeros(3, np.float32)),
        (ValueError, "size mismatch", bytearray(b"q" * 10), b"x" * 11),
        (ValueError, "read-only", memoryview(bytearray(b"q" * 4)).toreadonly(), b"abcd"),
        (TypeError, "buffer protocol", None, b"abcd"),
        (TypeError, "object", np.full(2, 7.0), np.array([None, 1], dtype=object)),
    ]
    for exc, words, dst, src in cases:
        before = None if dst is None else bytes(memoryview(dst).cast("B")) if not isinstance(dst, np.ndarray) \
            else dst.tobytes()
        with pytest.raises(exc, match=words):
            fastcopy.copy(dst, src)
        if dst is not None:
            after = dst.tobytes() if isinstance(dst, np.ndarray) else bytes(memoryview(dst).cast("B"))
            assert after == before
    mm = mmap.mmap(-1, 8)
    mm.close()
    with pytest.raises(ValueError, match="fastcopy.copy: dst:"):
        fastcopy.copy(mm, b"12345678")
