"""fastcopy.net: numpy arrays over Zenoh, and a bridge that carries a local fastcopy.shm.Topic
to other hosts (docs/net.md).

Needs the ``net`` extra (``pip install fastcopy[net]``, which installs eclipse-zenoh). zenoh is
imported when a session is opened, never by ``import fastcopy``.

- :class:`Publisher` (key) / :class:`Subscriber` (key): arrays with their dtype, shape and
  order (wire format: ``fastcopy.net._wire``, versioned and validated strictly).
- :class:`Bridge`: ``Bridge.out(topic, key)`` publishes a local Topic's messages to a key;
  ``Bridge.into(key, topic, slot_bytes=...)`` republishes a key's messages into a local Topic.
"""
from __future__ import annotations

import atexit
import json
import math
import os
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple

import numpy as np

from .. import _core
from ._shared_payloads import SharedPayloads
from ._wire import (_DTYPE_OF, _TEXT_OF, SPLIT_FROM, WHOLE_THROUGH_SHARED_MEMORY_UP_TO, Assembly, Head, WireError,
                    first_payload, piece_bytes_for, pieces, take)

__all__ = ["Publisher", "Subscriber", "Bridge", "WireError", "MessagesLost", "open_session", "zenoh_config",
           "ZENOH_SETTINGS", "zenoh_module", "keep_freed_memory"]


def zenoh_module() -> Any:
    """The zenoh module; ImportError naming the extra when it is not installed."""
    try:
        import zenoh
    except ImportError as exc:
        raise ImportError("fastcopy.net needs eclipse-zenoh: pip install 'fastcopy[net]' "
                          f"(or pip install eclipse-zenoh) [{exc}]") from None
    return zenoh


def keep_freed_memory(max_bytes: Optional[int] = None) -> bool:
    """Makes the C library of this process serve blocks below ``max_bytes`` (default and most:
    32 MiB) from its heap and keep up to twice that of freed memory there for reuse, instead of
    mapping fresh pages for each large block and unmapping them at free. A process that receives
    large messages allocates and frees buffers of the same size per message (Zenoh's, and
    fastcopy.net's for a message in pieces); without this it faults in and zeroes new pages for
    each (evidence: net-keep-freed-memory). ``python -m fastcopy bridge`` calls it. Process-wide:
    up to 2 * max_bytes of freed memory stays with the process. True when the C library took
    the setting (glibc), False otherwise (nothing changed)."""
    if max_bytes is None:
        return _core.net_keep_freed_memory()
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
        raise TypeError(f"keep_freed_memory: max_bytes must be an int, got {type(max_bytes).__name__}")
    if not 0 < max_bytes < 1 << 63:
        raise ValueError(f"keep_freed_memory: max_bytes must be positive and below 2**63, got {max_bytes}")
    return _core.net_keep_freed_memory(max_bytes)


def MessagesLost(count: int, message: Optional[str] = None) -> Exception:  # noqa: N802 (same name as shm's)
    from ..shm import MessagesLost as _ML
    return _ML(count, message)


# The Zenoh configuration that open_session starts from (a caller's ``settings`` go on top):
# a data queue of 16 batches, the most Zenoh takes (its default: 2), which moves arrays through
# TCP, the path between hosts, faster at every size measured, at a small cost where Zenoh
# passes them through shared memory between peers of one host (evidence: net-zenoh-data-queue).
ZENOH_SETTINGS: Dict[str, Any] = {"transport/link/tx/queue/size/data": 16}


def zenoh_config(listen: Sequence[str] = (), connect: Sequence[str] = (), mode: str = "peer",
                   settings: Optional[Dict[str, Any]] = None) -> Any:
    """The zenoh.Config that open_session opens Zenoh with (same arguments)."""
    zenoh = zenoh_module()
    conf = zenoh.Config()
    conf.insert_json5("mode", json.dumps(mode))
    conf.insert_json5("scouting/multicast/enabled", "false")
    if listen:
        conf.insert_json5("listen/endpoints", json.dumps(list(listen)))
    if connect:
        conf.insert_json5("connect/endpoints", json.dumps(list(connect)))
    for path, value in {**ZENOH_SETTINGS, **(settings or {})}.items():
        conf.insert_json5(path, json.dumps(value))
    return conf


