"""Copy-bandwidth benchmark behind ``python -m fastcopy bench`` (see docs/benchmarks.md).

Every variant (fastcopy's automatic choice, each usable kernel, ``np.copyto``,
``dst[...] = src`` and torch's ``copy_`` when torch is importable) copies the same
buffers. Bandwidth is bytes copied per second with each byte counted *once* per copy
(STREAM's Copy counts it twice, read plus write). For each size every variant is
calibrated to a loop of at least ``min_time`` seconds after a warm-up, then timed
``repeats`` times with the variants interleaved round-robin inside each repeat, in a new
(seeded random) order each repeat, so a noisy neighbour slows every variant alike rather than
one of them, and no variant always runs right after the same other one.
"""

from __future__ import annotations

import datetime
import glob
import math
import os
import platform
import random
import re
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

PAGE = 4096
SCHEMA = "fastcopy-bench/1"
DEFAULT_SIZES = "64:256M:x4"
QUICK_SIZES = "64:64M:x16"
UCX_SIZES = "4K:256M:x2"  # the sizes ucx_info -s prints
MIXED_OFFSETS = [0, 16, 64, 1024, 2048 + 16]
BASELINE = "np.copyto"

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

    A range without a step multiplies by 4. The result is sorted, without duplicates.
    """
    sizes: List[int] = []
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
                if factor <= 1:
                    raise ValueError(f"factor in '{part}' must be greater than 1")
                value = float(start)
                while round(value) <= stop:
                    sizes.append(int(round(value)))
                    value *= factor
            elif step[:1] == "+":
                inc = parse_size(step[1:])
                sizes.extend(range(start, stop + 1, inc))
            else:
                raise ValueError(f"cannot parse step '{step}' in '{part}' (use xFACTOR or +STEP)")
        else:
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


# ----------------------------------------------------------------------------- buffers

def aligned_buffer(nbytes: int, align: int = PAGE) -> np.ndarray:
    """A uint8 array of ``nbytes`` whose first byte is ``align``-aligned (numpy over-allocation)."""
    raw = np.empty(nbytes + align, dtype=np.uint8)
    skip = (-raw.ctypes.data) % align
    return raw[skip:skip + nbytes]


class Buffers:
    """A page-aligned source and a destination placed at each requested (dst - src) mod 4096."""

    def __init__(self, size: int, offsets: Sequence[int]):
        self.size = size
        self.src = aligned_buffer(size)
        self.src[:] = (np.arange(size, dtype=np.uint32) * 2654435761 >> 24).astype(np.uint8) if size <= 1 << 16 \
            else np.resize(np.arange(251, dtype=np.uint8), size)
        self._dst_raw = aligned_buffer(size + PAGE)
        self._dst_raw.fill(0)  # fault the pages in before timing
        self.dst = {off: self._dst_raw[off:off + size] for off in sorted(set(offsets))}


# ----------------------------------------------------------------------------- variants

class Variant:
    """A named way to copy; ``make(dst, src)`` returns a timer ``run(n) -> seconds`` for n copies."""

    def __init__(self, name: str, make: Callable[[np.ndarray, np.ndarray], Callable[[int], float]],
                 description: str):
        self.name, self.make, self.description = name, make, description


def _callable_timer(f: Callable[[Any, Any], Any]) -> Callable[[np.ndarray, np.ndarray], Callable[[int], float]]:
    def make(dst: np.ndarray, src: np.ndarray) -> Callable[[int], float]:
        pc = time.perf_counter

        def run(n: int) -> float:
            r = range(n)
            t0 = pc()
            for _ in r:
                f(dst, src)
            return pc() - t0
        return run
    return make


def _slice_timer(dst: np.ndarray, src: np.ndarray) -> Callable[[int], float]:
    pc = time.perf_counter

    def run(n: int) -> float:
        r = range(n)
        t0 = pc()
        for _ in r:
            dst[...] = src
        return pc() - t0
    return run


def _torch_module() -> Optional[Any]:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    # Idle OpenMP workers of torch spin for a while after each parallel copy; interleaved with the
    # other variants that spinning steals their CPU time. Passive waiting keeps the comparison fair
    # (an explicit OMP_WAIT_POLICY is respected). Only effective before torch's OpenMP starts.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import torch  # type: ignore[import-not-found]

        return torch
    except Exception:  # a broken torch install must not break the benchmark
        return None


def _torch_timer(torch: Any) -> Callable[[np.ndarray, np.ndarray], Callable[[int], float]]:
    def make(dst: np.ndarray, src: np.ndarray) -> Callable[[int], float]:
        tdst, tsrc = torch.from_numpy(dst), torch.from_numpy(src)
        pc = time.perf_counter

        def run(n: int) -> float:
            r = range(n)
            t0 = pc()
            for _ in r:
                tdst.copy_(tsrc)
            return pc() - t0
        return run
    return make


def available_variants(with_torch: bool = True, torch_threads: Optional[int] = None
                       ) -> Tuple[List[Variant], Dict[str, Any]]:
    """All variants usable here, and notes about them (torch version or why it is absent)."""
    import fastcopy

    out = [Variant("fastcopy", _callable_timer(fastcopy.copy), "fastcopy.copy: the automatic choice")]
    for name in fastcopy.kernels():
        out.append(Variant(f"fastcopy[{name}]", _callable_timer(fastcopy.kernel(name)),
                           f"fastcopy.kernel('{name}') forced"))
    out.append(Variant(BASELINE, _callable_timer(np.copyto), "numpy's np.copyto(dst, src)"))
    out.append(Variant("dst[...]=src", _slice_timer, "numpy slice assignment dst[...] = src"))
    notes: Dict[str, Any] = {"torch_version": None, "torch_threads": None}
    torch = _torch_module() if with_torch else None
    if torch is not None:
        out.append(Variant("torch.copy_", _torch_timer(torch), "torch.from_numpy(dst).copy_(torch.from_numpy(src))"))
        notes["torch_version"] = torch.__version__
        notes["torch_default_threads"] = torch.get_num_threads()
        notes["omp_wait_policy"] = os.environ.get("OMP_WAIT_POLICY")
        if torch_threads is None:  # the same parallelism budget as fastcopy's pool
            torch_threads = fastcopy.get_threads()
        if torch_threads:
            torch.set_num_threads(torch_threads)
        notes["torch_threads"] = torch.get_num_threads()
    else:
        notes["torch_missing"] = "not requested" if not with_torch else "torch is not importable"
    return out, notes


def select_variants(all_variants: List[Variant], spec: Optional[str]) -> List[Variant]:
    """``spec`` is a comma list of names; ``kernels`` selects every fastcopy[...] kernel, ``all`` everything."""
    if not spec:
        return all_variants
    by_name = {v.name: v for v in all_variants}
    aliases = {"copyto": BASELINE, "slice": "dst[...]=src", "torch": "torch.copy_", "auto": "fastcopy"}
    chosen: List[Variant] = []
    for word in (w.strip() for w in spec.split(",")):
        if not word:
            continue
        if word == "all":
            names = [v.name for v in all_variants]
        elif word == "kernels":
            names = [v.name for v in all_variants if v.name.startswith("fastcopy[")]
        else:
            name = aliases.get(word, word)
            if name not in by_name and f"fastcopy[{name}]" in by_name:
                name = f"fastcopy[{name}]"
            if name not in by_name:
                raise ValueError(f"unknown variant '{word}' (usable here: {', '.join(by_name)})")
            names = [name]
        for n in names:
            if by_name[n] not in chosen:
                chosen.append(by_name[n])
    if not chosen:
        raise ValueError(f"no variant selected by '{spec}'")
    return chosen


# ----------------------------------------------------------------------------- NUMA and energy

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


def numa_report(buffers: Optional[Buffers] = None) -> Dict[str, Any]:
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


def _proc_cpuinfo_model() -> Optional[str]:
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
        "cpu_brand": info["cpu"].get("brand") or _proc_cpuinfo_model(),
        "cpu_model_name": _proc_cpuinfo_model(),
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


# ----------------------------------------------------------------------------- measurement

class Progress:
    """A one-line bar on stderr, shown only on a terminal and only once a run has taken ~2 s."""

    def __init__(self, total: int, enabled: Optional[bool] = None, delay: float = 2.0):
        self.total, self.done = max(total, 1), 0
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.start, self.delay, self.shown = time.monotonic(), delay, False

    def step(self, label: str, n: int = 1) -> None:
        self.done += n
        if not self.enabled or time.monotonic() - self.start < self.delay:
            return
        width = 30
        fill = int(width * self.done / self.total)
        sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {100 * self.done // self.total:3d}% {label:<24}")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\r" + " " * 64 + "\r")
            sys.stderr.flush()


def _calibrate(run: Callable[[int], float], min_time: float) -> int:
    """Loop length n with run(n) >= min_time (the first call doubles as the warm-up)."""
    run(1)
    n = 1
    while True:
        t = run(n)
        if t >= min_time:
            return n
        n = max(n * 2, int(math.ceil(n * min_time * 1.2 / max(t, 1e-9))))
        n = min(n, 1 << 30)


def _verify(dst: np.ndarray, src: np.ndarray) -> bool:
    if dst.size <= 1 << 22:
        return bool(np.array_equal(dst, src))
    step = 4099
    return bool(np.array_equal(dst[:1 << 16], src[:1 << 16]) and np.array_equal(dst[-(1 << 16):], src[-(1 << 16):])
                and np.array_equal(dst[::step], src[::step]))


def run_bench(sizes: Sequence[int], variants: Sequence[Variant], repeats: int = 5, min_time: float = 0.02,
              offsets: Sequence[int] = (0,), energy: Optional[Rapl] = None,
              progress: Optional[Progress] = None) -> List[Dict[str, Any]]:
    """Measure every (size, variant); return one result dict per pair with all samples."""
    from . import _core

    import fastcopy

    results: List[Dict[str, Any]] = []
    threads = fastcopy.get_threads()
    parallel_from = _core.parallel_threshold()
    use_energy = energy is not None and energy.available
    shuffle = random.Random(12345)
    for size in sizes:
        if progress is not None:
            progress.step(f"{human_size(size)} (warm-up)", 0)
        bufs = Buffers(size, offsets)
        src = bufs.src
        runs: Dict[Tuple[str, int], Callable[[int], float]] = {}
        iters: Dict[str, int] = {}
        verified: Dict[str, bool] = {}
        for v in variants:
            ok = True
            for off, dst in bufs.dst.items():
                dst.fill(0)
                runs[(v.name, off)] = v.make(dst, src)
                runs[(v.name, off)](1)
                ok = ok and _verify(dst, src)
            verified[v.name] = ok
            iters[v.name] = _calibrate(runs[(v.name, offsets[0])], min_time)
        chosen: Dict[int, Optional[str]] = {}
        for off, dst in bufs.dst.items():
            try:
                chosen[off] = _core.chosen_kernel(dst.ctypes.data, src.ctypes.data, size)
            except Exception:
                chosen[off] = None
        samples: Dict[str, List[Dict[str, Any]]] = {v.name: [] for v in variants}
        for r in range(repeats):
            off = offsets[r % len(offsets)]
            order = list(variants)
            shuffle.shuffle(order)  # a new order every repeat: no variant always goes first or after another
            for v in order:
                n = iters[v.name]
                e0 = energy.read() if use_energy else None  # type: ignore[union-attr]
                t = runs[(v.name, off)](n)
                joules = energy.joules(e0, energy.read()) if use_energy else None  # type: ignore[union-attr,arg-type]
                samples[v.name].append({"repeat": r, "offset": off, "iterations": n, "seconds": t,
                                        "gbps": size * n / t / 1e9, "joules": joules})
            if progress is not None:
                progress.step(f"{human_size(size)} ({r + 1}/{repeats})")
        base = None
        if any(v.name == BASELINE for v in variants):
            base = statistics.median(s["gbps"] for s in samples[BASELINE])
        numa = numa_report(bufs) if size >= 1 << 20 else None
        for v in variants:
            g = [s["gbps"] for s in samples[v.name]]
            med = statistics.median(g)
            res: Dict[str, Any] = {
                "size": size, "variant": v.name, "iterations": iters[v.name], "verified": verified[v.name],
                "offsets": [s["offset"] for s in samples[v.name]],
                "median_gbps": med, "min_gbps": min(g), "max_gbps": max(g),
                "ratio_to_copyto": (med / base) if base else None,
                "samples": samples[v.name],
            }
            if v.name == "fastcopy":
                res["chosen_kernel"] = {str(o): c for o, c in chosen.items()}
                res["threads_used"] = threads if (threads > 1 and parallel_from is not None
                                                  and size >= parallel_from) else 1
            if use_energy:
                j = sum(s["joules"] for s in samples[v.name])
                nbytes = size * sum(s["iterations"] for s in samples[v.name])
                res["joules"] = j
                res["gb_per_joule"] = nbytes / 1e9 / j if j > 0 else None
            if numa is not None:
                res["numa"] = numa
            results.append(res)
        del bufs, runs
    return results


# ----------------------------------------------------------------------------- output

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
        f"ratio = median / median of {BASELINE}; caches are warm (the same buffers every iteration)",
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
