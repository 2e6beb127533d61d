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

Transports (``TRANSPORTS``; those whose package is missing are listed in ``skipped`` with
the reason):

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

import ctypes
import functools
import importlib.util
import math
import multiprocessing as mp
import os
import platform
import statistics
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from .measure import system
from .measure.engine import SPREAD_DISAGREES_NOTE, order_balance_words, paired_spread, ratio_words, repeat_order

__all__ = ["run_ipc_bench", "format_ipc_table", "DEFAULT_SIZES", "TRANSPORTS"]

DEFAULT_SIZES = (64, 4096, 65536, 1 << 20, 16 << 20, 64 << 20)
TRANSPORTS = ("channel", "channel_alloc", "channel_view", "iceoryx2_view", "iceoryx2_copy", "faster_fifo", "zmq",
              "shared_memory", "queue", "pipe")
_DEFAULT_TRANSPORTS = ("channel", "channel_view", "iceoryx2_view", "iceoryx2_copy", "faster_fifo", "zmq",
                       "shared_memory", "queue", "pipe")
# The package each optional transport needs.
_NEEDS = {"iceoryx2_view": "iceoryx2", "iceoryx2_copy": "iceoryx2", "faster_fifo": "faster_fifo", "zmq": "zmq"}
_ACK = b"k"
_ACK_ARRAY = np.frombuffer(_ACK, np.uint8)


def _missing(transport: str) -> Optional[str]:
    """Why a transport cannot run here, or None."""
    module = _NEEDS.get(transport)
    if module and importlib.util.find_spec(module) is None:
        pip = {"zmq": "pyzmq", "faster_fifo": "faster-fifo"}.get(module, module)
        return f"{module} is not installed (pip install {pip}, or fastcopy[bench])"
    return None


# ---- optional transports: one object per process and direction pair ------------------------
class _Iceoryx2:
    """iceoryx2 publish-subscribe, one service per direction; `role` says which end we are."""

    def __init__(self, fwd: str, back: str, max_size: int, role: str):
        import iceoryx2 as iox2  # type: ignore[import-untyped,import-not-found,unused-ignore]

        iox2.set_log_level_from_env_or(iox2.LogLevel.Error)
        self.node = iox2.NodeBuilder.new().create(iox2.ServiceType.Ipc)

        def service(name: str) -> Any:
            return (self.node.service_builder(iox2.ServiceName.new(name))
                    .publish_subscribe(iox2.Slice[ctypes.c_uint8])
                    .enable_safe_overflow(False)      # never drop a message: the sender waits
                    .history_size(0).max_publishers(1).max_subscribers(1)
                    .subscriber_max_buffer_size(2)
                    .open_or_create())

        out_name, in_name = (fwd, back) if role == "parent" else (back, fwd)
        self.out_service, self.in_service = service(out_name), service(in_name)
        self.pub = (self.out_service.publisher_builder().initial_max_slice_len(max(1, max_size))
                    .backpressure_strategy(iox2.BackpressureStrategy.RetryUntilDelivered).create())
        self.sub = self.in_service.subscriber_builder().create()

    def send(self, msg: np.ndarray) -> None:
        n = msg.nbytes
        sample = self.pub.loan_slice_uninit(n)
        _fill_address(sample.payload_ptr, msg)
        sample.assume_init().send()

    def _sample(self) -> Any:
        # Poll, spinning a little, then yielding the CPU between polls: a pure spin starved
        # the peer on the 2-vCPU development VM (1 MiB round trip 8 ms instead of tens of us).
        receive = self.sub.receive
        spins = 0
        while True:
            sample = receive()
            if sample is not None:
                return sample
            spins += 1
            if spins > 64:
                os.sched_yield()

    def recv_view(self) -> Any:
        sample = self._sample()
        # The sample must stay alive while the view is used: the memoryview does not hold it.
        return sample, np.frombuffer(sample.payload().as_memory_view(), np.uint8)

    def recv_copy(self, out: np.ndarray) -> np.ndarray:
        from . import copy as fast_copy

        sample = self._sample()
        view = np.frombuffer(sample.payload().as_memory_view(), np.uint8)
        dst = out if out.nbytes == view.nbytes else np.empty(view.nbytes, np.uint8)
        fast_copy(dst, view)
        del view, sample
        return dst


