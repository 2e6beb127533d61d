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
import threading
import time
from typing import Any, Deque, Dict, Iterator, Optional, Sequence

import numpy as np

from ._wire import WireError, decode, encode

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
    import json

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
        self.sent = 0
        self.closed = False

    def send(self, arr: Any) -> None:
        """Sends ``arr`` (any array-like numpy accepts; its dtype, shape and order travel with it)."""
        if self.closed:
            raise ValueError("fastcopy.net.Publisher: send on a closed publisher")
        a = np.asarray(arr)
        self._pub.put(encode(a, self.sent))
        self.sent += 1

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
    drops the oldest. Messages lost on the way (dropped here, by Zenoh, or before this subscriber
    joined a running publisher, which is not counted) raise MessagesLost from recv with the exact
    count from the publisher's message numbers. A corrupt or foreign payload raises WireError from
    recv (``rejected`` counts them); the next recv goes on."""

    def __init__(self, key: str, session: Any = None, *, capacity: int = 64, overflow: str = "block",
                 listen: Sequence[str] = (), connect: Sequence[str] = ()) -> None:
        if overflow not in ("block", "drop"):
            raise ValueError(f"overflow must be 'block' or 'drop', got {overflow!r}")
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._own = session is None
        self.session = open_session(listen, connect) if session is None else session
        self.key = key
        self.overflow = overflow
        self.capacity = capacity
        self._q: Deque[Any] = collections.deque()
        self._cv = threading.Condition()
        self._next: Optional[int] = None
        self.lost = 0
        self.rejected = 0
        self.received = 0
        self.closed = False
        self._sub = self.session.declare_subscriber(key, self._on_sample)

    def _on_sample(self, sample: Any) -> None:
        # The payload as Zenoh hands it over; its bytes are taken in recv, on the receiving
        # thread, so Zenoh's own thread goes on receiving meanwhile.
        data = sample.payload
        with self._cv:
            if self.overflow == "block":
                while len(self._q) >= self.capacity and not self.closed:
                    self._cv.wait(0.1)
            elif len(self._q) >= self.capacity:
                self._q.popleft()
                self._dropped_here += 1
            self._q.append(data)
            self._cv.notify_all()

    _dropped_here = 0

    def _take(self, timeout: Optional[float]) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while not self._q:
                if self.closed:
                    raise ValueError("fastcopy.net.Subscriber: recv on a closed subscriber")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"fastcopy.net.Subscriber: no message on {self.key!r} within {timeout} s")
                self._cv.wait(left if left is not None else 0.5)
            data = self._q.popleft()
            self._cv.notify_all()
            return data

    def recv_view(self, timeout: Optional[float] = None) -> np.ndarray:
        """The next message as a read-only array over the received bytes (no copy after Zenoh's)."""
        if self._pending is not None:
            arr, self._pending = self._pending, None
            return arr
        data = self._take(timeout).to_bytes()
        try:
            seq, arr = decode(data)
        except WireError:
            self.rejected += 1
            raise
        if self._next is not None and seq != self._next:
            gap = seq - self._next
            self._next = seq + 1
            if gap > 0:
                self.lost += gap
                self.received += 1
                self._pending = arr
                raise MessagesLost(gap, f"fastcopy.net: {gap} messages lost on {self.key!r}")
            # A restarted publisher numbers from 0 again: start over from it.
        self._next = seq + 1
        self.received += 1
        return arr

    _pending: Optional[np.ndarray] = None

    def recv(self, out: Any = None, timeout: Optional[float] = None) -> Any:
        """The next message: a writable array, or copied into ``out`` (same shape and dtype, one
        copy with fastcopy.copy). MessagesLost first when messages were lost before it; the
        message after the gap is then returned by the next recv."""
        arr = self.recv_view(timeout)
        if out is None:
            return arr.copy(order="K")
        if not isinstance(out, np.ndarray) or out.shape != arr.shape or out.dtype != arr.dtype:
            self._pending = arr  # the message stays: the next recv returns it
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
