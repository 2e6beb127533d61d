"""``python -m fastcopy bench --loader``: batches per second of ``fastcopy.torch.Loader``
against ``torch.utils.data.DataLoader`` (same dataset, same worker count, pin_memory=False),
for batches of images (64 x 3x224x224 uint8) and of feature rows (256 x 1024 float32) from a
dataset whose ``__getitem__`` only returns a stored array.

Each repeat runs one epoch of every variant, in rotating order (engine.repeat_order), and
times the batches after the first (the workers' start is not counted); the table gives the
medians and the ratio of the medians. Target: at least 1.3x DataLoader's batches per second
for the images, no slower for the rows (evidence: bench-loader-vs-dataloader).
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Dict, List, Sequence

import numpy as np

from .engine import repeat_order

# name -> sample shape, dtype, batch size, batches timed per epoch
CASES: Dict[str, Dict[str, Any]] = {
    "images_64x3x224x224_u8": {"shape": (3, 224, 224), "dtype": "uint8", "batch": 64, "batches": 30},
    "rows_256x1024_f32": {"shape": (1024,), "dtype": "float32", "batch": 256, "batches": 150},
}
# (case, least ratio fastcopy/DataLoader of the median batches per second)
TARGETS = [("images_64x3x224x224_u8", 1.3), ("rows_256x1024_f32", 1.0)]
VARIANTS = ("fastcopy", "DataLoader")


class StoredArrays:
    """A dataset whose __getitem__ only returns one of `distinct` stored arrays."""

    def __init__(self, shape: Sequence[int], dtype: str, length: int, distinct: int) -> None:
        rng = np.random.default_rng(0)
        self.items = [rng.integers(0, 255, size=tuple(shape)).astype(dtype) for _ in range(distinct)]
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> np.ndarray:
        return self.items[i % len(self.items)]


def _epoch(loader: Any) -> float:
    """Batches per second of one epoch of `loader`, from its first batch on."""
    it = iter(loader)
    next(it)
    t0 = time.perf_counter()
    n = 0
    for _ in it:
        n += 1
    return n / (time.perf_counter() - t0)


def run_loader_bench(repeats: int = 5, workers: int = 2, quick: bool = False) -> Dict[str, Any]:
    import torch

    from ..torch import Loader

    rows = []
    for name, case in CASES.items():
        batches = case["batches"] // (3 if quick else 1)
        ds = StoredArrays(case["shape"], case["dtype"], case["batch"] * (batches + 1), case["batch"])
        make = {
            "fastcopy": lambda: Loader(ds, batch_size=case["batch"], num_workers=workers),
            "DataLoader": lambda: torch.utils.data.DataLoader(ds, batch_size=case["batch"], num_workers=workers,
                                                              pin_memory=False),
        }
        rates: Dict[str, List[float]] = {v: [] for v in VARIANTS}
        for r in range(repeats):
            for v in repeat_order(VARIANTS, r):
                rates[v].append(_epoch(make[v]()))
        med = {v: statistics.median(rates[v]) for v in VARIANTS}
        rows.append({"case": name, "batches": batches, "rates": rates, "median": med,
                     "ratio": med["fastcopy"] / med["DataLoader"]})
    return {"config": {"repeats": repeats, "workers": workers, "quick": quick}, "rows": rows}


def format_loader_table(results: Dict[str, Any]) -> str:
    targets = dict(TARGETS)
    lines = [f"{'case':<26} {'fastcopy b/s':>13} {'DataLoader b/s':>15} {'ratio':>7}  target",
             "-" * 72]
    for row in results["rows"]:
        m = row["median"]
        want = targets.get(row["case"])
        verdict = "" if want is None else f">= {want:g}x " + ("met" if row["ratio"] >= want else "MISSED")
        lines.append(f"{row['case']:<26} {m['fastcopy']:>13.1f} {m['DataLoader']:>15.1f} {row['ratio']:>6.2f}x  "
                     f"{verdict}")
    cfg = results["config"]
    lines.append(f"medians of {cfg['repeats']} interleaved epochs, {cfg['workers']} workers each, pin_memory=False")
    return "\n".join(lines)


def run_cli(parser: Any, args: Any, argv: Sequence[str]) -> int:
    """``python -m fastcopy bench --loader``: repeats, quick and json apply; the others are refused."""
    for option, given in (("--sizes", bool(args.sizes)), ("--variants", args.variants is not None),
                          ("--offset", args.offset is not None), ("--offsets", args.offsets is not None),
                          ("--plot", bool(args.plot)), ("--format ucx", args.format == "ucx"),
                          ("--ipc", args.ipc), ("--batch", args.batch), ("--min-time", args.min_time is not None)):
        if given:
            parser.error(f"argument --loader: {option} does not apply to the loader benchmark")
    from .engine import torch_module

    if torch_module() is None:
        parser.error("argument --loader: needs torch, which is not installed (pip install 'fastcopy[torch]')")
    results = run_loader_bench(repeats=args.repeats or (3 if args.quick else 5), quick=args.quick)
    print(format_loader_table(results))
    if args.json:
        from .cli import save_json
        from .system import metadata

        doc = metadata([sys.executable, "-m", "fastcopy"] + list(argv))
        doc.update({"kind": "loader", "results": results})
        return save_json(args.json, doc, "the loader results")
    return 0
