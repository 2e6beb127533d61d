"""The fastcopy.net wire format: every dtype, shape and order comes back exactly; anything that is
not a valid message is a WireError (never a crash, never a wrong array). Needs no zenoh."""
from __future__ import annotations

import numpy as np
import pytest

from _net import piece_head, wire_head
from fastcopy import _core
from fastcopy.net import WireError
from fastcopy.net import _wire
from fastcopy.net._wire import decode, encode, encode_parts

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
    msg = encode(arr, 41, 7)
    seq, got = decode(msg)
    assert seq == 41
    assert got.dtype == arr.dtype and got.shape == arr.shape
    assert got.tobytes(order="A") == arr.tobytes(order="A")
    _wire._DTYPE_OF.clear()
    for _ in range(2):  # the dtype not checked yet (read in Python), then checked (one C++ call)
        source, seq, taken = _wire.take(msg)
        assert (source, seq) == (7, 41) and taken.dtype == arr.dtype and taken.shape == arr.shape
        assert taken.tobytes(order="A") == arr.tobytes(order="A") and not taken.flags.writeable
        assert taken.flags.c_contiguous == got.flags.c_contiguous
        assert taken.flags.f_contiguous == got.flags.f_contiguous
    if order == "F" and arr.ndim > 1 and arr.size > 1:
        assert got.flags.f_contiguous and not got.flags.c_contiguous
    assert not got.flags.writeable


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("order", ["C", "F"])
def test_a_send_in_one_call_puts_the_bytes_of_the_full_way(dtype, shape, order):
    """_core.net_send_whole (Publisher.send's one-call path) puts exactly the payload the full
    way builds (first_payload), for every dtype, shape and order, once the dtype's text is known."""
    rng = np.random.default_rng(2)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    arr = np.asarray(raw.view(dtype).reshape(shape), order=order)
    put = []
    texts = {arr.dtype: _wire.dtype_text(arr.dtype)}
    assert _core.net_send_whole(put.append, arr, texts, 7, 41, _wire.SPLIT_FROM) is True
    assert put == [_wire.first_payload(arr, 41, 7)[0]]


def test_a_send_in_one_call_leaves_everything_else_to_the_full_way():
    """net_send_whole puts nothing and says False for what the full way must handle: a dtype
    whose text is not known, a message above whole_max, an array neither C- nor Fortran-
    contiguous, anything but an exact ndarray; an error raised by put reaches the caller."""
    arr = np.arange(12, dtype=np.int32).reshape(3, 4)
    texts = {np.dtype(np.int32): _wire.dtype_text(np.dtype(np.int32))}
    put = []
    for what, obj, known, most in (("dtype", arr.astype(np.int64), texts, 1 << 20),
                                   ("size", arr, texts, arr.nbytes - 1),
                                   ("strides", arr[:, ::2], texts, 1 << 20),
                                   ("subclass", arr.view(np.ma.MaskedArray), texts, 1 << 20),
                                   ("list", arr.tolist(), texts, 1 << 20),
                                   ("texts", arr, {}, 1 << 20)):
        assert _core.net_send_whole(put.append, obj, known, 1, 0, most) is False, what
    assert put == []
    assert _core.net_send_whole(put.append, arr, texts, 1, 0, arr.nbytes) is True and len(put) == 1

    def refuse(payload):
        raise RuntimeError("put refused")

    with pytest.raises(RuntimeError, match="put refused"):
        _core.net_send_whole(refuse, arr, texts, 1, 0, 1 << 20)