def open_session(listen: Sequence[str] = (), connect: Sequence[str] = (), mode: str = "peer",
                 settings: Optional[Dict[str, Any]] = None) -> Any:
    """Opens Zenoh (zenoh.open): peer mode, multicast scouting off, listening on / connecting to
    the given endpoints (e.g. ``tcp/127.0.0.1:7447``), ZENOH_SETTINGS. ``mode``: "peer", "client"
    (talks only to routers) or "router". ``settings``: further Zenoh configuration, path ->
    value (e.g. ``{"transport/shared_memory/enabled": False}``), applied last."""
    return zenoh_module().open(zenoh_config(listen, connect, mode, settings))


# A wake-up: an empty sample with this attachment, which a Subscriber puts to its own Zenoh
# session only (never the network) so that a receive blocked in Zenoh's queue looks again at its
# deadline, at close() and at pending signals such as Ctrl-C.
_WAKE_MARK = b"W"


# Publishers and Subscribers not yet closed. At interpreter exit each is closed while every
# thread still runs: a thread in a send or a receive then leaves Zenoh's code (the next call
# raises ValueError, the Publisher or Subscriber is closed) before the interpreter finalizes. A
# thread that is inside Zenoh's code while the interpreter finalizes unwinds through Zenoh's
# frames as it takes the GIL back, and the process aborts ("FATAL: exception not rethrown").
_open_ends: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _close_open_ends() -> None:
    errors = []
    for end in list(_open_ends):  # every one, whatever another's close raises
        try:
            end.close()
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


atexit.register(_close_open_ends)


# How often (seconds) a Publisher looks again at its session's Zenoh transports for its rule
# of whole messages (WHOLE_THROUGH_SHARED_MEMORY_UP_TO): a peer that joins or leaves changes
# the rule within this time. Either way every message arrives whole and intact; the rule
# decides only how fast.
TRANSPORTS_RECHECK_S = 0.5


def through_shared_memory_only(session: Any) -> bool:
    """Whether Zenoh moves ``session``'s messages to each of its peers through shared memory:
    it has at least one transport, and every one is a shared-memory unicast one (peers on one
    host with Zenoh's shared memory on at both ends). A session in client mode sees only its
    router: its messages may still cross the network beyond it."""
    try:
        transports = list(session.info.transports())
    except AttributeError:  # a Zenoh without SessionInfo.transports
        return False
    return bool(transports) and all(t.is_shm and not t.is_multicast for t in transports)


def _congestion(overflow: str) -> Any:
    zenoh = zenoh_module()
    if overflow == "block":
        return zenoh.CongestionControl.BLOCK
    if overflow == "drop":
        return zenoh.CongestionControl.DROP
    raise ValueError(f"overflow must be 'block' or 'drop', got {overflow!r}")


