"""Builds fastcopy.info() and prints it in plain words (``python -m fastcopy info``)."""

from __future__ import annotations

import json
import textwrap
from typing import Any, Dict, List, Optional, Tuple

from . import _core

_CLASS_TITLES = {
    "page_aligned": "(dst - src) mod 4096 = 0",
    "near": "mod 4096 in 1..63",
    "far": "mod 4096 >= 64",
    "backward": "backward overlap",
}

_REGION_TITLES = {
    "private": "Ordinary copies",
    "to_shared": "Copies into shared memory",
    "from_shared": "Copies out of shared memory",
}



def _guard_end(nt: Dict[str, Any]) -> str:
    """Words for where the NT rule's page-distance guard ends ("" when it covers every size)."""
    below = nt.get("min_page_distance_below")
    return "" if below is None else f" below {human_size(below)} (every distance from there)"


def _split_words(data: Dict[str, Any]) -> str:
    """Which private copies the split learner decides, in words ("" when none: no pool, one
    thread, a profile whose parallel.learn_from is null, or every copy that would learns its
    store mode instead)."""
    parallel = data["thresholds"]["parallel_bytes"]
    if parallel is None or data["threads"]["count"] < 2:
        return ""
    learn_from = data["profile"]["parallel"].get("learn_from")
    if learn_from is None:
        return ""
    start = max(parallel, learn_from)
    end = data["profile"]["regions"]["private"]["nt"].get("learn_from")
    if end is not None and end <= start:
        return ""
    sizes = f"from {human_size(start)}" if end is None else f"of {human_size(start)} to {human_size(end)}"
    return f"private copies {sizes} split or run alone, whichever ran faster lately"


def _shared_pool_words(shared_from: Optional[int]) -> str:
    """When copies into and out of shared memory go to the thread pool, in words."""
    return "never" if shared_from is None else f"from {human_size(shared_from)}"


def _learn_words(nt: Dict[str, Any]) -> str:
    """Words for the sizes that learn their store mode ("" when none)."""
    start = nt.get("learn_from")
    return "" if start is None else \
        f"; from {human_size(start)}, copies use cached or streaming stores, whichever ran faster lately " \
        "(starting as this rule says)"


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
    from . import _profile

    kernels = _core.kernel_table()
    profile = _core.active_profile()
    status = _profile.status()
    threads_reason = _core.threads_reason()
    profile_threads = profile["parallel"]["threads"]
    if profile_threads and _core.overrides()["FASTCOPY_THREADS"] is None and "set_threads" not in threads_reason:
        threads_reason = f"{profile_threads} (from the dispatch profile: {profile['parallel']['why']})"
    data: Dict[str, Any] = {
        "version": __version__,
        "cpu": cpu,
        "kernels": kernels,
        "usable_kernels": [k["name"] for k in kernels if k["supported"]],
        "profile": profile,
        "profile_source": {
            "name": profile["name"],
            "source": status["source"],
            "path": status["path"],
            "detail": status["detail"],
            "matched": profile["matched"],
            "date": profile["provenance"].get("date"),
            "ignored": status["ignored"],
        },
        "policy": _core.policy_table(),
        "notes": list(_core.policy_notes()),
        "thresholds": {
            "non_temporal_bytes": _core.nt_threshold(),
            "non_temporal_reason": _core.nt_reason(),
            "parallel_bytes": _core.parallel_threshold(),
            "parallel_reason": _core.parallel_reason(),
            # copies into and out of shared memory (to_shared, from_shared): parallel.shared_from
            "parallel_shared_bytes": profile["parallel"]["shared_from"],
        },
        "threads": {
            "count": _core.threads(),
            "default": _core.default_threads(),
            "reason": threads_reason,
            # What the pool did in this process so far: the back-off and the busy fallback are
            # decided per copy at run time, so they show here rather than in the policy table.
            "pool": dict(_core.pool_stats()),
            "isolated_copies": dict(_core.isolated_copy_rule()),
            "worker_spin": dict(_core.worker_spin_rule()),
        },
        # What private copies from the profile's nt.learn_from measured in this process so far.
        "private_store_modes": {"rule": dict(_core.private_store_mode_rule()),
                                "classes": list(_core.private_store_modes())},
        # Whether private copies the profile splits across the pool ran split or alone, as timed.
        "private_split_modes": {"rule": dict(_core.private_split_rule()),
                                "classes": list(_core.private_split_modes())},
        "overrides": _core.overrides(),
        "shm": list(_core._shm_rules()),
    }
    data["evidence"] = cited_evidence(data)
    return data


