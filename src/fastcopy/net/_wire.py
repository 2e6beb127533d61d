"""The wire format of one fastcopy.net message: a fixed header, the shape, the dtype text, the
array's bytes. Every field is validated strictly on receipt; anything else is a WireError.

Layout (little-endian), version 1:
  magic  b"FCN1" (4 bytes)  version u8  order u8 (b"C" or b"F")  ndim u8  dtype_len u8
  seq u64 (the publisher's message number, from 0)  nbytes u64 (payload length)
  shape  ndim x u64
  dtype  dtype_len bytes, ASCII: numpy's dtype.str of a plain (non-structured, non-object) dtype
  payload nbytes bytes
"""
from __future__ import annotations

import struct
from typing import Dict, Tuple

import numpy as np

from .. import _core

MAGIC = b"FCN1"
VERSION = 1
_HEAD = struct.Struct("<4sBcBBQQ")
MAX_NDIM = 32


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


def encode_header(arr: np.ndarray, seq: int) -> Tuple[bytes, np.ndarray]:
    """(header bytes, the array as a contiguous block in its order) for message number ``seq``."""
    if arr.ndim > MAX_NDIM:
        raise ValueError(f"fastcopy.net: {arr.ndim} dimensions, at most {MAX_NDIM}")
    if arr.flags.c_contiguous:
        order = b"C"
    elif arr.flags.f_contiguous:
        order = b"F"
    else:
        arr = np.ascontiguousarray(arr)
        order = b"C"
    dt = dtype_text(arr.dtype)
    head = _HEAD.pack(MAGIC, VERSION, order, arr.ndim, len(dt), seq, arr.nbytes)
    return head + struct.pack(f"<{arr.ndim}Q", *arr.shape) + dt, arr


def encode(arr: np.ndarray, seq: int) -> bytes:
    """The message: one copy of the array's bytes, into a bytes object, which Zenoh takes at
    half the cost of a bytearray (evidence: net-send-payload-type)."""
    head, block = encode_header(arr, seq)
    return _core.concat_bytes(head, block)


def decode(buf: bytes) -> Tuple[int, np.ndarray]:
    """(seq, read-only array viewing ``buf``); WireError for anything but a valid message."""
    if len(buf) < _HEAD.size:
        raise WireError(f"fastcopy.net: payload of {len(buf)} bytes is shorter than a message header")
    magic, version, order, ndim, dlen, seq, nbytes = _HEAD.unpack_from(buf, 0)
    if magic != MAGIC:
        raise WireError(f"fastcopy.net: payload does not start with {MAGIC!r} (a foreign payload on the key)")
    if version != VERSION:
        raise WireError(f"fastcopy.net: wire format version {version}, this fastcopy reads version {VERSION}")
    if order not in (b"C", b"F") or ndim > MAX_NDIM or dlen == 0 or dlen > 64:
        raise WireError("fastcopy.net: corrupt message header (order, ndim or dtype length out of range)")
    off = _HEAD.size
    if len(buf) < off + 8 * ndim + dlen:
        raise WireError("fastcopy.net: truncated message header")
    shape = struct.unpack_from(f"<{ndim}Q", buf, off)
    off += 8 * ndim
    try:
        dt = wire_dtype(bytes(buf[off:off + dlen]))
    except Exception as exc:
        raise WireError(f"fastcopy.net: corrupt dtype text in message header ({exc})") from None
    off += dlen
    count = 1
    for n in shape:
        count *= n
    if count * dt.itemsize != nbytes or len(buf) - off != nbytes:
        raise WireError(f"fastcopy.net: payload holds {len(buf) - off} bytes, header says {nbytes} "
                        f"for shape {tuple(shape)} of {dt}")
    arr = np.frombuffer(buf, dtype=dt, count=count, offset=off)
    if ndim != 1:
        arr = arr.reshape(shape, order=order.decode())
    if arr.flags.writeable:  # a bytearray or other writable buffer (bytes give read-only arrays)
        arr.flags.writeable = False
    return seq, arr
