"""``python -m fastcopy compare BASE.json NEW.json``: how two ``bench --json`` runs differ.

For each (size, variant) present in both files: the change of the median in percent, marked
``*`` when it lies beyond the measured spread, i.e. the [min, max] ranges of the two runs do not
overlap. A geometric mean of the new/base ratios summarises all common rows, and each variant.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, List, Tuple

from .paths import read_regular
from .system import SCHEMA
from .units import human_size


# Largest result file compare reads: a default bench run with every sample is well under 1 MiB.
MAX_RESULT_BYTES = 64 << 20


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_results(path: str, results: List[Any]) -> None:
    """ValueError naming the first entry of ``results`` that compare cannot use: each is an
    object; one with a median (a measured row) also has an integer size >= 0, a string variant,
    and numbers for median, min and max GB/s."""
    for i, r in enumerate(results):
        where = f"{path}: results[{i}]"
        if not isinstance(r, dict):
            raise ValueError(f"{where} is {json.dumps(r)[:40]}, not an object")
        if "median_gbps" not in r:
            continue  # not a measured row (compare skips it)
        size = r.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"{where}: size must be a whole number of bytes, got {json.dumps(size)[:40]}")
        if not isinstance(r.get("variant"), str):
            raise ValueError(f"{where}: variant must be a string, got {json.dumps(r.get('variant'))[:40]}")
        for key in ("median_gbps", "min_gbps", "max_gbps"):
            if not _number(r.get(key)):
                raise ValueError(f"{where}: {key} must be a number, got {json.dumps(r.get(key))[:40]}")


def load(path: str) -> Dict[str, Any]:
    """A ``bench --json`` document from ``path``: a regular file of at most MAX_RESULT_BYTES
    (never a device, FIFO or directory), whose results list compare_docs can use; ValueError
    naming the file and the problem otherwise."""
    data = read_regular(path, MAX_RESULT_BYTES)
    try:
        doc = json.loads(data)
    except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path}: not JSON ({e})") from None
    except RecursionError:
        raise ValueError(f"{path}: not JSON (nested too deeply)") from None
    if isinstance(doc, dict) and doc.get("kind") == "ipc":
        raise ValueError(f"{path}: a 'bench --ipc' result; compare reads copy benchmarks only")
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise ValueError(f"{path}: not a 'python -m fastcopy bench --json' file (no results list)")
    schema = doc.get("schema")
    if schema is not None and str(schema).split("/")[0] != SCHEMA.split("/")[0]:
        raise ValueError(f"{path}: schema '{schema}' is not {SCHEMA}")
    _check_results(path, doc["results"])
    return doc


def _key_rows(doc: Dict[str, Any]) -> Dict[Tuple[int, str], Dict[str, Any]]:
    rows = {}
    for r in doc["results"]:
        if "median_gbps" in r and "size" in r and "variant" in r:
            rows[(int(r["size"]), str(r["variant"]))] = r
    return rows


def percent(change: float) -> str:
    return f"{change * 100:+.1f} %"


def compare_docs(base: Dict[str, Any], new: Dict[str, Any]) -> Tuple[List[str], List[Dict[str, Any]]]:
    b, n = _key_rows(base), _key_rows(new)
    common = sorted(set(b) & set(n))
    lines: List[str] = []
    for label, field in (("CPU", "cpu_brand"), ("fastcopy", "fastcopy_version"), ("threads", "threads"),
                         ("offsets", "offsets"), ("overrides", "overrides")):
        if base.get(field) != new.get(field):
            lines.append(f"note: {label} differs: base {base.get(field)!r}, new {new.get(field)!r}")
    lines.append(f"base: {base.get('date', '?')}   new: {new.get('date', '?')}")
    lines.append("change of the median GB/s; '*' = beyond the spread (the min-max ranges of both runs do not overlap)")
    lines.append("")
    header = f"{'size':>9}  {'variant':<20} {'base GB/s':>10} {'new GB/s':>10} {'change':>10}"
    lines += [header, "-" * len(header)]
    rows: List[Dict[str, Any]] = []
    last = None
    for key in common:
        rb, rn = b[key], n[key]
        ratio = rn["median_gbps"] / rb["median_gbps"] if rb["median_gbps"] > 0 else float("nan")
        sig = rn["min_gbps"] > rb["max_gbps"] or rn["max_gbps"] < rb["min_gbps"]
        row = {"size": key[0], "variant": key[1], "base": rb["median_gbps"], "new": rn["median_gbps"],
               "ratio": ratio, "significant": sig,
               "base_range": (rb["min_gbps"], rb["max_gbps"]), "new_range": (rn["min_gbps"], rn["max_gbps"])}
        rows.append(row)
        if last is not None and key[0] != last:
            lines.append("")
        size = human_size(key[0]) if key[0] != last else ""
        last = key[0]
        lines.append(f"{size:>9}  {key[1]:<20} {rb['median_gbps']:10.2f} {rn['median_gbps']:10.2f} "
                     f"{percent(ratio - 1):>10}{' *' if sig else ''}")
    only_b = sorted(set(b) - set(n))
    only_n = sorted(set(n) - set(b))
    lines.append("")
    for label, keys in (("only in base", only_b), ("only in new", only_n)):
        if keys:
            shown = ", ".join(f"{human_size(s)} {v}" for s, v in keys[:8])
            more = f" and {len(keys) - 8} more" if len(keys) > 8 else ""
            lines.append(f"{label} ({len(keys)}): {shown}{more}")
    good = [r for r in rows if r["ratio"] > 0 and math.isfinite(r["ratio"])]
    if good:
        variants = sorted({r["variant"] for r in good}, key=lambda v: [r["variant"] for r in good].index(v))
        if len(variants) > 1:
            for v in variants:
                sel = [r for r in good if r["variant"] == v]
                gm = math.exp(sum(math.log(r["ratio"]) for r in sel) / len(sel))
                lines.append(f"  {v:<20} geometric mean {percent(gm - 1)} over {len(sel)} sizes")
        gm = math.exp(sum(math.log(r["ratio"]) for r in good) / len(good))
        nsig = sum(r["significant"] for r in good)
        lines.append(f"geometric mean change: {percent(gm - 1)} over {len(good)} common rows "
                     f"({nsig} beyond the spread)")
    else:
        lines.append("geometric mean change: n/a (no size and variant in common)")
    return lines, rows


def compare_files(base_path: str, new_path: str) -> Tuple[str, List[Dict[str, Any]]]:
    lines, rows = compare_docs(load(base_path), load(new_path))
    return "\n".join(lines), rows
