"""The transports of the inter-process benchmark (``fastcopy.bench.ipc``), as a registry.

``TRANSPORTS[name]`` is a ``Transport``: its name and words, the package it needs (``missing()``
says why it cannot run here, or None), the shared resource it is set up with (``RESOURCES``:
made in the parent, attached in the child) and how one process sends and receives one message
on its ends (``Ends``). The parent and the child run the same ``send``/``recv``, each on its own
ends: the parent sends on the forward direction and receives on the back one, the child the
other way round, and a child that echoes sends back what its ``recv`` returned.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np


class Ends:
    """One process's ends of every transport, each a pair (what it sends on, what it receives
    on): ``ch`` (the two fastcopy.shm.Channels), ``q`` (multiprocessing Queues), ``pipe`` (the
    send_bytes and recv_bytes ends of two Pipes) and, per resource or ``channel_view``, ``extra``."""

    def __init__(self, ch: Tuple[Any, Any], q: Tuple[Any, Any], pipe: Tuple[Any, Any]):
        self.ch, self.q, self.pipe = ch, q, pipe
        self.extra: Dict[str, Any] = {}


@dataclass(frozen=True)
class Resource:
    """Something a transport is set up with. ``make(ctx, tag, max_size)`` runs in the parent and
    returns (the parent's ends, what the child gets); ``attach(got)`` runs in the child and returns
    its ends; ``close(ends, parent)`` releases them (the parent also removes what it made)."""

    make: Callable[[Any, str, int], Tuple[Any, Any]]
    attach: Callable[[Any], Any]
    close: Callable[[Any, bool], None] = lambda ends, parent: None


@dataclass(frozen=True)
class Transport:
    """One way to move a message between the two processes (see the module docstring)."""

    name: str
    words: str
    recv: Callable[[Ends, np.ndarray], Any]  # one message, into the buffer where the transport can
    send: Callable[[Ends, Any], None]        # one message, or what recv returned (an echo)
    resource: Optional[str] = None           # the key of RESOURCES it needs
    package: Optional[Tuple[str, str]] = None  # (module to import, pip name)
    array_ack: bool = False  # it carries arrays only: the end-of-run acknowledgement is an array
    default: bool = True     # run when no transports are named

    def missing(self) -> Optional[str]:
        """Why this transport cannot run here, or None."""
        if self.package is not None and importlib.util.find_spec(self.package[0]) is None:
            module, pip = self.package
            return f"{module} is not installed (pip install {pip}, or fastcopy[bench])"
        return None


# ---- the objects behind the optional transports: one per process and direction pair -------

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
        # Poll, spinning a little, then yielding the CPU between polls: a pure spin starves the
        # peer on a machine of few CPUs (evidence: bench-iceoryx2-poll-yields).
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
        from .. import copy as fast_copy

        sample = self._sample()
        view = np.frombuffer(sample.payload().as_memory_view(), np.uint8)
        dst = out if out.nbytes == view.nbytes else np.empty(view.nbytes, np.uint8)
        fast_copy(dst, view)
        del view, sample
        return dst


class _Zmq:
    """pyzmq PUSH/PULL over ``ipc://`` endpoints, one socket per direction; the parent binds."""

    def __init__(self, fwd: str, back: str, role: str):
        import zmq  # type: ignore[import-not-found,unused-ignore]

        self.paths: Tuple[str, ...] = ()  # the socket files, removed by the parent at the end
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


# How the zero-copy transports (channel_view, iceoryx2_view) fill a loaned slot, the same
# routine for both and in both processes: "memmove" (glibc's memmove: ctypes.memmove to an
# iceoryx2 slice's address, the way its Python examples write one, and np.copyto into a loaned
# array) or "fastcopy" (fastcopy.copy into a numpy array over the slot, the way a fastcopy user
# writes one). Set by run_ipc_bench(view_fill=) through set_view_fill.
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
    ``_contig_to_contig``): the same glibc routine as ctypes.memmove without looking up two
    addresses in Python (evidence: bench-loan-fill-copyto)."""
    if _view_fill == "fastcopy":
        from .. import copy as fast_copy

        fast_copy(dst, msg)
    else:
        np.copyto(dst, msg)


def _address(arr: np.ndarray) -> int:
    """The address of an array's data, through the array interface: ``arr.ctypes.data`` costs
    more than the transport of a small message (evidence: bench-array-address-cost)."""
    return arr.__array_interface__["data"][0]  # type: ignore[no-any-return]


def _send_loaned(ch: Any, msg: Any) -> None:
    """A producer that writes its data in place: loan, fill, publish. The fill is the one
    iceoryx2's loan gets (see _fill_address), so the two zero-copy paths differ only in the transport."""
    if isinstance(msg, bytes):
        msg = np.frombuffer(msg, np.uint8)
    with ch.loan(msg.shape, msg.dtype) as a:
        _fill_array(a, msg)


