"""Inter-process benchmark: fastcopy.shm.Channel against multiprocessing.Queue and Pipe.

``run_ipc_bench(sizes)`` starts a second, real process (``spawn`` by default) and measures,
for each transport and message size:

* one-way throughput: the parent sends N messages of ``size`` bytes (uint8 numpy arrays),
  the child receives them all and acknowledges; bandwidth = N * size / time (GB/s and MB/s),
  message rate = N / time (msg/s). N is calibrated so one run takes about ``min_time``;
  the run is repeated ``repeats`` times and the median run is reported (all runs are kept);
* round-trip latency: ping-pong, the child echoes each message back; median (and 90th
  percentile) of the per-message round trip in microseconds.

Transports: ``channel`` (fastcopy.shm.Channel, the child receives with ``recv(out=buf)``
into a preallocated array), ``channel_alloc`` (``recv()`` returning a new array each time;
optional), ``queue`` (multiprocessing.Queue, numpy array pickled) and ``pipe``
(multiprocessing.Pipe, ``send_bytes`` / ``recv_bytes``).

``format_ipc_table(results)`` prints the results in a layout like ucx_perftest's. Results
are JSON-serialisable dicts (``python -m fastcopy bench --ipc`` uses both functions).
"""

from __future__ import annotations

import functools
import math
import multiprocessing as mp
import os
import platform
import statistics
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np

__all__ = ["run_ipc_bench", "format_ipc_table", "DEFAULT_SIZES", "TRANSPORTS"]

DEFAULT_SIZES = (64, 4096, 65536, 1 << 20, 16 << 20, 64 << 20)
TRANSPORTS = ("channel", "channel_alloc", "queue", "pipe")
_DEFAULT_TRANSPORTS = ("channel", "queue", "pipe")
_ACK = b"k"


# ---- the child process ---------------------------------------------------------------------
def _child_endpoints(transport, buf, fwd_ch, back_ch, fwd_q, back_q, fwd_r, back_w):
    """(receive one message, send one back) for a transport, as the child runs it."""
    if transport == "channel":  # into the reused buffer (recv returns it), as a real consumer would
        return functools.partial(fwd_ch.recv, out=buf), back_ch.send
    if transport == "channel_alloc":
        return fwd_ch.recv, back_ch.send
    if transport == "queue":
        return fwd_q.get, back_q.put
    return fwd_r.recv_bytes, back_w.send_bytes


def _child_main(ctrl, names, queues, pipes) -> None:  # pragma: no cover - runs in the child
    from .shm import Channel

    fwd_ch = Channel.attach(names[0])
    back_ch = Channel.attach(names[1])
    fwd_q, back_q = queues
    fwd_r, back_w = pipes
    bufs: Dict[int, np.ndarray] = {}  # receive buffers are reused across runs, as a real consumer would
    try:
        while True:
            cmd = ctrl.recv()
            if cmd[0] == "exit":
                break
            kind, transport, size, count = cmd
            buf = bufs.get(size)
            if buf is None:
                buf = bufs[size] = np.ones(size, np.uint8)
            echo = kind == "pingpong"
            receive, reply = _child_endpoints(transport, buf, fwd_ch, back_ch, fwd_q, back_q, fwd_r, back_w)
            for _ in range(count):
                m = receive()
                if echo:
                    reply(m)
            if not echo:
                reply(_ACK)
            ctrl.send("done")
    finally:
        fwd_ch.close()
        back_ch.close()


