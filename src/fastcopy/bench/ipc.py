"""Inter-process benchmark: fastcopy.shm.Channel against the alternatives a user would pick.

``run_ipc_bench(sizes)`` starts a second, real process (``spawn`` by default) and measures,
for each transport and message size:

* one-way throughput: the parent sends N messages of ``size`` bytes (uint8 numpy arrays),
  the child receives them all and acknowledges; bandwidth = N * size / time (GB/s and MB/s),
  message rate = N / time (msg/s). N is calibrated so one run takes about ``min_time``;
  the run is repeated ``repeats`` times and the median run is reported (all runs are kept);
* round-trip latency: ping-pong, the child echoes each message back; median (and 90th
  percentile) of the per-message round trip in microseconds, over ``repeats`` blocks of
  round trips interleaved across transports like the throughput runs.

Transports (``TRANSPORTS``, the registry in ``fastcopy.bench.ipc_transports``; those whose
package is missing or whose setup fails are listed in ``skipped`` with the reason):

* ``channel``: fastcopy.shm.Channel, ``send`` and ``recv(out=buf)`` into a reused array;
  ``channel_alloc``: ``recv()`` returning a new array each time (optional);
* ``channel_view``: zero copy: the sender fills a ``loan()`` (one copy of the message into the
  ring, as a producer writing its data in place would) and publishes it; the receiver takes
  ``recv_view()`` and drops it. Its ring is made for each size: three messages (one held by
  the receiver, one being filled, one in flight; 64 KiB at least), so that, like iceoryx2's
  pool of samples (a subscriber buffer of 2), the slots stay warm in the cache;
* ``iceoryx2_view`` / ``iceoryx2_copy``: iceoryx2 publish-subscribe (``Slice[c_uint8]``,
  no overflow, blocking back-pressure), the sender copies into ``loan_slice_uninit`` with
  ``ctypes.memmove`` (see ``VIEW_FILLS``); the receiver polls ``receive()`` (iceoryx2's Python API has no blocking
  receive on a subscriber) and either wraps the sample in a numpy view and drops it (view) or
  copies it out into a reused array with fastcopy (copy);
* ``faster_fifo``: faster-fifo's Queue (array pickled);
* ``zmq``: pyzmq PUSH/PULL over ``ipc://`` with ``copy=False`` (the received frame is the
  receiver's own memory);
* ``shared_memory``: the do-it-yourself route: one ``multiprocessing.shared_memory`` slot per
  direction guarded by two semaphores (empty/full), copied in and out with numpy;
* ``queue`` (multiprocessing.Queue, array pickled) and ``pipe`` (multiprocessing.Pipe,
  ``send_bytes`` / ``recv_bytes``).

``format_ipc_table(results)`` prints the results in a layout like ucx_perftest's. Results
are JSON-serialisable dicts (``python -m fastcopy bench --ipc`` uses both functions).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import platform
import statistics
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np

from . import ipc_transports
from . import system
from .engine import SPREAD_DISAGREES_NOTE, order_balance_words, paired_spread, ratio_words, repeat_order
from .ipc_transports import DEFAULT_TRANSPORTS, RESOURCES, TRANSPORTS, Ends

__all__ = ["run_ipc_bench", "format_ipc_table", "DEFAULT_SIZES", "TRANSPORTS"]

DEFAULT_SIZES = (64, 4096, 65536, 1 << 20, 16 << 20, 64 << 20)
_ACK = b"k"
_ACK_ARRAY = np.frombuffer(_ACK, np.uint8)


# ---- the child process ---------------------------------------------------------------------
def _child_main(ctrl, names, queues, pipes, setup=None) -> None:  # pragma: no cover - runs in the child
    from ..shm import Channel
    from .engine import exit_with_parent

    exit_with_parent()
    setup = setup or {}
    ipc_transports.set_view_fill(setup.get("view_fill", "memmove"))
    fwd_q, back_q = queues
    fwd_r, back_w = pipes
    ends = Ends((Channel.attach(names[1]), Channel.attach(names[0])), (back_q, fwd_q), (back_w, fwd_r))
    for key, got in setup.get("resources", {}).items():
        ends.extra[key] = RESOURCES[key].attach(got)
    ctrl.send("ready")
    bufs: Dict[int, np.ndarray] = {}  # receive buffers are reused across runs, as a real consumer would
    try:
        while True:
            cmd = ctrl.recv()
            if cmd[0] == "exit":
                break
            if cmd[0] == "view_channels":  # a new pair for channel_view, sized for the next size
                for ch in ends.extra.pop("channel_view", ()):
                    ch.close()
                fwd, back = (Channel.attach(n) for n in cmd[1])
                ends.extra["channel_view"] = (back, fwd)
                ctrl.send("done")
                continue
            kind, name, size, count = cmd
            buf = bufs.get(size)
            if buf is None:
                buf = bufs[size] = np.ones(size, np.uint8)
            echo = kind == "pingpong"
            transport = TRANSPORTS[name]
            m = None
            for _ in range(count):
                m = transport.recv(ends, buf)
                if echo:
                    transport.send(ends, m)
                m = None  # a view (or sample) is released before the next receive
            if not echo:
                transport.send(ends, _ACK_ARRAY if transport.array_ack else _ACK)
            ctrl.send("done")
    finally:
        for ch in ends.ch + tuple(ends.extra.get("channel_view", ())):
            ch.close()
        for key in setup.get("resources", {}):
            RESOURCES[key].close(ends.extra[key], False)


# ---- the parent ---------------------------------------------------------------------------
class _Parent:
    def __init__(self, ctx, capacity: int, transports: Sequence[str] = (), max_size: int = 0,
                 view_fill: str = "memmove"):
        from ..shm import Channel

        self.fwd_ch = Channel.create(capacity=capacity)
        self.back_ch = Channel.create(capacity=capacity)
        self.fwd_q, self.back_q = ctx.Queue(), ctx.Queue()
        fwd_r, fwd_w = ctx.Pipe(duplex=False)
        back_r, back_w = ctx.Pipe(duplex=False)
        self.ctrl, child_ctrl = ctx.Pipe()
        self.ends = Ends((self.fwd_ch, self.back_ch), (self.fwd_q, self.back_q), (fwd_w, back_r))
        made: Dict[str, Any] = {}  # resource -> what the child attaches to
        tag = f"fastcopy-bench-{os.getpid()}-{os.urandom(3).hex()}"
        self.capacity = capacity
        # Transports whose setup failed here (installed but unusable): skipped with the reason.
        self.failed: Dict[str, str] = {}
        resources = [r for r in (TRANSPORTS[t].resource for t in transports) if r]
        for key in dict.fromkeys(resources):
            try:
                self.ends.extra[key], made[key] = RESOURCES[key].make(ctx, tag, max_size)
            except Exception as e:  # a broken install must not end the whole benchmark
                for t in transports:
                    if TRANSPORTS[t].resource == key:
                        self.failed[t] = f"could not be set up: {type(e).__name__}: {e}"
        self.made = list(made)
        self.proc = ctx.Process(
            target=_child_main,
            args=(child_ctrl, (self.fwd_ch.name, self.back_ch.name), (self.fwd_q, self.back_q), (fwd_r, back_w),
                  {"view_fill": view_fill, "resources": made}),
            daemon=True,
        )
        try:
            self.proc.start()
            fwd_r.close()
            back_w.close()
            child_ctrl.close()
            if not self.ctrl.poll(120):
                raise RuntimeError("ipc benchmark child did not start (exit code %s)" % self.proc.exitcode)
            self.ctrl.recv()
        except BaseException:
            self.close()  # no channel, socket file or shared_memory segment left behind
            raise

    def close(self) -> None:
        try:
            if self.proc.pid is not None:  # started
                if self.proc.is_alive():
                    self.ctrl.send(("exit",))
                self.proc.join(10)
                if self.proc.is_alive():
                    self.proc.kill()
                    self.proc.join()
        finally:
            for ch in (self.fwd_ch, self.back_ch) + tuple(self.ends.extra.get("channel_view", ())):
                ch.close()
                ch.unlink()
            for q in (self.fwd_q, self.back_q):
                q.close()
                q.join_thread()
            for key in self.made:
                RESOURCES[key].close(self.ends.extra.pop(key), True)
            self.ends.extra.clear()

    def view_channels(self, size: int, timeout: float) -> None:
        """A new channel pair for channel_view with room for three messages of `size` bytes
        (header included): one held by the receiver, one being filled, one in flight."""
        from ..shm import Channel

        ring = max(64 << 10, 3 * (size + 4096))
        pair = (Channel.create(capacity=ring), Channel.create(capacity=ring))
        self.ctrl.send(("view_channels", (pair[0].name, pair[1].name)))
        self._finish(timeout)
        for ch in self.ends.extra.pop("channel_view", ()):
            ch.close()
            ch.unlink()
        self.ends.extra["channel_view"] = pair

    def _start(self, kind: str, transport: str, size: int, count: int) -> None:
        self.ctrl.send((kind, transport, size, count))

    def _finish(self, timeout: float) -> None:
        if not self.ctrl.poll(timeout):
            raise RuntimeError("ipc benchmark child did not answer (exit code %s)" % self.proc.exitcode)
        self.ctrl.recv()

    def throughput(self, name: str, size: int, count: int, timeout: float) -> float:
        """Seconds for `count` one-way messages, ended by the child's acknowledgement."""
        transport, ends = TRANSPORTS[name], self.ends
        msg = np.ones(size, np.uint8)
        ack = np.empty(len(_ACK), np.uint8)
        self._start("throughput", name, size, count)
        t0 = time.perf_counter()
        for _ in range(count):
            transport.send(ends, msg)
        transport.recv(ends, ack)
        dt = time.perf_counter() - t0
        self._finish(timeout)
        return dt

    def pingpong(self, name: str, size: int, count: int, timeout: float) -> List[float]:
        transport, ends = TRANSPORTS[name], self.ends
        msg = np.ones(size, np.uint8)
        out = np.empty(size, np.uint8)
        self._start("pingpong", name, size, count)
        rtts = []
        for _ in range(count):
            t0 = time.perf_counter()
            transport.send(ends, msg)
            transport.recv(ends, out)
            rtts.append(time.perf_counter() - t0)
        self._finish(timeout)
        return rtts


