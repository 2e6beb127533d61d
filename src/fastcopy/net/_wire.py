"""The wire format of fastcopy.net: every field is validated strictly on receipt; anything
else is a WireError.

A message of up to SPLIT_FROM bytes goes as one payload; a larger one as a head and pieces
(piece_bytes_for), each a Zenoh message of its own: Zenoh moves a large message it fragments
and joins again itself several times slower (evidence: net-large-messages-in-pieces,
net-pieces-from-128k).

Layout (little-endian), version 2:
  head   magic b"FCN1" (4 bytes)  version u8  kind u8 (b"M" a whole message, b"H" the head
         of one in pieces)  order u8 (b"C" or b"F")  ndim u8
         dtype_len u8  pad u8  source u64 (the publisher's random id)  seq u64 (its message
         number, from 0)  nbytes u64 (the array's bytes)
         shape  ndim x u64
         dtype  dtype_len bytes, ASCII: numpy's dtype.str of a plain (non-structured, non-object) dtype
         data   the array's bytes: all nbytes (b"M"), or the first of them (b"H", at least one
                byte and fewer than nbytes)
  piece  magic b"FCN1"  version u8  kind b"P"  pad 2 bytes  source u64  seq u64  offset u64
         data   the array's bytes from offset on, a piece's size of them or the rest
"""
from __future__ import annotations

import struct
from typing import Dict, Iterator, Optional, Tuple

import numpy as np

from .. import _core

MAGIC = b"FCN1"
VERSION = 2
WHOLE = b"M"
FIRST = b"H"
PIECE = b"P"
_HEAD = struct.Struct("<4sBccBBxQQQ")
_PIECE = struct.Struct("<4sBc2xQQQ")
_PREFIX = struct.Struct("<4sBc")
_ORDER = {b"C": "C", b"F": "F"}
MAX_NDIM = 32
# Messages above SPLIT_FROM bytes go in pieces: a quarter of the message each (at least PIECES
# pieces), at least MIN_PIECE_BYTES and at most PIECE_BYTES (evidence:
# net-large-messages-in-pieces, net-pieces-from-128k).
SPLIT_FROM = 128 << 10
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


def encode_header(arr: np.ndarray, source: int, seq: int) -> Tuple[bytes, np.ndarray]:
    """(head bytes without data, the array as a contiguous block in its order) for message
    number ``seq`` of publisher ``source``."""
    if arr.ndim > MAX_NDIM:
        raise ValueError(f"fastcopy.net: {arr.ndim} dimensions, at most {MAX_NDIM}")
    if arr.flags.c_contiguous:
        order, block = b"C", arr
    elif arr.flags.f_contiguous:
        order, block = b"F", arr
    else:
        order, block = b"C", np.ascontiguousarray(arr)
    dt = dtype_text(arr.dtype)
    head = _HEAD.pack(MAGIC, VERSION, WHOLE, order, arr.ndim, len(dt), source, seq, arr.nbytes)
    return head + struct.pack(f"<{arr.ndim}Q", *arr.shape) + dt, block


def encode(arr: np.ndarray, seq: int, source: int = 0) -> bytes:
    """The whole message in one payload (any size): one copy of the array's bytes, into a bytes
    object, which Zenoh takes at half the cost of a bytearray (evidence: net-send-payload-type)."""
    head, block = encode_header(arr, source, seq)
    return _core.concat_bytes(head, block)


def encode_parts(arr: np.ndarray, seq: int, source: int, piece_bytes: Optional[int] = None) -> Iterator[bytes]:
    """The payloads of message ``seq``: the whole message when it holds at most ``piece_bytes``
    bytes (by default piece_bytes_for its size), else a head with the first ``piece_bytes`` and
    pieces of the rest, built one at a time as the caller takes them."""
    head, block = encode_header(arr, source, seq)
    nbytes = block.nbytes
    if piece_bytes is None:
        piece_bytes = piece_bytes_for(nbytes)
    if nbytes <= piece_bytes:
        yield _core.concat_bytes(head, block)
        return
    flat = block.ravel(order="A").view(np.uint8)
    yield _core.concat_bytes(head[:5] + FIRST + head[6:], flat[:piece_bytes])
    for offset in range(piece_bytes, nbytes, piece_bytes):
        yield _core.concat_bytes(_PIECE.pack(MAGIC, VERSION, PIECE, source, seq, offset),
                                 flat[offset:offset + piece_bytes])


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
        arr = np.frombuffer(self.buf, dtype=self.dtype, count=self.count, offset=self.off)
        if len(self.shape) != 1:
            arr = arr.reshape(self.shape, order=self.order)
        if arr.flags.writeable:  # a bytearray or other writable buffer (bytes give read-only arrays)
            arr.flags.writeable = False
        return arr


