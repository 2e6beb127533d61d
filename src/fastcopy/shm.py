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
ValueError) for an invalid name or a capacity out of range. docs/shm.md has a table of every
failure mode.

Names in /dev/shm are removed by the creating process (``unlink()``, ``with``, interpreter
exit, multiprocessing child exit, SIGTERM/SIGHUP); :func:`list_segments` and
:func:`clean_segments` (``python -m fastcopy shm --list/--clean``) find and remove the ones a
killed creator left behind.
"""

from __future__ import annotations

import ast
import atexit
import math
import os
import secrets
import sys
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Type, Union

import numpy as np

from . import _core

if sys.platform != "linux":  # pragma: no cover
    raise ImportError("fastcopy.shm needs Linux (futex, /dev/shm)")

__all__ = [
    "Channel",
    "LoanedArray",
    "ChannelError",
    "ChannelArgumentError",
    "ChannelCorrupted",
    "PeerDied",
    "ChannelClosed",
    "MessagesLost",
    "Topic",
    "Subscriber",
    "DEFAULT_CAPACITY",
    "list_segments",
    "clean_segments",
]


def __dir__() -> List[str]:
    # dir() and tab completion list the public API, not the modules and typing names imported here.
    return sorted(__all__)


#: Ring size in bytes when Channel.create() is not given one.
DEFAULT_CAPACITY = 8 << 20


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


class MessagesLost(ChannelError):
    """A :class:`Subscriber` of a topic with ``overflow="drop"`` fell behind: ``count``
    messages were overwritten before it read them (never handed out torn). The next
    ``recv`` continues with the oldest message still in the ring."""

    def __init__(self, count: int, message: Optional[str] = None) -> None:
        super().__init__(message or f"{count} messages were lost (overwritten before they were read)")
        self.count = count

    def __reduce__(self):  # type: ignore[override]
        return (MessagesLost, (self.count, str(self)))


# How a dtype travels in a message header (whose layout and limits, a dtype text of printable
# ASCII among them, cpp/shm/shm_sync.h defines): ``dtype.str`` for a plain dtype, else ``'lit:'``
# and the ascii() text of a Python literal, which escapes every character outside ASCII in
# field names, titles and metadata (ast.literal_eval gives them back exactly):
#   ["sub", base, shape]                                           a sub-array dtype
#   ["struct", names, formats, offsets, itemsize, aligned]         a structure
#   ["struct", names, formats, offsets, itemsize, aligned, titles] one with titles (None: untitled)
#   ["record", struct]                                             a structure of type np.record
#   ["meta", dtype, metadata]                                      a dtype with metadata (a dict)
# A dtype whose description does not come back exactly from its text is refused by send and
# loan (TypeError): a receiver never gets a dtype other than the one sent.
_LITERAL_ATOMS = (str, bytes, int, bool, type(None))


def _is_literal(obj: Any, depth: int = 0) -> bool:
    """Whether ast.literal_eval(ascii(obj)) gives obj back: str, bytes, int, bool, None,
    finite floats and complex numbers, and lists, tuples, non-empty sets and dicts of them."""
    kind = type(obj)
    if depth > 32:
        return False
    if kind in _LITERAL_ATOMS:
        return True
    if kind is float:
        return math.isfinite(obj)
    if kind is complex:
        return math.isfinite(obj.real) and math.isfinite(obj.imag)
    if kind in (list, tuple) or (kind is set and obj):
        return all(_is_literal(x, depth + 1) for x in obj)
    if kind is dict:
        return all(_is_literal(k, depth + 1) and _is_literal(v, depth + 1) for k, v in obj.items())
    return False


def _short_repr(obj: Any) -> str:
    try:
        text = repr(obj)
    except Exception:
        text = f"<{type(obj).__name__}>"
    return text if len(text) <= 120 else text[:117] + "..."


def _encode_dtype(dtype: np.dtype, what: str, kinds: List[Any]) -> Any:
    """The literal that describes dtype (see above); appends to ``kinds`` what the literal does
    not name of each part: its DType class, scalar type and flags."""
    kinds.append((type(dtype), dtype.type, dtype.flags))
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        enc: Any = ["sub", _encode_dtype(base, what, kinds), list(shape)]
    elif dtype.fields is not None:
        names = list(dtype.names or ())
        fields = [dtype.fields[n] for n in names]
        enc = ["struct", names, [_encode_dtype(f[0], what, kinds) for f in fields], [f[1] for f in fields],
               dtype.itemsize, bool(dtype.isalignedstruct)]
        titles = [f[2] if len(f) > 2 else None for f in fields]
        for name, title in zip(names, titles):
            if not _is_literal(title):
                raise TypeError(f"{what}: dtype {dtype} cannot be sent: the title {_short_repr(title)} of field "
                                f"{name!r} is not a Python literal (str, bytes, numbers, bool, None)")
        if any(t is not None for t in titles):
            enc.append(titles)
        if dtype.type is np.record:
            enc = ["record", enc]
    else:
        enc = dtype.str
        if np.dtype(enc).type is not dtype.type:
            # A type that shares its layout with another: np.longlong is '<i8' as np.int64 is
            # (on Linux), and only its character code names it.
            enc = enc[0] + dtype.char
    if dtype.metadata is not None:
        meta = dict(dtype.metadata)
        if not _is_literal(meta):
            raise TypeError(f"{what}: dtype {dtype} cannot be sent: its metadata {_short_repr(meta)} is not made "
                            "of Python literals (str, bytes, int, finite float and complex, bool, None, and "
                            "lists, tuples, non-empty sets and dicts of them)")
        enc = ["meta", enc, meta]
    return enc


def _decode_dtype(obj: Any) -> np.dtype:
    if isinstance(obj, str):
        return np.dtype(obj)
    tag = obj[0] if isinstance(obj, list) and obj else None
    if tag == "sub" and len(obj) == 3:
        shape = obj[2]
        if not (isinstance(shape, list) and all(isinstance(d, int) and 0 <= d < 2**31 for d in shape)):
            raise ValueError("bad sub-array shape")
        return np.dtype((_decode_dtype(obj[1]), tuple(shape)))
    if tag == "struct" and len(obj) in (6, 7):
        _, names, formats, offsets, itemsize, aligned = obj[:6]
        titles = obj[6] if len(obj) == 7 else None
        if not (isinstance(names, list) and isinstance(formats, list) and isinstance(offsets, list)
                and len(names) == len(formats) == len(offsets) and all(isinstance(n, str) for n in names)
                and all(isinstance(o, int) and 0 <= o < 2**31 for o in offsets)
                and isinstance(itemsize, int) and 0 <= itemsize < 2**31 and isinstance(aligned, bool)
                and (titles is None or (isinstance(titles, list) and len(titles) == len(names)))):
            raise ValueError("bad structured dtype")
        spec = {"names": names, "formats": [_decode_dtype(f) for f in formats], "offsets": offsets,
                "itemsize": itemsize}
        if titles is not None:
            spec["titles"] = titles
        return np.dtype(spec, align=aligned)
    if tag == "record" and len(obj) == 2:
        inner = _decode_dtype(obj[1])
        if inner.fields is None:
            raise ValueError("bad record dtype")
        return np.dtype((np.record, inner))
    if tag == "meta" and len(obj) == 3 and isinstance(obj[2], dict):
        return np.dtype(_decode_dtype(obj[1]), metadata=obj[2])
    raise ValueError("bad dtype description")


def _same_dtype(a: np.dtype, b: np.dtype) -> bool:
    """a and b alike in every respect, recursively: ``==`` ignores metadata and the scalar type."""
    if (type(a), a.type, a.str, a.itemsize, a.alignment, a.flags, a.isalignedstruct) != (
            type(b), b.type, b.str, b.itemsize, b.alignment, b.flags, b.isalignedstruct):
        return False
    if (a.metadata is None) != (b.metadata is None) or (a.metadata is not None and dict(a.metadata) != dict(b.metadata)):
        return False
    if (a.subdtype is None) != (b.subdtype is None) or (a.names is None) != (b.names is None):
        return False
    if a.subdtype is not None and (a.subdtype[1] != b.subdtype[1] or not _same_dtype(a.subdtype[0], b.subdtype[0])):
        return False
    if a.names is not None:
        if a.names != b.names:
            return False
        for n in a.names:
            fa, fb = a.fields[n], b.fields[n]
            if fa[1:] != fb[1:] or not _same_dtype(fa[0], fb[0]):
                return False
    return True


# (text, kinds) of the dtypes whose text gave them back exactly. The check decodes the text:
# done at every send of a structure whose dtype object the Channel had not seen (its cache
# keeps 64), a send + recv took 22-25 us against 4 us without the check, and 4.2 us with this
# record (200 distinct dtype objects, 2-vCPU Xeon VM). Two dtypes with the same text and kinds
# decode alike, so one check answers for both.
_carried: Dict[Tuple[str, Tuple[Any, ...]], None] = {}


def _dtype_to_wire(dtype: np.dtype, what: str = "send") -> str:
    """dtype -> the text carried in message headers (see above). TypeError, naming ``what``,
    for a dtype the text cannot describe exactly."""
    if dtype.hasobject:
        raise TypeError(f"{what}: arrays of dtype {dtype} hold Python object pointers, which cannot cross processes")
    kinds: List[Any] = []
    enc = _encode_dtype(dtype, what, kinds)
    wire = enc if isinstance(enc, str) else "lit:" + ascii(enc)
    key = (wire, tuple(kinds))
    if key in _carried:
        return wire
    try:
        same = _same_dtype(_dtype_from_wire(wire), dtype)
    except Exception:
        same = False
    if not same:
        raise TypeError(f"{what}: dtype {_short_repr(dtype)} cannot be sent: a message header cannot describe it "
                        "exactly (its scalar type is not numpy's own, or a part of it does not come back "
                        "from its description)")
    if len(_carried) >= 4096:
        _carried.clear()
    _carried[key] = None
    return wire


def _dtype_from_wire(wire: str) -> np.dtype:
    """Inverse of _dtype_to_wire for untrusted input: only literals are parsed, and anything
    unexpected raises (the channel then reports ChannelCorrupted)."""
    if wire.startswith("lit:"):
        dt = _decode_dtype(ast.literal_eval(wire[4:]))
    else:
        if len(wire) > 64:
            raise ValueError("dtype string too long")
        dt = np.dtype(wire)
    if dt.hasobject:
        raise ValueError("object dtype in a message")
    return dt


class LoanedArray(np.ndarray):
    """A writable numpy array that lives in a channel's ring, from :meth:`Channel.loan`.

    Fill it in place, then :meth:`Channel.publish` it (or leave a ``with`` block without an
    exception) to send it without a copy. Leaving the ``with`` block with an exception, calling
    :meth:`Channel.discard`, closing the channel or dropping the last reference to the array
    (and to anything derived from it) sends nothing and frees its space. After publish or
    discard the array is read-only; slices taken before must not be written any more (the
    consumer may be reading those bytes, and later the space is reused).
    """

    def __enter__(self) -> "LoanedArray":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # Publish (or discard, when the block raised) unless that happened inside the block;
        # ValueError for an array that is not a loan (a slice or copy of one).
        _end_loan_block(self, exc_type is None)

    def __array_wrap__(self, arr: Any, context: Any = None, return_scalar: bool = False) -> Any:
        # Results of ufuncs on a loan are ordinary arrays (they do not live in the ring).
        if return_scalar:
            return arr[()]
        return np.asarray(arr)


_end_loan_block = _core._end_loan_block
_core._shm_set_loaned_array_type(LoanedArray)
_core._shm_set_messages_lost_type(MessagesLost)
_core._shm_set_bad_argument_type(ChannelArgumentError)

_ShapeArg = Union[int, Sequence[int]]


# Segments this process created and has not unlinked: removed at interpreter exit (so a
# forgotten unlink() does not leave files in /dev/shm). Only in the creating process, not in
# forked children.
_created: Dict[str, int] = {}


@atexit.register
def _unlink_created_at_exit() -> None:
    pid = os.getpid()
    for name, owner in list(_created.items()):
        if owner == pid:
            _core.shm_unlink(name)
    _created.clear()


_child_cleanup_pid = 0


def _unlink_created_in_multiprocessing_child() -> None:
    """A multiprocessing child (fork, forkserver or spawn; Pool workers too) ends with
    ``os._exit`` after multiprocessing's own finalizers, so atexit never runs there and the
    channels it created stayed in /dev/shm. Register the same cleanup as a multiprocessing
    finalizer (in a plain process it also runs at exit; the second call finds nothing)."""
    global _child_cleanup_pid
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is None or _child_cleanup_pid == os.getpid():
        return
    _child_cleanup_pid = os.getpid()
    mp_util.Finalize(None, _unlink_created_at_exit, exitpriority=0)


def _loan_args(what: str, shape: Any, dtype: Any) -> Tuple[Tuple[int, ...], np.dtype]:
    """(dims, dtype) of a loan request; TypeError naming ``what`` for bad arguments. The C++
    loan reads the common case (an int or a tuple of ints, a numpy dtype) itself and calls
    this for anything else (a dtype given by name or type, a list, numpy integers)."""
    dims: Tuple[int, ...]
    kind = type(shape)
    if kind is int:
        dims = (shape,)
    elif kind is tuple and all(type(d) is int for d in shape):
        dims = shape
    elif isinstance(shape, bool):
        raise TypeError(f"{what}: shape must be an int or a sequence of ints, got bool")
    elif hasattr(type(shape), "__index__"):
        dims = (shape.__index__(),)
    else:
        try:
            dims = tuple(d.__index__() for d in shape)
        except (TypeError, AttributeError):
            raise TypeError(f"{what}: shape must be an int or a sequence of ints, got {shape!r}") from None
        if any(isinstance(d, bool) for d in shape):
            raise TypeError(f"{what}: shape must be an int or a sequence of ints, got a bool in it")
    if isinstance(dtype, np.dtype):
        dt = dtype
    else:
        try:
            dt = np.dtype(dtype)
        except TypeError as e:
            raise TypeError(f"{what}: not a dtype: {dtype!r} ({e})") from None
    if dt.hasobject:
        raise TypeError(f"{what}: arrays of dtype {dt} hold Python object pointers, which cannot cross processes")
    return dims, dt


_core._shm_set_support(
    ChannelError, ChannelCorrupted, PeerDied, ChannelClosed, _dtype_to_wire, _dtype_from_wire,
    np.ascontiguousarray, np.generic, np.asarray, _loan_args,
)


def _name_arg(method: str, name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"Channel.{method}: name must be a str, got {type(name).__name__}")
    return name


def _default_name() -> str:
    return f"fastcopy-{os.getpid()}-{secrets.token_hex(6)}"


class Channel(_core.ShmRing):
    """One end of a one-way message channel in shared memory (one producer, one consumer).

    Make one with :meth:`create` (allocates ``/dev/shm/<name>``) and open the other end in
    another process with :meth:`attach` (or inherit it through ``fork``). The first
    :meth:`send` makes an end the producer, the first :meth:`recv` the consumer; an end is
    either, not both (use two channels for request/reply).

    ``send(obj, timeout=None)``
        Copies a numpy array (any dtype without Python objects, any shape; non-contiguous
        arrays are made contiguous first) or any C-contiguous buffer (bytes, bytearray,
        memoryview, mmap) into the ring. The receiver gets the exact dtype (names, titles,
        metadata included); one a message header cannot describe exactly (metadata or a title
        that is not a Python literal, a scalar type of its own) raises ``TypeError`` here and
        in ``loan``, with nothing sent. Blocks while the ring is full; ``timeout`` in
        seconds (None = wait forever, 0 = don't wait) raises ``TimeoutError`` with nothing
        sent. Messages larger than the capacity are streamed in chunks (the consumer must be
        receiving); if such a send times out or is interrupted half way, the message is cut:
        the consumer skips it (``cut_messages`` counts them) and the channel goes on; a
        ``send`` that raises never delivers its message. A ``recv`` that times out or is
        interrupted half way keeps its place: the next ``recv`` returns the whole message.
        Any other failure half way (a dead peer, a corrupt header, no memory to keep the
        part a ``recv`` received) breaks the channel.
    ``recv(out=None, timeout=None)``
        Returns the next message as a new numpy array with the sent dtype and shape
        (buffers that were not numpy arrays come back as 1-D ``uint8`` arrays), or copies
        it into ``out`` and returns ``out``: a numpy array needs the same dtype and shape and
        to be C-contiguous and writable; any other writable buffer needs the same byte
        length. A wrong ``out`` raises ``ValueError`` (``TypeError`` when it is not a writable
        C-contiguous buffer) and leaves the message in the channel.
    ``peek(timeout=None)``
        ``(dtype, shape)`` of the next message without consuming it, or None on timeout.
    ``loan(shape, dtype=uint8, timeout=None)``, ``publish(arr)``, ``discard(arr)``
        Zero copy on the producer side: a writable array in the ring (:class:`LoanedArray`),
        sent in place by ``publish`` or a ``with`` block.
    ``recv_view(timeout=None)``
        Zero copy on the consumer side: the next message as a read-only array pointing into
        the ring. Its slot stays held (``held_views``, ``held_bytes``) until the array and
        everything derived from it (slices, views) are gone; the ring is FIFO, so held views
        eventually block the producer. ``send`` puts a message that would wrap around the
        ring's end at its start when it can (always, up to half the ring); messages that do
        not lie in one piece of the ring (a larger sent message that met the end, or one
        larger than the ring) come back as a read-only copy instead.
    ``store_modes``
        How ``fastcopy.copy`` fills of this end's loans of 256 KiB or more store, per size
        class: cached or streaming, whichever ran faster lately, with the last rate of each
        (docs/shm.md, "Fills of loans adapt to where the reader is").

    Iterating over a channel receives until the producer closes it.
    """

    _created_here = False

    @classmethod
    def create(cls, name: Optional[str] = None, capacity: int = DEFAULT_CAPACITY) -> "Channel":
        """A new channel with a ring of ``capacity`` bytes (64 KiB to 1 TiB, rounded up to 64).

        ``name`` (no ``/``) defaults to a random ``fastcopy-<pid>-<hex>``. Raises
        ``FileExistsError`` if the name is taken. The creating process should call
        :meth:`unlink` when done (a ``with`` block does, and so does interpreter exit).
        """
        if name is None:
            name = _default_name()
        name = _name_arg("create", name).lstrip("/")
        if isinstance(capacity, bool) or not hasattr(type(capacity), "__index__"):
            raise TypeError(f"Channel.create: capacity must be an int number of bytes, got {type(capacity).__name__}")
        capacity = capacity.__index__()
        if not 0 <= capacity < 1 << 64:  # the C++ check below words the same error for the size_t range
            raise ChannelArgumentError(f"capacity {capacity} is out of range: use 65536 (64 KiB) to "
                                       f"1099511627776 (1 TiB) bytes")
        ch = cls(name, capacity, True)
        ch._created_here = True
        _created[name] = os.getpid()
        _unlink_created_in_multiprocessing_child()
        return ch

    @classmethod
    def attach(cls, name: str) -> "Channel":
        """Opens the channel ``name`` made by :meth:`create` in another process.

        Raises ``FileNotFoundError`` if there is none, :class:`ChannelCorrupted` if the
        segment is not a valid channel.
        """
        return cls(_name_arg("attach", name).lstrip("/"), 0, False)

    def unlink(self) -> bool:  # type: ignore[override]
        """Removes ``/dev/shm/<name>``; processes that have it open keep working.

        Idempotent: returns False when the name was already removed.
        """
        _created.pop(self.name, None)
        return super().unlink()

    def __enter__(self) -> "Channel":
        return self

    def __exit__(self, *exc: Any) -> None:
        """Closes; the creating process also unlinks."""
        try:
            self.close()
        finally:
            if self._created_here and _created.get(self.name) == os.getpid():
                self.unlink()

    def loan(self, shape: _ShapeArg, dtype: Any = np.uint8, timeout: Optional[float] = None) -> LoanedArray:
        """A writable array of ``shape`` and ``dtype`` that lives in the ring (zero copy).

        Fill it in place, then :meth:`publish` it, or use ``with ch.loan(...) as a:`` (published
        when the block ends without an exception). Waits for room like :meth:`send`
        (``timeout`` raises ``TimeoutError``, nothing reserved). The message must fit in the
        ring (header included), else ``ValueError``. One loan at a time per channel; ``send``
        while a loan is outstanding raises :class:`ChannelError`. An abandoned loan
        (exception in the ``with`` block, :meth:`discard`, garbage collected, channel closed)
        sends nothing and frees its space.
        """
        return self._loan(shape, dtype, timeout)  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            try:
                yield self.recv()
            except ChannelClosed:
                return

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"role={self.role}"
        return f"<fastcopy.shm.Channel name={self.name!r} capacity={self.capacity} {state}>"

    def __reduce__(self):  # pickling (e.g. to a spawned process) attaches by name there
        return (_attach_by_name, (type(self), self.name))


def _attach_by_name(cls, name: str) -> "Channel":
    return cls.attach(name)



# ---- Topic: one publisher, many subscribers ---------------------------------------------------
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
    ``held_bytes``). ``lost`` counts the messages lost (overflow="drop"); iteration receives
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


# ---- finding and removing stale segments (python -m fastcopy shm --list / --clean) -----------
_SEGMENT_DIR = "/dev/shm"
_MAGIC = 0x31484353504F4346  # "FCOPSCH1", the first 8 bytes of every channel segment
_TOPIC_MAGIC = 0x31504F544F50434F  # "FCOPTOP1", the first 8 bytes of every topic segment


def _read_header(path: str) -> Optional[Dict[str, Any]]:
    """The header fields of a channel segment, or None when ``path`` is not one (or unreadable)."""
    import struct

    try:
        with open(path, "rb") as f:
            head = f.read(4096)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return None
    if len(head) < 4096 or struct.unpack_from("<Q", head, 0)[0] not in (_MAGIC, _TOPIC_MAGIC):
        return None
    u32 = lambda off: struct.unpack_from("<I", head, off)[0]  # noqa: E731
    u64 = lambda off: struct.unpack_from("<Q", head, off)[0]  # noqa: E731
    if struct.unpack_from("<Q", head, 0)[0] == _TOPIC_MAGIC:
        # A topic: the publisher is the producer; subscribers are in the records after the
        # header (read from the file below), listed as consumers.
        subs = []
        max_subs = min(u32(20), 1024)
        try:
            with open(path, "rb") as f:
                f.seek(4096)
                table = f.read(128 * max_subs)
        except OSError:
            table = b""
        for i in range(len(table) // 128):
            state, pid, start = struct.unpack_from("<IIQ", table, 128 * i)
            if state in (1, 2):
                subs.append((pid, start, False))
        return {
            "kind": "topic", "version": u32(8), "capacity": u64(24) * u32(16), "bytes": size,
            "creator": (u32(1408), u64(1416)),
            "producer": (u32(128), u64(136), u32(132) != 0),
            "consumers": subs,
        }
    return {
        "kind": "channel", "version": u32(8), "capacity": u64(16), "bytes": size,
        "creator": (u32(1408), u64(1416)),
        "producer": (u32(128), u64(136), u32(132) != 0),
        "consumer": (u32(256), u64(264), u32(260) != 0),
        "consumers": [(u32(256), u64(264), u32(260) != 0)],
    }


def list_segments(prefix: str = "", directory: str = _SEGMENT_DIR) -> List[Dict[str, Any]]:
    """Every fastcopy channel or topic segment in /dev/shm (found by its header, whatever its name)
    whose name starts with ``prefix``.

    Each entry: ``name``, ``kind`` (``"channel"`` or ``"topic"``), ``bytes``, ``capacity``
    (a topic: slots x slot_bytes), ``creator_pid`` (0: not recorded, made by an older
    fastcopy), ``creator_alive``, ``producer_pid``/``consumer_pid`` (0: none yet; a topic's
    publisher and first subscriber), ``subscriber_pids`` (a topic's subscriber records),
    ``ends_alive`` (a producer, publisher, consumer or subscriber that has not closed is
    running) and ``stale``: the
    creator is recorded and gone and no end is running, so nobody can still use the name
    (processes that have the channel open keep working even when the name is removed).
    """
    out: List[Dict[str, Any]] = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return out
    for name in names:
        if not name.startswith(prefix):
            continue
        header = _read_header(os.path.join(directory, name))
        if header is None:
            continue
        creator_pid, creator_start = header["creator"]
        creator_alive = creator_pid != 0 and _core.shm_process_alive(creator_pid, creator_start)
        ends_alive = any(pid != 0 and not closed and _core.shm_process_alive(pid, start)
                         for pid, start, closed in [header["producer"], *header["consumers"]])
        consumers = header["consumers"]
        out.append({
            "name": name, "kind": header["kind"], "bytes": header["bytes"], "capacity": header["capacity"],
            "creator_pid": creator_pid, "creator_alive": creator_alive,
            "producer_pid": header["producer"][0], "consumer_pid": consumers[0][0] if consumers else 0,
            "subscriber_pids": [pid for pid, _, _ in consumers] if header["kind"] == "topic" else [],
            "ends_alive": ends_alive,
            "stale": creator_pid != 0 and not creator_alive and not ends_alive,
        })
    return out


def clean_segments(prefix: str = "", directory: str = _SEGMENT_DIR) -> List[str]:
    """Removes the stale segments of :func:`list_segments` (creator gone, no end running) whose
    name starts with ``prefix`` and returns their names. Segments of running processes, and
    segments without a recorded creator, are left alone."""
    removed: List[str] = []
    for seg in list_segments(prefix, directory):
        if not seg["stale"]:
            continue
        path = os.path.join(directory, seg["name"])
        header = _read_header(path)  # re-check: the name may have been reused meanwhile
        if header is None or header["creator"][0] != seg["creator_pid"]:
            continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        removed.append(seg["name"])
    return removed