def _machine() -> Dict[str, Any]:
    info: Dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version(),
                            "cpu_count": os.cpu_count()}
    try:
        info["cpus_usable"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover
        pass
    try:
        info["loadavg"] = list(os.getloadavg())
    except OSError:  # pragma: no cover
        pass
    return info


def run_ipc_bench(
    sizes: Iterable[int] = DEFAULT_SIZES,
    repeats: int = 3,
    min_time: float = 0.2,
    transports: Sequence[str] = DEFAULT_TRANSPORTS,
    latency: bool = True,
    capacity: Optional[int] = None,
    start_method: str = "spawn",
    max_messages: int = 2_000_000,
    timeout: float = 120.0,
    view_fill: str = "memmove",
) -> Dict[str, Any]:
    """Measures each transport at each message size between two processes.

    ``sizes``: message sizes in bytes. ``repeats``: throughput runs per point (median
    reported). ``min_time``: seconds one throughput run (and the ping-pong loop) aims for.
    ``view_fill``: how the zero-copy transports fill a loan, ``"memmove"`` (glibc) or
    ``"fastcopy"`` (``fastcopy.copy``), the same for channel_view and iceoryx2.
    ``transports``: any of ``TRANSPORTS``. ``latency``: also run ping-pong. ``capacity``:
    Channel ring size (default fastcopy.shm.DEFAULT_CAPACITY, 8 MiB). ``start_method``: multiprocessing start method of
    the child. Returns a JSON-serialisable dict: ``config``, ``machine``, ``cpu_distance`` (a
    probe of how far apart the first two CPUs are, before each throughput repeat of each size:
    see :func:`fastcopy.bench.system.cpu_distance_record`), ``rows`` (one per
    transport and size: ``transport``, ``size``, ``messages``, ``seconds``,
    ``bandwidth_gbps``, ``bandwidth_mbps``, ``msg_rate``, ``runs``, ``rtt_median_us``,
    ``rtt_p90_us``, ``rtt_samples``, ``rtt_runs_us``: the median round trip of each repeat) and
    ``ratios`` (per size: ``channel_vs_queue``/``_pipe``, and zero copy against copy in/out and
    iceoryx2: ``a_vs_b`` throughput ratio of medians, ``a_vs_b_rtt`` round-trip ratio,
    ``*_spread`` the middle half of the paired per-repeat ratios, see
    :func:`fastcopy.bench.engine.paired_spread`).
    """
    from ..shm import DEFAULT_CAPACITY

    sizes = [int(s) for s in sizes]
    for t in transports:
        if t not in TRANSPORTS:
            raise ValueError(f"unknown transport {t!r}; choose from {', '.join(TRANSPORTS)}")
    if repeats < 1 or min_time <= 0:
        raise ValueError("repeats must be >= 1 and min_time > 0")
    skipped = {t: why for t in transports if (why := TRANSPORTS[t].missing()) is not None}
    transports = [t for t in transports if t not in skipped]
    capacity = int(capacity or DEFAULT_CAPACITY)
    ctx = mp.get_context(start_method)
    ipc_transports.set_view_fill(view_fill)  # ValueError names the choices
    parent = _Parent(ctx, capacity, transports, max(sizes, default=0), view_fill)
    skipped.update(parent.failed)
    transports = [t for t in transports if t not in parent.failed]
    rows: List[Dict[str, Any]] = []
    pair = system.cpu_pair()
    distance: List[Optional[float]] = []  # one probe before each throughput repeat
    try:
        for size in sizes:
            if "channel_view" in transports:
                parent.view_channels(size, timeout)
            # Calibrate each transport (also warms up: pages of the ring, buffers, pickling
            # paths): grow the count until one run takes at least half of min_time.
            targets = {}
            for transport in transports:
                parent.throughput(transport, size, 1, timeout)  # warm-up, not measured
                count = max(1, min(max_messages, (4 << 20) // max(size, 1), 20000))
                for _ in range(5):
                    dt = parent.throughput(transport, size, count, timeout)
                    if dt >= min_time / 2 or count >= max_messages:
                        break
                    count = min(max_messages, max(count + 1, int(count * min(100.0, min_time / max(dt, 1e-6)))))
                targets[transport] = max(2, min(max_messages, int(math.ceil(count * min_time / max(dt, 1e-6)))))
            # Repeats are interleaved across transports, so a change in machine load affects
            # all of them alike and the ratios stay fair; each repeat runs them in another order
            # (repeat_order), so that none always runs first or right after the same one.
            runs: Dict[str, List[Dict[str, float]]] = {t: [] for t in transports}
            for r in range(repeats):
                distance.append(system.cache_line_round_trip(pair))
                for transport in repeat_order(transports, r):
                    dt = parent.throughput(transport, size, targets[transport], timeout)
                    runs[transport].append({"messages": targets[transport], "seconds": dt})
            # Round trips are interleaved the same way: each repeat runs a ping-pong loop per
            # transport, and the median is over all the round trips of all repeats.
            rtts: Dict[str, List[float]] = {t: [] for t in transports}
            rtt_runs: Dict[str, List[float]] = {t: [] for t in transports}  # one median per repeat
            if latency:
                iters: Dict[str, int] = {}
                for transport in transports:
                    per = statistics.median(r["seconds"] for r in runs[transport]) / targets[transport]
                    iters[transport] = max(3, min(10000, int(min_time / max(2 * per, 1e-6)) // repeats))
                    parent.pingpong(transport, size, min(iters[transport], 10), timeout)  # warm-up
                for r in range(repeats):
                    for transport in repeat_order(transports, r):
                        trips = parent.pingpong(transport, size, iters[transport], timeout)
                        rtts[transport] += trips
                        rtt_runs[transport].append(statistics.median(trips) * 1e6)
            for transport in transports:
                target = targets[transport]
                med = statistics.median(r["seconds"] for r in runs[transport])
                rate = target / med
                row: Dict[str, Any] = {
                    "transport": transport,
                    "size": size,
                    "messages": target,
                    "seconds": med,
                    "msg_rate": rate,
                    "bandwidth_mbps": rate * size / 1e6,
                    "bandwidth_gbps": rate * size / 1e9,
                    "runs": runs[transport],
                }
                if latency:
                    samples = sorted(rtts[transport])
                    row["rtt_median_us"] = statistics.median(samples) * 1e6
                    row["rtt_p90_us"] = samples[min(len(samples) - 1, int(0.9 * len(samples)))] * 1e6
                    row["rtt_samples"] = len(samples)
                    row["rtt_runs_us"] = rtt_runs[transport]
                rows.append(row)
    finally:
        parent.close()
    ratios: Dict[str, Dict[str, Any]] = {}
    by = {(r["transport"], r["size"]): r for r in rows}
    for size in sizes:
        entry = {}
        ch = by.get(("channel", size))
        if ch:
            for other in ("queue", "pipe"):
                o = by.get((other, size))
                if o and o["msg_rate"] > 0:
                    entry[f"channel_vs_{other}"] = ch["msg_rate"] / o["msg_rate"]
        # Zero copy against copy in/out and against iceoryx2's view path: throughput ratio
        # (higher is better) and round-trip ratio (lower is better).
        for a, b in (("channel_view", "channel"), ("channel_view", "iceoryx2_view"), ("channel", "iceoryx2_copy")):
            ra, rb = by.get((a, size)), by.get((b, size))
            if ra and rb and rb["msg_rate"] > 0:
                entry[f"{a}_vs_{b}"] = ra["msg_rate"] / rb["msg_rate"]
                spread = paired_spread([r["messages"] / r["seconds"] for r in ra["runs"]],
                                       [r["messages"] / r["seconds"] for r in rb["runs"]])
                if spread:
                    entry[f"{a}_vs_{b}_spread"] = spread
                if "rtt_median_us" in ra and "rtt_median_us" in rb and rb["rtt_median_us"] > 0:
                    entry[f"{a}_vs_{b}_rtt"] = ra["rtt_median_us"] / rb["rtt_median_us"]
                    spread = paired_spread(ra.get("rtt_runs_us", []), rb.get("rtt_runs_us", []))
                    if spread:
                        entry[f"{a}_vs_{b}_rtt_spread"] = spread
        ratios[str(size)] = entry
    return {
        "benchmark": "ipc",
        "config": {"sizes": sizes, "repeats": repeats, "min_time": min_time, "transports": list(transports),
                   "view_fill": view_fill,
                   "latency": latency, "capacity": capacity, "start_method": start_method},
        "machine": _machine(),
        "cpu_distance": system.cpu_distance_record(pair, distance),
        "rows": rows,
        "ratios": ratios,
        "skipped": skipped,
    }


def _load_words(machine: Dict[str, Any]) -> str:
    load = machine.get("loadavg")
    return f"{load[0]:.2f}" if load else "?"


def _size_words(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= (1 << shift) and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def format_ipc_table(results: Dict[str, Any]) -> str:
    """The results of :func:`run_ipc_bench` as a text table in ucx_perftest's layout
    (overhead = round-trip latency, bandwidth, message rate), with Channel's speed-up over
    Queue and Pipe at each size."""
    rows = results["rows"] if isinstance(results, dict) else list(results)
    ratios = results.get("ratios", {}) if isinstance(results, dict) else {}
    widths = [15, 9, 9, 11, 11, 10, 8, 10, 8, 9]
    def sep() -> str:
        return "+" + "+".join("-" * w for w in widths) + "+"
    def line(cells: Sequence[str], align: str = ">") -> str:
        out = []
        for w, c in zip(widths, cells):
            out.append(f" {c:{align}{w - 2}} ")
        return "|" + "|".join(out) + "|"
    def group_line() -> str:
        groups = [("", widths[0]), ("", widths[1]), ("", widths[2]),
                  ("overhead (usec)", widths[3] + widths[4] + 1),
                  ("bandwidth", widths[5] + widths[6] + 1),
                  ("message rate", widths[7]),
                  ("speed-up", widths[8] + widths[9] + 1)]
        return "|" + "|".join(f"{g:^{w}}" for g, w in groups) + "|"
    head = ["Transport", "Size", "# msgs", "RTT 50%", "RTT 90%", "MB/s", "GB/s", "msg/s", "vs Q", "vs Pipe"]
    out = [sep(), group_line(), sep(), line(head, "^"), sep()]
    for r in rows:
        rt = ratios.get(str(r["size"]), {}) if r["transport"] == "channel" else {}
        def fmt_ratio(key: str) -> str:
            return f"{rt[key]:.1f}x" if key in rt else ""
        out.append(line([
            r["transport"],
            _size_words(r["size"]),
            str(r["messages"]),
            f"{r['rtt_median_us']:.1f}" if "rtt_median_us" in r else "-",
            f"{r['rtt_p90_us']:.1f}" if "rtt_p90_us" in r else "-",
            f"{r['bandwidth_mbps']:.1f}",
            f"{r['bandwidth_gbps']:.3f}",
            f"{r['msg_rate']:.0f}",
            fmt_ratio("channel_vs_queue"),
            fmt_ratio("channel_vs_pipe"),
        ]))
    out.append(sep())
    for t, why in (results.get("skipped", {}) if isinstance(results, dict) else {}).items():
        out.append(f"skipped {t}: {why}")
    zero_copy = []
    disagreements = False
    for size, entry in ratios.items():
        words = []
        for k, v in entry.items():
            if k.startswith("channel_vs_") or k.endswith("_spread"):
                continue
            text, outside = ratio_words(v, entry.get(k + "_spread"))
            disagreements |= outside
            words.append(f"{k.replace('_vs_', ' / ')} {text}")
        if words:
            zero_copy.append(f"  {_size_words(int(size))}: " + ", ".join(words))
    if zero_copy:
        out.append("ratios of medians (throughput; *_rtt: round-trip time, lower is better; in brackets the middle "
                   "half of the ratios of the repeats, paired: one that contains 1.00 is within this run's noise):")
        out.extend(zero_copy)
        if disagreements:
            out.append(SPREAD_DISAGREES_NOTE)
    if isinstance(results, dict) and "config" in results:
        c = results["config"]
        m = results.get("machine", {})
        out.append(f"one-way throughput, median of {c['repeats']} runs of ~{c['min_time']} s; RTT = ping-pong "
                   f"round trip; child started with '{c['start_method']}'; Channel ring {_size_words(c['capacity'])}; "
                   f"{m.get('cpus_usable', m.get('cpu_count'))} CPUs usable, load {_load_words(m)}")
        balance = order_balance_words("transports", len(c["transports"]), c["repeats"])
        if balance:
            out.append(balance)
        distance = system.cpu_distance_words(results.get("cpu_distance"))
        if distance:
            out.append(distance)
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover
    import json
    import sys

    res = run_ipc_bench()
    print(format_ipc_table(res))
    if "--json" in sys.argv:
        print(json.dumps(res, indent=1))