def set_view_fill(fill: str) -> None:
    """How the zero-copy transports fill a loan in this process (one of VIEW_FILLS)."""
    global _view_fill
    if fill not in VIEW_FILLS:
        raise ValueError(f"unknown view_fill {fill!r}; choose from {', '.join(VIEW_FILLS)}")
    _view_fill = fill


# ---- the resources -------------------------------------------------------------------------

def _make_iceoryx2(ctx: Any, tag: str, max_size: int) -> Tuple[Any, Any]:
    names = (tag + "-fwd", tag + "-back", max_size)
    return _Iceoryx2(names[0], names[1], max_size, "parent"), names


def _make_faster_fifo(ctx: Any, tag: str, max_size: int) -> Tuple[Any, Any]:
    import faster_fifo  # type: ignore[import-not-found,import-untyped,unused-ignore]

    room = max(1 << 20, 3 * (max_size + 4096))
    pair = (faster_fifo.Queue(max_size_bytes=room), faster_fifo.Queue(max_size_bytes=room))
    return pair, pair


def _make_zmq(ctx: Any, tag: str, max_size: int) -> Tuple[Any, Any]:
    import tempfile

    base = os.path.join(tempfile.gettempdir(), tag)
    endpoints = ("ipc://" + base + "-fwd", "ipc://" + base + "-back")
    z = _Zmq(endpoints[0], endpoints[1], "parent")
    z.paths = (base + "-fwd", base + "-back")
    return z, endpoints


def _close_zmq(z: Any, parent: bool) -> None:
    z.close()
    for path in getattr(z, "paths", ()) if parent else ():
        try:
            os.unlink(path)
        except OSError:
            pass


def _make_shared_memory(ctx: Any, tag: str, max_size: int) -> Tuple[Any, Any]:
    pair = (_ShmSlot(ctx, max_size), _ShmSlot(ctx, max_size))
    return pair, pair


def _close_shared_memory(pair: Any, parent: bool) -> None:
    for slot in pair if parent else ():
        slot.close(unlink=True)


def _swap(pair: Tuple[Any, Any]) -> Tuple[Any, Any]:
    """The child's (send, receive) pair from the parent's: the child sends on the back direction."""
    return pair[1], pair[0]


RESOURCES: Dict[str, Resource] = {
    "iceoryx2": Resource(_make_iceoryx2, lambda got: _Iceoryx2(got[0], got[1], got[2], "child")),
    "faster_fifo": Resource(_make_faster_fifo, _swap),
    "zmq": Resource(_make_zmq, lambda got: _Zmq(got[0], got[1], "child"), _close_zmq),
    "shared_memory": Resource(_make_shared_memory, _swap, _close_shared_memory),
}


# ---- the transports ------------------------------------------------------------------------

def _iceoryx2_echo(e: Ends, m: Any) -> None:
    e.extra["iceoryx2"].send(m[1] if isinstance(m, tuple) else m)  # a received view is (sample, array)