def test_payloads_built_into_a_bytearray_are_the_bytes_of_new_ones():
    """With ``into`` (the bytearray a Publisher reuses), net_encode, net_piece and net_send_whole
    resize it to the payload, larger or smaller than before, and fill it with exactly the bytes
    they give as a new bytes object; anything but a bytearray or None is a TypeError naming
    ``into``, and a bytearray another reader still holds a view of is left as it was."""
    rng = np.random.default_rng(9)
    arr = rng.integers(0, 256, 3 << 20, dtype=np.uint8)
    text = _wire.dtype_text(arr.dtype)
    into = bytearray(b"junk" * 1000)
    for piece_bytes in (arr.nbytes, 1 << 20, 100):
        got = _core.net_encode(arr, text, 7, 41, piece_bytes, into)
        assert got is into and into == _core.net_encode(arr, text, 7, 41, piece_bytes)
    for offset, piece_bytes in ((1 << 20, 1 << 20), (arr.nbytes - 5, 1 << 20), (64, 16)):
        assert _core.net_piece(arr, 7, 41, offset, piece_bytes, into) is into
        assert into == _core.net_piece(arr, 7, 41, offset, piece_bytes)
    put = []
    assert _core.net_send_whole(put.append, arr, {arr.dtype: text}, 7, 41, arr.nbytes, into) is True
    assert put == [into] and into == _core.net_encode(arr, text, 7, 41, arr.nbytes)
    for wrong in (b"bytes", memoryview(bytearray(8)), [0]):
        with pytest.raises(TypeError, match="into must be a bytearray"):
            _core.net_encode(arr, text, 7, 41, arr.nbytes, wrong)
    held = bytearray(b"kept")
    view = memoryview(held)
    with pytest.raises(BufferError):
        _core.net_piece(arr, 7, 41, 64, 16, held)
    assert held == b"kept"
    view.release()


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


def test_net_encode_refuses_a_block_that_is_not_contiguous_and_bad_arguments():
    """The C++ builder takes only C- or Fortran-contiguous blocks (the Python side sends a copy of
    any other array), a dtype text of 1 to 64 bytes, and pieces of at least one byte; a piece
    lies after the head's bytes and before the end."""
    with pytest.raises(BufferError, match="neither C- nor Fortran-contiguous"):
        _core.net_encode(np.arange(10)[::2], b"<i8", 0, 0, 1 << 20)
    with pytest.raises(ValueError, match="dtype text"):
        _core.net_encode(np.arange(10), b"", 0, 0, 1 << 20)
    with pytest.raises(ValueError, match="dtype text"):
        _core.net_encode(np.arange(10), b"x" * 65, 0, 0, 1 << 20)
    with pytest.raises(ValueError, match="piece_bytes"):
        _core.net_encode(np.arange(10), b"<i8", 0, 0, 0)
    for offset in (0, 80, -1):
        with pytest.raises(ValueError, match="a piece at byte"):
            _core.net_piece(np.arange(10), 0, 0, offset, 16)
    assert _core.net_piece(np.arange(10), 0, 0, 72, 16)[-8:] == np.int64(9).tobytes()
    try:
        too_many = [np.zeros((1,) * 33, np.uint8), np.zeros((1,) * 32 + (4,), np.uint8)[..., ::2]]
    except ValueError:  # numpy 1.x makes no array of more than 32 dimensions, the wire's limit
        too_many = []
    for arr in too_many:
        with pytest.raises(ValueError, match="33 dimensions, at most 32"):
            encode(arr, 0)


def test_non_contiguous_is_sent_as_its_values():
    arr = np.arange(60, dtype=np.int32).reshape(6, 10)[::2, 1::3]
    _, got = decode(encode(arr, 0))
    np.testing.assert_array_equal(got, arr)


@pytest.mark.parametrize("dtype", [object, [("a", "i4"), ("b", "f8")], [("a", "i4", (2,))]], ids=["object", "struct", "struct-subarray"])
def test_unsendable_dtypes_are_refused(dtype):
    with pytest.raises(TypeError, match="cannot be sent"):
        encode(np.zeros(3, dtype=dtype), 0)


GOOD = encode(np.arange(12, dtype="<f4").reshape(3, 4), 5)
HEAD_SIZE = _core.net_wire_layout()["head_bytes"]
KIND_AT = _core.net_wire_layout()["head_fields"]["kind"][0]


@pytest.mark.parametrize("payload, match", [
    (b"", "shorter than a message header"),
    (b"hello world, a foreign payload on the key!!", "foreign payload"),
    (GOOD[:4] + bytes([1]) + GOOD[5:], "version 1"),
    (GOOD[:KIND_AT] + b"X" + GOOD[KIND_AT + 1:], "corrupt message header"),
    (GOOD[:KIND_AT + 1] + b"X" + GOOD[KIND_AT + 2:], "corrupt message header"),
    (GOOD[:-1], "header says 48"),
    (GOOD + b"\0", "header says 48"),
    (GOOD[:HEAD_SIZE + 4], "truncated"),
    (GOOD[:KIND_AT] + _wire.FIRST + GOOD[KIND_AT + 1:], "in pieces"),
    (GOOD[:KIND_AT] + _wire.PIECE + GOOD[KIND_AT + 1:], "a piece of a message"),
], ids=["empty", "foreign", "old-version", "kind", "order", "short-data", "long-data", "truncated",
        "head-of-pieces", "piece"])
