"""Shared-memory channels between processes: ``fastcopy.shm.Channel``.

A :class:`Channel` is a single-producer single-consumer ring buffer in POSIX shared memory
(``/dev/shm/<name>``). One process sends numpy arrays (or any buffer), another receives
them with their dtype and shape; the bytes are copied into and out of the ring with
fastcopy's kernels (the ``to_shared`` / ``from_shared`` policy entries of ``fastcopy.info()``).
Messages of any size are accepted: messages larger than the ring are split into chunks and
reassembled on the receiving side. See docs/shm.md.

Example (two processes)::

    # producer                                    # consumer
    ch = Channel.create("frames", capacity=1<<24)  ch = Channel.attach("frames")
    ch.send(np.arange(10.0))                       a = ch.recv()          # new array
    ...                                            ch.recv(out=buffer)    # into a buffer
    ch.close(); ch.unlink()                        ch.close()

Errors: :class:`ChannelError` (a RuntimeError) and its subclasses :class:`ChannelCorrupted`
(the shared header or a message header failed validation), :class:`PeerDied` (the other
process exited while we waited for it) and :class:`ChannelClosed` (the other end closed);
``TimeoutError`` when a timeout passes; ``ValueError`` for an ``out`` of the wrong dtype,
shape or length (``TypeError`` when it is not a writable C-contiguous buffer at all; the
message stays in the channel either way) or use after ``close()``; ``TypeError`` naming the
argument for a wrong argument type; :class:`ChannelArgumentError` (both a ChannelError and a
ValueError) for an invalid name or a capacity out of range; :class:`ShmSpaceError` (an OSError
ENOSPC and a ChannelError) when /dev/shm has no room, checked before anything is created
(:func:`preflight` checks several segments' sum at once). docs/shm.md has a table of every
failure mode.

Names in /dev/shm are removed by the creating process (``unlink()``, ``with``, interpreter
exit, multiprocessing child exit, SIGTERM/SIGHUP); :func:`list_segments` and
:func:`clean_segments` (``python -m fastcopy shm --list/--clean``) find and remove the ones a
killed creator left behind.
"""

from __future__ import annotations

import sys
from typing import List

if sys.platform != "linux":  # pragma: no cover
    raise ImportError("fastcopy.shm needs Linux (futex, /dev/shm)")

# The modules by concern: errors (the exceptions), dtypes (the dtype wire text), names (the
# names this process created), channel (Channel, LoanedArray), topic (Topic, Subscriber),
# segments (finding and removing stale segments), space (preflight, the doctor's report).
from .channel import DEFAULT_CAPACITY, Channel, LoanedArray
from .errors import (ChannelArgumentError, ChannelClosed, ChannelCorrupted, ChannelError, MessagesLost, PeerDied,
                     ShmSpaceError)
from .segments import clean_segments, list_segments
from .space import preflight
from .topic import DEFAULT_MAX_SUBSCRIBERS, Subscriber, Topic  # noqa: F401 (DEFAULT_MAX_SUBSCRIBERS: public, not in __all__)

__all__ = [
    "Channel",
    "LoanedArray",
    "ChannelError",
    "ChannelArgumentError",
    "ChannelCorrupted",
    "PeerDied",
    "ChannelClosed",
    "MessagesLost",
    "ShmSpaceError",
    "preflight",
    "Topic",
    "Subscriber",
    "DEFAULT_CAPACITY",
    "list_segments",
    "clean_segments",
]

# The public classes and functions are fastcopy.shm's: that is the name tracebacks, reprs and
# pickles show, whichever module defines them.
for _obj in (Channel, LoanedArray, ChannelError, ChannelArgumentError, ChannelCorrupted, PeerDied, ChannelClosed,
             MessagesLost, ShmSpaceError, Topic, Subscriber, list_segments, clean_segments, preflight):
    _obj.__module__ = __name__
del _obj


def __dir__() -> List[str]:
    # dir() and tab completion list the public API, not the modules and typing names imported here.
    return sorted(__all__)
