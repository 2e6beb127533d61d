"""Fan-out benchmark: fastcopy.shm.Topic with 1 and 2 subscribers against a Channel with one consumer.

``run_topic_bench(sizes)`` starts two receiver processes (``spawn``) once and, for each size and
repeat, interleaved, measures one-way throughput of:

* ``channel``: Channel, ``send`` and ``recv(out=buf)`` into a reused array (one consumer);
* ``topic1``: Topic with one subscriber, ``send`` and ``recv(out=buf)``;
* ``topic2``: Topic with two subscribers, each receiving every message;
* ``channel_view``, ``topic1_view``, ``topic2_view``: the same three with zero copy: the sender
  fills a ``loan()`` (``view_fill``: ``np.copyto``, i.e. glibc's memmove, or ``fastcopy.copy``,
  as in the IPC benchmark) and publishes it; each receiver takes ``recv_view()`` and drops it.

A run: the receivers attach (or subscribe) and say they are ready; the parent takes the time,
sends N messages of ``size`` bytes (a reused uint8 array) and each receiver reports the
CLOCK_MONOTONIC time (system-wide on Linux) when it has the last one; per-receiver throughput
= N * size / (its end - start). N is chosen so that one run moves about ``min_time`` x 2 GB.
Both get what a user gets by default: the Channel an 8 MiB ring (for views, where a loan must
fit whole, room for at least four messages: 64 MiB at 16 MiB), the topic ``slot_bytes = size``
and the default number of slots (as many as hold 4 MiB, 4 to 1024: see ``Topic.create``).
Reported per size: the median per-subscriber GB/s of each configuration over the repeats
(two subscribers: the slower of the two in each run), the ratio of each Topic median to the
median of the Channel that moves data the same way (``BASELINES``: copies against
``channel``, views against ``channel_view``) and, as for the IPC benchmark, the middle half of
the ratios of the repeats taken in pairs (each repeat runs every configuration once, one after
the other). ``python -m fastcopy bench --ipc --variants topic`` runs it and prints
``format_topic_table``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np

from .. import _core
from . import system
from .engine import SPREAD_DISAGREES_NOTE, order_balance_words, paired_spread, ratio_words, repeat_order

__all__ = ["run_topic_bench", "format_topic_table", "DEFAULT_TOPIC_SIZES", "CONFIGS", "BASELINES"]

DEFAULT_TOPIC_SIZES = (64 << 10, 1 << 20, 16 << 20)
CONFIGS = ("channel", "topic1", "topic2", "channel_view", "topic1_view", "topic2_view")
# Each Topic configuration against the Channel that moves data the same way.
BASELINES = {"topic1": "channel", "topic2": "channel", "topic1_view": "channel_view", "topic2_view": "channel_view"}
_HOW = {"channel": "send + recv(out=)", "channel_view": "loan + recv_view"}
_RING_BYTES = 8 << 20
_BYTES_PER_SECOND_GUESS = 2e9  # sizes the runs; the measured figure does not depend on it


def _channel_capacity(size: int, views: bool) -> int:
    """The default ring; loans must fit whole, so for views at least four (page-aligned)
    messages, as the topic's default has at least four slots."""
    return max(_RING_BYTES, 4 * (size + 4096)) if views else _RING_BYTES


def _receiver(conn: Any) -> None:  # pragma: no cover - runs in the child
    from fastcopy.shm import Channel, Topic

    from .engine import exit_with_parent

    exit_with_parent()
    while True:
        cmd = conn.recv()
        if cmd is None:
            return
        kind, views, name, count, size = cmd
        end = Channel.attach(name) if kind == "channel" else Topic.subscribe(name)
        out = np.empty(size, np.uint8)
        conn.send("ready")  # attached (topic: subscribed, so it gets every message from here)
        if views:
            for _ in range(count):
                end.recv_view(timeout=60)  # dropped at once: its slot is released
        else:
            for _ in range(count):
                end.recv(out=out, timeout=60)
        conn.send(time.monotonic())
        end.close()