# ---- the parent ---------------------------------------------------------------------------
class _Parent:
    def __init__(self, ctx, capacity: int):
        from .shm import Channel

        self.fwd_ch = Channel.create(capacity=capacity)
        self.back_ch = Channel.create(capacity=capacity)
        self.fwd_q, self.back_q = ctx.Queue(), ctx.Queue()
        fwd_r, self.fwd_w = ctx.Pipe(duplex=False)
        self.back_r, back_w = ctx.Pipe(duplex=False)
        self.ctrl, child_ctrl = ctx.Pipe()
        self.proc = ctx.Process(
            target=_child_main,
            args=(child_ctrl, (self.fwd_ch.name, self.back_ch.name), (self.fwd_q, self.back_q), (fwd_r, back_w)),
            daemon=True,
        )
        self.proc.start()
        fwd_r.close()
        back_w.close()
        child_ctrl.close()

    def close(self) -> None:
        try:
            if self.proc.is_alive():
                self.ctrl.send(("exit",))
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()
        finally:
            for ch in (self.fwd_ch, self.back_ch):
                ch.close()
                ch.unlink()
            for q in (self.fwd_q, self.back_q):
                q.close()
                q.join_thread()

    def _send(self, transport: str, msg: np.ndarray) -> None:
        if transport.startswith("channel"):
            self.fwd_ch.send(msg)
        elif transport == "queue":
            self.fwd_q.put(msg)
        else:
            self.fwd_w.send_bytes(msg)

    def _recv(self, transport: str, out: np.ndarray) -> None:
        if transport == "channel":
            self.back_ch.recv(out=out)
        elif transport == "channel_alloc":
            self.back_ch.recv()
        elif transport == "queue":
            self.back_q.get()
        else:
            self.back_r.recv_bytes()

    def _start(self, kind: str, transport: str, size: int, count: int) -> None:
        self.ctrl.send((kind, transport, size, count))

    def _finish(self, timeout: float) -> None:
        if not self.ctrl.poll(timeout):
            raise RuntimeError("ipc benchmark child did not answer (exit code %s)" % self.proc.exitcode)
        self.ctrl.recv()

    def throughput(self, transport: str, size: int, count: int, timeout: float) -> float:
        """Seconds for `count` one-way messages, ended by the child's acknowledgement."""
        msg = np.ones(size, np.uint8)
        ack = np.empty(len(_ACK), np.uint8)
        self._start("throughput", transport, size, count)
        t0 = time.perf_counter()
        for _ in range(count):
            self._send(transport, msg)
        self._recv(transport, ack)
        dt = time.perf_counter() - t0
        self._finish(timeout)
        return dt

    def pingpong(self, transport: str, size: int, count: int, timeout: float) -> List[float]:
        msg = np.ones(size, np.uint8)
        out = np.empty(size, np.uint8)
        self._start("pingpong", transport, size, count)
        rtts = []
        for _ in range(count):
            t0 = time.perf_counter()
            self._send(transport, msg)
            self._recv(transport, out)
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
    transports: Sequence[str] = _DEFAULT_TRANSPORTS,
    latency: bool = True,
    capacity: Optional[int] = None,
    start_method: str = "spawn",
    max_messages: int = 2_000_000,
    timeout: float = 120.0,
) -> Dict[str, Any]:
    """Measures each transport at each message size between two processes.

    ``sizes``: message sizes in bytes. ``repeats``: throughput runs per point (median
    reported). ``min_time``: seconds one throughput run (and the ping-pong loop) aims for.
    ``transports``: any of ``TRANSPORTS``. ``latency``: also run ping-pong. ``capacity``:
    Channel ring size (default fastcopy.shm.DEFAULT_CAPACITY, 8 MiB). ``start_method``: multiprocessing start method of
    the child. Returns a JSON-serialisable dict: ``config``, ``machine``, ``rows`` (one per
    transport and size: ``transport``, ``size``, ``messages``, ``seconds``,
    ``bandwidth_gbps``, ``bandwidth_mbps``, ``msg_rate``, ``runs``, ``rtt_median_us``,
    ``rtt_p90_us``, ``rtt_samples``) and ``ratios`` (per size: Channel throughput divided by
    Queue's and by Pipe's).
    """
    from .shm import DEFAULT_CAPACITY

    sizes = [int(s) for s in sizes]
    for t in transports:
        if t not in TRANSPORTS:
            raise ValueError(f"unknown transport {t!r}; choose from {', '.join(TRANSPORTS)}")
    if repeats < 1 or min_time <= 0:
        raise ValueError("repeats must be >= 1 and min_time > 0")
    capacity = int(capacity or DEFAULT_CAPACITY)
    ctx = mp.get_context(start_method)
    parent = _Parent(ctx, capacity)
    rows: List[Dict[str, Any]] = []
    try:
        for size in sizes:
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
            # all of them alike and the ratios stay fair.
            runs: Dict[str, List[Dict[str, float]]] = {t: [] for t in transports}
            for _ in range(repeats):
                for transport in transports:
                    dt = parent.throughput(transport, size, targets[transport], timeout)
                    runs[transport].append({"messages": targets[transport], "seconds": dt})
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
                    per = med / target  # one-way time per message: a first guess at the RTT scale
                    iters = max(3, min(10000, int(min_time / max(2 * per, 1e-6))))
                    parent.pingpong(transport, size, min(iters, 10), timeout)  # warm-up
                    rtts = parent.pingpong(transport, size, iters, timeout)
                    rtts.sort()
                    row["rtt_median_us"] = statistics.median(rtts) * 1e6
                    row["rtt_p90_us"] = rtts[min(len(rtts) - 1, int(0.9 * len(rtts)))] * 1e6
                    row["rtt_samples"] = len(rtts)
                rows.append(row)
    finally:
        parent.close()
    ratios: Dict[str, Dict[str, float]] = {}
    by = {(r["transport"], r["size"]): r for r in rows}
    for size in sizes:
        ch = by.get(("channel", size))
        if not ch:
            continue
        entry = {}
        for other in ("queue", "pipe"):
            o = by.get((other, size))
            if o and o["msg_rate"] > 0:
                entry[f"channel_vs_{other}"] = ch["msg_rate"] / o["msg_rate"]
        ratios[str(size)] = entry
    return {
        "benchmark": "ipc",
        "config": {"sizes": sizes, "repeats": repeats, "min_time": min_time, "transports": list(transports),
                   "latency": latency, "capacity": capacity, "start_method": start_method},
        "machine": _machine(),
        "rows": rows,
        "ratios": ratios,
    }


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
    if isinstance(results, dict) and "config" in results:
        c = results["config"]
        m = results.get("machine", {})
        out.append(f"one-way throughput, median of {c['repeats']} runs of ~{c['min_time']} s; RTT = ping-pong "
                   f"round trip; child started with '{c['start_method']}'; Channel ring {_size_words(c['capacity'])}; "
                   f"{m.get('cpus_usable', m.get('cpu_count'))} CPUs usable, load {m.get('loadavg', ['?'])[0]}")
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover
    import json
    import sys

    res = run_ipc_bench()
    print(format_ipc_table(res))
    if "--json" in sys.argv:
        print(json.dumps(res, indent=1))
