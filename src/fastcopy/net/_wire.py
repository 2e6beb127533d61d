"""The wire format of fastcopy.net, built and checked in C++ (``_core.net_encode``,
``net_piece``, ``net_read``; the layout: ``_core.net_wire_layout()``; evidence:
net-wire-in-cpp); every field is validated strictly on receipt, anything else is a WireError.

A message of up to SPLIT_FROM bytes goes as one payload (kind WHOLE); a larger one as a head
(FIRST) and pieces (PIECE) of piece_bytes_for its size, each a Zenoh message of its own: Zenoh
moves a large message it fragments and joins again itself several times slower (evidence:
net-large-messages-in-pieces, net-pieces-from-128k). A head carries the publisher's random id,
the message number, the array's dtype (numpy's dtype.str of a plain, non-structured,
non-object dtype), shape, order (C or F) and size, then the array's bytes in its order (all of
them, or the first piece's); a piece carries the id, the number and its offset in the array's
bytes, then its bytes.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, Optional, Tuple, Union, cast

import numpy as np

from .. import _core

LAYOUT = _core.net_wire_layout()
MAGIC: bytes = LAYOUT["magic"]
VERSION: int = LAYOUT["version"]
WHOLE: bytes = LAYOUT["whole"]
FIRST: bytes = LAYOUT["first"]
PIECE: bytes = LAYOUT["piece"]
PIECE_HEAD_BYTES: int = LAYOUT["piece_head_bytes"]
MAX_NDIM: int = LAYOUT["max_ndim"]
_WHOLE, _PIECE = WHOLE.decode(), PIECE.decode()
# Messages above SPLIT_FROM bytes go in pieces: a quarter of the message each (at least PIECES
# pieces), at least MIN_PIECE_BYTES and at most PIECE_BYTES (evidence:
# net-large-messages-in-pieces, net-pieces-from-128k).
SPLIT_FROM = 128 << 10
# Where Zenoh moves a publisher's messages to every peer through its shared memory (every
# transport of its session is a shared-memory one: peers on one host), messages up to this size
# go whole: there whole messages of 256 KiB to 4 MiB moved 1.1-2.0x their pieces, and from
# 8 MiB, more than a quarter of Zenoh's default 16 MiB pool for them, 0.3-0.45x
# (evidence: net-whole-through-shared-memory).
WHOLE_THROUGH_SHARED_MEMORY_UP_TO = 4 << 20
PIECES = 4
MIN_PIECE_BYTES = 128 << 10
PIECE_BYTES = 1 << 20


def piece_bytes_for(nbytes: int) -> int:
    """The piece size of a message of ``nbytes`` (``nbytes`` itself: the message goes whole)."""
    if nbytes <= SPLIT_FROM:
        return nbytes
    return max(MIN_PIECE_BYTES, min(PIECE_BYTES, -(-nbytes // PIECES)))


class WireError(ValueError):
    """A payload on the key is not a valid fastcopy.net message (corrupt, truncated or foreign)."""


def _exact_dtype_text(dtype: np.dtype) -> bytes:
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise TypeError(f"fastcopy.net: dtype {dtype} cannot be sent (only plain numeric, bool, bytes, str "
                        "and datetime dtypes travel; no object, structured or sub-array dtypes)")
    text = dtype.str.encode("ascii")
    if np.dtype(text.decode()) != dtype or len(text) > 64:
        raise TypeError(f"fastcopy.net: dtype {dtype} cannot be described exactly on the wire")
    return text


# The dtypes a process sends and receives are few; parsing and checking a dtype's text costs
# more than the rest of a message's header, so each side remembers the texts and dtypes it has
# checked (at most _REMEMBERED of each; both maps start over when full)
# (evidence: net-wire-dtype-memo).
_REMEMBERED = 256
_TEXT_OF: Dict[np.dtype, bytes] = {}
_DTYPE_OF: Dict[bytes, np.dtype] = {}


def _remember(memo: Dict, key: object, value: object) -> None:
    if len(memo) >= _REMEMBERED:
        memo.clear()
    memo[key] = value


def dtype_text(dtype: np.dtype) -> bytes:
    """The dtype's wire text; TypeError for a dtype the text cannot describe exactly."""
    text = _TEXT_OF.get(dtype)
    if text is None:
        text = _exact_dtype_text(dtype)
        _remember(_TEXT_OF, dtype, text)
    return text


def wire_dtype(text: bytes) -> np.dtype:
    """The dtype a wire text names; ValueError unless the text is that dtype's own."""
    dt = _DTYPE_OF.get(text)
    if dt is None:
        dt = np.dtype(text.decode("ascii"))
        if _exact_dtype_text(dt) != text:
            raise ValueError("not canonical")
        _remember(_DTYPE_OF, text, dt)
    return dt


