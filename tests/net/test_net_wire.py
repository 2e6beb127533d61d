"""The fastcopy.net wire format: every dtype, shape and order comes back exactly; anything that is
not a valid message is a WireError (never a crash, never a wrong array). Needs no zenoh."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from fastcopy.net import WireError
from fastcopy.net._wire import decode, encode

pytestmark = pytest.mark.net

DTYPES = ["u1", "i2", "<u4", ">i8", "f2", "<f4", ">f8", "c8", "?", "S5", "U3", "M8[ns]", "m8[s]", "V7"]
SHAPES = [(), (0,), (7,), (3, 4), (2, 0, 3), (2, 3, 5)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("order", ["C", "F"])
def test_round_trip(dtype, shape, order):
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    arr = np.asarray(raw.view(dtype).reshape(shape), order=order)
    seq, got = decode(encode(arr, 41))
    assert seq == 41
    assert got.dtype == arr.dtype and got.shape == arr.shape
    assert got.tobytes(order="A") == arr.tobytes(order="A")
    if order == "F" and arr.ndim > 1 and arr.size > 1:
        assert got.flags.f_contiguous and not got.flags.c_contiguous
    assert not got.flags.writeable


@pytest.mark.parametrize("order", ["C", "F"])
def test_messages_of_every_size_class_carry_their_bytes(order):
    """The message body is copied by fastcopy's kernels, with the GIL released from 64 KiB."""
    rng = np.random.default_rng(7)
    for n in (1, 63, 4096, 65535, 65536, 3 << 20):
        a = rng.integers(0, 256, n, dtype=np.uint8)
        if order == "F" and n >= 6:                  # a true Fortran-order block (3 rows)
            a = np.asfortranarray(a[:n - n % 3].reshape(3, -1))
        buf = encode(a, n)
        assert buf[-a.nbytes:] == a.tobytes(order="A")
        seq, back = decode(buf)
        assert seq == n and np.array_equal(back, a)


def test_concat_bytes_refuses_a_buffer_that_is_not_contiguous():
    from fastcopy import _core

    with pytest.raises((BufferError, ValueError)):
        _core.concat_bytes(b"head", np.arange(10)[::2])
    assert _core.concat_bytes(b"", b"xyz") == b"xyz"


def test_non_contiguous_is_sent_as_its_values():
    arr = np.arange(60, dtype=np.int32).reshape(6, 10)[::2, 1::3]
    _, got = decode(encode(arr, 0))
    np.testing.assert_array_equal(got, arr)


@pytest.mark.parametrize("dtype", [object, [("a", "i4"), ("b", "f8")], [("a", "i4", (2,))]], ids=["object", "struct", "struct-subarray"])
def test_unsendable_dtypes_are_refused(dtype):
    with pytest.raises(TypeError, match="cannot be sent"):
        encode(np.zeros(3, dtype=dtype), 0)


GOOD = encode(np.arange(12, dtype="<f4").reshape(3, 4), 5)


@pytest.mark.parametrize("payload, match", [
    (b"", "shorter than a message header"),
    (b"hello world, a foreign payload on the key!!", "foreign payload"),
    (b"FCN1" + bytes([2]) + GOOD[5:], "version 2"),
    (GOOD[:5] + b"X" + GOOD[6:], "corrupt message header"),
    (GOOD[:-1], "header says 48"),
    (GOOD + b"\0", "header says 48"),
    (GOOD[:30], "truncated|header says"),
])
def test_corrupt_payloads_are_rejected(payload, match):
    with pytest.raises(WireError, match=match):
        decode(payload)


def test_every_single_byte_corruption_is_rejected_or_exact():
    """A flipped byte anywhere in the header gives a WireError or a message whose array has
    exactly the bytes after the header (the payload itself carries no checksum)."""
    head_len = len(GOOD) - 48
    for i in range(head_len):
        for flip in (0x01, 0x80, 0xFF):
            bad = bytearray(GOOD)
            bad[i] ^= flip
            try:
                _, arr = decode(bytes(bad))
            except WireError:
                continue
            assert arr.nbytes > 0
            assert arr.tobytes(order="A") == bytes(bad[len(bad) - arr.nbytes:])


def test_huge_shape_in_header_is_rejected_without_allocating():
    head = struct.pack("<4sBcBBQQ", b"FCN1", 1, b"C", 2, 3, 0, 16) + struct.pack("<2Q", 2**40, 2**40) + b"<f4"
    with pytest.raises(WireError):
        decode(head + bytes(16))


def _with_dtype_text(message: bytes, text: bytes) -> bytes:
    """``message`` (a 1-d array's) with its dtype text replaced by ``text``."""
    head = struct.Struct("<4sBcBBQQ")
    magic, version, order, ndim, dlen, seq, nbytes = head.unpack_from(message, 0)
    off = head.size + 8 * ndim
    return (head.pack(magic, version, order, ndim, len(text), seq, nbytes) + message[head.size:off] + text
            + message[off + dlen:])


def test_remembered_dtypes_still_refuse_other_texts_for_them():
    """Each side remembers the dtype texts it has checked; a text that names the same dtype in
    another spelling is still refused after the canonical one was read, and again on a second try."""
    good = encode(np.arange(3, dtype="<f8"), 0)
    assert decode(good)[1].dtype == np.dtype("<f8")
    for text in (b"float64", b"=f8", b"d"):
        for _ in range(2):
            with pytest.raises(WireError, match="corrupt dtype text"):
                decode(_with_dtype_text(good, text))
    assert decode(good)[1].dtype == np.dtype("<f8")


def test_remembered_dtypes_stay_few_and_every_one_stays_exact():
    """Hundreds of distinct dtypes (str lengths) pass both ways exactly; what each side remembers
    stays bounded."""
    from fastcopy.net import _wire

    for n in range(1, 601):
        arr = np.array(["x" * n], dtype=f"<U{n}")
        seq, got = decode(encode(arr, n))
        assert seq == n and got.dtype == arr.dtype and got[0] == arr[0]
        assert len(_wire._TEXT_OF) <= _wire._REMEMBERED and len(_wire._DTYPE_OF) <= _wire._REMEMBERED


def test_a_writable_buffer_gives_a_read_only_array():
    seq, got = decode(bytearray(encode(np.arange(4, dtype="<i4"), 9)))
    assert seq == 9 and got.tolist() == [0, 1, 2, 3] and not got.flags.writeable
