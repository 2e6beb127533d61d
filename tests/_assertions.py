"""Short explanations for failed comparisons of long byte strings, for every test.

pytest explains a failed ``==`` of two sequences with difflib over their pretty-printed forms
when it believes it runs on CI (environment variable CI or BUILD_NUMBER set, as CI runners
set them): quadratic in their length, hours for two payloads of a few MiB, so a failing test
hangs instead of failing. Here a comparison with a long operand (bytes-like, str, or a list or
tuple holding one) is explained by its lengths and its first difference instead. tests/conftest.py
registers the hook; a test that runs pytest on a file of its own registers it the same way.
"""
from __future__ import annotations

import os
from typing import List, Optional

import numpy as np
import pytest

# An operand longer than this (items, bytes or characters) is explained here. pytest's own
# explanations of shorter ones are quick whatever the environment (a few thousand pretty-printed
# lines at most).
LONG_OPERAND = 256

# Bytes shown on each side of the first difference.
CONTEXT_BYTES = 8


def _bytes_like(x) -> bool:
    return isinstance(x, (bytes, bytearray, memoryview))


def _long(x) -> bool:
    if _bytes_like(x) or isinstance(x, str):
        return len(x) > LONG_OPERAND
    if isinstance(x, (list, tuple)):
        return len(x) > LONG_OPERAND or any(_long(item) for item in x)
    return False


def _as_bytes(x) -> np.ndarray:
    view = memoryview(x)
    return np.frombuffer(view.cast("B") if view.contiguous else view.tobytes(), np.uint8)


def _first_byte_difference(left, right) -> List[str]:
    a, b = _as_bytes(left), _as_bytes(right)
    n = min(a.size, b.size)
    lines = [f"{type(left).__name__} of {a.size} bytes == {type(right).__name__} of {b.size} bytes"]
    differ = np.flatnonzero(a[:n] != b[:n])
    if differ.size:
        i = int(differ[0])
        lo, hi = max(0, i - CONTEXT_BYTES), i + CONTEXT_BYTES + 1
        lines.append(f"first difference at byte {i} ({differ.size} of the first {n} bytes differ)")
        lines.append(f"left [{lo}:{hi}]:  {a[lo:hi].tobytes().hex(' ')}")
        lines.append(f"right[{lo}:{hi}]:  {b[lo:hi].tobytes().hex(' ')}")
    else:
        lines.append(f"the first {n} bytes are equal; the lengths differ")
    return lines


def _first_text_difference(left: str, right: str) -> List[str]:
    n = min(len(left), len(right))
    i = next((k for k in range(n) if left[k] != right[k]), n)
    lo, hi = max(0, i - CONTEXT_BYTES), i + CONTEXT_BYTES + 1
    return [f"str of {len(left)} characters == str of {len(right)} characters",
            f"first difference at character {i}: {left[lo:hi]!r} against {right[lo:hi]!r}"]


def explain(left, right) -> Optional[List[str]]:
    """Lines explaining why ``left == right`` is false, or None to leave it to pytest."""
    if not (_long(left) or _long(right)):
        return None
    if _bytes_like(left) and _bytes_like(right):
        return _first_byte_difference(left, right)
    if isinstance(left, str) and isinstance(right, str):
        return _first_text_difference(left, right)
    if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        lines = [f"{type(left).__name__} of {len(left)} items == {type(right).__name__} of {len(right)} items"]
        for i, (a, b) in enumerate(zip(left, right)):
            if not a == b:
                inner = explain(a, b) or [f"{a!r:.200} != {b!r:.200}"]
                return lines + [f"first difference at item {i}:"] + ["  " + line for line in inner]
        return lines + [f"the first {min(len(left), len(right))} items are equal; the lengths differ"]
    return [f"{type(left).__name__} == {type(right).__name__}: long operands of different kinds",
            f"left:  {left!r:.200}", f"right: {right!r:.200}"]


# pytest's own reasons to print a whole diff: its verbosity, and these environment variables.
_CI_VARIABLES = ("CI", "BUILD_NUMBER")


@pytest.hookimpl(hookwrapper=True)  # the old-style wrapper: Debian 12's pytest 7.2 (CI's arm runs) has no other
def pytest_assertrepr_compare(config, op, left, right):
    """Every implementation of this hook runs, pytest's own included, and pytest prints the first
    explanation it gets. For a long operand this wrapper runs pytest's at verbosity 0 and without
    the CI variables (a few lines, computed in linear time) and gives its own instead."""
    lines = explain(left, right) if op == "==" else None
    if lines is None:
        yield
        return
    saved_env = {name: os.environ.pop(name) for name in _CI_VARIABLES if name in os.environ}
    saved_verbose = config.option.verbose
    config.option.verbose = min(saved_verbose, 0)
    try:
        outcome = yield
    finally:
        os.environ.update(saved_env)
        config.option.verbose = saved_verbose
    outcome.force_result([[f"{left!r:.60} == {right!r:.60}", *lines]])