class Publisher:
    """Publishes numpy arrays to a Zenoh key. ``overflow='block'`` (default) waits when the
    network is congested; ``'drop'`` lets Zenoh drop, and subscribers count the loss."""

    def __init__(self, key: str, session: Any = None, *, overflow: str = "block", listen: Sequence[str] = (),
                 connect: Sequence[str] = ()) -> None:
        self._own = session is None
        self.session = open_session(listen, connect) if session is None else session
        self.key = key
        self.overflow = overflow
        self._pub = self.session.declare_publisher(key, congestion_control=_congestion(overflow))
        # Tells this publisher's messages from another's on the same key.
        self.source = int.from_bytes(os.urandom(8), "little")
        # Every payload of this publisher is built here (Zenoh's put copies it before it returns):
        # a new bytes object per large message costs page faults at every message
        # (evidence: net-send-buffer-reused).
        self._payload = bytearray()
        # The largest message sent whole (SPLIT_FROM, or more where every peer is reached
        # through shared memory), and when the transports were last looked at.
        self._whole_max = SPLIT_FROM
        self._transports_at = -math.inf
        # Where every peer is reached through shared memory (self._through_pool), payloads go out
        # of a pool of Zenoh shared memory of this publisher's own (fastcopy.net._shared_payloads);
        # else as they are.
        self._shared = SharedPayloads(self._pub.put)
        self._through_pool = False
        self.sent = 0
        self.closed = False
        # Held by each send: close() undeclares with no send of another thread inside Zenoh's
        # code, and sends from several threads go out one message at a time.
        self._lock = threading.Lock()
        self._undeclared = False
        _open_ends.add(self)

    def send(self, arr: Any) -> None:
        """Sends ``arr`` (any array-like numpy accepts; its dtype, shape and order travel with it).
        A message larger than the piece size goes as a head and pieces (fastcopy.net._wire).
        ValueError once the Publisher is closed (by close() from another thread, or at
        interpreter exit)."""
        with self._lock:
            try:
                self._send(arr)
            except ValueError:
                raise
            except Exception as exc:
                if not self.closed:
                    raise
                # close() stopped waiting for this send and the program then closed the Zenoh
                # connection under it, which undeclared the publisher as well; the message may
                # be cut short, and subscribers count it lost.
                self._undeclared = True
                raise ValueError("fastcopy.net.Publisher: closed during this send") from exc
            finally:
                # A close() that could not wait for this send left the rest of the close to it.
                if self.closed and not self._undeclared:
                    self._finish_close()

    def _send(self, arr: Any) -> None:
        if self.closed:
            raise ValueError("fastcopy.net.Publisher: send on a closed publisher")
        seq = self.sent
        # A whole message of a dtype sent before, from a contiguous ndarray, in one C++ call
        # (evidence: net-send-in-one-call); anything else below.
        whole_max = self._whole_limit()
        put = self._shared.put if self._through_pool else self._pub.put
        if _core.net_send_whole(put, arr, _TEXT_OF, self.source, seq, whole_max, self._payload):
            self.sent = seq + 1
            return
        block = arr if type(arr) is np.ndarray else np.asarray(arr)
        nbytes = block.nbytes
        first, block, piece_bytes = first_payload(block, seq, self.source,
                                                  nbytes if nbytes <= whole_max else piece_bytes_for(nbytes),
                                                  self._payload)
        put(first)
        # The number is spent once the head is out: a message cut short after it is a gap
        # that subscribers count as lost.
        self.sent = seq + 1
        if block.nbytes > piece_bytes:
            for piece in pieces(block, seq, self.source, piece_bytes, self._payload):
                put(piece)

    def _whole_limit(self) -> int:
        """The largest message to send whole: SPLIT_FROM, or WHOLE_THROUGH_SHARED_MEMORY_UP_TO
        where Zenoh reaches every peer of the session through shared memory (looked at again
        every TRANSPORTS_RECHECK_S), and then the payloads go out of the publisher's pool of
        shared memory (self._through_pool)."""
        now = time.monotonic()
        if now - self._transports_at >= TRANSPORTS_RECHECK_S:
            self._transports_at = now
            shared = through_shared_memory_only(self.session)
            self._whole_max = max(SPLIT_FROM, WHOLE_THROUGH_SHARED_MEMORY_UP_TO) if shared else SPLIT_FROM
            self._through_pool = shared
        return self._whole_max

    def close(self) -> None:
        """Stops publishing; a send in another thread finishes first (up to 5 s). A send that
        Zenoh holds longer (block mode, a subscriber that stopped reading) is left where it
        waits: when its put returns, that send undeclares the publisher (and closes the Zenoh
        connection the Publisher opened, if it opened one). At interpreter exit such a send stays
        held and the process ends normally."""
        if self.closed:
            return
        self.closed = True
        _open_ends.discard(self)
        # Not taken: a send is inside Zenoh's put, which holds Zenoh's publisher object (an
        # undeclare would raise "Already borrowed", and closing the Zenoh connection would wait
        # for the send, then raise).
        if self._lock.acquire(timeout=5):
            try:
                if not self._undeclared:  # a send that ended after closed was set did it already
                    self._finish_close()
            finally:
                self._lock.release()

    def _finish_close(self) -> None:
        """Undeclares the publisher and closes the Zenoh connection it opened (with no send in
        Zenoh's put)."""
        self._undeclared = True
        self._shared.close()
        try:
            self._pub.undeclare()
        finally:
            if self._own:
                self.session.close()

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Alarm:
    """Wakes a receive blocked in Zenoh's channel at a set time, by calling ``wake`` from a thread
    of its own (one per Subscriber, started at its first wait). Once it fires it is unset until
    the next ``set``. A wake-up that comes early or late only makes a receive look again."""

    def __init__(self, wake: Any) -> None:
        self._wake = wake
        self.at: Optional[float] = None  # when it fires next; None: unset
        self._sleeps_until = math.inf
        self._stopped = False
        self._cv = threading.Condition(threading.Lock())
        self._thread = threading.Thread(target=self._run, name="fastcopy.net wake-up", daemon=True)
        self._thread.start()

    def set(self, at: float) -> None:
        with self._cv:
            self.at = at
            if at < self._sleeps_until:
                self._cv.notify()

    def stop(self, timeout: float) -> None:
        """Stops the thread and waits up to ``timeout`` seconds for it to end (a wake-up it is
        running finishes first)."""
        with self._cv:
            self._stopped = True
            self._cv.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        with self._cv:
            while not self._stopped:
                at, now = self.at, time.monotonic()
                if at is not None and now >= at:
                    # Unset before the wake-up reads whether a receive waits (see Subscriber._wait).
                    self.at = None
                    self._cv.release()
                    try:
                        self._wake()
                    finally:
                        self._cv.acquire()
                    continue
                self._sleeps_until = math.inf if at is None else at
                self._cv.wait(None if at is None else at - now)


