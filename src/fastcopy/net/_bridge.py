"""The bridge: a local fastcopy.shm.Topic carried over a Zenoh key to other hosts (docs/net.md)."""
from __future__ import annotations

import sys
import threading
from typing import Any, Dict, Optional, Sequence

import numpy as np


class Bridge:
    """``Bridge.out(topic, key)``: subscribes to the local Topic ``topic`` and publishes each
    message to ``key``. ``Bridge.into(key, topic, slot_bytes=...)``: creates the local Topic
    ``topic`` and republishes each message from ``key`` into it, so N local subscribers cost one
    network transfer and read with zero-copy recv_view. ``run()`` forwards until ``stop()`` or
    the local publisher closes; counters: ``forwarded``, ``lost``, ``rejected``, ``too_big``,
    ``in_place`` (messages in pieces that ``into`` assembled straight in a slot of the local
    Topic, a loan: one copy fewer than assembling them apart and sending; ``in_place=False``
    turns that off) (evidence: net-bridge-in-place). ``settings``: further Zenoh configuration
    for the bridge's connection, as open_session takes it."""

    def __init__(self, direction: str, topic: str, key: str, *, listen: Sequence[str] = (),
                 connect: Sequence[str] = (), overflow: str = "block", slot_bytes: int = 0,
                 slots: Optional[int] = None, log: Any = None, in_place: bool = True,
                 settings: Optional[Dict[str, Any]] = None) -> None:
        from . import Publisher, Subscriber, open_session
        from .. import shm

        self.direction = direction
        self.topic = topic
        self.key = key
        self.log = sys.stderr if log is None else log
        self.forwarded = self.lost = self.rejected = self.too_big = self.in_place = 0
        self._loan: Any = None  # into: the local Topic's loan that a message in pieces fills
        self._stop = threading.Event()
        self.session = open_session(listen, connect, settings=settings)
        if direction == "out":
            self._local: Any = shm.Topic.subscribe(topic)
            self._remote: Any = Publisher(key, self.session, overflow=overflow)
        elif direction == "into":
            if slot_bytes <= 0:
                raise ValueError("Bridge.into: slot_bytes (the largest message the local Topic holds) is required")
            self._local = shm.Topic.create(topic, slot_bytes=slot_bytes, slots=slots, overflow=overflow)
            # The network side always holds Zenoh back rather than dropping here: a loss here
            # could not reach the local subscribers' MessagesLost. The local Topic drops (and
            # counts per subscriber) when created with overflow="drop".
            self._remote = Subscriber(key, self.session, overflow="block")
            if in_place:
                self._remote._assemble_into(self._loan_for, self._give_back)
        else:
            raise ValueError(f"Bridge: direction must be 'out' or 'into', got {direction!r}")

    @classmethod
    def out(cls, topic: str, key: str, **kw: Any) -> "Bridge":
        return cls("out", topic, key, **kw)

    @classmethod
    def into(cls, key: str, topic: str, **kw: Any) -> "Bridge":
        return cls("into", topic, key, **kw)

    def _say(self, text: str) -> None:
        print(f"fastcopy bridge {self.direction} {self.topic!r} <-> {self.key!r}: {text}", file=self.log, flush=True)

    def _loan_for(self, head: Any) -> Any:
        """A loan of the local Topic for the message ``head`` announces, to assemble it in place;
        None (assembled apart, then sent) while another loan is out, for a message larger than
        the slots, in Fortran order or of a dtype the Topic does not lend."""
        if self._loan is not None or head.nbytes > self._local.slot_bytes or (
                head.order == "F" and len(head.shape) > 1):
            return None
        try:
            self._loan = self._local.loan(head.shape, head.dtype)
        except (TypeError, ValueError):
            return None
        return self._loan

    def _give_back(self, loan: Any) -> None:
        """Discards the loan of a message that cannot be completed."""
        if loan is self._loan:
            self._loan = None
            self._local.discard(loan)

    def stop(self) -> None:
        self._stop.set()

    def run(self, count: Optional[int] = None) -> None:
        """Forwards messages until stop(), the local publisher closes (out), or ``count`` forwarded."""
        from ..shm import ChannelClosed, MessagesLost, PeerDied
        from ._wire import WireError

        while not self._stop.is_set() and (count is None or self.forwarded < count):
            if self.direction == "out":
                try:
                    view = self._local.recv_view(timeout=0.2)
                except TimeoutError:
                    continue
                except MessagesLost as exc:
                    self.lost += exc.count
                    self._say(f"{exc.count} messages lost on the local topic")
                    continue
                except (ChannelClosed, PeerDied) as exc:
                    self._say(f"local publisher gone ({type(exc).__name__}); stopping")
                    return
                try:
                    self._remote.send(view)
                except ValueError:
                    if self._remote.closed:  # closed by close() or at interpreter exit
                        return
                    raise
                del view
                self.forwarded += 1
            else:
                try:
                    arr, _ = self._remote._recv(timeout=0.2)
                except TimeoutError:
                    continue
                except ValueError:
                    if self._remote.closed:  # closed by close() or at interpreter exit
                        return
                    raise
                except MessagesLost as exc:
                    self.lost += exc.count
                    self._say(f"{exc.count} messages lost on the network")
                    continue
                except WireError as exc:
                    self.rejected += 1
                    self._say(f"rejected a payload: {exc}")
                    continue
                if arr is self._loan:  # assembled in place
                    self._loan = None
                    self._local.publish(arr)
                    self.forwarded += 1
                    self.in_place += 1
                    continue
                if self._loan is not None:
                    # Another publisher's message is being assembled in the loan: it goes on
                    # apart, and the Topic is free to send this one.
                    self._remote._detach(self._loan)
                    self._give_back(self._loan)
                if arr.nbytes > self._local.slot_bytes:
                    self.too_big += 1
                    self._say(f"message of {arr.nbytes} bytes does not fit the local topic's "
                              f"{self._local.slot_bytes}-byte slots; skipped")
                    continue
                self._local.send(np.ascontiguousarray(arr) if not (arr.flags.c_contiguous or arr.flags.f_contiguous)
                                 else arr)
                self.forwarded += 1

    def close(self) -> None:
        self._stop.set()
        self._remote.close()
        if self.direction == "into":
            self._local.close()
            self._local.unlink()
        else:
            self._local.close()
        self.session.close()

    def __enter__(self) -> "Bridge":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
