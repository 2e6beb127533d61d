"""The exceptions of fastcopy.shm (re-exported there): what a channel or topic raises beyond
the built-in TypeError, ValueError and TimeoutError."""

from __future__ import annotations

from typing import Optional


class ChannelError(RuntimeError):
    """A shared-memory channel cannot be used (base class of the channel errors)."""


class ChannelArgumentError(ChannelError, ValueError):
    """An invalid channel or topic name, or a capacity out of range: a :class:`ChannelError`
    that is also a ``ValueError``, like the other bad values given to this module."""


class ChannelCorrupted(ChannelError):
    """The shared header or a message header failed validation (corrupt or hostile segment).

    The channel is unusable afterwards; nothing outside the segment was read or written.
    """


class PeerDied(ChannelError):
    """The process at the other end exited (or was killed) while this one waited for it."""


class ChannelClosed(ChannelError):
    """The other end closed the channel (recv: and every sent message was received)."""


class ShmSpaceError(OSError, ChannelError):
    """/dev/shm has no room for a segment: raised by ``Channel.create`` / ``Topic.create`` before
    anything is created (the preflight), by ``attach`` when the segment's pages cannot be
    allocated, and by :func:`preflight`. An ``OSError`` with ``errno`` ENOSPC (what a full
    /dev/shm always raised) that is also a :class:`ChannelError`. The message names the bytes
    needed and free, the path, and the fix (``docker run --shm-size=...``, a Kubernetes
    ``emptyDir`` with ``medium: Memory``); ``needed``, ``free`` (bytes) and ``path`` hold them."""

    def __init__(self, errno: int, message: str, needed: Optional[int] = None, free: Optional[int] = None,
                 path: Optional[str] = None) -> None:
        super().__init__(errno, message)
        self.needed = needed
        self.free = free
        self.path = path

    def __reduce__(self):  # type: ignore[override]
        return (ShmSpaceError, (self.errno, self.strerror, self.needed, self.free, self.path))


class MessagesLost(ChannelError):
    """A :class:`Subscriber` of a topic with ``overflow="drop"`` fell behind: ``count``
    messages were overwritten before it read them (never handed out torn). The next
    ``recv`` continues with the oldest message still in the ring."""

    def __init__(self, count: int, message: Optional[str] = None) -> None:
        super().__init__(message or f"{count} messages were lost (overwritten before they were read)")
        self.count = count

    def __reduce__(self):  # type: ignore[override]
        return (MessagesLost, (self.count, str(self)))
