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

import collections
import json
import os
import threading
import time
from typing import Any, Deque, Dict, Iterator, Optional, Sequence, Tuple

import numpy as np

from ._wire import Assembly, Head, WireError, encode_parts, read

__all__ = ["Publisher", "Subscriber", "Bridge", "WireError", "MessagesLost", "open_session", "zenoh_module"]


def zenoh_module() -> Any:
    """The zenoh module; ImportError naming the extra when it is not installed."""
    try:
        import zenoh
    except ImportError as exc:
        raise ImportError("fastcopy.net needs eclipse-zenoh: pip install 'fastcopy[net]' "
                          f"(or pip install eclipse-zenoh) [{exc}]") from None
    return zenoh


def MessagesLost(count: int, message: Optional[str] = None) -> Exception:  # noqa: N802 (same name as shm's)
    from ..shm import MessagesLost as _ML
    return _ML(count, message)


def open_session(listen: Sequence[str] = (), connect: Sequence[str] = (), mode: str = "peer",
                 settings: Optional[Dict[str, Any]] = None) -> Any:
    """A Zenoh session: peer mode, multicast scouting off, listening on / connecting to the given
    endpoints (e.g. ``tcp/127.0.0.1:7447``). ``mode``: "peer", "client" (talks only to routers)
    or "router". ``settings``: further Zenoh configuration, path -> value (e.g.
    ``{"transport/link/rx/buffer_size": 1 << 24}``), applied last."""
    zenoh = zenoh_module()
    conf = zenoh.Config()
    conf.insert_json5("mode", json.dumps(mode))
    conf.insert_json5("scouting/multicast/enabled", "false")
    if listen:
        conf.insert_json5("listen/endpoints", json.dumps(list(listen)))
    if connect:
        conf.insert_json5("connect/endpoints", json.dumps(list(connect)))
    for path, value in (settings or {}).items():
        conf.insert_json5(path, json.dumps(value))
    return zenoh.open(conf)