class _Zmq:
    def __init__(self, fwd: str, back: str, role: str):
        import zmq  # type: ignore[import-not-found,unused-ignore]

        self.ctx = zmq.Context()
        self.push = self.ctx.socket(zmq.PUSH)
        self.pull = self.ctx.socket(zmq.PULL)
        if role == "parent":
            self.push.bind(fwd)
            self.pull.bind(back)
        else:
            self.pull.connect(fwd)
            self.push.connect(back)

    def send(self, msg: Any) -> None:
        self.push.send(msg, copy=False)

    def recv(self) -> np.ndarray:
        return np.frombuffer(self.pull.recv(copy=False).buffer, np.uint8)

    def close(self) -> None:
        self.push.close(0)
        self.pull.close(0)
        self.ctx.term()


class _ShmSlot:
    """The do-it-yourself route: one shared_memory slot (8-byte length + data) guarded by an
    `empty` and a `full` semaphore."""

    def __init__(self, ctx: Any, size: int):
        from multiprocessing import shared_memory

        self.shm = shared_memory.SharedMemory(create=True, size=8 + max(size, 1))
        self.name = self.shm.name
        self.empty = ctx.Semaphore(1)
        self.full = ctx.Semaphore(0)

    def attach(self) -> None:  # in the child
        from multiprocessing import shared_memory

        # A spawned child shares the parent's resource tracker, which the parent's unlink() settles.
        self.shm = shared_memory.SharedMemory(self.name)

    def __getstate__(self) -> Dict[str, Any]:
        return {"name": self.name, "empty": self.empty, "full": self.full}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.attach()

    def send(self, msg: np.ndarray) -> None:
        n = msg.nbytes
        self.empty.acquire()
        buf = self.shm.buf
        assert buf is not None
        buf[:8] = n.to_bytes(8, "little")
        np.frombuffer(buf, np.uint8, n, 8)[...] = msg.reshape(-1).view(np.uint8)
        self.full.release()

    def recv(self, out: Optional[np.ndarray] = None) -> np.ndarray:
        self.full.acquire()
        buf = self.shm.buf
        assert buf is not None
        n = int.from_bytes(buf[:8], "little")
        dst = out if out is not None and out.nbytes == n else np.empty(n, np.uint8)
        dst[...] = np.frombuffer(buf, np.uint8, n, 8)
        self.empty.release()
        return dst

    def close(self, unlink: bool = False) -> None:
        self.shm.close()
        if unlink:
            self.shm.unlink()


# ---- the child process ---------------------------------------------------------------------
def _child_endpoints(transport, buf, fwd_ch, back_ch, fwd_q, back_q, fwd_r, back_w, extra):
    """(receive one message, send one back) for a transport, as the child runs it."""
    if transport == "channel":  # into the reused buffer (recv returns it), as a real consumer would
        return functools.partial(fwd_ch.recv, out=buf), back_ch.send
    if transport == "channel_alloc":
        return fwd_ch.recv, back_ch.send
    if transport == "channel_view":
        fwd_v, back_v = extra["channel_view"]
        return fwd_v.recv_view, functools.partial(_send_loaned, back_v)
    if transport in ("iceoryx2_view", "iceoryx2_copy"):
        iox = extra["iceoryx2"]
        if transport == "iceoryx2_view":
            return iox.recv_view, lambda m: iox.send(m[1] if isinstance(m, tuple) else m)
        return functools.partial(iox.recv_copy, buf), iox.send
    if transport == "faster_fifo":
        fwd_f, back_f = extra["faster_fifo"]
        return functools.partial(fwd_f.get, timeout=600), back_f.put
    if transport == "zmq":
        z = extra["zmq"]
        return z.recv, z.send
    if transport == "shared_memory":
        fwd_s, back_s = extra["shared_memory"]
        return functools.partial(fwd_s.recv, buf), back_s.send
    if transport == "queue":
        return fwd_q.get, back_q.put
    return fwd_r.recv_bytes, back_w.send_bytes


