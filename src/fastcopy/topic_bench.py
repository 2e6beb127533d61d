"""Fan-out benchmark: fastcopy.shm.Topic with 1 and 2 subscribers against a Channel with one consumer.

``run_topic_bench(sizes)`` starts two receiver processes (``spawn``) once and, for each size and
repeat, interleaved, measures one-way throughput of:

* ``channel``: Channel, ``send`` and ``recv(out=buf)`` into a reused array (one consumer);
* ``topic1``: Topic with one subscriber, ``send`` and ``recv(out=buf)``;
* ``topic2``: Topic with two subscribers, each receiving every message.

A run: the receivers attach (or subscribe) and say they are ready; the parent takes the time,
sends N messages of ``size`` bytes (a reused uint8 array) and each receiver reports the
CLOCK_MONOTONIC time (system-wide on Linux) when it has the last one; per-receiver throughput
= N * size / (its end - start). N is chosen so that one run moves about ``min_time`` x 2 GB.
Both get what a user gets by default: the Channel an 8 MiB ring, the topic ``slot_bytes = size``
and the default number of slots (as many as hold 4 MiB, 4 to 1024: see ``Topic.create``).
Reported per size: the median per-subscriber GB/s of each configuration over the repeats
(topic2: the slower of its two subscribers in each run), the ratio of each Topic median to
the Channel median and, as for the IPC benchmark, the middle half of the ratios of the
repeats taken in pairs (each repeat runs every configuration once, one after the other).
``python -m fastcopy bench --ipc --variants topic`` runs it and prints ``format_topic_table``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from typing import Any, Dict, Iterable, List, Sequence

import numpy as np

from . import _core
from .measure.engine import SPREAD_DISAGREES_NOTE, paired_spread, ratio_words

__all__ = ["run_topic_bench", "format_topic_table", "DEFAULT_TOPIC_SIZES", "CONFIGS"]

DEFAULT_TOPIC_SIZES = (64 << 10, 1 << 20, 16 << 20)
CONFIGS = ("channel", "topic1", "topic2")
_RING_BYTES = 8 << 20
_BYTES_PER_SECOND_GUESS = 2e9  # sizes the runs; the measured figure does not depend on it


def _receiver(conn: Any) -> None:  # pragma: no cover - runs in the child
    from fastcopy.shm import Channel, Topic

    while True:
        cmd = conn.recv()
        if cmd is None:
            return
        kind, name, count, size = cmd
        end = Channel.attach(name) if kind == "channel" else Topic.subscribe(name)
        out = np.empty(size, np.uint8)
        conn.send("ready")  # attached (topic: subscribed, so it gets every message from here)
        for _ in range(count):
            end.recv(out=out, timeout=60)
        conn.send(time.monotonic())
        end.close()


def _one_run(kind: str, receivers: Sequence[Any], size: int, count: int) -> List[float]:
    from fastcopy.shm import Channel, Topic

    name = f"fastcopy-topicbench-{os.getpid()}-{time.monotonic_ns()}"
    msg = np.full(size, 7, np.uint8)
    if kind == "channel":
        end: Any = Channel.create(name, capacity=_RING_BYTES)
    else:
        end = Topic.create(name, slot_bytes=size)
    try:
        for conn in receivers:
            conn.send((kind, name, count, size))
        for conn in receivers:
            if conn.recv() != "ready":
                raise RuntimeError("topic benchmark: a receiver failed")
        start = time.monotonic()
        for _ in range(count):
            end.send(msg, timeout=60)
        return [count * size / (conn.recv() - start) / 1e9 for conn in receivers]
    finally:
        end.close()
        end.unlink()


def run_topic_bench(sizes: Iterable[int] = DEFAULT_TOPIC_SIZES, repeats: int = 5, min_time: float = 0.2,
                    configs: Sequence[str] = CONFIGS) -> Dict[str, Any]:
    """Per-subscriber throughput of Channel (1 consumer) and Topic (1 and 2 subscribers).

    Returns a JSON-serialisable dict: ``config`` (with ``topic_slots``: each size's default slot
    count, which the topics get), ``rows`` (per config and size: ``config``,
    ``size``, ``messages``, ``gbps`` (median per-subscriber GB/s), ``runs`` (every run's
    per-subscriber figures)), ``ratios`` (per size: ``topic1``/``topic2`` median over the
    Channel median) and ``spreads`` (per size and Topic configuration: the middle half of the
    per-repeat ratios to the Channel, see :func:`fastcopy.measure.engine.paired_spread`; absent
    with one repeat).
    """
    sizes = [int(s) for s in sizes]
    for c in configs:
        if c not in CONFIGS:
            raise ValueError(f"unknown topic benchmark configuration {c!r}; choose from {', '.join(CONFIGS)}")
    if repeats < 1 or min_time <= 0 or any(s < 1 for s in sizes):
        raise ValueError("repeats must be >= 1, min_time > 0 and sizes >= 1")
    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe() for _ in range(2)]
    procs = [ctx.Process(target=_receiver, args=(child,), daemon=True) for _, child in pipes]
    for p in procs:
        p.start()
    runs: Dict[tuple, List[List[float]]] = {(c, s): [] for c in configs for s in sizes}
    counts = {s: max(8, min(50_000, int(min_time * _BYTES_PER_SECOND_GUESS / s))) for s in sizes}
    try:
        for _ in range(repeats):  # interleaved: every configuration sees the same machine state
            for s in sizes:
                for c in configs:
                    receivers = [pipes[0][0]] if c != "topic2" else [pipes[0][0], pipes[1][0]]
                    runs[(c, s)].append(_one_run("channel" if c == "channel" else "topic", receivers, s, counts[s]))
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
        medians[(c, s)] = statistics.median(min(r) for r in per_run)  # topic2: its slower subscriber
        rows.append({"config": c, "size": s, "messages": counts[s], "gbps": medians[(c, s)], "runs": per_run})
    ratios = {}
    spreads: Dict[int, Dict[str, List[float]]] = {}
    for s in sizes:
        if ("channel", s) in medians:
            ratios[s] = {c: medians[(c, s)] / medians[("channel", s)] for c in configs if c != "channel"}
            channel_runs = [min(r) for r in runs[("channel", s)]]
            for c in ratios[s]:
                spread = paired_spread([min(r) for r in runs[(c, s)]], channel_runs)
                if spread:
                    spreads.setdefault(s, {})[c] = spread
    try:
        load = list(os.getloadavg())
    except OSError:  # pragma: no cover
        load = []
    return {"config": {"sizes": sizes, "repeats": repeats, "min_time": min_time, "configs": list(configs),
                       "channel_capacity": _RING_BYTES, "topic_slots": {s: _core._shm_default_topic_slots(s, 0)
                                                                        for s in sizes},
                       "loadavg": load},
            "rows": rows, "ratios": ratios, "spreads": spreads}


def _size_words(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def format_topic_table(results: Dict[str, Any]) -> str:
    """The medians as a table: GB/s per subscriber and the ratio to Channel, with the middle half
    of the paired per-repeat ratios in brackets (marked ``!`` where the ratio lies far outside
    it: see :func:`fastcopy.measure.engine.ratio_words`)."""
    by = {(r["config"], r["size"]): r for r in results["rows"]}
    sizes = results["config"]["sizes"]
    configs = results["config"]["configs"]
    spreads = results.get("spreads", {})
    head = "|    Size |" + "".join(f" {c + ' GB/s':>13} |" for c in configs) + "".join(
        f" {c + '/channel':>22} |" for c in configs if c != "channel")
    lines = [f"Topic fan-out: per-subscriber throughput, median of {results['config']['repeats']} runs "
             f"(topic2: the slower subscriber of each run); in brackets the middle half of the ratios of the "
             f"repeats, paired", head]
    disagreements = False
    for s in sizes:
        line = f"| {_size_words(s):>7} |" + "".join(f" {by[(c, s)]['gbps']:>13.2f} |" for c in configs)
        for c in configs:
            if c != "channel":
                ratio = results["ratios"].get(s, {}).get(c)
                if ratio is None:
                    line += f" {'-':>22} |"
                    continue
                text, outside = ratio_words(ratio, spreads.get(s, {}).get(c))
                disagreements |= outside
                line += f" {text:>22} |"
        lines.append(line)
    if disagreements:
        lines.append(SPREAD_DISAGREES_NOTE)
    return "\n".join(lines)
