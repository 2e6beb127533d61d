"""Loopback throughput of fastcopy.net against plain Zenoh and pyzmq (docs/net.md, "Speed").

Entry point: :func:`run` (``python -m fastcopy.net.bench``) prints, per size, the median
throughput of each transport and the ratios. Each transport is a function
``(size_bytes, count) -> seconds`` for moving ``count`` arrays of ``size_bytes`` from a publisher
to a subscriber in this process over tcp/127.0.0.1, received as ndarrays (Zenoh's on the path
that :data:`path` names, :data:`PATHS`: by default the network path); :data:`TRANSPORTS`
maps names to them (the ones whose package is missing are left out, with the reason, by
:func:`available`).

:func:`run_fanout` measures the bridge's fan-out: one receiving Bridge feeding 1 and N local
Topic subscribers, the throughput of each (``python -m fastcopy bench --ipc --net`` and
``python -m fastcopy.net.bench`` print it with :func:`format_fanout`).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import statistics
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _endpoint(port: int) -> str:
    return f"tcp/127.0.0.1:{port}"


# How Zenoh carries payloads between the benchmark's peers, which share this host. "network":
# Zenoh's shared-memory transport off, so that every payload goes through TCP as it does
# between hosts. "host": Zenoh's defaults, under which peers of one host pass payloads of
# 3 KiB and more through a shared-memory pool (16 MiB) and TCP carries only their descriptors:
# several times the network path's throughput on loopback (evidence: net-zenoh-paths).
PATHS: Dict[str, Dict[str, Any]] = {
    "network": {"transport/shared_memory/enabled": False},
    "host": {},
}
# The path that every Zenoh peer this module opens takes (``bench --ipc --net --net-path``).
path = "network"


def peer_settings(zenoh_defaults: bool = False, path_name: Optional[str] = None) -> Dict[str, Any]:
    """The settings (open_session's) of a benchmark peer on ``path_name`` (default: ``path``);
    ``zenoh_defaults``: Zenoh's own defaults at the paths that fastcopy.net.ZENOH_SETTINGS
    sets (plain Zenoh's rows: what a program that opens Zenoh with its defaults gets)."""
    from . import ZENOH_SETTINGS, zenoh_module

    out = dict(PATHS[path if path_name is None else path_name])
    if zenoh_defaults:
        defaults = zenoh_module().Config()
        out.update({key: json.loads(defaults.get_json(key)) for key in ZENOH_SETTINGS})
    return out


def path_note(path_name: Optional[str] = None) -> str:
    """What the Zenoh rows measure on ``path_name`` (default: ``path``), in words."""
    name = path if path_name is None else path_name
    if name == "network":
        return "Zenoh's network path: its shared-memory transport off, every payload through TCP as between hosts"
    return "Zenoh's one-host path: payloads of 3 KiB and more through its shared memory, as between peers of one host"


def _zenoh_pair(port: int, settings: Optional[Dict[str, Any]] = None, zenoh_defaults: bool = False) -> Tuple:
    from . import open_session

    ep = _endpoint(port)
    settings = {**peer_settings(zenoh_defaults), **(settings or {})}
    a = open_session(listen=[ep], settings=settings)
    b = open_session(connect=[ep], settings=settings)
    return a, b


# Seconds to wait once a path carries messages, before those that count: Zenoh lost block-mode
# messages in 4 of 2000 fresh loopback connections when they followed the first one delivered
# within a millisecond, in none of 2000 when they followed 0.3 s later (evidence:
# net-block-mode-loss-after-connect).
SETTLE_S = 0.3


def _wait(pub_send: Callable[[], None], got: Callable[[], int]) -> None:
    """Calls ``pub_send`` every 20 ms until ``got()`` is not 0 (at most 20 s), then waits SETTLE_S."""
    deadline = time.monotonic() + 20
    while got() == 0:
        if time.monotonic() > deadline:
            raise RuntimeError("loopback pair never connected")
        pub_send()
        time.sleep(0.02)
    time.sleep(SETTLE_S)


def _drained(sub: Any) -> int:
    """The number of messages ``sub`` takes before none comes for 0.1 s."""
    n = 0
    while True:
        try:
            sub.recv_view(timeout=0.1)
        except TimeoutError:
            return n
        n += 1


def fastcopy_net(size: int, count: int, settings: Optional[Dict[str, Any]] = None) -> float:
    """fastcopy.net.Publisher -> Subscriber.recv_view (an ndarray over the received bytes);
    ``settings``: further Zenoh configuration for both peers (open_session)."""
    from . import Publisher, Subscriber

    a, b = _zenoh_pair(_port(), settings)
    try:
        pub = Publisher("bench/net", a)
        sub = Subscriber("bench/net", b, capacity=8)
        probe = np.zeros(1, np.uint8)
        _wait(lambda: pub.send(probe), lambda: _drained(sub))
        arr = np.ones(size, np.uint8)
        sub._next.clear()
        t0 = time.perf_counter()
        def send() -> None:
            for _ in range(count):
                pub.send(arr)

        th = threading.Thread(target=send)
        th.start()
        for _ in range(count):
            sub.recv_view(timeout=20)
        th.join()
        return time.perf_counter() - t0
    finally:
        a.close()
        b.close()


def zenoh_plain(size: int, count: int, settings: Optional[Dict[str, Any]] = None) -> float:
    """Plain Zenoh: put(arr.tobytes()); the subscriber takes each sample from a Zenoh FIFO channel
    of 8 (what Zenoh's default handler is) and makes np.frombuffer(payload.to_bytes()).reshape(shape);
    Zenoh's default configuration on the benchmark's path; ``settings``: further Zenoh
    configuration for both peers (open_session)."""
    import zenoh

    from . import _congestion

    a, b = _zenoh_pair(_port(), settings, zenoh_defaults=True)
    try:
        # Blocking congestion control, as fastcopy.net's default and IpcEnds': with Zenoh's
        # default a message is dropped while the queue is full, and the count is never reached.
        zpub = a.declare_publisher("bench/plain", congestion_control=_congestion("block"))
        zsub = b.declare_subscriber("bench/plain", zenoh.handlers.FifoChannel(8))
        got: List[Any] = []

        def received() -> int:
            got.append(zsub.try_recv())
            return sum(g is not None for g in got)

        _wait(lambda: zpub.put(b"x"), received)
        time.sleep(0.1)
        while zsub.try_recv() is not None:
            pass
        arr = np.ones(size, np.uint8)
        t0 = time.perf_counter()
        th = threading.Thread(target=lambda: [zpub.put(arr.tobytes()) for _ in range(count)])
        th.start()
        for _ in range(count):
            np.frombuffer(zsub.recv().payload.to_bytes(), dtype=np.uint8).reshape(arr.shape)
        th.join()
        return time.perf_counter() - t0
    finally:
        a.close()
        b.close()


def pyzmq(size: int, count: int) -> float:
    """pyzmq PUB/SUB over tcp, send(copy=False) of the array, np.frombuffer of the frame. The
    publisher is an XPUB that waits at its high-water mark (XPUB_NODROP), as IpcEnds' is: a
    plain PUB drops there, and the receiver would wait for ever for the count."""
    import zmq

    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    sub = ctx.socket(zmq.SUB)
    try:
        pub.setsockopt(zmq.XPUB_NODROP, 1)
        pub.setsockopt(zmq.SNDHWM, 8)
        sub.setsockopt(zmq.RCVHWM, 8)
        sub.setsockopt(zmq.RCVTIMEO, 20_000)  # a lost message ends in zmq.Again, not a hang
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        sub.connect(f"tcp://127.0.0.1:{port}")
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        deadline = time.monotonic() + 20
        while not pub.poll(20):  # the subscription message: the subscriber is there
            if time.monotonic() > deadline:
                raise RuntimeError("pyzmq pair never connected")
        pub.recv()
        arr = np.ones(size, np.uint8)
        done = threading.Event()

        def send() -> None:
            for _ in range(count):
                pub.send(arr, copy=False)  # type: ignore[call-overload]  # an ndarray is a Buffer at run time
            done.set()

        t0 = time.perf_counter()
        th = threading.Thread(target=send, daemon=True)  # a sender left waiting ends with the process
        th.start()
        for _ in range(count):
            frame = sub.recv(copy=False)
            np.frombuffer(frame.buffer, dtype=np.uint8).reshape(arr.shape)
        th.join()
        return time.perf_counter() - t0
    finally:
        pub.close(0)
        sub.close(0)
        ctx.term()


TRANSPORTS: Dict[str, Callable[[int, int], float]] = {
    "fastcopy.net": fastcopy_net, "zenoh put+frombuffer": zenoh_plain, "pyzmq copy=False": pyzmq,
}
_NEEDS = {"fastcopy.net": "zenoh", "zenoh put+frombuffer": "zenoh", "pyzmq copy=False": "zmq"}


# ---- the inter-process benchmark's net transports (``python -m fastcopy bench --ipc --net``) ----
# fastcopy.bench.ipc_transports registers them: IPC_TRANSPORTS says which kind each is; the parent
# makes its ends with ipc_make(kind) and the child attaches with ipc_attach(what make returned).

IPC_KINDS = {
    "net": "fastcopy.net Publisher.send over tcp/127.0.0.1; Subscriber.recv_view (an ndarray over the received bytes)",
    "zenoh_plain": "plain Zenoh (its default configuration) over tcp/127.0.0.1: put(arr.tobytes()); a FIFO channel of 8 (Zenoh's default handler), np.frombuffer(payload.to_bytes()).reshape",
    "zmq_pubsub": "pyzmq (X)PUB/SUB over tcp://127.0.0.1, send(copy=False), np.frombuffer of the frame (no-drop)",
}


# The longest one receive of IpcEnds waits: a peer that died mid-run sends nothing more, and the
# receive then ends in TimeoutError instead of waiting for ever.
RECV_TIMEOUT_S = 600.0


class IpcEnds:
    """One process's ends of a net transport: it sends on one key (or socket) and receives on the
    other; the parent listens (sends forward), the child connects (sends back). The first send
    waits until the peer's subscriber is matched, so no message goes to nobody. A receive waits
    at most ``recv_timeout`` seconds (TimeoutError): for pyzmq through the socket's RCVTIMEO,
    for plain Zenoh through a watchdog thread that undeclares the subscriber, which closes the
    channel the receive waits on; neither adds more than a clock read per message."""

    def __init__(self, kind: str, port: int, role: str, recv_timeout: float = RECV_TIMEOUT_S,
                 path_name: Optional[str] = None) -> None:
        self.kind, self.role, self._matched = kind, role, False
        self.recv_timeout = recv_timeout
        # pyzmq sockets, fastcopy.net's ends or plain Zenoh's, by kind
        self.pub: Any
        self.sub: Any
        self._zpub: Any
        out_key, in_key = ("bench/fwd", "bench/back") if role == "parent" else ("bench/back", "bench/fwd")
        if kind == "zmq_pubsub":
            import zmq

            self.ctx = zmq.Context()
            # XPUB: a PUB that also reports its subscribers, so the first send waits for the peer's.
            self.pub, self.sub = self.ctx.socket(zmq.XPUB), self.ctx.socket(zmq.SUB)
            self.pub.setsockopt(zmq.XPUB_NODROP, 1)  # the sender waits at the high-water mark, never drops
            for s, opt in ((self.pub, zmq.SNDHWM), (self.sub, zmq.RCVHWM)):
                s.setsockopt(opt, 8)
            self.sub.setsockopt(zmq.RCVTIMEO, max(1, int(recv_timeout * 1000)))
            self._zmq_again = zmq.Again  # what recv raises at RCVTIMEO
            self.sub.setsockopt(zmq.SUBSCRIBE, b"")
            base = port if role == "parent" else port + 1
            self.pub.bind(f"tcp://127.0.0.1:{base}")
            self.sub.connect(f"tcp://127.0.0.1:{port + 1 if role == 'parent' else port}")
            return
        from . import Publisher, Subscriber, open_session

        ep = _endpoint(port)
        settings = peer_settings(kind == "zenoh_plain", path_name)
        self.session = (open_session(listen=[ep], settings=settings) if role == "parent"
                        else open_session(connect=[ep], settings=settings))
        if kind == "net":
            self.pub = Publisher(out_key, self.session)
            self.sub = Subscriber(in_key, self.session, capacity=8)
            self._zpub = self.pub._pub
        else:
            # Blocking congestion control, as fastcopy.net's default: Zenoh's default drops, and a
            # dropped message would leave the receiving end waiting. The subscriber takes samples
            # from a FIFO channel (Zenoh's default handler), as fastcopy.net's Subscriber does.
            zenoh = __import__("zenoh")
            self._zpub = self.pub = self.session.declare_publisher(
                out_key, congestion_control=zenoh.CongestionControl.BLOCK)
            self.sub = self.session.declare_subscriber(in_key, zenoh.handlers.FifoChannel(8))
            # The receive waits on the handler, not on the subscriber: a receive borrows the
            # object it waits on, and the watchdog must be able to undeclare the subscriber.
            self._handler = self.sub.handler
            self._waiting_since: Optional[float] = None
            self._expired = False
            self._closed = threading.Event()
            self._watchdog = threading.Thread(target=self._watch, daemon=True, name="fastcopy-bench-recv-watchdog")
            self._watchdog.start()

    def _wait_matched(self) -> None:
        deadline = time.monotonic() + 30
        if self.kind == "zmq_pubsub":  # a PUB has no matching status: the peer's SUB says it is there
            while not self.pub.poll(100):  # the subscription message (b"\\x01")
                if time.monotonic() > deadline:
                    raise RuntimeError("net benchmark: the peer's subscriber never connected")
            self.pub.recv()
        else:
            while not self._zpub.matching_status.matching:
                if time.monotonic() > deadline:
                    raise RuntimeError("net benchmark: the peer's subscriber never matched")
                time.sleep(0.01)
            time.sleep(0.05)  # the route is declared on both sides
        self._matched = True

    def send(self, msg: Any) -> None:
        if not self._matched:
            self._wait_matched()
        if self.kind == "net":
            self.pub.send(msg)
        elif self.kind == "zenoh_plain":
            self.pub.put(msg.tobytes() if isinstance(msg, np.ndarray) else bytes(msg))
        else:
            self.pub.send(msg, copy=False)

    def _watch(self) -> None:
        """Plain Zenoh's watchdog: undeclares the subscriber once a receive has waited longer
        than recv_timeout; ends with close(), which waits for it."""
        while not self._closed.wait(min(1.0, self.recv_timeout / 4)):
            since = self._waiting_since
            if since is not None and time.monotonic() - since > self.recv_timeout:
                self._expired = True
                self.sub.undeclare()
                return

    def _timed_out(self) -> TimeoutError:
        return TimeoutError(f"net benchmark: no message from the peer within {self.recv_timeout:g} s "
                            f"({self.kind}, {self.role}'s end)")

    def recv(self) -> np.ndarray:
        if self.kind == "net":
            return self.sub.recv_view(timeout=self.recv_timeout)
        if self.kind == "zenoh_plain":
            self._waiting_since = time.monotonic()
            try:
                data = self._handler.recv().payload.to_bytes()
            except Exception:
                if self._expired:
                    raise self._timed_out() from None
                raise
            finally:
                self._waiting_since = None
            return np.frombuffer(data, np.uint8).reshape(len(data))
        try:
            return np.frombuffer(self.sub.recv(copy=False).buffer, np.uint8)
        except self._zmq_again:
            raise self._timed_out() from None

    def close(self) -> None:
        if self.kind == "zmq_pubsub":
            self.pub.close(0)
            self.sub.close(0)
            self.ctx.term()
            return
        if self.kind == "net":
            self.sub.close()
        if self.kind == "zenoh_plain":
            # The watchdog thread ends first: a thread still inside a Zenoh call (its undeclare)
            # when the interpreter exits aborts the process as it takes the GIL back ("FATAL:
            # exception not rethrown").
            self._closed.set()
            self._watchdog.join()
        self.pub.undeclare() if self.kind == "zenoh_plain" else self.pub.close()
        self.session.close()


def ipc_make(kind: str) -> Callable[[Any, str, int], Tuple[Any, Any]]:
    """The parent's make for the ipc benchmark's resource of ``kind``: (its ends, what the child gets)."""
    def make(ctx: Any, tag: str, max_size: int) -> Tuple[Any, Any]:
        port = _port() if kind != "zmq_pubsub" else _port_pair()
        return IpcEnds(kind, port, "parent", path_name=path), (kind, port, path)
    return make


def ipc_attach(got: Tuple[str, int, str]) -> IpcEnds:
    return IpcEnds(got[0], got[1], "child", path_name=got[2])


def ipc_close(ends: IpcEnds, parent: bool) -> None:
    ends.close()


def _port_pair() -> int:
    """A free port p with p + 1 also free (the two directions of the pyzmq pair)."""
    for _ in range(100):
        p = _port()
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
    raise RuntimeError("net benchmark: no two adjacent free ports on 127.0.0.1")


def available() -> Dict[str, str]:
    """Transport name -> "" when usable here, else the reason it is skipped."""
    import importlib.util

    return {name: "" if importlib.util.find_spec(mod) else f"{mod} is not installed"
            for name, mod in _NEEDS.items()}


def run(sizes: List[int] = [64 << 10, 1 << 20, 16 << 20], repeats: int = 3, total: int = 32 << 20) -> Dict:
    """Median seconds per transport and size (``count`` = total // size, 8 to 2000 messages)."""
    results: Dict = {}
    usable = [n for n, why in available().items() if not why]
    for size in sizes:
        count = max(8, min(2000, total // size))
        for _ in range(repeats):
            for name in usable:
                results.setdefault(size, {}).setdefault(name, []).append(TRANSPORTS[name](size, count) / count)
    return {size: {name: statistics.median(v) for name, v in per.items()} for size, per in results.items()}


# ---- the bridge's fan-out: fastcopy.net.Publisher -> Zenoh (tcp/127.0.0.1) -> Bridge.into ->
# a local Topic -> 1 or N subscribers reading recv_view -----------------------------------------
# The receiving bridge and every subscriber are child processes (spawn), the publisher is this
# process: on the remote host the bridge and each consumer are processes of their own, each
# with its own GIL, so the figures show what the Topic's fan-out costs, not how threads of one
# interpreter share its lock. On a machine with few CPUs the processes share the cores, as the
# 1- and N-subscriber rounds do alike: the ratio compares the two under the same load.

FANOUT_SIZES = (64 << 10, 1 << 20, 16 << 20)
FANOUT_SUBSCRIBERS = (1, 3)
# The local Topic's slots: one bridge (one Topic of the largest size) serves every size, with
# room for 8 messages in flight, as the other rows' subscribers hold 8.
FANOUT_SLOTS = 8
# One-byte messages, smaller than any measured size: the probe is sent until every subscriber
# sees one (the path is up), the end marker ends a round.
_PROBE = np.zeros(1, np.uint8)
_END = np.full(1, 255, np.uint8)


def _fanout_bridge(conn: Any, key: str, topic: str, port: int, slot_bytes: int, keep_memory: bool = True,
                   in_place: bool = True, settings: Optional[Dict[str, Any]] = None) -> None:  # pragma: no cover - child
    """Child: the receiving bridge, forwarding from ``key`` into the new local Topic ``topic``
    until the parent says stop; then reports (forwarded, lost). ``keep_memory``: calls
    keep_freed_memory() first, as ``python -m fastcopy bridge`` does; ``in_place`` and
    ``settings``: Bridge's."""
    from ..bench.engine import exit_with_parent
    from . import Bridge, keep_freed_memory

    exit_with_parent()
    if keep_memory:
        keep_freed_memory()
    try:
        bridge = Bridge.into(key, topic, connect=[_endpoint(port)], slot_bytes=slot_bytes, slots=FANOUT_SLOTS,
                             in_place=in_place, settings=settings)
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    th = threading.Thread(target=bridge.run, daemon=True)
    th.start()
    conn.send("ready")
    while conn.recv() == "cpu":  # the CPU seconds this process used so far, every thread's
        conn.send(time.process_time())
    bridge.stop()
    th.join(10)
    conn.send((bridge.forwarded, bridge.lost))
    bridge.close()


def _fanout_subscriber(conn: Any, topic: str) -> None:  # pragma: no cover - child
    """Child: on ("round", size), subscribes to ``topic``, says "subscribed", takes recv_view and
    counts the messages of ``size`` bytes until the end marker (size 0: until any message),
    dropping each view at once (as the ipc benchmark's view rows do); reports (messages,
    time.monotonic() at the last of them, the CPU seconds it used meanwhile) and unsubscribes.
    Counting up to the end marker, rather than up to the number sent, makes a lost message show
    in the count. CLOCK_MONOTONIC is the same clock in every process, so the parent subtracts
    its own start time."""
    from ..bench.engine import exit_with_parent
    from ..shm import Topic

    exit_with_parent()
    while True:
        cmd = conn.recv()
        if cmd[0] == "exit":
            return
        size = cmd[1]
        try:
            sub = Topic.subscribe(topic)
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
            continue
        try:
            conn.send("subscribed")
            got, last, cpu0 = 0, time.monotonic(), time.process_time()
            while True:
                view = sub.recv_view(timeout=60)
                if view.nbytes == size:
                    got += 1
                    last = time.monotonic()
                elif size == 0 or (view.nbytes == _END.nbytes and view[0] == _END[0]):
                    break
                del view
            del view
            conn.send((got, last, time.process_time() - cpu0))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        finally:
            sub.close()


def _replies(conns: List[Any], timeout: float) -> List[Any]:
    """One reply from each child, in order; RuntimeError when one reports an error or is silent."""
    out = []
    for i, c in enumerate(conns):
        if not c.poll(timeout):
            raise RuntimeError(f"net fan-out: child {i} did not answer within {timeout} s")
        got = c.recv()
        if isinstance(got, tuple) and got and got[0] == "error":
            raise RuntimeError(f"net fan-out: child {i}: {got[1]}")
        out.append(got)
    return out


def _fanout_round(pub: Any, conns: List[Any], size: int, count: int, timeout: float,
                  bridge: Any = None) -> Tuple[List[Dict[str, float]], Dict[str, float]]:
    """``count`` messages of ``size`` bytes, then the end marker, to the subscribers of ``conns``:
    (per subscriber, the messages it received, the seconds from the first send to its last and
    the CPU seconds it used; the CPU seconds this process (the publisher) and the ``bridge``
    child's process used over the round)."""
    for c in conns:
        c.send(("round", size))
    _replies(conns, timeout)  # all subscribed: each gets every message of the round
    arr = np.ones(size, np.uint8)

    def bridge_cpu() -> float:
        if bridge is None:
            return 0.0
        bridge.send("cpu")
        return float(_replies([bridge], timeout)[0])

    b0, p0 = bridge_cpu(), time.process_time()
    t0 = time.monotonic()
    for _ in range(count):
        pub.send(arr)
    pub.send(_END)
    subs = [{"messages": got, "seconds": t - t0, "cpu_seconds": cpu} for got, t, cpu in _replies(conns, timeout)]
    p1 = time.process_time()
    return subs, {"publisher": p1 - p0, "bridge": bridge_cpu() - b0}


def fanout_summary(size: int, runs: Dict[int, List[List[Dict[str, float]]]],
                   cpu: Optional[Dict[int, List[Dict[str, float]]]] = None) -> Dict[str, Any]:
    """The figures of one size from its runs (subscriber count -> one list per repeat of each
    subscriber's {"messages", "seconds", "cpu_seconds"}; ``cpu``: subscriber count -> per
    repeat, the publisher's and the bridge's CPU seconds): ``gbps`` (subscriber count ->
    per-subscriber median GB/s over the repeats), ``ratio`` (subscriber count > 1 -> the slowest
    subscriber's figure over the single subscriber's), ``ratio_range`` (subscriber count > 1 ->
    the lowest and highest over the repeats of the same ratio within one repeat: the slowest
    subscriber's GB/s in that repeat's round over the single subscriber's in the same repeat,
    whose rounds run next to each other) and ``cpu_us`` (subscriber count -> the
    medians over the repeats of the CPU microseconds per message of the publisher, the bridge
    and a subscriber (the median of the subscribers), and "all": the three processes' sum with
    every subscriber: what one message costs the machine)."""
    gbps: Dict[int, List[float]] = {}
    cpu_us: Dict[int, Dict[str, float]] = {}
    for n, reps in runs.items():
        gbps[n] = [statistics.median(size * rep[i]["messages"] / rep[i]["seconds"] / 1e9 for rep in reps)
                   for i in range(n)]
        if cpu and cpu.get(n):
            per: Dict[str, List[float]] = {"publisher": [], "bridge": [], "subscriber": [], "all": []}
            for rep, rc in zip(reps, cpu[n]):
                msgs = max(1, max(sub["messages"] for sub in rep))
                subs = [1e6 * sub["cpu_seconds"] / msgs for sub in rep]
                pub, bridge = 1e6 * rc["publisher"] / msgs, 1e6 * rc["bridge"] / msgs
                for key, value in (("publisher", pub), ("bridge", bridge), ("subscriber", statistics.median(subs)),
                                   ("all", pub + bridge + sum(subs))):
                    per[key].append(value)
            cpu_us[n] = {key: statistics.median(v) for key, v in per.items()}
    single = gbps.get(1, [0.0])[0]
    ratio = {n: min(g) / single for n, g in gbps.items() if n > 1 and single > 0}
    slowest = {n: [min(size * sub["messages"] / sub["seconds"] / 1e9 for sub in rep) for rep in reps]
               for n, reps in runs.items()}
    ratio_range: Dict[int, Tuple[float, float]] = {}
    for n in ratio:
        paired = [a / b for a, b in zip(slowest[n], slowest[1]) if b > 0]
        if paired:
            ratio_range[n] = (min(paired), max(paired))
    return {"size": size, "gbps": gbps, "ratio": ratio, "ratio_range": ratio_range, "cpu_us": cpu_us,
            "runs": runs, "cpu": cpu or {}}


def run_fanout(sizes: Sequence[int] = FANOUT_SIZES, repeats: int = 3, subscribers: Sequence[int] = FANOUT_SUBSCRIBERS,
               total: int = 64 << 20, count: Optional[int] = None, timeout: float = 60.0,
               keep_memory: bool = True, in_place: bool = True) -> Dict[str, Any]:
    """One receiving bridge feeding ``subscribers`` local subscribers in turn (1 and 3 by
    default), at each size: ``count`` messages per round (default total // size, 8 to 2000),
    one unmeasured round with the most subscribers first, then ``repeats`` rounds of each
    subscriber count, in an order that changes per repeat (repeat_order). ``keep_memory``: the
    bridge's process calls keep_freed_memory() (as ``python -m fastcopy bridge`` does);
    ``in_place``: the Bridge's (messages in pieces assembled in a loan of its Topic). Returns
    {"sizes", "subscribers", "repeats", "counts", "rows": [fanout_summary per size], "bridge":
    {"forwarded", "lost"}, "published", "cpus" (the CPUs this process may run on), "path" (the
    Zenoh path, PATHS)}."""
    from ..bench.engine import repeat_order
    from ..bench.system import usable_cpu_count
    from . import Publisher, open_session

    sizes = [int(s) for s in sizes]
    subscribers = sorted(set(int(n) for n in subscribers))
    if not sizes or min(sizes) <= _PROBE.nbytes:
        raise ValueError(f"net fan-out: sizes must be larger than the {_PROBE.nbytes}-byte probe and end marker")
    if not subscribers or subscribers[0] < 1 or repeats < 1:
        raise ValueError("net fan-out: subscriber counts and repeats must be at least 1")
    ctx = mp.get_context("spawn")
    port = _port()
    tag = f"fastcopy-fanout-{os.getpid()}-{os.urandom(3).hex()}"
    settings = peer_settings()
    peer = open_session(listen=[_endpoint(port)], settings=settings)
    pub = Publisher(f"bench/fanout/{tag}", peer)
    procs: List[Any] = []
    conns: List[Any] = []

    def start(target: Callable[..., None], *args: Any) -> Any:
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=target, args=(theirs, *args), daemon=True)
        proc.start()
        theirs.close()
        procs.append(proc)
        conns.append(mine)
        return mine

    rows: List[Dict[str, Any]] = []
    counts: Dict[int, int] = {}
    bridge_end: Tuple[int, int] = (0, 0)
    stopped = False
    try:
        bridge = start(_fanout_bridge, pub.key, tag, port, max(sizes), keep_memory, in_place, settings)
        _replies([bridge], timeout)
        subs = [start(_fanout_subscriber, tag) for _ in range(subscribers[-1])]
        for c in subs:  # every subscriber waits for any message; probes go until all have one
            c.send(("round", 0))
        _replies(subs, timeout)
        _wait(lambda: pub.send(_PROBE), lambda: int(all(c.poll() for c in subs)))
        _replies(subs, timeout)
        for size in sizes:
            n_msgs = counts[size] = count or max(8, min(2000, total // size))
            _fanout_round(pub, subs, size, n_msgs, timeout)  # warm-up: the slots' pages, Zenoh's buffers
            runs: Dict[int, List[List[Dict[str, float]]]] = {n: [] for n in subscribers}
            cpu: Dict[int, List[Dict[str, float]]] = {n: [] for n in subscribers}
            for r in range(repeats):
                for n in repeat_order(subscribers, r):
                    got, used = _fanout_round(pub, subs[:n], size, n_msgs, timeout, bridge)
                    runs[n].append(got)
                    cpu[n].append(used)
            rows.append(fanout_summary(size, runs, cpu))
        bridge.send("stop")
        stopped = True
        bridge_end = _replies([bridge], timeout)[0]
    finally:
        # conns[0] is the bridge's: "stop" (unless sent above), the others' "exit".
        for i, c in enumerate(conns):
            if i or not stopped:
                try:
                    c.send("stop" if i == 0 else ("exit",))
                except OSError:
                    pass
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
        for c in conns:
            c.close()
        pub.close()
        peer.close()
    return {"sizes": sizes, "subscribers": subscribers, "repeats": repeats, "counts": counts, "rows": rows,
            "bridge": {"forwarded": bridge_end[0], "lost": bridge_end[1]}, "published": pub.sent,
            "cpus": usable_cpu_count(), "path": path}


def format_fanout(res: Dict[str, Any]) -> str:
    """The fan-out rows: per size, each subscriber's GB/s with 1 and N subscribers, and the ratio."""
    head = (f"bridge fan-out ({path_note(res.get('path', path))}): fastcopy.net.Publisher -> tcp/127.0.0.1 -> "
            "Bridge.into -> local Topic -> "
            "subscribers (child processes) reading recv_view; GB/s per subscriber, median of "
            f"{res['repeats']} rounds; ratio: the slowest of N over a single subscriber (and its lowest "
            "and highest within one repeat, the two rounds side by side)")
    out = [head]
    for row in res["rows"]:
        cells = []
        for n, g in row["gbps"].items():
            cells.append(f"{n} subscriber{'s' if n > 1 else ''}: " + ", ".join(f"{x:.2f}" for x in g))
        ranges = row.get("ratio_range", {})
        cells += [f"min of {n} / single {r:.2f}x" + (f" (rounds {ranges[n][0]:.2f}-{ranges[n][1]:.2f})" if n in ranges
                                                      else "") for n, r in row["ratio"].items()]
        out.append(f"{row['size'] >> 10:>8} KiB  " + "  ".join(cells))
        if row.get("cpu_us"):
            out.append(" " * 14 + "CPU us per message: " + "; ".join(
                f"{n} subscriber{'s' if n > 1 else ''}: publisher {c['publisher']:.0f}, bridge {c['bridge']:.0f}, "
                f"subscriber {c['subscriber']:.0f} ({c['all']:.0f} in all)" for n, c in row["cpu_us"].items()))
    if any(row.get("cpu_us") for row in res["rows"]):
        out.append(f"CPU: every thread of each process over a round (time.process_time), per message; on "
                   f"{res.get('cpus', '?')} usable CPUs, messages costing X us in all come at most one per "
                   f"X / {res.get('cpus', '?')} us: where that is the pace, each added subscriber's own CPU slows all")
    return "\n".join(out)


def main() -> None:
    import os

    print(f"load average: {os.getloadavg()}")
    res = run()
    for size, per in res.items():
        base = per["fastcopy.net"]
        row = "  ".join(f"{name}: {size / t / 1e9:.2f} GB/s ({t / base:.2f}x)" for name, t in per.items())
        print(f"{size >> 10:>6} KiB  {row}")
    if not available()["fastcopy.net"]:
        print(format_fanout(run_fanout()))


if __name__ == "__main__":
    main()
