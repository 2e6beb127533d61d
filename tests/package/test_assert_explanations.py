"""A failed comparison of payloads of a few MiB fails at once on CI too (tests/_assertions.py):
pytest's own explanation there is a difflib diff, quadratic in their length, and hangs."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

FAILING = textwrap.dedent("""
    import numpy as np

    BIG = np.random.default_rng(1).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    CHANGED = BIG[:1234567] + bytes([BIG[1234567] ^ 1]) + BIG[1234568:]

    def test_bytes():
        assert bytearray(BIG) == CHANGED

    def test_list_of_one_payload():
        assert [bytearray(BIG)] == [BIG + b"x"]

    def test_short_bytes_left_to_pytest():
        assert b"abc" == b"abd"
""")


@pytest.mark.parametrize("ci, args", [("true", []), (None, ["-vv"])], ids=["on_ci", "verbose"])
def test_a_failed_comparison_of_long_payloads_names_the_first_difference(tmp_path, ci, args):
    """On CI (CI set) and at -vv pytest's own explanation would be a whole diff."""
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
        "from _assertions import pytest_assertrepr_compare  # noqa: F401\n")
    (tmp_path / "test_failing.py").write_text(FAILING)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "BUILD_NUMBER")}
    if ci:
        env["CI"] = ci
    r = subprocess.run([sys.executable, "-m", "pytest", *(args or ["-q"]), "-p", "no:cacheprovider", "-o", "addopts=",
                        "test_failing.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert "3 failed" in out, out[-3000:]
    assert "bytearray of 3145728 bytes == bytes of 3145728 bytes" in out, out[-3000:]
    assert "first difference at byte 1234567 (1 of the first 3145728 bytes differ)" in out, out[-3000:]
    assert "first difference at item 0:" in out and "the first 3145728 bytes are equal; the lengths differ" in out
    assert "At index 2 diff: b'c' != b'd'" in out, out[-3000:]  # pytest's own explanation
    assert len(out) < 20000, "an explanation printed whole payloads"
