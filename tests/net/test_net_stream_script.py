"""benchmarks/net_stream.py end to end: each variant named gives its figures (its receiver checks
the size of every message it times; both ends report their CPU time per message), and an
unknown variant is refused."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from _child import child_env, explain
from _net import needs_zenoh

pytestmark = [pytest.mark.net, needs_zenoh]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "net_stream.py"


def test_the_stream_script_measures_each_variant_named(tmp_path):
    got = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "256K", "--rounds", "1", "--paths", "network",
                          "--variants", "net,net-whole,net-pieces,net-bytes,plain+pool64"],
                         capture_output=True, text=True, timeout=180, env=child_env(), cwd=str(tmp_path))
    assert got.returncode == 0, explain(got)
    rows = re.findall(r"^\s+256 KiB\s+(\S+)\s+([0-9.]+) GB/s.*receiver\s+([0-9.]+) us.*publisher\s+([0-9.]+) us",
                      got.stdout, re.M)
    assert [name for name, *_ in rows] == ["net", "net-whole", "net-pieces", "net-bytes", "plain+pool64"], explain(got)
    assert all(float(x) > 0 for _, *figures in rows for x in figures), explain(got)
    assert "lost" not in got.stdout, explain(got)


def test_an_unknown_variant_is_refused(tmp_path):
    got = subprocess.run([sys.executable, str(SCRIPT), "--variants", "net,fast"], capture_output=True, text=True,
                         timeout=60, env=child_env(), cwd=str(tmp_path))
    assert got.returncode == 2 and "unknown variants ['fast']" in got.stderr, explain(got)