_ALL = [
    Transport("channel", "fastcopy.shm.Channel: send, and recv(out=) into a reused array",
              lambda e, buf: e.ch[1].recv(out=buf), lambda e, m: e.ch[0].send(m)),
    Transport("channel_alloc", "fastcopy.shm.Channel: send, and recv() returning a new array",
              lambda e, buf: e.ch[1].recv(), lambda e, m: e.ch[0].send(m), default=False),
    Transport("channel_view", "fastcopy.shm.Channel zero copy: loan, fill, publish; recv_view and drop",
              lambda e, buf: e.extra["channel_view"][1].recv_view(),
              lambda e, m: _send_loaned(e.extra["channel_view"][0], m), array_ack=True),
    Transport("iceoryx2_view", "iceoryx2 publish-subscribe: loan, fill, send; a view of the sample, dropped",
              lambda e, buf: e.extra["iceoryx2"].recv_view(), _iceoryx2_echo,
              resource="iceoryx2", package=("iceoryx2", "iceoryx2"), array_ack=True),
    Transport("iceoryx2_copy", "iceoryx2 publish-subscribe: the sample copied out with fastcopy",
              lambda e, buf: e.extra["iceoryx2"].recv_copy(buf), lambda e, m: e.extra["iceoryx2"].send(m),
              resource="iceoryx2", package=("iceoryx2", "iceoryx2"), array_ack=True),
    Transport("faster_fifo", "faster-fifo's Queue (array pickled)",
              lambda e, buf: e.extra["faster_fifo"][1].get(timeout=600), lambda e, m: e.extra["faster_fifo"][0].put(m),
              resource="faster_fifo", package=("faster_fifo", "faster-fifo"), array_ack=True),
    Transport("zmq", "pyzmq PUSH/PULL over ipc://, copy=False",
              lambda e, buf: e.extra["zmq"].recv(), lambda e, m: e.extra["zmq"].send(m),
              resource="zmq", package=("zmq", "pyzmq")),
    Transport("shared_memory", "multiprocessing.shared_memory slot per direction, two semaphores, numpy copies",
              lambda e, buf: e.extra["shared_memory"][1].recv(buf), lambda e, m: e.extra["shared_memory"][0].send(m),
              resource="shared_memory", array_ack=True),
    Transport("queue", "multiprocessing.Queue (array pickled)",
              lambda e, buf: e.q[1].get(), lambda e, m: e.q[0].put(m)),
    Transport("pipe", "multiprocessing.Pipe: send_bytes, recv_bytes",
              lambda e, buf: e.pipe[1].recv_bytes(), lambda e, m: e.pipe[0].send_bytes(m)),
]

# The network transports of fastcopy.net.bench (``bench --ipc --net``): run only when named or with
# --net; zenoh and pyzmq are imported by their make/attach, never by this module.
def _net_resource(kind: str) -> Resource:
    def make(ctx: Any, tag: str, max_size: int) -> Tuple[Any, Any]:
        from ..net import bench as net_bench
        return net_bench.ipc_make(kind)(ctx, tag, max_size)

    def attach(got: Any) -> Any:
        from ..net import bench as net_bench
        return net_bench.ipc_attach(got)

    return Resource(make, attach, lambda ends, parent: ends.close())


NET_TRANSPORTS = (("net", "zenoh", "eclipse-zenoh (the fastcopy[net] extra)",
                   "fastcopy.net Publisher.send; Subscriber.recv_view (tcp/127.0.0.1)"),
                  ("zenoh_plain", "zenoh", "eclipse-zenoh (the fastcopy[net] extra)",
                   "plain Zenoh: put(arr.tobytes()); np.frombuffer(payload.to_bytes()).reshape (tcp/127.0.0.1)"),
                  ("zmq_pubsub", "zmq", "pyzmq",
                   "pyzmq XPUB/SUB over tcp://127.0.0.1, copy=False, no-drop, np.frombuffer of the frame"))


def _net_recv(key: str) -> Callable[[Any, Any], Any]:
    return lambda e, buf: e.extra[key].recv()


def _net_send(key: str) -> Callable[[Any, Any], Any]:
    return lambda e, m: e.extra[key].send(m)


for _name, _module, _pip, _words in NET_TRANSPORTS:
    RESOURCES[_name] = _net_resource(_name)
    _ALL.append(Transport(_name, _words, _net_recv(_name), _net_send(_name), resource=_name,
                          package=(_module, _pip), array_ack=True, default=False))
TRANSPORTS: Dict[str, Transport] = {t.name: t for t in _ALL}
DEFAULT_TRANSPORTS = tuple(t.name for t in _ALL if t.default)