def test_corrupt_payloads_are_rejected(payload, match):
    with pytest.raises(WireError, match=match):
        decode(payload)


def test_every_single_byte_corruption_is_rejected_or_exact():
    """A flipped byte anywhere in the header gives a WireError, a message whose array has
    exactly the bytes after the header (the payload itself carries no checksum), or a head or
    piece of a message in pieces, which a subscriber completes only with its exact pieces."""
    head_len = len(GOOD) - 48
    for i in range(head_len):
        for flip in (0x01, 0x80, 0xFF):
            bad = bytearray(GOOD)
            bad[i] ^= flip
            try:
                part = _wire.read(bytes(bad))
            except WireError:
                continue
            if isinstance(part, _wire.Head) and part.complete:
                arr = part.array()
                assert arr.nbytes > 0
                assert arr.tobytes(order="A") == bytes(bad[len(bad) - arr.nbytes:])
            elif isinstance(part, _wire.Head):
                assert 0 < len(part.buf) - part.off < part.nbytes
            else:
                assert isinstance(part, _wire.Piece)


def test_huge_shape_in_header_is_rejected_without_allocating():
    head = wire_head(shape=(2**40, 2**40), nbytes=16)
    with pytest.raises(WireError):
        decode(head + bytes(16))


def test_a_shape_that_needs_other_than_the_announced_bytes_is_rejected():
    """Shape (3,) of <f4 needs 12 bytes: a head announcing 16, with 16 bytes after it, is refused,
    by the reader and by the receiver's path alike."""
    with pytest.raises(WireError, match="header says 16 bytes for shape"):
        decode(wire_head(shape=(3,), nbytes=16) + bytes(16))
    assert decode(wire_head(shape=(4,), nbytes=16) + bytes(16))[1].tolist() == [0.0] * 4
    assert b"<f4" in _wire._DTYPE_OF  # so the receiver's C++ path reads it too
    with pytest.raises(WireError, match="header says 16 bytes for shape"):
        _wire.take(wire_head(shape=(3,), nbytes=16) + bytes(16))


def test_a_message_in_pieces_larger_than_max_bytes_is_refused_before_allocating():
    head = wire_head(kind=_wire.FIRST, shape=(1 << 50,), nbytes=4 << 50)
    part = _wire.read(head + bytes(16))
    assert not part.complete and part.nbytes == 4 << 50
    with pytest.raises(WireError, match="more than max_bytes"):
        _wire.Assembly(part, max_bytes=1 << 30)


def _assemble(parts, max_bytes=1 << 30):
    """The array the parts of one message make (head first)."""
    head = _wire.read(parts[0])
    if head.complete:
        assert len(parts) == 1
        return head.array()
    asm = _wire.Assembly(head, max_bytes)
    for k, buf in enumerate(parts[1:], 1):
        piece = _wire.read(buf)
        assert isinstance(piece, _wire.Piece) and asm.fits(piece)
        assert asm.add(piece) == (k == len(parts) - 1)
    return asm.array()


KiB, MiB = 1 << 10, 1 << 20


@pytest.mark.parametrize("nbytes, piece", [
    (1, 1), (128 * KiB, 128 * KiB),                       # up to 128 KiB: whole
    (128 * KiB + 1, 128 * KiB), (192 * KiB, 128 * KiB),   # above: pieces of 128 KiB at least
    (256 * KiB, 128 * KiB), (512 * KiB, 128 * KiB),
    (512 * KiB + 4, 128 * KiB + 1), (MiB, 256 * KiB),     # then a quarter of the message each
    (4 * MiB, MiB), (16 * MiB, MiB)])                      # of 1 MiB at most
