"""``python -m fastcopy bench --batch``: batched copies against numpy (and torch).

Each case copies many arrays in one call: ``fastcopy.stack`` against ``np.stack`` and
``torch.stack`` (same ``out=`` when the case has one), ``fastcopy.concatenate`` against
``np.concatenate`` and ``torch.cat``, ``fastcopy.copy_many`` against a loop of ``np.copyto``.
Every repeat times every variant of a case, in rotating order, so drift and other processes
hit them alike; the table gives the medians and the ratios of the medians. torch gets the
thread count fastcopy uses (``torch.set_num_threads``), the same parallelism budget.

Targets: stacking 64 arrays of 256 KiB into ``out=``: at least 1.5x ``np.stack``
and 1.0x ``torch.stack``; stacking 1000 arrays of 1 KiB: at least 3x ``np.stack``.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

import fastcopy
from .engine import repeat_order

# name -> (what, count, bytes per array, out=?)
CASES: Dict[str, Dict[str, Any]] = {
    "stack_64x256K_out": {"op": "stack", "count": 64, "nbytes": 256 << 10, "out": True},
    "stack_1000x1K": {"op": "stack", "count": 1000, "nbytes": 1 << 10, "out": False},
    "concatenate_64x256K_out": {"op": "concatenate", "count": 64, "nbytes": 256 << 10, "out": True},
    "copy_many_64x256K": {"op": "copy_many", "count": 64, "nbytes": 256 << 10, "out": True},
    "copy_many_1000x1K": {"op": "copy_many", "count": 1000, "nbytes": 1 << 10, "out": True},
}
# Speed targets: (case, other variant, least ratio other/fastcopy).
TARGETS = [("stack_64x256K_out", "numpy", 1.5), ("stack_64x256K_out", "torch", 1.0),
           ("stack_1000x1K", "numpy", 3.0)]


def _torch(threads: Optional[int]) -> Optional[Any]:
    from .engine import torch_module

    torch = torch_module()
    if torch is not None and threads != 0:
        torch.set_num_threads(threads or fastcopy.get_threads())
    return torch


def _variants(case: Dict[str, Any], torch: Optional[Any]) -> Dict[str, Callable[[], Any]]:
    """The calls to time for one case (fresh inputs, float64, like a batch of samples)."""
    count, n = case["count"], case["nbytes"] // 8
    rng = np.random.default_rng(0)
    xs = [rng.random(n) for _ in range(count)]
    op = case["op"]
    calls: Dict[str, Callable[[], Any]] = {}
    if op == "copy_many":
        dsts = [np.empty(n) for _ in range(count)]
        np_copyto = np.copyto

        def np_loop() -> None:
            for d, s in zip(dsts, xs):
                np_copyto(d, s)
        calls["fastcopy"] = lambda: fastcopy.copy_many(dsts, xs)
        calls["numpy"] = np_loop
        return calls
    shape = (count, n) if op == "stack" else (count * n,)
    out = np.empty(shape) if case["out"] else None
    fc_op, np_op = getattr(fastcopy, op), getattr(np, op)
    if out is not None:
        calls["fastcopy"] = lambda: fc_op(xs, out=out)
        calls["numpy"] = lambda: np_op(xs, out=out)
    else:
        calls["fastcopy"] = lambda: fc_op(xs)
        calls["numpy"] = lambda: np_op(xs)
    if torch is not None:
        ts = [torch.from_numpy(x) for x in xs]
        t_op = torch.stack if op == "stack" else torch.cat
        if out is not None:
            tout = torch.from_numpy(out)
            calls["torch"] = lambda: t_op(ts, out=tout)
        else:
            calls["torch"] = lambda: t_op(ts)
    return calls


def _loops_for(call: Callable[[], Any], min_time: float) -> int:
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        if time.perf_counter() - t0 >= min_time or n >= 1 << 20:
            return n
        n *= 2


def run_batch_bench(cases: Optional[Sequence[str]] = None, repeats: int = 11, min_time: float = 0.02,
                    torch_threads: Optional[int] = None, with_torch: bool = True) -> Dict[str, Any]:
    """{'cases': {name: {'bytes', 'seconds': {variant: [per-call seconds per repeat]}}}, 'torch': ...}."""
    names = list(cases) if cases else list(CASES)
    for name in names:
        if name not in CASES:
            raise ValueError(f"unknown batch case {name!r}; valid: {', '.join(CASES)}")
    torch = _torch(torch_threads) if with_torch else None
    result: Dict[str, Any] = {
        "threads": fastcopy.get_threads(),
        "torch_version": getattr(torch, "__version__", None),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "repeats": repeats,
        "cases": {},
    }
    for name in names:
        case = CASES[name]
        calls = _variants(case, torch)
        loops = {v: _loops_for(c, min_time) for v, c in calls.items()}
        order = list(calls)
        seconds: Dict[str, List[float]] = {v: [] for v in order}
        for r in range(repeats):
            for v in repeat_order(order, r):  # none always first or after the same one
                c, n = calls[v], loops[v]
                t0 = time.perf_counter()
                for _ in range(n):
                    c()
                seconds[v].append((time.perf_counter() - t0) / n)
        result["cases"][name] = {"bytes": case["count"] * case["nbytes"], "count": case["count"],
                                 "array_bytes": case["nbytes"], "seconds": seconds}
    return result


def ratios(result: Dict[str, Any]) -> Dict[str, Dict[str, float]]:
    """{case: {variant: median(variant) / median(fastcopy)}}: > 1 means fastcopy is faster."""
    out: Dict[str, Dict[str, float]] = {}
    for name, c in result["cases"].items():
        fc = statistics.median(c["seconds"]["fastcopy"])
        out[name] = {v: statistics.median(s) / fc for v, s in c["seconds"].items() if v != "fastcopy"}
    return out


def check_targets(result: Dict[str, Any]) -> List[str]:
    """The speed targets (TARGETS): one line each, 'met' or 'MISSED' (skipped when not measured)."""
    lines = []
    r = ratios(result)
    for case, other, least in TARGETS:
        got = r.get(case, {}).get(other)
        if got is None:
            lines.append(f"{case} vs {other}: not measured")
        else:
            lines.append(f"{case} vs {other}: {got:.2f}x (target >= {least}x) {'met' if got >= least else 'MISSED'}")
    return lines


def format_batch_table(result: Dict[str, Any]) -> str:
    r = ratios(result)
    variants = ["fastcopy", "numpy", "torch"]
    lines = [f"batched copies: medians of {result['repeats']} interleaved repeats; fastcopy threads "
             f"{result['threads']}, torch {result['torch_version'] or 'not installed'}"
             + (f" ({result['torch_threads']} threads)" if result["torch_threads"] else ""),
             f"{'case':<26}{'fastcopy ms':>12}{'numpy ms':>10}{'torch ms':>10}{'GB/s fc':>9}"
             f"{'vs numpy':>10}{'vs torch':>10}"]
    for name, c in result["cases"].items():
        med = {v: statistics.median(c["seconds"][v]) if v in c["seconds"] else None for v in variants}
        cells = "".join(f"{m * 1e3:>{w}.3f}" if m is not None else f"{'-':>{w}}"
                        for m, w in zip(med.values(), (12, 10, 10)))
        gbs = c["bytes"] / med["fastcopy"] / 1e9
        vs = "".join(f"{r[name][v]:>9.2f}x" if v in r[name] else f"{'-':>10}" for v in ("numpy", "torch"))
        lines.append(f"{name:<26}{cells}{gbs:>9.1f}{vs}")
    lines.append("vs X: median time of X / median time of fastcopy (> 1: fastcopy is faster); numpy for "
                 "copy_many is a loop of np.copyto")
    lines.extend(check_targets(result))
    return "\n".join(lines)


def run_cli(parser: Any, args: Any, argv: Sequence[str]) -> int:
    """``python -m fastcopy bench --batch``: repeats, min-time, quick, torch-threads and json apply
    (threads and cpus were applied by the bench command); the other options are refused."""
    for option, given in (("--sizes", bool(args.sizes)), ("--variants", args.variants is not None),
                          ("--offset", args.offset is not None), ("--offsets", args.offsets is not None),
                          ("--plot", bool(args.plot)), ("--format ucx", args.format == "ucx"),
                          ("--ipc", args.ipc)):
        if given:
            parser.error(f"argument --batch: {option} does not apply to the batched-copy benchmark")
    results = run_batch_bench(repeats=args.repeats or (3 if args.quick else 11),
                              min_time=args.min_time or (0.01 if args.quick else 0.02),
                              torch_threads=args.torch_threads)
    print(format_batch_table(results))
    if args.json:
        from .system import metadata

        doc = metadata([sys.executable, "-m", "fastcopy"] + list(argv))
        doc.update({"kind": "batch", "results": results})
        from .cli import save_json

        return save_json(args.json, doc, "the batched-copy results")
    return 0