def _one_run(config: str, receivers: Sequence[Any], size: int, count: int, view_fill: str) -> List[float]:
    from fastcopy import copy as fast_copy
    from fastcopy.shm import Channel, Topic

    kind = "channel" if config.startswith("channel") else "topic"
    views = config.endswith("_view")
    fill = fast_copy if view_fill == "fastcopy" else np.copyto

    name = f"fastcopy-topicbench-{os.getpid()}-{time.monotonic_ns()}"
    msg = np.full(size, 7, np.uint8)
    if kind == "channel":
        end: Any = Channel.create(name, capacity=_channel_capacity(size, views))
    else:
        end = Topic.create(name, slot_bytes=size)
    try:
        for conn in receivers:
            conn.send((kind, views, name, count, size))
        for conn in receivers:
            if conn.recv() != "ready":
                raise RuntimeError("topic benchmark: a receiver failed")
        start = time.monotonic()
        if views:
            for _ in range(count):
                with end.loan(msg.shape, msg.dtype, timeout=60) as loaned:
                    fill(loaned, msg)
        else:
            for _ in range(count):
                end.send(msg, timeout=60)
        return [count * size / (conn.recv() - start) / 1e9 for conn in receivers]
    finally:
        end.close()
        end.unlink()


def run_topic_bench(sizes: Iterable[int] = DEFAULT_TOPIC_SIZES, repeats: int = 5, min_time: float = 0.2,
                    configs: Sequence[str] = CONFIGS, view_fill: str = "memmove") -> Dict[str, Any]:
    """Per-subscriber throughput of Channel (1 consumer) and Topic (1 and 2 subscribers), with
    copies and with zero copy.

    Returns a JSON-serialisable dict: ``config`` (with ``view_fill``, ``channel_view_capacity``
    and ``topic_slots``: each size's ring for channel_view and default slot count, which the
    topics get), ``rows`` (per config and size:
    ``config``, ``size``, ``messages``, ``gbps`` (median per-subscriber GB/s), ``runs`` (every
    run's per-subscriber figures)), ``ratios`` (per size and Topic configuration: its median
    over the median of its baseline, ``BASELINES``) and ``spreads`` (the same keys: the middle
    half of the per-repeat ratios to the baseline, see
    :func:`fastcopy.bench.engine.paired_spread`; absent with one repeat) and ``cpu_distance``
    (a probe of how far apart the first two CPUs are, before each repeat of each size: see
    :func:`fastcopy.bench.system.cpu_distance_record`).
    """
    from .ipc_transports import VIEW_FILLS

    sizes = [int(s) for s in sizes]
    for c in configs:
        if c not in CONFIGS:
            raise ValueError(f"unknown topic benchmark configuration {c!r}; choose from {', '.join(CONFIGS)}")
    if view_fill not in VIEW_FILLS:
        raise ValueError(f"unknown view_fill {view_fill!r}; choose from {', '.join(VIEW_FILLS)}")
    if repeats < 1 or min_time <= 0 or any(s < 1 for s in sizes):
        raise ValueError("repeats must be >= 1, min_time > 0 and sizes >= 1")
    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe() for _ in range(2)]
    procs = [ctx.Process(target=_receiver, args=(child,), daemon=True) for _, child in pipes]
    for p in procs:
        p.start()
    runs: Dict[tuple, List[List[float]]] = {(c, s): [] for c in configs for s in sizes}
    pair = system.cpu_pair()
    distance: List[Optional[float]] = []  # one probe before each repeat of each size
    counts = {s: max(8, min(50_000, int(min_time * _BYTES_PER_SECOND_GUESS / s))) for s in sizes}
    try:
        for r in range(repeats):  # interleaved: every configuration sees the same machine state
            for s in sizes:
                distance.append(system.cache_line_round_trip(pair))
                for c in repeat_order(configs, r):  # none always first or after the same one
                    receivers = [parent for parent, _ in pipes[:_subscribers(c)]]
                    runs[(c, s)].append(_one_run(c, receivers, s, counts[s], view_fill))
    finally:
        for parent, _ in pipes:
            try:
                parent.send(None)
            except OSError:
                pass
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    rows = []
    medians: Dict[tuple, float] = {}
    for (c, s), per_run in runs.items():
        medians[(c, s)] = statistics.median(min(r) for r in per_run)  # two subscribers: the slower one
        rows.append({"config": c, "size": s, "messages": counts[s], "gbps": medians[(c, s)], "runs": per_run})
    ratios: Dict[int, Dict[str, float]] = {}
    spreads: Dict[int, Dict[str, List[float]]] = {}
    for s in sizes:
        for c in configs:
            base = BASELINES.get(c)
            if base is None or (base, s) not in medians:
                continue
            ratios.setdefault(s, {})[c] = medians[(c, s)] / medians[(base, s)]
            spread = paired_spread([min(r) for r in runs[(c, s)]], [min(r) for r in runs[(base, s)]])
            if spread:
                spreads.setdefault(s, {})[c] = spread
    try:
        load = list(os.getloadavg())
    except OSError:  # pragma: no cover
        load = []
    return {"config": {"sizes": sizes, "repeats": repeats, "min_time": min_time, "configs": list(configs),
                       "view_fill": view_fill, "channel_capacity": _RING_BYTES,
                       "channel_view_capacity": {s: _channel_capacity(s, True) for s in sizes},
                       "topic_slots": {s: _core._shm_default_topic_slots(s, 0) for s in sizes}, "loadavg": load},
            "rows": rows, "ratios": ratios, "spreads": spreads, "cpu_distance": system.cpu_distance_record(pair, distance)}


