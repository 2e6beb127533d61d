"""Sizes, CPU lists and offsets: parsing the benchmark arguments and formatting them back.

Shared by ``python -m fastcopy bench`` and ``tune``.
"""

from __future__ import annotations

import math
import re
from typing import List, Sequence

PAGE = 4096
DEFAULT_SIZES = "64:256M:x4"
QUICK_SIZES = "64:64M:x16"
UCX_SIZES = "4K:256M:x2"  # the sizes ucx_info -s prints
MIXED_OFFSETS = [0, 16, 64, 1024, 2048 + 16]
# Most sizes one list may hold: a range with a step of +1 or a factor of 1.0000001 would
# otherwise build a list that fills the memory before the run starts.
MAX_SIZES = 10000
# Longest timed loop per repeat (--min-time), in seconds: a longer one is a typo, and inf or
# 1e300 would overflow the loop count.
MAX_MIN_TIME = 60.0

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


# ----------------------------------------------------------------------------- argument parsing

def parse_size(text: str) -> int:
    """``'4K'`` -> 4096. Units K, M, G (KiB, MiB, GiB also accepted) are powers of 1024."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"cannot parse '{text}'")
    value = int(m.group(1)) * _UNITS[m.group(2).upper()]
    if value <= 0:
        raise ValueError(f"size must be positive, got '{text}'")
    return value


def parse_sizes(text: str) -> List[int]:
    """A comma list of sizes and ranges: ``4K,1M``, ``64:256M:x2`` (times 2), ``1K:8K:+1K`` (plus 1 KiB).

    A range without a step multiplies by 4; a factor is a finite number greater than 1. The
    result is sorted, without duplicates, and holds at most MAX_SIZES sizes (ValueError beyond).
    """
    sizes: List[int] = []

    def too_many(part: str) -> ValueError:
        return ValueError(f"'{part}' gives more than {MAX_SIZES} sizes, counting repeats (at most {MAX_SIZES} "
                          f"in one list)")
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if ":" in part:
            fields = part.split(":")
            if len(fields) not in (2, 3):
                raise ValueError(f"cannot parse '{part}' (expected START:STOP[:xFACTOR or :+STEP])")
            start, stop = parse_size(fields[0]), parse_size(fields[1])
            step = fields[2].strip() if len(fields) == 3 else "x4"
            if stop < start:
                raise ValueError(f"range '{part}' ends before it starts")
            if step[:1] in ("x", "*"):
                try:
                    factor = float(step[1:])
                except ValueError:
                    raise ValueError(f"cannot parse step '{step}' in '{part}'") from None
                if not math.isfinite(factor):
                    raise ValueError(f"factor in '{part}' must be a finite number greater than 1")
                if factor <= 1:
                    raise ValueError(f"factor in '{part}' must be greater than 1")
                value = float(start)
                while round(value) <= stop:
                    if len(sizes) >= MAX_SIZES:
                        raise too_many(part)
                    sizes.append(int(round(value)))
                    value *= factor
            elif step[:1] == "+":
                inc = parse_size(step[1:])
                if len(sizes) + (stop - start) // inc + 1 > MAX_SIZES:
                    raise too_many(part)
                sizes.extend(range(start, stop + 1, inc))
            else:
                raise ValueError(f"cannot parse step '{step}' in '{part}' (use xFACTOR or +STEP)")
        else:
            if len(sizes) >= MAX_SIZES:
                raise too_many(text)
            sizes.append(parse_size(part))
    if not sizes:
        raise ValueError(f"cannot parse '{text}'")
    return sorted(set(sizes))


def parse_cpus(text: str) -> List[int]:
    """``'0,2-3'`` -> [0, 2, 3]."""
    cpus: List[int] = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"cannot parse '{part or text}'")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f"range '{part}' ends before it starts")
        cpus.extend(range(lo, hi + 1))
    return sorted(set(cpus))


def parse_offsets(text: str) -> List[int]:
    """``'mixed'`` -> the realistic mix; else a comma list of (dst - src) mod 4096 values."""
    if text.strip().lower() == "mixed":
        return list(MIXED_OFFSETS)
    out = []
    for part in text.split(","):
        try:
            value = int(part.strip(), 0)
        except ValueError:
            raise ValueError(f"cannot parse '{part.strip()}' (expected 'mixed' or numbers 0-4095)") from None
        if not 0 <= value < PAGE:
            raise ValueError(f"offset {value} is not in 0..4095")
        out.append(value)
    return out


def format_cpus(cpus: Sequence[int]) -> str:
    cpus = sorted(cpus)
    parts, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        parts.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(parts)


def human_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or n % 1024 or unit == "GiB":
            return f"{n} {unit}"
        n //= 1024
    return f"{n} GiB"
