"""Channel, the single-producer single-consumer ring of fastcopy.shm, and LoanedArray, the
writable array a loan hands out (of a channel or of a topic)."""

from __future__ import annotations

import os
from typing import Any, Iterator, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _core
from .dtypes import _dtype_from_wire, _dtype_to_wire
from .errors import (ChannelArgumentError, ChannelClosed, ChannelCorrupted, ChannelError, MessagesLost, PeerDied,
                     ShmSpaceError)
from .names import _created, _default_name, _unlink_created_in_multiprocessing_child

#: Ring size in bytes when Channel.create() is not given one.
DEFAULT_CAPACITY = 8 << 20


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
_core._shm_set_space_error_type(ShmSpaceError)

_ShapeArg = Union[int, Sequence[int]]

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
    ``recv_view(timeout=None, cow=True)``
        The same, as a writable array over private copy-on-write pages of the message: a
        write copies only the pages it touches into this process and never reaches the ring;
        the slot is held as for a read-only view (docs/shm.md, "Copy-on-write views").
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
