"""The bridge: a local fastcopy.shm.Topic carried over a Zenoh key to other hosts (docs/net.md)."""
from __future__ import annotations

import sys
import threading
from typing import Any, Optional, Sequence

import numpy as np


class Bridge:
    """``Bridge.out(topic, key)``: subscribes to the local Topic ``topic`` and publishes each
    message to ``key``. ``Bridge.into(key, topic, slot_bytes=...)``: creates the local Topic
    ``topic`` and republishes each message from ``key`` into it, so N local subscribers cost one
    network transfer and read with zero-copy recv_view. ``run()`` forwards until ``stop()`` or
    the local publisher closes; counters: ``forwarded``, ``lost``, ``rejected``, ``too_big``."""

    def __init__(self, direction: str, topic: str, key: str, *, listen: Sequence[str] = (),
                 connect: Sequence[str] = (), overflow: str = "block", slot_bytes: int = 0,
                 slots: Optional[int] = None, log: Any = None) -> None:
        from . import Publisher, Subscriber, open_session
        from .. import shm

        self.direction = direction
        self.topic = topic
        self.key = key
        self.log = sys.stderr if log is None else log
        self.forwarded = self.lost = self.rejected = self.too_big = 0
        self._stop = threading.Event()
        self.session = open_session(listen, connect)
        if direction == "out":
            self._local = shm.Topic.subscribe(topic)
            self._remote: Any = Publisher(key, self.session, overflow=overflow)
        elif direction == "into":
            if slot_bytes <= 0:
                raise ValueError("Bridge.into: slot_bytes (the largest message the local Topic holds) is required")
            self._local = shm.Topic.create(topic, slot_bytes=slot_bytes, slots=slots, overflow=overflow)
            # The network side always holds Zenoh back rather than dropping here: a loss here
            # could not reach the local subscribers' MessagesLost. The local Topic drops (and
            # counts per subscriber) when created with overflow="drop".
            self._remote = Subscriber(key, self.session, overflow="block")
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
                self._remote.send(view)
                del view
                self.forwarded += 1
            else:
                try:
                    arr = self._remote.recv_view(timeout=0.2)
                except TimeoutError:
                    continue
                except MessagesLost as exc:
                    self.lost += exc.count
                    self._say(f"{exc.count} messages lost on the network")
                    continue
                except WireError as exc:
                    self.rejected += 1
                    self._say(f"rejected a payload: {exc}")
                    continue
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