def first_payload(arr: np.ndarray, seq: int, source: int, piece_bytes: Optional[int] = None,
                  into: Optional[bytearray] = None) -> Tuple[Union[bytes, bytearray], np.ndarray, int]:
    """(the first payload of message ``seq`` of publisher ``source``: the whole message when it
    holds at most ``piece_bytes`` bytes (by default piece_bytes_for its size), else its head
    with the first ``piece_bytes``; the array as a C- or Fortran-contiguous block; the piece
    size). One copy of the array's bytes: into a new bytes object, or into ``into`` (a
    bytearray the caller reuses for every payload, as a Publisher does: see
    ``_core.net_encode``), resized to the payload."""
    dt = arr.dtype
    text = _TEXT_OF.get(dt) or dtype_text(dt)
    if piece_bytes is None:
        nbytes = arr.nbytes
        piece_bytes = nbytes if nbytes <= SPLIT_FROM else piece_bytes_for(nbytes)
    try:
        return _core.net_encode(arr, text, source, seq, piece_bytes, into), arr, piece_bytes
    except BufferError:  # neither C- nor Fortran-contiguous: sent as a C-contiguous copy
        if arr.ndim > MAX_NDIM:
            raise ValueError(f"fastcopy.net: {arr.ndim} dimensions, at most {MAX_NDIM}") from None
        block = np.ascontiguousarray(arr)
        return _core.net_encode(block, text, source, seq, piece_bytes, into), block, piece_bytes


def pieces(block: np.ndarray, seq: int, source: int, piece_bytes: int,
           into: Optional[bytearray] = None) -> Iterator[Union[bytes, bytearray]]:
    """The pieces of message ``seq`` after its head (none for a whole message), built one at a
    time as the caller takes them: each a new bytes object, or ``into`` refilled (the caller
    puts each piece out before it takes the next)."""
    if block.nbytes <= piece_bytes:
        return
    for offset in range(piece_bytes, block.nbytes, piece_bytes):
        yield _core.net_piece(block, source, seq, offset, piece_bytes, into)


def encode(arr: np.ndarray, seq: int, source: int = 0) -> bytes:
    """The whole message in one payload (any size)."""
    return cast(bytes, first_payload(arr, seq, source, max(1, arr.nbytes))[0])  # no ``into``: bytes


def encode_parts(arr: np.ndarray, seq: int, source: int, piece_bytes: Optional[int] = None) -> Iterator[bytes]:
    """The payloads of message ``seq``: the whole message when it holds at most ``piece_bytes``
    bytes (by default piece_bytes_for its size), else a head with the first ``piece_bytes`` and
    pieces of the rest, built one at a time as the caller takes them."""
    first, block, piece_bytes = first_payload(arr, seq, source, piece_bytes)
    yield cast(bytes, first)  # no ``into``: bytes
    yield from cast(Iterator[bytes], pieces(block, seq, source, piece_bytes))


class Head:
    """A message's head: who sent it, its number, its array's dtype, shape, order and size, and
    the bytes of the array it carries, ``buf[off:]`` (all of them unless ``complete`` is False)."""

    __slots__ = ("source", "seq", "dtype", "shape", "order", "nbytes", "count", "buf", "off", "complete")

    def __init__(self, source: int, seq: int, dtype: np.dtype, shape: Tuple[int, ...], order: str,
                 nbytes: int, count: int, buf: bytes, off: int, complete: bool) -> None:
        self.source, self.seq, self.dtype, self.shape = source, seq, dtype, shape
        self.order, self.nbytes, self.count = order, nbytes, count
        self.buf, self.off, self.complete = buf, off, complete

    def array(self) -> np.ndarray:
        """The read-only array over the bytes (a complete message)."""
        return _array(self.buf, self.dtype, self.count, self.off, self.shape, self.order)


class Piece:
    """A piece of a message sent in pieces: its publisher, message number, offset in the
    message, and its bytes, ``buf[PIECE_HEAD_BYTES:]``."""

    __slots__ = ("source", "seq", "offset", "buf")

    def __init__(self, source: int, seq: int, offset: int, buf: bytes) -> None:
        self.source, self.seq, self.offset, self.buf = source, seq, offset, buf

    @property
    def size(self) -> int:
        return len(self.buf) - PIECE_HEAD_BYTES


def _checked(buf: bytes) -> "Tuple[Any, ...] | Piece":
    """A piece, or (kind, source, seq, dtype, shape, order, nbytes, count, data offset) of a head
    whose dtype and size agree; WireError for anything else."""
    try:
        got = _core.net_read(buf)
    except ValueError as exc:
        raise WireError(str(exc)) from None
    if got[0] == _PIECE:
        return Piece(got[1], got[2], got[3], buf)
    kind, source, seq, text, shape, order, nbytes, count, off = got
    dt = _DTYPE_OF.get(text)
    if dt is None:
        try:
            dt = wire_dtype(text)
        except Exception as exc:
            raise WireError(f"fastcopy.net: corrupt dtype text in message header ({exc})") from None
    if count * dt.itemsize != nbytes:
        raise WireError(f"fastcopy.net: header says {nbytes} bytes for shape {shape} of {dt}")
    return kind, source, seq, dt, shape, order, nbytes, count, off