# Marks the pieces of a message sent in pieces (their Zenoh attachment), so a subscriber counts
# messages, not pieces, against its capacity without reading the payload.
_PIECE_MARK = b"P"


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
        self.sent = 0
        self.closed = False

    def send(self, arr: Any) -> None:
        """Sends ``arr`` (any array-like numpy accepts; its dtype, shape and order travel with it).
        A message larger than the piece size goes as a head and pieces (fastcopy.net._wire)."""
        if self.closed:
            raise ValueError("fastcopy.net.Publisher: send on a closed publisher")
        a = np.asarray(arr)
        parts = encode_parts(a, self.sent, self.source)
        self._pub.put(next(parts))
        # The number is spent once the head is out: a message cut short after it is a gap
        # that subscribers count as lost.
        self.sent += 1
        for piece in parts:
            self._pub.put(piece, attachment=_PIECE_MARK)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._pub.undeclare()
            if self._own:
                self.session.close()

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Subscriber:
    """Receives the arrays published on a Zenoh key, in order. Keeps up to ``capacity`` messages;
    ``overflow='block'`` holds Zenoh back when full (back-pressure to the publisher), ``'drop'``
    drops the oldest. Messages lost on the way (dropped here, by Zenoh, cut short, or before this
    subscriber joined a running publisher, which is not counted) raise MessagesLost from recv
    with the exact count from each publisher's message numbers. A corrupt or foreign payload
    raises WireError from recv (``rejected`` counts them); the next recv goes on. ``max_bytes``:
    the largest message in pieces accepted; a head announcing more is rejected before anything
    is allocated."""

    # Pieces held besides the capacity's messages: a message in pieces comes in while the reader
    # takes the pieces before it. In drop mode, more pieces drop older messages' pieces.
    PIECES_HELD = 64
    # Publishers whose next message number and unfinished message are kept (the oldest go first).
    SOURCES_KEPT = 64

    def __init__(self, key: str, session: Any = None, *, capacity: int = 64, overflow: str = "block",
                 max_bytes: int = 1 << 30, listen: Sequence[str] = (), connect: Sequence[str] = ()) -> None:
        if overflow not in ("block", "drop"):
            raise ValueError(f"overflow must be 'block' or 'drop', got {overflow!r}")
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        self._own = session is None
        self.session = open_session(listen, connect) if session is None else session
        self.key = key
        self.overflow = overflow
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._q: Deque[Tuple[Any, bool]] = collections.deque()  # (payload, is a piece)
        self._heads = 0   # messages (heads) in _q
        self._pieces = 0  # pieces in _q
        self._cv = threading.Condition()
        self._next: Dict[int, int] = {}  # publisher -> its next message number
        self._assembling: Dict[int, Assembly] = {}  # publisher -> its message coming in pieces
        self._pending: Optional[Tuple[np.ndarray, bool]] = None
        self.lost = 0
        self.rejected = 0
        self.received = 0
        self.closed = False
        self._sub = self.session.declare_subscriber(key, self._on_sample)

    def _on_sample(self, sample: Any) -> None:
        # The payload as Zenoh hands it over; its bytes are taken in recv, on the receiving
        # thread, so Zenoh's own thread goes on receiving meanwhile.
        data = sample.payload
        piece = sample.attachment is not None
        with self._cv:
            if piece:
                if self.overflow == "block":
                    while self._pieces >= self.PIECES_HELD and not self.closed:
                        self._cv.wait(0.1)
                else:
                    while self._pieces >= self.PIECES_HELD:
                        if not self._make_room_for_piece():
                            return  # recv counts this piece's message lost
                self._pieces += 1
            else:
                if self.overflow == "block":
                    while self._heads >= self.capacity and not self.closed:
                        self._cv.wait(0.1)
                elif self._heads >= self.capacity:
                    self._drop_oldest_message()
                self._heads += 1
            self._q.append((data, piece))
            self._cv.notify_all()

    def _make_room_for_piece(self) -> bool:
        """Drop mode, the pieces held reached: drops the oldest piece queued before the newest
        head (of an older message, recv counts it lost). False when only the newest message's
        own pieces are queued: the incoming piece is then dropped."""
        q = self._q
        last_head = max((i for i, (_, piece) in enumerate(q) if not piece), default=-1)
        for i in range(last_head):
            if q[i][1]:
                del q[i]
                self._pieces -= 1
                return True
        return False

    def _drop_oldest_message(self) -> None:
        """Drops the oldest queued message with its pieces (and the pieces before it, of a
        message recv has begun, which is then lost)."""
        q = self._q
        while q and q[0][1]:
            q.popleft()
            self._pieces -= 1
        q.popleft()
        self._heads -= 1
        while q and q[0][1]:
            q.popleft()
            self._pieces -= 1

    def _take(self, deadline: Optional[float], timeout: Optional[float]) -> Any:
        with self._cv:
            while not self._q:
                if self.closed:
                    raise ValueError("fastcopy.net.Subscriber: recv on a closed subscriber")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"fastcopy.net.Subscriber: no message on {self.key!r} within {timeout} s")
                self._cv.wait(left if left is not None else 0.5)
            data, piece = self._q.popleft()
            if piece:
                self._pieces -= 1
            else:
                self._heads -= 1
            self._cv.notify_all()
            return data

    def _message(self, timeout: Optional[float]) -> Tuple[int, int, np.ndarray, bool]:
        """(publisher, message number, array, whether the array is this subscriber's own) of the
        next complete message. A message whose pieces do not follow its head in order (some were
        lost) is dropped here; its number's gap counts it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                part = read(self._take(deadline, timeout).to_bytes())
                if isinstance(part, Head):
                    self._assembling.pop(part.source, None)  # unfinished: lost
                    if part.complete:
                        return part.source, part.seq, part.array(), False
                    self._keep(self._assembling, part.source, Assembly(part, self.max_bytes))
                    continue
            except WireError:
                self.rejected += 1
                raise
            asm = self._assembling.get(part.source)
            if asm is None:
                continue  # a piece of a message whose head this subscriber did not take
            if not asm.fits(part):
                del self._assembling[part.source]
                continue
            if asm.add(part):
                del self._assembling[part.source]
                return part.source, part.seq, asm.array(), True

    def _keep(self, memo: Dict[int, Any], source: int, value: Any) -> None:
        if source not in memo and len(memo) >= self.SOURCES_KEPT:
            del memo[next(iter(memo))]
        memo[source] = value

    def _recv(self, timeout: Optional[float]) -> Tuple[np.ndarray, bool]:
        """(the next message's array, whether it is this subscriber's own); MessagesLost first
        when messages were lost before it."""
        if self._pending is not None:
            got, self._pending = self._pending, None
            return got
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
        while not self.closed:
            yield self.recv()

    def close(self) -> None:
        with self._cv:
            if self.closed:
                return
            self.closed = True
            self._cv.notify_all()
        self._sub.undeclare()
        if self._own:
            self.session.close()

    def __enter__(self) -> "Subscriber":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


from ._bridge import Bridge  # noqa: E402
