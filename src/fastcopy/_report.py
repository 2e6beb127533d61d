"""Builds fastcopy.info() and prints it in plain words (``python -m fastcopy info``)."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from . import _core

_REGION_TITLES = {
    "private": "Ordinary copies",
    "to_shared": "Copies into shared memory",
    "from_shared": "Copies out of shared memory",
}


def _cpu_brand() -> Optional[str]:
    """Brand string from py-cpuinfo, imported only here (it is slow to import)."""
    try:
        import cpuinfo  # type: ignore[import-untyped]

        return cpuinfo.get_cpu_info().get("brand_raw")
    except Exception:  # py-cpuinfo missing or failing must not break info()
        return None


def collect_info(brand: bool = True) -> Dict[str, Any]:
    from . import __version__

    cpu = dict(_core.cpu_facts())
    if brand:
        cpu["brand"] = _cpu_brand()
    kernels = _core.kernel_table()
    return {
        "version": __version__,
        "cpu": cpu,
        "kernels": kernels,
        "usable_kernels": [k["name"] for k in kernels if k["supported"]],
        "policy": _core.policy_table(),
        "notes": list(_core.policy_notes()),
        "thresholds": {
            "non_temporal_bytes": _core.nt_threshold(),
            "non_temporal_reason": _core.nt_reason(),
            "parallel_bytes": _core.parallel_threshold(),
            "parallel_reason": _core.parallel_reason(),
        },
        "threads": {
            "count": _core.threads(),
            "default": _core.default_threads(),
            "reason": _core.threads_reason(),
        },
        "overrides": _core.overrides(),
    }


def human_size(n: Optional[int]) -> str:
    if n is None:
        return "inf"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or n % 1024 or unit == "TiB":
            return f"{n} {unit}"
        n //= 1024
    return f"{n} TiB"


def format_info(data: Dict[str, Any]) -> str:
    cpu = data["cpu"]
    lines: List[str] = [f"fastcopy {data['version']}", "", "CPU detected:"]
    name = cpu.get("brand") or cpu["vendor"]
    lines.append(f"  {name} ({cpu['arch']}, vendor {cpu['vendor']}, family {cpu['family']} model {cpu['model']} "
                 f"stepping {cpu['stepping']}{', under a hypervisor' if cpu['hypervisor'] else ''})")
    flags = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in cpu["flags"].items())
    if flags:
        lines.append(f"  features: {flags}")
    if cpu["arch"] == "aarch64" and cpu["flags"].get("sve"):
        lines.append(f"  SVE vector length: {cpu['sve_vector_bytes']} bytes")
    caches = f"  caches: L1d {human_size(cpu['l1d_bytes'])}, L2 {human_size(cpu['l2_bytes'])}, " \
             f"L3 {human_size(cpu['l3_bytes'])} (from {cpu['cache_source']})"
    if cpu["l3_cpuid_bytes"] and cpu["l3_sysfs_bytes"] and cpu["l3_cpuid_bytes"] != cpu["l3_sysfs_bytes"]:
        caches += f"; CPUID claims an L3 of {human_size(cpu['l3_cpuid_bytes'])}, not used"
    lines.append(caches)
    lines.append(f"  Linux kernel {cpu['kernel_version']}, {cpu['usable_cpus']} usable CPUs")
    lines += ["", "Kernels:"]
    for k in data["kernels"]:
        state = "usable" if k["supported"] else f"not usable: {k['why_not']}"
        lines.append(f"  {k['name']:<9} {state}; {k['description']}")
    by_region: Dict[str, List[Dict[str, Any]]] = {}
    for rule in data["policy"]:
        by_region.setdefault(rule["region"], []).append(rule)

    def bands(rules: List[Dict[str, Any]]) -> List[Any]:
        return [(r["min_bytes"], r["max_bytes"], r["kernel"], r["reason"]) for r in rules]

    for region, rules in by_region.items():
        title = _REGION_TITLES.get(region, region)
        if region != "private" and bands(rules) == bands(by_region.get("private", [])):
            lines += ["", f"{title}: same as ordinary copies"]
            continue
        lines += ["", f"{title}:"]
        for r in rules:
            band = f"{human_size(r['min_bytes'])} to {human_size(r['max_bytes'])}"
            lines.append(f"  {band:<22} {r['kernel']:<9} {r['reason']}")
    if data["notes"]:
        lines += ["", "Notes:"] + [f"  {note}" for note in data["notes"]]
    t = data["thresholds"]
    th = data["threads"]
    lines += ["", "Large copies:",
              (f"  non-temporal stores: never ({t['non_temporal_reason']})" if t["non_temporal_bytes"] is None
               else f"  non-temporal stores from {human_size(t['non_temporal_bytes'])}: {t['non_temporal_reason']}"),
              f"  thread pool from {human_size(t['parallel_bytes'])} (copies without overlap): {t['parallel_reason']}",
              f"  threads: {th['reason']}"]
    lines += ["", "Overrides:"]
    for key, value in data["overrides"].items():
        lines.append(f"  {key} = {value if value is not None else '(not set)'}")
    return "\n".join(lines)


def print_info(as_json: bool = False) -> None:
    data = collect_info()
    print(json.dumps(data, indent=2) if as_json else format_info(data))