# How the zero-copy transports (channel_view, iceoryx2_view) fill a loaned slot, the same
# routine for both and in both processes: "memmove" (glibc's memmove: ctypes.memmove to an
# iceoryx2 slice's address, the way its Python examples write one, and np.copyto into a loaned
# array) or "fastcopy" (fastcopy.copy into a numpy array over the slot, the way a fastcopy user
# writes one). Set by run_ipc_bench(view_fill=).
VIEW_FILLS = ("memmove", "fastcopy")
_view_fill = "memmove"


def _fill_address(address: int, msg: np.ndarray) -> None:
    """Writes msg's bytes at `address` (an iceoryx2 sample's payload).
    fastcopy's policy may pick non-temporal stores and two threads for large copies, which
    also changes what the receiver finds in the cache."""
    if _view_fill == "fastcopy":
        _fill_array(np.ctypeslib.as_array((ctypes.c_uint8 * msg.nbytes).from_address(address)), msg)
    else:
        ctypes.memmove(address, _address(msg), msg.nbytes)


def _fill_array(dst: np.ndarray, msg: np.ndarray) -> None:
    """Writes msg's bytes into dst (a loaned array of msg's shape and dtype). "memmove":
    np.copyto, whose contiguous same-dtype copy is one memmove call (numpy's
    ``_contig_to_contig``): the same glibc routine as ctypes.memmove without the 3 us of
    looking up two addresses in Python (5-6 against 12-16 us per 64 B loan + view here)."""
    if _view_fill == "fastcopy":
        from . import copy as fast_copy

        fast_copy(dst, msg)
    else:
        np.copyto(dst, msg)


def _address(arr: np.ndarray) -> int:
    """The address of an array's data. ``arr.ctypes.data`` costs 2.3 us a call here (Zen 3
    VM), more than the transport of a small message; the array interface costs 1.5 us."""
    return arr.__array_interface__["data"][0]  # type: ignore[no-any-return]


def _send_loaned(ch: Any, msg: Any) -> None:
    """A producer that writes its data in place: loan, fill, publish. The fill is the one
    iceoryx2's loan gets (see _fill_address), so the two zero-copy paths differ only in the transport."""
    if isinstance(msg, bytes):
        msg = np.frombuffer(msg, np.uint8)
    with ch.loan(msg.shape, msg.dtype) as a:
        _fill_array(a, msg)


def _child_extra(setup: Dict[str, Any]) -> Dict[str, Any]:  # pragma: no cover - runs in the child
    from .shm import Channel

    extra: Dict[str, Any] = {}
    if "iceoryx2" in setup:
        fwd, back, max_size = setup["iceoryx2"]
        extra["iceoryx2"] = _Iceoryx2(fwd, back, max_size, "child")
    if "faster_fifo" in setup:
        extra["faster_fifo"] = setup["faster_fifo"]
    if "zmq" in setup:
        extra["zmq"] = _Zmq(setup["zmq"][0], setup["zmq"][1], "child")
    if "shared_memory" in setup:
        extra["shared_memory"] = setup["shared_memory"]
    return extra


def _child_main(ctrl, names, queues, pipes, setup=None) -> None:  # pragma: no cover - runs in the child
    global _view_fill
    from .shm import Channel

    _view_fill = (setup or {}).get("view_fill", "memmove")
    fwd_ch = Channel.attach(names[0])
    back_ch = Channel.attach(names[1])
    fwd_q, back_q = queues
    fwd_r, back_w = pipes
    extra = _child_extra(setup or {})
    ctrl.send("ready")
    bufs: Dict[int, np.ndarray] = {}  # receive buffers are reused across runs, as a real consumer would
    try:
        while True:
            cmd = ctrl.recv()
            if cmd[0] == "exit":
                break
            if cmd[0] == "view_channels":  # a new pair for channel_view, sized for the next size
                for ch in extra.pop("channel_view", ()):
                    ch.close()
                extra["channel_view"] = tuple(Channel.attach(n) for n in cmd[1])
                ctrl.send("done")
                continue
            kind, transport, size, count = cmd
            buf = bufs.get(size)
            if buf is None:
                buf = bufs[size] = np.ones(size, np.uint8)
            echo = kind == "pingpong"
            receive, reply = _child_endpoints(transport, buf, fwd_ch, back_ch, fwd_q, back_q, fwd_r, back_w, extra)
            m = None
            for _ in range(count):
                m = receive()
                if echo:
                    reply(m)
                m = None  # a view (or sample) is released before the next receive
            if not echo:
                reply(_ACK_ARRAY if transport in ("channel_view", "iceoryx2_view", "iceoryx2_copy",
                                                  "shared_memory", "faster_fifo") else _ACK)
            ctrl.send("done")
    finally:
        fwd_ch.close()
        back_ch.close()
        for ch in extra.get("channel_view", ()):
            ch.close()
        if "zmq" in extra:
            extra["zmq"].close()