def read(buf: bytes) -> "Head | Piece":
    """The head or piece ``buf`` holds; WireError for anything but a valid one."""
    got = _checked(buf)
    if isinstance(got, Piece):
        return got
    kind, source, seq, dt, shape, order, nbytes, count, off = got
    return Head(source, seq, dt, shape, order, nbytes, count, buf, off, kind == _WHOLE)


def take(buf: bytes) -> "Tuple[int, int, np.ndarray] | Head | Piece":
    """What a receiver takes from ``buf`` (a bytes object): (source, seq, read-only array over
    ``buf``) for a whole message, else the head or piece, as read() gives them; WireError for
    anything else. The per-message path of Subscriber: a whole message of a dtype already
    checked is read in one C++ call (evidence: net-loopback-intel)."""
    try:
        whole = _core.net_take(buf, _DTYPE_OF)
    except ValueError as exc:
        raise WireError(str(exc)) from None
    if whole is not None:
        return whole
    got = _checked(buf)
    if isinstance(got, Piece):
        return got
    kind, source, seq, dt, shape, order, nbytes, count, off = got
    if kind != _WHOLE:
        return Head(source, seq, dt, shape, order, nbytes, count, buf, off, False)
    return source, seq, _array(buf, dt, count, off, shape, order)


def _array(buf: bytes, dt: np.dtype, count: int, off: int, shape: Tuple[int, ...], order: str) -> np.ndarray:
    """The read-only array over ``buf[off:]``."""
    arr = np.frombuffer(buf, dtype=dt, count=count, offset=off)
    if len(shape) != 1:
        arr = arr.reshape(shape, order="F" if order == "F" else "C")
    if type(buf) is not bytes and arr.flags.writeable:  # a bytearray or other writable buffer
        arr.flags.writeable = False
    return arr


def decode(buf: bytes) -> Tuple[int, np.ndarray]:
    """(seq, read-only array viewing ``buf``) of a message in one payload; WireError for
    anything else."""
    part = read(buf)
    if not isinstance(part, Head):
        raise WireError("fastcopy.net: a piece of a message where a whole message was expected")
    if not part.complete:
        raise WireError("fastcopy.net: the head of a message in pieces where a whole message was expected")
    return part.seq, part.array()


class Assembly:
    """A message arriving in pieces, copied into an array as they come: one of its own, or the
    ``target`` that ``target_for(head)`` gives (an array of the head's shape and dtype,
    C-contiguous, such as a Topic's loan; None: one of its own). ``add`` takes the next piece of
    the same message (same publisher and number, at the offset reached); anything else means the
    message cannot be completed."""

    def __init__(self, head: Head, max_bytes: int,
                 target_for: Optional[Callable[[Head], Optional[np.ndarray]]] = None) -> None:
        if head.nbytes > max_bytes:
            raise WireError(f"fastcopy.net: a message of {head.nbytes} bytes, more than max_bytes={max_bytes}")
        self.head = head
        self.target = None if target_for is None else target_for(head)
        if self.target is None:
            self.buf = np.empty(head.nbytes, np.uint8)
        else:
            if self.target.nbytes != head.nbytes or not self.target.flags.c_contiguous:
                raise ValueError("Assembly: the target must be C-contiguous and hold the message's bytes")
            self.buf = self.target.reshape(-1).view(np.uint8)
        self.filled = 0
        self._put(head.buf, head.off)

    def _put(self, buf: bytes, off: int) -> None:
        n = len(buf) - off
        _core.copy(self.buf[self.filled:self.filled + n], np.frombuffer(buf, np.uint8, n, off))
        self.filled += n

    def fits(self, piece: Piece) -> bool:
        """Whether ``piece`` is this message's next one."""
        return (piece.source == self.head.source and piece.seq == self.head.seq and piece.offset == self.filled
                and 0 < piece.size <= self.head.nbytes - self.filled)

    def add(self, piece: Piece) -> bool:
        """Copies in ``piece`` (one that fits); True when the message is complete."""
        self._put(piece.buf, PIECE_HEAD_BYTES)
        return self.filled == self.head.nbytes

    def detach(self) -> None:
        """Moves the bytes so far from the target into an array of its own and leaves the target:
        its owner may reuse it now."""
        if self.target is not None:
            own = np.empty(self.head.nbytes, np.uint8)
            _core.copy(own[:self.filled], self.buf[:self.filled])
            self.buf, self.target = own, None

    def array(self) -> np.ndarray:
        """The complete message's array: the target, or one of its own (writable, the caller's)."""
        if self.target is not None:
            return self.target
        h = self.head
        arr = self.buf.view(h.dtype)
        return arr.reshape(h.shape, order="F" if h.order == "F" else "C") if len(h.shape) != 1 else arr