def test_the_piece_size_of_each_message_size(nbytes, piece):
    """Messages above 128 KiB go in pieces (Zenoh moves a message it fragments itself at about
    1 GB/s in some runs from 192 KiB up): a quarter of the message each, from 128 KiB to 1 MiB."""
    assert _wire.piece_bytes_for(nbytes) == piece
    parts = list(encode_parts(np.zeros(nbytes, np.uint8), 0, 1))
    assert len(parts) == -(-nbytes // piece)


@pytest.mark.parametrize("dtype", ["u1", ">i2", "<f8", "c8", "V7", "U3", "M8[ns]"])
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("piece_bytes", [1, 64, 1000, 4096])
def test_messages_in_pieces_come_back_exact(dtype, order, piece_bytes):
    """Messages split at piece sizes that cut elements in two come back with every byte, dtype,
    shape and order; the head and pieces carry the publisher and the message number."""
    rng = np.random.default_rng(piece_bytes)
    for shape in [(0,), (5,), (13, 7), (3, 4, 9)]:
        dt = np.dtype(dtype)
        raw = rng.integers(0, 256, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
        arr = np.asarray(raw.view(dt).reshape(shape), order=order)
        parts = list(encode_parts(arr, 77, 0xABCDEF, piece_bytes))
        assert len(parts) == max(1, -(-arr.nbytes // piece_bytes))
        for buf in parts:
            part = _wire.read(buf)
            assert (part.source, part.seq) == (0xABCDEF, 77)
        got = _assemble(parts)
        assert got.dtype == arr.dtype and got.shape == arr.shape
        assert got.tobytes(order="A") == arr.tobytes(order="A")
        if order == "F" and arr.ndim > 1:
            assert got.flags.f_contiguous


def test_a_message_in_pieces_takes_only_its_own_next_piece():
    """A piece of another publisher, another message, at another offset, or running past the
    message's end does not fit: the message cannot be completed from it."""
    arr = np.arange(100, dtype=np.uint8)
    parts = list(encode_parts(arr, 3, 1, 40))
    assert len(parts) == 3
    others = {
        "publisher": list(encode_parts(arr, 3, 2, 40))[1],
        "message": list(encode_parts(arr, 4, 1, 40))[1],
        "offset": parts[2],
        "too-long": piece_head(1, 3, 40) + bytes(61),
    }
    for name, buf in others.items():
        asm = _wire.Assembly(_wire.read(parts[0]), 1 << 20)
        assert not asm.fits(_wire.read(buf)), name
    asm = _wire.Assembly(_wire.read(parts[0]), 1 << 20)
    assert asm.fits(_wire.read(parts[1])) and not asm.add(_wire.read(parts[1]))
    assert asm.fits(_wire.read(parts[2])) and asm.add(_wire.read(parts[2]))
    assert asm.array().tolist() == list(range(100)) and asm.array().flags.writeable


def test_assembly_into_a_target_and_detached_from_it():
    """An Assembly given a target fills it and returns it as the message; detached midway, it
    goes on in an array of its own and never writes the target again."""
    arr = np.arange(60, dtype=np.int16).reshape(3, 20)
    parts = [_wire.read(p) for p in encode_parts(arr, 3, 1, 40)]
    assert len(parts) == 3
    target = np.zeros((3, 20), np.int16)
    asm = _wire.Assembly(parts[0], 1 << 20, lambda head: target)
    assert not asm.add(parts[1]) and asm.add(parts[2])
    assert asm.array() is target and (target == arr).all()

    target = np.zeros((3, 20), np.int16)
    asm = _wire.Assembly(parts[0], 1 << 20, lambda head: target)
    assert not asm.add(parts[1])
    asm.detach()
    assert asm.target is None
    asm.detach()  # nothing left to leave
    before = target.copy()
    assert asm.add(parts[2])
    assert (target == before).all()
    got = asm.array()
    assert got is not target and got.shape == (3, 20) and (got == arr).all()

    for wrong in (np.zeros(59, np.int16), np.zeros((20, 3), np.int16).T):
        with pytest.raises(ValueError, match="C-contiguous"):
            _wire.Assembly(parts[0], 1 << 20, lambda head: wrong)


def _with_dtype_text(message: bytes, text: bytes) -> bytes:
    """``message`` (a 1-d array's) with its dtype text replaced by ``text``."""
    layout = _core.net_wire_layout()
    fields = layout["head_fields"]
    ndim = message[fields["ndim"][0]]
    dlen_at = fields["dtype_len"][0]
    off = layout["head_bytes"] + 8 * ndim
    return message[:dlen_at] + bytes([len(text)]) + message[dlen_at + 1:off] + text + message[off + message[dlen_at]:]


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
