"""Plots for ``bench --plot`` and ``compare --plot`` (matplotlib: the optional extra ``plot``)."""

from __future__ import annotations

import importlib.util
import math
from typing import Any, Dict, List

from .units import human_size


def have_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _size_axis(ax: Any, sizes: List[int]) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted(set(sizes))
    if len(ticks) > 12:
        step = (len(ticks) + 11) // 12
        ticks = ticks[::step]
    ax.set_xticks(ticks)
    ax.set_xticklabels([human_size(s).replace(" ", "\u2009") for s in ticks], rotation=45, ha="right")
    ax.minorticks_off()
    ax.set_xlabel("copy size")
    ax.grid(True, alpha=0.3)


def plot_bench(results: List[Dict[str, Any]], path: str, title: str = "") -> None:
    """Bandwidth vs size (log axes), one line per variant, the min-max band shaded; below it,
    when np.copyto was measured, each variant's median divided by np.copyto's."""
    plt = _pyplot()
    has_ratio = any(r.get("ratio_to_copyto") for r in results)
    if has_ratio:
        fig, (ax, ax2) = plt.subplots(2, 1, figsize=(8, 7), dpi=80, sharex=True,
                                      gridspec_kw={"height_ratios": [2, 1]})
    else:
        fig, ax = plt.subplots(figsize=(8, 4.8), dpi=80)
        ax2 = None
    by_variant: Dict[str, List[Dict[str, Any]]] = {}
    for r in results:
        by_variant.setdefault(r["variant"], []).append(r)
    for name, rows in by_variant.items():
        rows = sorted(rows, key=lambda r: r["size"])
        x = [r["size"] for r in rows]
        style: Dict[str, Any] = {"linewidth": 2.4} if name == "fastcopy" else {"linewidth": 1.2}
        if name == "np.copyto":
            style["linestyle"] = "--"
        line, = ax.plot(x, [r["median_gbps"] for r in rows], marker="o", markersize=3, label=name, **style)
        ax.fill_between(x, [r["min_gbps"] for r in rows], [r["max_gbps"] for r in rows],
                        color=line.get_color(), alpha=0.15, linewidth=0)
        if ax2 is not None:
            ax2.plot(x, [r.get("ratio_to_copyto") or float("nan") for r in rows], marker="o", markersize=3,
                     color=line.get_color(), **style)
    ax.set_yscale("log")
    ax.set_ylabel("GB/s, bytes counted once\n(median; min-max shaded)")
    ax.grid(True, which="both", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    if by_variant:
        ax.legend(fontsize=8, ncol=2)
    if ax2 is not None:
        ax2.set_yscale("log", base=2)
        ax2.axhline(1, color="black", linewidth=0.8)
        ax2.set_ylabel("median / np.copyto")
        ratios = [r["ratio_to_copyto"] for r in results if r.get("ratio_to_copyto")]
        lo, hi = math.floor(math.log2(min(ratios))), math.ceil(math.log2(max(ratios)))
        ticks = [2.0 ** k for k in range(lo, hi + 1)]
        ax2.set_yticks(ticks)
        ax2.set_yticklabels([f"{t:g}x" for t in ticks])
        ax2.minorticks_off()
        _size_axis(ax2, [r["size"] for r in results])
    else:
        _size_axis(ax, [r["size"] for r in results])
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_compare(rows: List[Dict[str, Any]], path: str, title: str = "") -> None:
    """Change of the median (new / base - 1, percent) vs size, one line per variant."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=90)
    by_variant: Dict[str, List[Dict[str, Any]]] = {}
    for r in rows:
        by_variant.setdefault(r["variant"], []).append(r)
    for name, rs in by_variant.items():
        rs = sorted(rs, key=lambda r: r["size"])
        line, = ax.plot([r["size"] for r in rs], [(r["ratio"] - 1) * 100 for r in rs], marker="o", markersize=3,
                        label=name)
        sig = [r for r in rs if r["significant"]]
        ax.scatter([r["size"] for r in sig], [(r["ratio"] - 1) * 100 for r in sig], s=40, facecolors="none",
                   edgecolors=line.get_color())
    ax.axhline(0, color="black", linewidth=0.8)
    _size_axis(ax, [r["size"] for r in rows] or [1])
    ax.set_ylabel("change of median GB/s, % (circled: beyond spread)")
    if title:
        ax.set_title(title, fontsize=10)
    if by_variant:
        ax.legend(fontsize=8, ncol=2)
    else:
        ax.text(0.5, 0.5, "no size and variant in common", transform=ax.transAxes, ha="center")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