class Subscriber:
    """Receives the arrays published on a Zenoh key, in order. Its queue is Zenoh's own channel
    of ``capacity`` payloads (a message of up to 128 KiB is one payload; a larger one is one per
    piece, fastcopy.net._wire): ``overflow='block'`` holds Zenoh back when it is full
    (back-pressure to the publisher), ``'drop'`` drops the oldest payload. Messages lost on the
    way (dropped here, by Zenoh, cut short, or before this subscriber joined a running
    publisher, which is not counted) raise MessagesLost from recv with the exact count from
    each publisher's message numbers. In drop mode a message of more pieces than ``capacity``
    arrives only while the reader keeps up. A corrupt or foreign payload raises WireError from
    recv (``rejected`` counts them); the next recv goes on. ``max_bytes``: the largest message
    in pieces accepted; a head announcing more is rejected before anything is allocated.

    Receiving takes payloads from Zenoh's channel on the receiving thread, so no Python code
    runs on Zenoh's threads (evidence: net-subscriber-zenoh-channel). A receive that waits
    wakes at least every WAKE_EVERY seconds (signals such as Ctrl-C, close() from another
    thread) by an empty sample it puts to its own Zenoh session only; other subscribers of the
    key in that Zenoh session see those samples (fastcopy.net's ignore them)."""

    # Publishers whose next message number and unfinished message are kept (the oldest go first).
    SOURCES_KEPT = 64
    WAKE_EVERY = 0.2

    def __init__(self, key: str, session: Any = None, *, capacity: int = 64, overflow: str = "block",
                 max_bytes: int = 1 << 30, listen: Sequence[str] = (), connect: Sequence[str] = ()) -> None:
        if overflow not in ("block", "drop"):
            raise ValueError(f"overflow must be 'block' or 'drop', got {overflow!r}")
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        zenoh = zenoh_module()
        self._own = session is None
        self.session = open_session(listen, connect) if session is None else session
        self.key = key
        self.overflow = overflow
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._local = zenoh.Locality.SESSION_LOCAL
        # Zenoh's channel takes no call from two threads at once (one blocked in recv() included):
        # every call to it holds this lock.
        self._lock = threading.Lock()
        self._alarm: Optional[_Alarm] = None
        # True while a receive waits in Zenoh's channel. Only then does a wake-up go in: the
        # channel is empty then, so the wake-up's put cannot wait for room (in block mode a full
        # channel holds the put back until a receive takes from it or undeclare).
        self._waiting = False
        self._next: Dict[int, int] = {}  # publisher -> its next message number
        self._assembling: Dict[int, Assembly] = {}  # publisher -> its message coming in pieces
        # Where messages in pieces are assembled (_assemble_into); None: arrays of its own.
        self._target_for: Optional[Callable[[Head], Optional[np.ndarray]]] = None
        self._release: Callable[[np.ndarray], None] = lambda target: None
        self._pending: Optional[Tuple[np.ndarray, bool]] = None
        # A payload the one-step receive took but left to the waiting path (_take returns it first).
        self._taken: Optional[bytes] = None
        self.lost = 0
        self.rejected = 0
        self.received = 0
        self.closed = False
        channel = zenoh.handlers.FifoChannel(capacity) if overflow == "block" else zenoh.handlers.RingChannel(capacity)
        self._sub = self.session.declare_subscriber(key, channel)
        _open_ends.add(self)

    def _assemble_into(self, target_for: Callable[[Head], Optional[np.ndarray]],
                       release: Callable[[np.ndarray], None]) -> None:
        """Assembles each message in pieces into ``target_for(head)`` (an array of the head's shape
        and dtype, C-contiguous; None: an array of its own), which the receive then returns as is;
        ``release(target)`` gets back a target whose message cannot be completed (lost, or
        dropped at close). The receiving Bridge assembles into loans of its local Topic so."""
        self._target_for, self._release = target_for, release

    def _detach(self, target: np.ndarray) -> None:
        """The unfinished message assembled in ``target`` goes on in an array of its own, so that
        the owner of ``target`` may reuse it."""
        for asm in self._assembling.values():
            if asm.target is target:
                asm.detach()

    def _drop_assembly(self, source: int) -> None:
        """Drops the unfinished message of ``source`` (it is lost), giving back its target."""
        asm = self._assembling.pop(source, None)
        if asm is not None and asm.target is not None:
            self._release(asm.target)

    def _start_assembly(self, head: Head) -> None:
        """Starts assembling the message ``head`` announces, dropping the unfinished one of the
        same publisher and, when SOURCES_KEPT are unfinished, the oldest."""
        self._drop_assembly(head.source)
        if len(self._assembling) >= self.SOURCES_KEPT:
            self._drop_assembly(next(iter(self._assembling)))
        self._assembling[head.source] = Assembly(head, self.max_bytes, self._target_for)

    def _wake(self) -> None:
        if not self._waiting:
            return
        try:
            self.session.put(self.key, b"", attachment=_WAKE_MARK, allowed_destination=self._local)
        except Exception:  # the Zenoh session is closed: a blocked receive has returned with an error
            pass

    def _take(self, deadline: Optional[float], timeout: Optional[float]) -> bytes:
        """The next payload's bytes, waiting until ``deadline`` (None: for ever)."""
        left = -1 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._lock.acquire(timeout=left):
            raise TimeoutError(f"fastcopy.net.Subscriber: no message on {self.key!r} within {timeout} s")
        try:
            while True:
                if self.closed:
                    raise ValueError("fastcopy.net.Subscriber: recv on a closed subscriber")
                if self._taken is not None:
                    data, self._taken = self._taken, None
                    return data
                try:
                    sample = self._sub.try_recv()
                    if sample is None:
                        sample = self._wait(deadline, timeout)
                except Exception:
                    if self.closed or self.session.is_closed():  # Zenoh's channel is closed with them
                        raise ValueError("fastcopy.net.Subscriber: recv on a closed subscriber") from None
                    raise
                data = sample.payload.to_bytes()
                if not data and sample.attachment is not None and sample.attachment.to_bytes() == _WAKE_MARK:
                    continue
                return data
        finally:
            self._lock.release()

    def _wait(self, deadline: Optional[float], timeout: Optional[float]) -> Any:
        """Waits in Zenoh's channel for the next sample, a wake-up at most WAKE_EVERY away."""
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise TimeoutError(f"fastcopy.net.Subscriber: no message on {self.key!r} within {timeout} s")
        if self._alarm is None:
            self._alarm = _Alarm(self._wake)
        due = now + self.WAKE_EVERY if deadline is None else min(deadline, now + self.WAKE_EVERY)
        # close() sets `closed` and then wakes a waiting receive; the alarm unsets itself and
        # then wakes a waiting receive. `_waiting` is set before `closed` and the alarm are read,
        # so either this receive sees them or they see it waiting. An alarm already set to fire
        # by `due` serves this wait too: the lock of setting it is taken about once per
        # WAKE_EVERY, not once per message.
        self._waiting = True
        try:
            if self.closed:
                raise ValueError("fastcopy.net.Subscriber: recv on a closed subscriber")
            at = self._alarm.at
            if at is None or at > due:
                self._alarm.set(due)
            return self._sub.recv()
        finally:
            self._waiting = False

    def _message(self, timeout: Optional[float]) -> Tuple[int, int, np.ndarray, bool]:
        """(publisher, message number, array, whether the array is this subscriber's own) of the
        next complete message. A message whose pieces do not follow its head in order (some were
        lost) is dropped here; its number's gap counts it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        assembling = self._assembling
        while True:
            try:
                part = take(self._take(deadline, timeout))
                if isinstance(part, tuple):  # a whole message: (source, seq, array)
                    if assembling:
                        self._drop_assembly(part[0])  # unfinished: lost
                    return part[0], part[1], part[2], False
                if isinstance(part, Head):
                    self._start_assembly(part)
                    continue
            except WireError:
                self.rejected += 1
                raise
            asm = assembling.get(part.source)
            if asm is None:
                continue  # a piece of a message whose head this subscriber did not take
            if not asm.fits(part):
                self._drop_assembly(part.source)
                continue
            if asm.add(part):
                del assembling[part.source]
                return part.source, part.seq, asm.array(), True

    def _keep(self, memo: Dict[int, Any], source: int, value: Any) -> None:
        if source not in memo and len(memo) >= self.SOURCES_KEPT:
            del memo[next(iter(memo))]
        memo[source] = value

    def _whole_now(self) -> Optional[np.ndarray]:
        """The common case in one step, with the lock held: when a payload is queued, takes it;
        returns the array of a whole message of a dtype already checked that carries its
        publisher's next number. Anything else taken (a wake-up aside) is left in ``_taken``
        for the waiting path, which reads, checks and counts it; None then, and when nothing was
        queued (evidence: net-receive-in-one-step)."""
        if self.closed or self._taken is not None:
            return None
        try:
            sample = self._sub.try_recv()
        except Exception:  # the waiting path reports it
            return None
        if sample is None:
            return None
        data = sample.payload.to_bytes()
        try:
            whole = _core.net_take(data, _DTYPE_OF)
        except ValueError:
            whole = None
        if whole is None or self._next.get(whole[0]) != whole[1]:
            if data or sample.attachment is None or sample.attachment.to_bytes() != _WAKE_MARK:
                self._taken = data
            return None
        source, seq, arr = whole
        self._next[source] = seq + 1
        self.received += 1
        return arr

    def _recv(self, timeout: Optional[float]) -> Tuple[np.ndarray, bool]:
        """(the next message's array, whether it is this subscriber's own); MessagesLost first
        when messages were lost before it."""
        if self._pending is not None:
            got, self._pending = self._pending, None
            return got
        if not self._assembling and self._lock.acquire(False):
            try:
                arr = self._whole_now()
            finally:
                self._lock.release()
            if arr is not None:
                return arr, False
        source, seq, arr, own = self._message(timeout)
        expected = self._next.get(source)
        self._keep(self._next, source, seq + 1)
        self.received += 1
        # A publisher's first message, or a number below the expected one (a foreign or
        # replayed publisher id), starts its count over.
        if expected is not None and seq > expected:
            gap = seq - expected
            self.lost += gap
            self._pending = (arr, own)
            raise MessagesLost(gap, f"fastcopy.net: {gap} messages lost on {self.key!r}")
        return arr, own

    def recv_view(self, timeout: Optional[float] = None) -> np.ndarray:
        """The next message as a read-only array over the received bytes (no copy after Zenoh's;
        a message in pieces is copied together once)."""
        arr, own = self._recv(timeout)
        if own and arr.flags.writeable:
            arr.flags.writeable = False
        return arr

    def recv(self, out: Any = None, timeout: Optional[float] = None) -> Any:
        """The next message: a writable array, or copied into ``out`` (same shape and dtype, one
        copy with fastcopy.copy). MessagesLost first when messages were lost before it; the
        message after the gap is then returned by the next recv."""
        arr, own = self._recv(timeout)
        if out is None:
            return arr if own and arr.flags.writeable else arr.copy(order="K")
        if not isinstance(out, np.ndarray) or out.shape != arr.shape or out.dtype != arr.dtype:
            self._pending = (arr, own)  # the message stays: the next recv returns it
            raise ValueError(f"recv(out=): out must be an ndarray of shape {arr.shape} and dtype {arr.dtype}; "
                             "the message stays for the next recv")
        from .. import copy as fcopy
        fcopy(out, arr)
        return out

    def __iter__(self) -> Iterator[np.ndarray]:
        """The messages as recv() returns them, until the Subscriber is closed (by close() from
        another thread, or at interpreter exit): the iteration then ends."""
        while not self.closed:
            try:
                msg = self.recv()
            except ValueError:
                if self.closed:
                    return
                raise
            yield msg

    def close(self) -> None:
        """Stops receiving; a recv blocked in another thread returns with ValueError."""
        if self.closed:
            return
        self.closed = True
        _open_ends.discard(self)
        self._wake()
        # A receive blocked in Zenoh's channel returns at the wake-up; the channel is then free.
        # undeclare also releases a wake-up's put held back by a full channel.
        taken = self._lock.acquire(timeout=5)
        try:
            if taken:
                self._sub.undeclare()
        finally:
            if taken:
                for source in list(self._assembling):
                    self._drop_assembly(source)
                self._lock.release()
            # The alarm's wake-up may be inside Zenoh (its put) now: it ends before close()
            # returns, so no thread of this Subscriber is in Zenoh's code when its Zenoh session
            # closes or the interpreter exits. A thread that takes the GIL back from Zenoh's code
            # while the interpreter finalizes unwinds through Zenoh's frames, and the process
            # aborts ("FATAL: exception not rethrown"). After undeclare: it releases a wake-up's
            # put that a full block-mode channel holds back.
            if self._alarm is not None:
                self._alarm.stop(timeout=5)
            if self._own:
                self.session.close()

    def __enter__(self) -> "Subscriber":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


from ._bridge import Bridge  # noqa: E402
