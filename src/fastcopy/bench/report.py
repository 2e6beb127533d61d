"""Formatting of benchmark results: the header, the table, ucx_info's block (``bench``)."""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional, Tuple

from .copy import BASELINE
from .units import format_cpus, human_size


def cache_words(config: Dict[str, Any]) -> str:
    """The cache mode in words, for the header."""
    if config.get("cache", "hot") == "cold":
        return ("caches are cold: each copy reads a different source from a rotation whose sources hold at "
                f"least {config.get('cold_l3_factor', 2)}x the {human_size(config.get('l3_bytes') or 0)} L3 "
                f"(at most {config.get('cold_max_buffers', 16384)} buffers; small sizes rotate through less, "
                "see rotation_bytes in the JSON)")
    return "caches are hot (the same buffers every iteration)"


def header_lines(meta: Dict[str, Any], config: Dict[str, Any], energy_desc: Dict[str, Any],
                 numa: Dict[str, Any], notes: Dict[str, Any]) -> List[str]:
    offs = config["offsets"]
    if len(offs) == 1 and offs[0] == 0:
        placement = "page-aligned source and destination ((dst - src) mod 4096 = 0)"
    elif len(offs) == 1:
        placement = f"page-aligned source, (dst - src) mod 4096 = {offs[0]}"
    else:
        placement = f"page-aligned source, (dst - src) mod 4096 cycling per repeat over {', '.join(map(str, offs))}"
    cpu = meta.get("cpu_brand") or meta["cpu"].get("vendor")
    libc = meta["libc"]
    lines = [
        f"fastcopy {meta['fastcopy_version']} copy bandwidth on {cpu}, {libc.get('name')} {libc.get('version')}, "
        f"numpy {meta['numpy_version']}" + (f", torch {notes['torch_version']}" if notes.get("torch_version") else ""),
        "GB/s = 1e9 bytes per second, each byte counted once per copy (STREAM's Copy counts it twice: "
        "read + write, so its figures are 2x these)",
        f"median of {config['repeats']} repeats [min - max]; each repeat times a loop of >= "
        f"{config['min_time'] * 1e3:g} ms after a warm-up; variants interleaved round-robin in a new order each repeat; "
        f"ratio = median / median of {BASELINE}; " + cache_words(config),
        f"buffers: {placement}",
        f"threads: {meta['threads']} (fastcopy pool); CPUs: {format_cpus(meta['cpus']) if meta['cpus'] else '?'}"
        + (f"; torch threads: {notes['torch_threads']} (its default: {notes['torch_default_threads']}, "
           f"OMP_WAIT_POLICY={notes.get('omp_wait_policy')})"
           if notes.get("torch_threads") else "")
        + (f"; load average {meta['load_average_before'][0]:.2f} on {meta['online_cpus']} CPUs"
           if meta.get("load_average_before") else ""),
    ]
    nodes = numa.get("nodes") or []
    if len(nodes) > 1:
        lines.append(f"NUMA: {len(nodes)} nodes ({', '.join(f'node{n}' for n in nodes)}); "
                     "pages per node of each buffer are in the table notes and JSON")
    else:
        lines.append(f"NUMA: one node{f' (node{nodes[0]})' if nodes else ''}; buffer placement not reported")
    if energy_desc.get("available"):
        lines.append(f"energy: RAPL {', '.join(energy_desc['domains'])} (whole package, other load included)")
    else:
        lines.append(f"energy: {energy_desc.get('reason')}")
    return lines


def slowest_offset(result: Dict[str, Any]) -> Optional[Tuple[int, float]]:
    """(offset, median GB/s at that offset) of the slowest destination offset in a result's samples."""
    per: Dict[int, List[float]] = {}
    for smp in result.get("samples", []):
        per.setdefault(smp["offset"], []).append(smp["gbps"])
    if len(per) < 2:
        return None
    return min(((off, statistics.median(g)) for off, g in per.items()), key=lambda x: x[1])


def _display_name(r: Dict[str, Any]) -> str:
    """``fastcopy (erms x2)``: the variant, with the kernel(s) the policy chose and the threads used."""
    name = r["variant"]
    ks = sorted(set(k for k in (r.get("chosen_kernel") or {}).values() if k))
    if ks:
        used = r.get("threads_used") or 1
        name += f" ({'/'.join(ks)}{f' x{used}' if used > 1 else ''})"
    return name


def format_table(results: List[Dict[str, Any]], with_energy: bool = False) -> str:
    has_ratio = any(r.get("ratio_to_copyto") is not None for r in results)
    multi_node = any(len((r.get("numa") or {}).get("nodes") or []) > 1 for r in results)
    multi_offset = any(len(set(r.get("offsets") or [])) > 1 for r in results)
    names = {id(r): _display_name(r) for r in results}
    width = max([22] + [len(n) for n in names.values()])
    cols = f"{'size':>9}  {'variant':<{width}} {'GB/s':>8}  {'[min - max]':<17}"
    if has_ratio:
        cols += f" {'vs copyto':>9}"
    if multi_offset:
        cols += f"  {'slowest offset':>16}"
    if with_energy:
        cols += f" {'J':>8} {'GB/J':>7}"
    lines = [cols, "-" * len(cols)]
    last = None
    for r in results:
        size = human_size(r["size"]) if r["size"] != last else ""
        if r["size"] != last and last is not None:
            lines.append("")
        last = r["size"]
        name = names[id(r)]
        spread = f"[{r['min_gbps']:.2f} - {r['max_gbps']:.2f}]"
        line = f"{size:>9}  {name:<{width}} {r['median_gbps']:8.2f}  {spread:<17}"
        if has_ratio:
            ratio = r.get("ratio_to_copyto")
            line += f" {ratio:8.2f}x" if ratio is not None else f" {'':>9}"
        if multi_offset:
            worst = slowest_offset(r)
            line += f"  {worst[1]:7.2f} at {worst[0]:>4}" if worst else f"  {'':>16}"
        if with_energy:
            j, gpj = r.get("joules"), r.get("gb_per_joule")
            line += f" {j:8.3f}" if j is not None else f" {'-':>8}"
            line += f" {gpj:7.2f}" if gpj is not None else f" {'-':>7}"
        if not r.get("verified", True):
            line += "  WRONG RESULT"
        lines.append(line)
    if multi_node:
        lines.append("")
        for r in results:
            if r.get("numa") and r["variant"] == results[0]["variant"]:
                n = r["numa"]
                lines.append(f"{human_size(r['size']):>9}  src pages {n.get('src_pages')}, dst pages {n.get('dst_pages')}")
    return "\n".join(lines)


def format_ucx(results: List[Dict[str, Any]], variant: str = "fastcopy") -> str:
    """The block ucx_info -s prints: sizes in bytes, MB/s with UCX's MB = 2**20 bytes (UCS_MBYTE)."""
    lines = ["# Memcpy bandwidth:"]
    for r in results:
        if r["variant"] == variant:
            lines.append(f"#     {r['size']:10d} bytes: {r['median_gbps'] * 1e9 / (1 << 20):.3f} MB/s")
    return "\n".join(lines)
