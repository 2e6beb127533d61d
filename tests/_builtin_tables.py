"""The built-in profiles as written (``_core.builtin_profile_table``: before they are resolved for
a CPU), for tests that hold a table's rules to its evidence on any CPU."""
from __future__ import annotations

from fastcopy import _core


def table(name: str) -> dict:
    """The built-in table called ``name``."""
    return next(t for t in _core.builtin_profile_table() if t["name"] == name)


def kernel_at(bands: list, size: int) -> str:
    """The kernel the bands name for a copy of ``size`` bytes."""
    return [b for b in bands if b["from"] <= size][-1]["kernel"]
