"""System facts for benchmark reports: NUMA placement, RAPL energy counters, C library, CPU
model and the run's metadata (shared by ``bench`` and ``tune``)."""

from __future__ import annotations

import datetime
import glob
import os
import platform
import re
import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

SCHEMA = "fastcopy-bench/1"


def numa_nodes() -> List[int]:
    nodes = []
    for path in glob.glob("/sys/devices/system/node/node[0-9]*"):
        m = re.search(r"node(\d+)$", path)
        if m:
            nodes.append(int(m.group(1)))
    return sorted(nodes)


def buffer_numa_pages(address: int) -> Optional[Dict[str, int]]:
    """Pages per NUMA node of the mapping holding ``address``, from /proc/self/numa_maps ({'N0': pages})."""
    try:
        with open("/proc/self/maps") as f:
            start = None
            for line in f:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if lo <= address < hi:
                    start = lo
                    break
        if start is None:
            return None
        with open("/proc/self/numa_maps") as f:
            for line in f:
                fields = line.split()
                if fields and int(fields[0], 16) == start:
                    return {k: int(v) for k, v in (x.split("=", 1) for x in fields[2:] if re.fullmatch(r"N\d+=\d+", x))}
    except (OSError, ValueError):
        return None
    return None


def numa_report(buffers: Optional[Any] = None) -> Dict[str, Any]:
    """NUMA nodes, and with ``buffers`` (an engine.Buffers) the pages per node of its source and destination."""
    nodes = numa_nodes()
    rep: Dict[str, Any] = {"nodes": nodes, "multi_node": len(nodes) > 1}
    if buffers is not None:
        rep["src_pages"] = buffer_numa_pages(buffers.src.ctypes.data)
        rep["dst_pages"] = buffer_numa_pages(buffers._dst_raw.ctypes.data)
    return rep


def _rapl_root() -> str:
    return os.environ.get("FASTCOPY_RAPL_ROOT", "/sys/class/powercap")


class Rapl:
    """Package energy from the RAPL powercap counters (top-level intel-rapl:N domains), when readable."""

    def __init__(self) -> None:
        self.domains: List[Tuple[str, str, int]] = []  # (name, energy_uj path, wrap range)
        self.reason: Optional[str] = None
        root = _rapl_root()
        if not os.path.isdir(root):
            self.reason = f"RAPL counters unavailable ({root} absent)"
            return
        paths = sorted(glob.glob(os.path.join(root, "intel-rapl:[0-9]*")))
        paths = [p for p in paths if re.fullmatch(r"intel-rapl:\d+", os.path.basename(p))]
        for p in paths:
            try:
                with open(os.path.join(p, "energy_uj")) as f:
                    int(f.read())
                try:
                    with open(os.path.join(p, "max_energy_range_uj")) as f:
                        wrap = int(f.read())
                except OSError:
                    wrap = 0
                try:
                    with open(os.path.join(p, "name")) as f:
                        name = f.read().strip()
                except OSError:
                    name = os.path.basename(p)
                self.domains.append((name, os.path.join(p, "energy_uj"), wrap))
            except (OSError, ValueError) as e:
                self.reason = f"RAPL counters unavailable ({p}/energy_uj: {getattr(e, 'strerror', None) or e})"
        if not self.domains:
            self.reason = self.reason or f"RAPL counters unavailable (no intel-rapl domains under {root})"
        else:
            self.reason = None

    @property
    def available(self) -> bool:
        return bool(self.domains)

    def read(self) -> List[int]:
        out = []
        for _, path, _ in self.domains:
            with open(path) as f:
                out.append(int(f.read()))
        return out

    def joules(self, before: List[int], after: List[int]) -> float:
        total = 0
        for (_, _, wrap), b, a in zip(self.domains, before, after):
            d = a - b
            if d < 0 and wrap:
                d += wrap
            total += d
        return total / 1e6

    def describe(self) -> Dict[str, Any]:
        if self.available:
            return {"available": True, "domains": [d[0] for d in self.domains],
                    "note": "package energy of the whole socket(s), idle and other processes included"}
        return {"available": False, "reason": self.reason}


# ----------------------------------------------------------------------------- metadata

def libc_info() -> Dict[str, Optional[str]]:
    name, version = platform.libc_ver()
    try:
        conf = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):
        conf = None
    return {"name": name or None, "version": version or None, "confstr": conf}


