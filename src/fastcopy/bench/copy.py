"""The copy benchmark, ``python -m fastcopy bench``: every variant that copies (fastcopy's
automatic choice, each forced kernel, numpy, torch) at every size, hot or cold, timed by the
engine (``fastcopy.bench.engine``) in a new order every repeat, with medians, spreads, the ratio
to ``np.copyto``, energy (RAPL) and where the buffers' pages live (NUMA)."""

from __future__ import annotations

import os
import random
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .engine import (Buffers, Progress, Timer, cache_sizes, calibrate, loop_timer, rotating_timer,
                     torch_module)
from .system import Rapl, numa_report
from .units import human_size

BASELINE = "np.copyto"


# ----------------------------------------------------------------------------- variants

class Variant:
    """A named way to copy. ``make(dst, src)`` returns a timer ``run(n) -> seconds`` for n copies
    of the same buffers (hot); ``make_rotating(pairs)`` one whose n copies walk the (dst, src)
    pairs in turn (cold)."""

    def __init__(self, name: str, make: Callable[[np.ndarray, np.ndarray], Timer], description: str,
                 make_rotating: Optional[Callable[[List[Tuple[np.ndarray, np.ndarray]]], Timer]] = None):
        self.name, self.make, self.description = name, make, description
        self.make_rotating = make_rotating

    def timer(self, bufs: "Buffers", offset: int) -> Timer:
        """The timer for these buffers at this offset, in their cache mode."""
        if bufs.count == 1:
            return self.make(bufs.dst[offset], bufs.src)
        if self.make_rotating is None:
            raise ValueError(f"variant {self.name} cannot run with a cold cache")
        return self.make_rotating(bufs.pairs(offset))


def _slice_assign(d: np.ndarray, s: np.ndarray) -> None:
    d[...] = s


def _slice_timer(dst: np.ndarray, src: np.ndarray) -> Callable[[int], float]:
    pc = time.perf_counter

    def run(n: int) -> float:
        r = range(n)
        t0 = pc()
        for _ in r:
            dst[...] = src
        return pc() - t0
    return run


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


def _torch_rotating(torch: Any) -> Callable[[List[Tuple[np.ndarray, np.ndarray]]], Timer]:
    def make(pairs: List[Tuple[np.ndarray, np.ndarray]]) -> Timer:
        tpairs = [(torch.from_numpy(d), torch.from_numpy(s)) for d, s in pairs]
        return rotating_timer(lambda d, s: d.copy_(s))(tpairs)
    return make


def callable_variant(name: str, f: Callable[[Any, Any], Any], description: str) -> Variant:
    """A variant that copies with ``f(dst, src)``, hot or cold."""
    return Variant(name, loop_timer(f), description, rotating_timer(f))


def available_variants(with_torch: bool = True, torch_threads: Optional[int] = None
                       ) -> Tuple[List[Variant], Dict[str, Any]]:
    """All variants usable here, and notes about them (torch version or why it is absent)."""
    import fastcopy

    out = [callable_variant("fastcopy", fastcopy.copy, "fastcopy.copy: the automatic choice")]
    for name in fastcopy.kernels():
        out.append(callable_variant(f"fastcopy[{name}]", fastcopy.kernel(name), f"fastcopy.kernel('{name}') forced"))
    out.append(callable_variant(BASELINE, np.copyto, "numpy's np.copyto(dst, src)"))
    out.append(Variant("dst[...]=src", _slice_timer, "numpy slice assignment dst[...] = src",
                       rotating_timer(_slice_assign)))
    notes: Dict[str, Any] = {"torch_version": None, "torch_threads": None}
    torch = torch_module() if with_torch else None
    if torch is not None:
        out.append(Variant("torch.copy_", _torch_timer(torch), "torch.from_numpy(dst).copy_(torch.from_numpy(src))",
                           _torch_rotating(torch)))
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

def _verify(dst: np.ndarray, src: np.ndarray) -> bool:
    if dst.size <= 1 << 22:
        return bool(np.array_equal(dst, src))
    step = 4099
    return bool(np.array_equal(dst[:1 << 16], src[:1 << 16]) and np.array_equal(dst[-(1 << 16):], src[-(1 << 16):])
                and np.array_equal(dst[::step], src[::step]))


def run_bench(sizes: Sequence[int], variants: Sequence[Variant], repeats: int = 5, min_time: float = 0.02,
              offsets: Sequence[int] = (0,), energy: Optional[Rapl] = None,
              progress: Optional[Progress] = None, cache: str = "hot") -> List[Dict[str, Any]]:
    """Measure every (size, variant); return one result dict per pair with all samples."""
    import fastcopy

    from .. import _core

    results: List[Dict[str, Any]] = []
    threads = fastcopy.get_threads()
    parallel_from = _core.parallel_threshold()
    use_energy = energy is not None and energy.available
    shuffle = random.Random(12345)
    l3 = cache_sizes()[1]
    for size in sizes:
        if progress is not None:
            progress.step(f"{human_size(size)} (warm-up)", 0)
        bufs = Buffers(size, offsets, cache=cache, l3=l3)
        src = bufs.src
        runs: Dict[Tuple[str, int], Timer] = {}
        iters: Dict[str, int] = {}
        verified: Dict[str, bool] = {}
        for v in variants:
            ok = True
            for off, dst in bufs.dst.items():
                for d in bufs.dsts[off]:
                    d.fill(0)
                runs[(v.name, off)] = v.timer(bufs, off)
                runs[(v.name, off)](bufs.count)  # one pass over the rotation (hot: one copy)
                ok = ok and _verify(dst, src) and _verify(bufs.dsts[off][-1], bufs.srcs[-1])
            verified[v.name] = ok
            iters[v.name] = calibrate(runs[(v.name, offsets[0])], min_time)
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
                "cache": cache,
                "samples": samples[v.name],
            }
            if cache == "cold":
                res["rotation_buffers"] = bufs.count
                res["rotation_bytes"] = bufs.rotation_bytes
                res["rotation_exceeds_l3"] = bufs.rotation_bytes > l3
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