def _strings(value: Any) -> List[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def cited_evidence(data: Dict[str, Any]) -> Dict[str, Optional[Dict[str, str]]]:
    """Every evidence entry the reasons in ``data`` cite, by id, in the order first cited (None for
    an id this build's evidence lacks). The entries are compiled into _core from docs/evidence/."""
    entries = {e["id"]: e for e in _core.evidence()}
    ids = _core.evidence_cited("\n".join(_strings(data)))
    return {i: entries.get(i) for i in ids}


def human_size(n: Optional[int]) -> str:
    if n is None:
        return "inf"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or n % 1024 or unit == "TiB":
            return f"{n} {unit}"
        n //= 1024
    return f"{n} TiB"


def _rule_value(rule: Dict[str, Any]) -> str:
    if rule["unit"] == "bytes":
        return human_size(rule["value"])
    seconds = rule["value"]
    return f"{seconds * 1e3:g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:g} us"


def format_info(data: Dict[str, Any], verbose: bool = False) -> str:
    """``data`` (collect_info()) in plain words. By default one screen: what was detected and
    what each copy gets; ``verbose`` adds the reason and the measurements behind each choice."""
    if not verbose:
        return _format_summary(data)
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
    lines += _format_profile(data["profile"], data["profile_source"])
    if data["notes"]:
        lines += ["", "Notes:"] + [f"  {note}" for note in data["notes"]]
    t = data["thresholds"]
    th = data["threads"]
    lines += ["", "Large copies:",
              (f"  non-temporal stores: never ({t['non_temporal_reason']})" if t["non_temporal_bytes"] is None
               else f"  non-temporal stores from {human_size(t['non_temporal_bytes'])}: {t['non_temporal_reason']}"),
              (f"  thread pool: never ({t['parallel_reason']})" if t["parallel_bytes"] is None else
               f"  thread pool from {human_size(t['parallel_bytes'])} (copies without overlap): {t['parallel_reason']}"),
              f"  threads: {th['reason']}"]
    if t["parallel_shared_bytes"] != t["parallel_bytes"]:
        lines.insert(-1, "  copies into and out of shared memory: on the thread pool " +
                     _shared_pool_words(t["parallel_shared_bytes"]))
    iso = th.get("isolated_copies")
    if iso:
        lines.append(f"  isolated copies under {human_size(iso['below_bytes'])} (more than "
                     f"{iso['gap_seconds'] * 1e6:g} us after the previous one) run alone while the workers sleep: "
                     f"{iso['why']}")
    spin = th.get("worker_spin")
    if spin:
        gap = f" (within {iso['gap_seconds'] * 1e6:g} us of the previous one)" if iso else ""
        lines.append(f"  idle workers spin {spin['within_stream_seconds'] * 1e6:g} us after a copy of a stream{gap}, "
                     f"{spin['after_isolated_copy_seconds'] * 1e6:g} us after others, then sleep: "
                     f"{spin['why']}")
    pool = th.get("pool")
    if pool and any(pool.values()):  # `python -m fastcopy info` is a fresh process: nothing to say
        alone = pool["busy_fallbacks"] + pool["backoff_fallbacks"] + pool["asleep_fallbacks"]
        lines.append(f"  this process so far: {pool['parallel_copies']} copies split over threads, {alone} done alone "
                     f"({pool['busy_fallbacks']} with the pool busy with another call, {pool['backoff_fallbacks']} "
                     f"in a back-off after {pool['late_events']} late-worker events, {pool['asleep_fallbacks']} isolated "
                     f"while the workers slept), {pool['chunks_by_workers']} chunks copied by workers, "
                     f"{pool['worker_sleeps']} times a worker went to sleep")
    learned = data.get("private_store_modes")
    if learned and data["profile"]["regions"]["private"]["nt"].get("learn_from") is not None:
        r = learned["rule"]
        lines.append(f"  learned store modes: the other mode is tried ({r['streaming_trial_copies']} copies of "
                     f"streaming stores or {r['cached_trial_copies']} of cached ones, the last one timed) after {r['explore_min']} copies "
                     f"({r['explore_first_while_streaming']} in a size class that starts or switches to streaming), then {r['explore_growth']}x less often after each loss (up to every "
                     f"{r['explore_max']}), and takes "
                     f"over when {r['to_streaming_margin']:g}x faster (streaming) or {r['to_cached_margin']:g}x "
                     f"(cached); the current one leaves after {r['slow_to_leave']} slow copies in a row; streaming "
                     f"stores are not tried while cached ones run over {r['trial_within']:g}x faster: {r['why']}")
        for c in learned["classes"]:  # a fresh process has none
            lines.append(f"    {c['sizes']}: {c['stores']} stores now ({c['cached_writes']} copies cached at "
                         f"{c['cached_gbps']:.1f} GB/s last, {c['streaming_writes']} streamed at "
                         f"{c['streaming_gbps']:.1f} GB/s last, {c['switches']} switches)")
    split = data.get("private_split_modes")
    if split and _split_words(data):
        r = split["rule"]
        lines.append(f"  learned split: {_split_words(data)}; the caller alone is tried ({r['alone_trial_copies']} "
                     f"copies, the last one timed) after {r['explore_min']} copies, then {r['explore_growth']}x less "
                     f"often after each loss (up to every {r['explore_max']}); splitting again is tried the same way "
                     f"({r['split_trial_copies']} copies a worker took part in, at least every "
                     f"{r['explore_max_while_alone']}); either takes over when {r['to_split_margin']:g}x faster "
                     f"(split) or {r['to_alone_margin']:g}x (alone): {r['why']}")
        for c in split["classes"]:  # a fresh process has none
            lines.append(f"    {c['sizes']}: {c['mode']} now ({c['split_copies']} copies split at "
                         f"{c['split_gbps']:.1f} GB/s last, {c['alone_copies']} alone at {c['alone_gbps']:.1f} GB/s "
                         f"last, {c['switches']} switches)")
    lines += ["", "Shared memory (fastcopy.shm):"]
    for rule in data["shm"]:
        lines.append(f"  {rule['name']} = {_rule_value(rule)}: {rule['rule']}")
        lines.append(f"      why: {rule['why']}")
    lines += ["", "Overrides:"]
    for key, value in data["overrides"].items():
        lines.append(f"  {key} = {value if value is not None else '(not set)'}")
    lines += _format_evidence(data.get("evidence", {}))
    return "\n".join(lines)


_EVIDENCE_FIELDS = ("figures", "machine", "date", "command")


def _format_evidence(evidence: Dict[str, Optional[Dict[str, str]]]) -> List[str]:
    """The evidence entries cited above: claim, figures, machine, date and command of each."""
    if not evidence:
        return []
    lines = ["", "Evidence cited above (docs/evidence/<subject>.md):"]
    for ident, entry in evidence.items():
        if entry is None:
            lines += ["", f"  [{ident}] not in this build's evidence"]
            continue
        head = f"  [{ident}] ({entry['subject']}) {entry['claim']}".replace("\n", " ")
        lines += ["", textwrap.fill(head, 100, subsequent_indent="      ", break_long_words=False,
                                    break_on_hyphens=False)]
        for field in _EVIDENCE_FIELDS:
            first, *rest = entry[field].split("\n")
            lines.append(f"    {field}: {first}")
            lines += [f"      {line}" for line in rest]
    return lines


def _cpu_lines(cpu: Dict[str, Any]) -> List[str]:
    name = cpu.get("brand") or cpu["vendor"]
    lines = [f"  {name} ({cpu['arch']}, vendor {cpu['vendor']}, family {cpu['family']} model {cpu['model']} "
             f"stepping {cpu['stepping']}{', under a hypervisor' if cpu['hypervisor'] else ''})"]
    flags = ", ".join(k for k, v in cpu["flags"].items() if v)
    if flags:
        lines.append(f"  features: {flags}" + (f", SVE vector length {cpu['sve_vector_bytes']} bytes"
                                               if cpu["arch"] == "aarch64" and cpu["flags"].get("sve") else ""))
    caches = f"  caches: L1d {human_size(cpu['l1d_bytes'])}, L2 {human_size(cpu['l2_bytes'])}, " \
             f"L3 {human_size(cpu['l3_bytes'])} (from {cpu['cache_source']})"
    if cpu["l3_cpuid_bytes"] and cpu["l3_sysfs_bytes"] and cpu["l3_cpuid_bytes"] != cpu["l3_sysfs_bytes"]:
        caches += f"; CPUID claims {human_size(cpu['l3_cpuid_bytes'])}"
    lines.append(caches + f"; Linux {cpu['kernel_version']}, {cpu['usable_cpus']} usable CPUs")
    return lines


def _band_words(bands: List[Dict[str, Any]], forced: Optional[str]) -> str:
    if forced:
        return f"{forced} (forced by FASTCOPY_KERNEL)"
    if len(bands) == 1:
        return bands[0]["kernel"]
    return ", ".join(f"{b['kernel']} {'below ' + human_size(bands[1]['from']) if i == 0 else 'from ' + human_size(b['from'])}"
                     for i, b in enumerate(bands))


def _region_summary(region: Dict[str, Any], forced: Optional[str]) -> Tuple[List[str], List[str]]:
    """(rows of the bands, rows of the NT rule) of one region, as the summary prints them."""
    groups: List[Any] = []
    for cls in ("page_aligned", "near", "far", "backward"):
        words = _band_words(region[cls], forced)
        for g in groups:
            if g[1] == words:
                g[0].append(cls)
                break
        else:
            groups.append(([cls], words))
    if len(groups) == 1:
        rows = [f"  every address: {groups[0][1]}"]
    else:
        rows = [f"  {', '.join(_CLASS_TITLES[c] for c in classes)}: {words}" for classes, words in groups]
    nt = region["nt"]
    nt_rows: List[str] = []
    if nt["threshold"] is not None and not forced:
        cond = f", at (dst - src) mod 4096 = 0 or >= {nt['min_page_distance']}{_guard_end(nt)}" \
            if nt["min_page_distance"] else ""
        nt_rows.append(f"  non-temporal stores ({nt['kernel']}) from {human_size(nt['threshold'])}{cond}"
                       f"{_learn_words(nt)}")
    return rows, nt_rows


def _regions_summary(regions: Dict[str, Any], forced: Optional[str]) -> List[str]:
    """The three regions, each said once: copies into and out of shared memory together where
    their rules match; "same as ordinary copies" where everything matches private copies, and
    only the NT rule where only that differs."""
    private = _region_summary(regions["private"], forced)
    lines = [f"{_REGION_TITLES['private']}:"] + private[0] + private[1]
    to_shared, from_shared = (_region_summary(regions[key], forced) for key in ("to_shared", "from_shared"))
    blocks = [("Copies into and out of shared memory", to_shared)] if to_shared == from_shared else \
        [(_REGION_TITLES["to_shared"], to_shared), (_REGION_TITLES["from_shared"], from_shared)]
    for title, (bands, nt) in blocks:
        if (bands, nt) == private:
            lines.append(f"{title}: same as ordinary copies")
        elif bands == private[0]:
            lines += [f"{title}: the bands of ordinary copies; " + (nt[0].strip() if nt else "no non-temporal stores")]
        else:
            lines += [f"{title}:"] + bands + nt
    return lines


def _format_summary(data: Dict[str, Any]) -> str:
    lines: List[str] = [f"fastcopy {data['version']}", "", "CPU detected:"] + _cpu_lines(data["cpu"])
    usable = [k["name"] for k in data["kernels"] if k["supported"]]
    lines += ["", "Kernels: " + ", ".join(usable) + " usable"]
    for k in data["kernels"]:
        if not k["supported"]:
            lines.append(f"  {k['name']}: not usable ({k['why_not']})")
    profile, source = data["profile"], data["profile_source"]
    prov = profile["provenance"]
    where = "built-in" if source["source"] == "built-in" else f"{source['path']} ({source['detail']})"
    lines += ["", f"Dispatch profile: {profile['name']} ({where}); measured on: {prov.get('machine') or '?'}, "
                  f"{prov.get('date') or '?'}"]
    for item in profile["overrides"]:
        lines.append(f"  override: {item}")
    lines += _regions_summary(profile["regions"], profile["forced_kernel"])
    t, th = data["thresholds"], data["threads"]
    if profile["forced_kernel"]:
        pool = "not used (a forced kernel)"
    else:
        pool = "never" if t["parallel_bytes"] is None else f"from {human_size(t['parallel_bytes'])}"
        split = _split_words(data)
        if split:
            pool += f" ({split})"
        if t["parallel_shared_bytes"] != t["parallel_bytes"]:
            pool += f"; copies into and out of shared memory {_shared_pool_words(t['parallel_shared_bytes'])}"
    lines += ["", f"Thread pool: {pool}; {th['count']} threads"]
    lines.append("Shared memory: " + ", ".join(f"{r['name']} {_rule_value(r)}" for r in data["shm"]))
    set_overrides = [f"{k}={v}" for k, v in data["overrides"].items() if v is not None]
    lines.append("Overrides: " + (", ".join(set_overrides) if set_overrides else "none set"))
    lines += ["", "python -m fastcopy info --verbose: the reason and the measurements behind each choice"]
    return "\n".join(textwrap.fill(line, 100, subsequent_indent="    " if line.startswith("  ") else "  ",
                                   break_long_words=False, break_on_hyphens=False)
                     if len(line) > 100 else line for line in lines)


def _format_profile(profile: Dict[str, Any], source: Dict[str, Any]) -> List[str]:
    """The active profile as it runs: every region, address class and band."""
    prov = profile["provenance"]
    lines = ["", f"Dispatch profile: {profile['name']}"]
    if source["source"] == "built-in":
        lines.append(f"  source: built-in; {profile['matched']}")
    else:
        lines.append(f"  source: {source['path']} ({source['detail']})")
    if source["source"] == "built-in" and source["detail"]:
        lines.append(f"  tuned profiles: {source['detail']}")
    for path in source["ignored"]:
        lines.append(f"  ignored: {path}")
    lines.append(f"  measured on: {prov.get('machine') or '?'}; {prov.get('date') or '?'}; {prov.get('libc') or '?'}")
    if prov.get("method"):
        lines.append(f"  how: {prov['method']}")
    if profile["signature"]:
        from ._profile import signature_differences, _compact

        mine = {k: _compact(v) for k, v in profile["signature"].items()}
        text = '{"signature": {' + ",".join(f"{_compact(k)}:{v}" for k, v in mine.items()) + "}}"
        differs = signature_differences(text)
        if differs:
            lines.append(f"  note: measured on a machine whose signature differs in {', '.join(differs)}")
    for item in profile["overrides"]:
        lines.append(f"  override: {item}")

    def region_rows(region: Dict[str, Any]) -> List[str]:
        rows: List[str] = []
        groups: List[Any] = []
        for cls in ("page_aligned", "near", "far", "backward"):
            bands = [(b["from"], b["kernel"], b["why"]) for b in region[cls]]
            for g in groups:
                if g[1] == bands:
                    g[0].append(cls)
                    break
            else:
                groups.append(([cls], bands))
        for classes, _ in groups:
            title = ", ".join(_CLASS_TITLES[c] for c in classes)
            rows.append(f"  {title}:")
            for b in region[classes[0]]:
                band = f"{human_size(b['from'])} to {human_size(b['to'])}"
                kernel = profile["forced_kernel"] or b["kernel"]
                why = "forced by FASTCOPY_KERNEL" if profile["forced_kernel"] else b["why"]
                rows.append(f"    {band:<22} {kernel:<9} {why}")
        nt = region["nt"]
        if nt["threshold"] is None:
            rows.append(f"  non-temporal stores: never ({nt['why']})")
        else:
            cond = "" if not nt["min_page_distance"] else \
                f", only at (dst - src) mod 4096 = 0 or >= {nt['min_page_distance']}{_guard_end(nt)}"
            rows.append(f"  non-temporal stores ({nt['kernel']}) from {human_size(nt['threshold'])} without "
                        f"overlap{cond}: {nt['why']}")
            if nt.get("learn_from") is not None:
                rows.append(f"  from {human_size(nt['learn_from'])}, copies without overlap time themselves and use "
                            "cached or streaming stores, whichever ran faster lately, those this rule streams as "
                            "well (each size class starts as the rule says)")
        return rows

    private = None
    for key in ("private", "to_shared", "from_shared"):
        rows = region_rows(profile["regions"][key])
        title = _REGION_TITLES.get(key, key)
        if key != "private" and rows == private:
            lines += ["", f"{title}: same as ordinary copies"]
            continue
        if key == "private":
            private = rows
        lines += ["", f"{title}:"] + rows
    return lines


def print_info(as_json: bool = False, verbose: bool = False) -> None:
    data = collect_info()
    print(json.dumps(data, indent=2) if as_json else format_info(data, verbose=verbose))