def cpu_model_name() -> Optional[str]:
    """The CPU model string of /proc/cpuinfo (x86 "model name", arm "Model" or "cpu model"), or None."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model", "cpu model")):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return None


def metadata(argv: Sequence[str]) -> Dict[str, Any]:
    import fastcopy

    info = fastcopy.info()
    return {
        "schema": SCHEMA,
        "fastcopy_version": fastcopy.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).astimezone().isoformat(timespec="seconds"),
        "command_line": list(argv),
        "host": platform.node(),
        "python": platform.python_version(),
        "numpy_version": np.__version__,
        "libc": libc_info(),
        "cpu": info["cpu"],
        "cpu_brand": info["cpu"].get("brand") or cpu_model_name(),
        "cpu_model_name": cpu_model_name(),
        "kernels": info["usable_kernels"],
        "policy": info["policy"],
        "thresholds": info["thresholds"],
        "overrides": info["overrides"],
        "threads": fastcopy.get_threads(),
        "threads_info": info["threads"],
        "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "online_cpus": os.cpu_count(),
        "load_average_before": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


# ---- how far apart two CPUs are (IPC and Topic benchmarks, tune) ----------------------------
# On a small VM the host can move the vCPUs between near and far placement every few seconds,
# and data passed between processes then moves several times slower while private copies do
# not (evidence: bench-vcpus-moved-apart). Figures that move data between processes need the
# probes next to them.
FAR_FACTOR = 2.0  # a probe above this many times the run's lowest counts as "far apart"


def usable_cpu_count() -> int:
    """How many CPUs this process may run on (its affinity mask; all online CPUs elsewhere)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def cpu_pair() -> Optional[Tuple[int, int]]:
    """The first two CPUs of this process's affinity mask (None with fewer than two): on a
    2-vCPU machine, the two CPUs the processes of an IPC benchmark share."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return None
    return (cpus[0], cpus[1]) if len(cpus) >= 2 else None


def cache_line_round_trip(pair: Optional[Tuple[int, int]]) -> Optional[float]:
    """Nanoseconds for a cache line to go between the two CPUs of ``pair`` and back, now
    (about 5 ms); None when there is no pair or the probe could not run (a CPU taken away,
    or the turns stalled because another process held a CPU for half a second)."""
    if pair is None:
        return None
    from .. import _core

    try:
        return float(_core.cache_line_round_trip_ns(pair[0], pair[1]))
    except (RuntimeError, ValueError):
        return None


def cpu_distance_record(pair: Optional[Tuple[int, int]], probes: Sequence[Optional[float]]) -> Dict[str, Any]:
    """What a benchmark keeps in its JSON: the pair and one probe per repeat (None: failed)."""
    return {"cpus": list(pair) if pair else None, "round_trip_ns": list(probes)}


def _probes_and_far(record: Optional[Dict[str, Any]]) -> Tuple[List[float], int]:
    """The probes that ran, and how many were far (above FAR_FACTOR x the lowest)."""
    if not record or not record.get("cpus"):
        return [], 0
    probes = [p for p in record.get("round_trip_ns", []) if p is not None]
    low = min(probes, default=0.0)
    return probes, sum(p > FAR_FACTOR * low for p in probes)


def cpu_distance_words(record: Optional[Dict[str, Any]]) -> Optional[str]:
    """One line for under a benchmark table: the probes' range and median, and how many were
    far (above FAR_FACTOR x the lowest), with what that means. None without probes."""
    probes, far = _probes_and_far(record)
    if not probes:
        return None
    a, b = record["cpus"]  # type: ignore[index]
    words = (f"cache-line round trip between CPUs {a} and {b}, before each repeat: {min(probes):.0f}-"
             f"{max(probes):.0f} ns (median {statistics.median(probes):.0f})")
    if far:
        words += (f"; {far} of {len(probes)} above {FAR_FACTOR:g}x the lowest: the host had moved the two CPUs "
                  f"apart then, and data passed between processes moves slower (up to 4x at 1 MiB on a 2-vCPU VM)")
    return words


def cpu_moved_note(record: Optional[Dict[str, Any]]) -> Optional[str]:
    """For a tuned profile's notes: words when the host moved the two CPUs during the run (some
    probes far), else None. Two threads gain most with the CPUs near (evidence:
    tune-pool-gain-by-cpu-distance, whose medians the note quotes)."""
    probes, far = _probes_and_far(record)
    if not far:
        return None
    a, b = record["cpus"]  # type: ignore[index]
    return (f"the host moved CPUs {a} and {b} during tuning (a cache line's round trip took {min(probes):.0f}-"
            f"{max(probes):.0f} ns, {far} of {len(probes)} probes above {FAR_FACTOR:g}x the lowest); two threads "
            f"gain most with the CPUs near (on a 2-vCPU Zen 3 VM at 4 MiB, medians: 1.4x near, 1.1x far apart, "
            f"1.0x on one core), so the pool threshold may not hold: rerun tune to confirm it")