class Piece:
    """A piece of a message sent in pieces: its publisher, message number, offset in the
    message, and its bytes, ``buf[_PIECE.size:]``."""

    __slots__ = ("source", "seq", "offset", "buf")

    def __init__(self, source: int, seq: int, offset: int, buf: bytes) -> None:
        self.source, self.seq, self.offset, self.buf = source, seq, offset, buf

    @property
    def size(self) -> int:
        return len(self.buf) - _PIECE.size


def read(buf: bytes) -> "Head | Piece":
    """The head or piece ``buf`` holds; WireError for anything but a valid one."""
    n = len(buf)
    if n >= _HEAD.size:
        magic, version, kind, order_byte, ndim, dlen, source, seq, nbytes = _HEAD.unpack_from(buf, 0)
    elif n >= _PIECE.size:
        magic, version, kind = _PREFIX.unpack_from(buf, 0)
    else:
        raise WireError(f"fastcopy.net: payload of {n} bytes is shorter than a message header")
    if magic != MAGIC:
        raise WireError(f"fastcopy.net: payload does not start with {MAGIC!r} (a foreign payload on the key)")
    if version != VERSION:
        raise WireError(f"fastcopy.net: wire format version {version}, this fastcopy reads version {VERSION}")
    if kind == PIECE:
        _, _, _, source, seq, offset = _PIECE.unpack_from(buf, 0)
        return Piece(source, seq, offset, buf)
    if kind not in (WHOLE, FIRST) or n < _HEAD.size:
        raise WireError("fastcopy.net: corrupt message header (kind or length)")
    order = _ORDER.get(order_byte)
    if order is None or ndim > MAX_NDIM or dlen == 0 or dlen > 64:
        raise WireError("fastcopy.net: corrupt message header (order, ndim or dtype length out of range)")
    off = _HEAD.size
    if n < off + 8 * ndim + dlen:
        raise WireError("fastcopy.net: truncated message header")
    shape = struct.unpack_from(f"<{ndim}Q", buf, off)
    off += 8 * ndim
    try:
        dt = wire_dtype(bytes(buf[off:off + dlen]))
    except Exception as exc:
        raise WireError(f"fastcopy.net: corrupt dtype text in message header ({exc})") from None
    off += dlen
    count = 1
    for extent in shape:
        count *= extent
    held = n - off
    if count * dt.itemsize != nbytes or (held != nbytes if kind == WHOLE else not 0 < held < nbytes):
        raise WireError(f"fastcopy.net: payload holds {held} bytes, header says {nbytes} "
                        f"for shape {tuple(shape)} of {dt}" + ("" if kind == WHOLE else " (the head of a message in pieces)"))
    return Head(source, seq, dt, shape, order, nbytes, count, buf, off, kind == WHOLE)


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
    """A message arriving in pieces, copied into an array of its own as they come. ``add`` takes
    the next piece of the same message (same publisher and number, at the offset reached);
    anything else means the message cannot be completed."""

    def __init__(self, head: Head, max_bytes: int) -> None:
        if head.nbytes > max_bytes:
            raise WireError(f"fastcopy.net: a message of {head.nbytes} bytes, more than max_bytes={max_bytes}")
        self.head = head
        self.buf = np.empty(head.nbytes, np.uint8)
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
        self._put(piece.buf, _PIECE.size)
        return self.filled == self.head.nbytes

    def array(self) -> np.ndarray:
        """The complete message's array (writable, owned by the caller)."""
        h = self.head
        arr = self.buf.view(h.dtype)
        return arr.reshape(h.shape, order=h.order) if len(h.shape) != 1 else arr