# ---- the parent ---------------------------------------------------------------------------
class _Parent:
    def __init__(self, ctx, capacity: int, transports: Sequence[str] = (), max_size: int = 0,
                 view_fill: str = "memmove"):
        from .shm import Channel

        self.fwd_ch = Channel.create(capacity=capacity)
        self.back_ch = Channel.create(capacity=capacity)
        self.fwd_q, self.back_q = ctx.Queue(), ctx.Queue()
        fwd_r, self.fwd_w = ctx.Pipe(duplex=False)
        self.back_r, back_w = ctx.Pipe(duplex=False)
        self.ctrl, child_ctrl = ctx.Pipe()
        self.extra: Dict[str, Any] = {}
        setup: Dict[str, Any] = {"view_fill": view_fill}
        tag = f"fastcopy-bench-{os.getpid()}-{os.urandom(3).hex()}"
        self.capacity = capacity
        self.zmq_paths: Tuple[str, ...] = ()
        # Transports whose setup failed here (installed but unusable): skipped with the reason.
        self.failed: Dict[str, str] = {}

        def optional(names: Sequence[str], make: Any) -> None:
            wanted = [t for t in names if t in transports]
            if not wanted:
                return
            try:
                make()
            except Exception as e:  # a broken install must not end the whole benchmark
                for t in wanted:
                    self.failed[t] = f"could not be set up: {type(e).__name__}: {e}"

        def make_iceoryx2() -> None:
            names = (tag + "-fwd", tag + "-back")
            self.extra["iceoryx2"] = _Iceoryx2(names[0], names[1], max_size, "parent")
            setup["iceoryx2"] = (names[0], names[1], max_size)

        def make_faster_fifo() -> None:
            import faster_fifo  # type: ignore[import-not-found,import-untyped,unused-ignore]

            room = max(1 << 20, 3 * (max_size + 4096))
            pair = (faster_fifo.Queue(max_size_bytes=room), faster_fifo.Queue(max_size_bytes=room))
            self.extra["faster_fifo"] = pair
            setup["faster_fifo"] = pair

        def make_zmq() -> None:
            import tempfile

            base = os.path.join(tempfile.gettempdir(), tag)
            endpoints = ("ipc://" + base + "-fwd", "ipc://" + base + "-back")
            self.zmq_paths = (base + "-fwd", base + "-back")
            self.extra["zmq"] = _Zmq(endpoints[0], endpoints[1], "parent")
            setup["zmq"] = endpoints

        def make_shared_memory() -> None:
            pair = (_ShmSlot(ctx, max_size), _ShmSlot(ctx, max_size))
            self.extra["shared_memory"] = pair
            setup["shared_memory"] = pair

        optional(("iceoryx2_view", "iceoryx2_copy"), make_iceoryx2)
        optional(("faster_fifo",), make_faster_fifo)
        optional(("zmq",), make_zmq)
        optional(("shared_memory",), make_shared_memory)
        self.proc = ctx.Process(
            target=_child_main,
            args=(child_ctrl, (self.fwd_ch.name, self.back_ch.name), (self.fwd_q, self.back_q), (fwd_r, back_w),
                  setup),
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
            for ch in (self.fwd_ch, self.back_ch) + tuple(self.extra.get("channel_view", ())):
                ch.close()
                ch.unlink()
            for q in (self.fwd_q, self.back_q):
                q.close()
                q.join_thread()
            if "zmq" in self.extra:
                self.extra["zmq"].close()
            if self.zmq_paths:
                for path in self.zmq_paths:
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
            for slot in self.extra.get("shared_memory", ()):
                slot.close(unlink=True)
            self.extra.pop("iceoryx2", None)

    def view_channels(self, size: int, timeout: float) -> None:
        """A new channel pair for channel_view with room for three messages of `size` bytes
        (header included): one held by the receiver, one being filled, one in flight."""
        from .shm import Channel

        ring = max(64 << 10, 3 * (size + 4096))
        pair = (Channel.create(capacity=ring), Channel.create(capacity=ring))
        self.ctrl.send(("view_channels", (pair[0].name, pair[1].name)))
        self._finish(timeout)
        for ch in self.extra.pop("channel_view", ()):
            ch.close()
            ch.unlink()
        self.extra["channel_view"] = pair

    def _send(self, transport: str, msg: np.ndarray) -> None:
        if transport == "channel_view":
            _send_loaned(self.extra["channel_view"][0], msg)
        elif transport.startswith("channel"):
            self.fwd_ch.send(msg)
        elif transport.startswith("iceoryx2"):
            self.extra["iceoryx2"].send(msg)
        elif transport == "faster_fifo":
            self.extra["faster_fifo"][0].put(msg)
        elif transport == "zmq":
            self.extra["zmq"].send(msg)
        elif transport == "shared_memory":
            self.extra["shared_memory"][0].send(msg)
        elif transport == "queue":
            self.fwd_q.put(msg)
        else:
            self.fwd_w.send_bytes(msg)

    def _recv(self, transport: str, out: np.ndarray) -> None:
        if transport == "channel":
            self.back_ch.recv(out=out)
        elif transport == "channel_alloc":
            self.back_ch.recv()
        elif transport == "channel_view":
            self.extra["channel_view"][1].recv_view()  # dropped at once: the slot is released
        elif transport == "iceoryx2_view":
            self.extra["iceoryx2"].recv_view()
        elif transport == "iceoryx2_copy":
            self.extra["iceoryx2"].recv_copy(out)
        elif transport == "faster_fifo":
            self.extra["faster_fifo"][1].get(timeout=600)
        elif transport == "zmq":
            self.extra["zmq"].recv()
        elif transport == "shared_memory":
            self.extra["shared_memory"][1].recv(out)
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
    see :func:`fastcopy.measure.system.cpu_distance_record`), ``rows`` (one per
    transport and size: ``transport``, ``size``, ``messages``, ``seconds``,
    ``bandwidth_gbps``, ``bandwidth_mbps``, ``msg_rate``, ``runs``, ``rtt_median_us``,
    ``rtt_p90_us``, ``rtt_samples``, ``rtt_runs_us``: the median round trip of each repeat) and
    ``ratios`` (per size: ``channel_vs_queue``/``_pipe``, and zero copy against copy in/out and
    iceoryx2: ``a_vs_b`` throughput ratio of medians, ``a_vs_b_rtt`` round-trip ratio,
    ``*_spread`` the middle half of the paired per-repeat ratios, see
    :func:`fastcopy.measure.engine.paired_spread`).
    """
    from .shm import DEFAULT_CAPACITY

    sizes = [int(s) for s in sizes]
    for t in transports:
        if t not in TRANSPORTS:
            raise ValueError(f"unknown transport {t!r}; choose from {', '.join(TRANSPORTS)}")
    if repeats < 1 or min_time <= 0:
        raise ValueError("repeats must be >= 1 and min_time > 0")
    skipped = {t: why for t in transports if (why := _missing(t)) is not None}
    transports = [t for t in transports if t not in skipped]
    capacity = int(capacity or DEFAULT_CAPACITY)
    ctx = mp.get_context(start_method)
    if view_fill not in VIEW_FILLS:
        raise ValueError(f"unknown view_fill {view_fill!r}; choose from {', '.join(VIEW_FILLS)}")
    global _view_fill
    _view_fill = view_fill
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
