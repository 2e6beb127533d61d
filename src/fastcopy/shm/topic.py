"""Topic and Subscriber: one publisher, many subscribers, in shared memory."""

from __future__ import annotations

import os
from typing import Any, Iterator, Optional

import numpy as np

from .. import _core
from .channel import LoanedArray, _ShapeArg
from .errors import ChannelClosed
from .names import _created, _default_name, _unlink_created_in_multiprocessing_child

#: Subscriber records of a topic when Topic.create() is not given a number.
DEFAULT_MAX_SUBSCRIBERS = 16


def _int_arg(method: str, what: str, value: Any) -> int:
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"Topic.{method}: {what} must be an int, got {type(value).__name__}")
    v = int(value.__index__())
    if v < 0:
        raise ValueError(f"Topic.{method}: {what} must be >= 0, got {v}")
    if v >= 2**63:
        raise ValueError(f"Topic.{method}: {what} is too large: {v}")
    return v


class Topic(_core.ShmTopic):
    """The publisher of a topic in shared memory: one publisher, any number of subscribers.

    ``Topic.create(name=None, *, slot_bytes, slots=None, history=0, overflow="block",
    max_subscribers=16)`` makes ``/dev/shm/<name>`` with ``slots`` slots of ``slot_bytes``
    bytes (by default as many as hold 4 MiB, 4 to 1024, and at least ``history + 1``);
    message ``k`` lives in slot ``k % slots``. :meth:`subscribe` (in any process, at
    any time) returns a :class:`Subscriber` that reads every message from its joining point
    on, in order. ``overflow="block"``: ``send`` waits while a subscriber has not read the
    message in the slot it needs (dead subscribers are detected and dropped);
    ``overflow="drop"``: ``send`` overwrites and a subscriber that fell behind gets
    :class:`MessagesLost`. A slot a subscriber holds as a view (``recv_view``) is never
    overwritten, in either mode. ``history=k`` lets a late joiner start with the last ``k``
    messages still in the ring (``k <= slots - 1``). See docs/shm.md, "Topic".
    """

    _created_here = False

    @classmethod
    def create(cls, name: Optional[str] = None, *, slot_bytes: int, slots: Optional[int] = None,
               history: int = 0, overflow: str = "block",
               max_subscribers: int = DEFAULT_MAX_SUBSCRIBERS) -> "Topic":
        """A new topic; this object is its publisher. ``name`` defaults to a random
        ``fastcopy-<pid>-<hex>``; ``FileExistsError`` if it is taken. Messages (payload bytes)
        may be up to ``slot_bytes``; ``slots`` 2 to 2**20, by default as many as hold 4 MiB of
        payload, 4 to 1024, and at least ``history + 1`` (``info()["shm"]``, rule
        ``topic_default_bytes``, has the measurement); ``max_subscribers`` 1 to 1024."""
        if name is None:
            name = _default_name()
        if not isinstance(name, str):
            raise TypeError(f"Topic.create: name must be a str, got {type(name).__name__}")
        if not isinstance(overflow, str):
            raise TypeError(f"Topic.create: overflow must be 'block' or 'drop', got {type(overflow).__name__}")
        sb = _int_arg("create", "slot_bytes", slot_bytes)
        hist = _int_arg("create", "history", history)
        n = _core._shm_default_topic_slots(sb, hist) if slots is None else _int_arg("create", "slots", slots)
        subs = _int_arg("create", "max_subscribers", max_subscribers)
        if n >= 2**32 or hist >= 2**32 or subs >= 2**32:
            raise ValueError("Topic.create: slots, history and max_subscribers must be below 2**32")
        name = name.lstrip("/")
        t = cls(name, sb, n, hist, overflow, subs, True)
        t._created_here = True
        _created[name] = os.getpid()
        _unlink_created_in_multiprocessing_child()
        return t

    @staticmethod
    def subscribe(name: str) -> "Subscriber":
        """A new subscriber of the topic ``name`` (``FileNotFoundError`` if there is none,
        :class:`ChannelCorrupted` if the segment is not a valid topic, :class:`ChannelError`
        when it has ``max_subscribers`` subscribers already)."""
        return Subscriber.attach(name)

    def loan(self, shape: _ShapeArg, dtype: Any = np.uint8, timeout: Optional[float] = None) -> LoanedArray:
        """A writable array in the next slot; ``publish`` it (or leave a ``with`` block) to send
        it without a copy. Waits for the slot like :meth:`send`. At most ``slot_bytes``."""
        return self._loan(shape, dtype, timeout)  # type: ignore[no-any-return]

    def unlink(self) -> bool:  # type: ignore[override]
        """Removes ``/dev/shm/<name>`` (attached subscribers keep working). False if already gone."""
        _created.pop(self.name, None)
        return super().unlink()

    def __enter__(self) -> "Topic":
        return self

    def __exit__(self, *exc: Any) -> None:
        """Closes (subscribers get ChannelClosed after the last message); the creator also unlinks."""
        try:
            self.close()
        finally:
            if self._created_here and _created.get(self.name) == os.getpid():
                self.unlink()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"published={self.published}"
        return (f"<fastcopy.shm.Topic name={self.name!r} slots={self.slots} slot_bytes={self.slot_bytes} "
                f"overflow={self.overflow!r} {state}>")

    def __reduce__(self):
        raise TypeError("a Topic publisher cannot be pickled; pickle a Subscriber, or pass the name")


class Subscriber(_core.ShmTopic):
    """A subscriber of a :class:`Topic` (from :meth:`Topic.subscribe`).

    ``recv(out=None, timeout=None)`` returns the next message as a new array (or copies it
    into ``out``); ``recv_view(timeout=None)`` returns it as a read-only array that pins its
    slot until the array and everything derived from it are gone (``held_views``,
    ``held_bytes``); ``recv_view(cow=True)`` as a writable one whose writes copy the pages
    they touch into this process, unseen by the publisher and the other subscribers. ``lost`` counts the messages lost (overflow="drop"); iteration receives
    until the publisher closes. Picklable: unpickling subscribes again by name (a new
    subscriber starting at the next message).
    """

    @classmethod
    def attach(cls, name: str) -> "Subscriber":
        if not isinstance(name, str):
            raise TypeError(f"Topic.subscribe: name must be a str, got {type(name).__name__}")
        return cls(name.lstrip("/"), 0, 0, 0, "block", 0, False)

    def recv(self, out: Any = None, timeout: Optional[float] = None) -> Any:  # type: ignore[override]
        """The next message: a new array with the sent dtype and shape, or copied into ``out``
        (same rules and argument order as Channel.recv). Raises :class:`MessagesLost` when messages were
        overwritten before this subscriber read them (then ``out`` holds nothing useful),
        :class:`ChannelClosed` when the publisher closed and every message was read,
        :class:`PeerDied` when the publisher died, ``TimeoutError``."""
        return super().recv(out, timeout)

    def __enter__(self) -> "Subscriber":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            try:
                yield self.recv()
            except ChannelClosed:
                return

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"position={self.position} lost={self.lost}"
        return f"<fastcopy.shm.Subscriber name={self.name!r} {state}>"

    def __reduce__(self):
        return (_subscribe_by_name, (self.name,))


def _subscribe_by_name(name: str) -> Subscriber:
    return Subscriber.attach(name)