def _subscribers(config: str) -> int:
    return 2 if config.startswith("topic2") else 1


def _size_words(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def format_topic_table(results: Dict[str, Any]) -> str:
    """The medians as a table, one line per size and configuration: GB/s per subscriber and the
    ratio to its baseline Channel, with the middle half of the paired per-repeat ratios in
    brackets (marked ``!`` where the ratio lies far outside it: see
    :func:`fastcopy.bench.engine.ratio_words`)."""
    by = {(r["config"], r["size"]): r for r in results["rows"]}
    config = results["config"]
    spreads = results.get("spreads", {})
    lines = [f"Topic fan-out: per-subscriber throughput, median of {config['repeats']} runs (two subscribers: "
             f"the slower of each run); in brackets the middle half of the ratios of the repeats, paired",
             f"| {'Size':>7} | {'configuration':<13} | {'GB/s':>7} | {'against':<12} | {'ratio':<20} |"]
    disagreements = False
    for s in config["sizes"]:
        for c in config["configs"]:
            ratio = results["ratios"].get(s, {}).get(c)
            against, text = "-", "-"
            if ratio is not None:
                text, outside = ratio_words(ratio, spreads.get(s, {}).get(c))
                disagreements |= outside
                against = BASELINES[c]
            lines.append(f"| {_size_words(s):>7} | {c:<13} | {by[(c, s)]['gbps']:>7.2f} | {against:<12} | {text:<20} |")
    how = [f"{name}: {_HOW[name]}" for name in ("channel", "channel_view") if any(
        c == name or BASELINES.get(c) == name for c in config["configs"])]
    if any(c.endswith("_view") for c in config["configs"]):
        how[-1] += f" (loans filled with {'fastcopy.copy' if config.get('view_fill') == 'fastcopy' else 'np.copyto'})"
    lines.append("topicN: the same with N subscribers. " + "; ".join(how))
    balance = order_balance_words("configurations", len(config["configs"]), config["repeats"])
    if balance:
        lines.append(balance)
    distance = system.cpu_distance_words(results.get("cpu_distance"))
    if distance:
        lines.append(distance)
    if disagreements:
        lines.append(SPREAD_DISAGREES_NOTE)
    return "\n".join(lines)
