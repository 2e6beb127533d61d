"""Bad inputs: exception type, the key words of the message, and dst left unchanged."""

from __future__ import annotations

import array
import mmap
from multiprocessing import shared_memory

import numpy as np
import pytest

import fastcopy
from conftest import no_subprocess, snapshot


def expect_error(exc, words, dst, src, copy=None):
    """Calls copy(dst, src); asserts the exception type, that each word is in the message,
    and that dst's bytes did not change."""
    copy = copy or fastcopy.copy
    before = snapshot(dst) if _is_buffer(dst) else None
    with pytest.raises(exc) as info:
        copy(dst, src)
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    if before is not None:
        assert snapshot(dst) == before
    return msg


def _is_buffer(obj):
    try:
        memoryview(obj).release()
        return True
    except (TypeError, ValueError):
        return False


def test_shape_mismatch_names_both_and_points_to_copyto():
    dst = np.arange(6, dtype=np.float64)
    msg = expect_error(ValueError, ["shape", "dst", "src", "(6,)", "(2, 3)", "np.copyto", "broadcast"], dst,
                       np.ones((2, 3)))
    assert msg.index("(6,)") < msg.index("(2, 3)")
    expect_error(ValueError, ["shape", "(3, 1)", "(3,)"], np.zeros((3, 1)), np.ones(3))  # no broadcasting
    expect_error(ValueError, ["shape", "()", "(1,)"], np.array(1.0), np.ones(1))


@pytest.mark.parametrize("dt_dst,dt_src", [
    ("f8", "f4"), ("i4", ">i4"), ("M8[s]", "M8[ms]"), ("i8", "u8"), ("S4", "U1"), ("V4", "i4"),
    ([("a", "i4")], [("b", "i4")]),
])
def test_dtype_mismatch_names_both(dt_dst, dt_src):
    dst = np.zeros(4, dt_dst)
    src = np.zeros(4, dt_src)
    expect_error(TypeError, ["dtype", "dst", "src", str(dst.dtype), str(src.dtype), "np.copyto", "cast"], dst, src)


def test_byte_count_mismatch_raw_buffers():
    expect_error(ValueError, ["size", "bytes", "dst", "src", "10", "11"], bytearray(10), b"x" * 11)
    expect_error(ValueError, ["dst", "src", "bytes", "24", "16"], np.zeros(3), bytearray(16))
    expect_error(ValueError, ["dst", "src", "bytes"], memoryview(bytearray(8)).cast("i"), np.zeros(3, np.int32))


@pytest.mark.parametrize("kind", ["bytes", "readonly_array", "broadcast", "readonly_memoryview", "memoryview_of_bytes",
                                  "readonly_mmap"])
def test_read_only_destination(kind, tmp_path):
    src = bytes(range(16))
    if kind == "bytes":
        dst = bytes(16)
    elif kind == "readonly_array":
        dst = np.zeros(16, np.uint8)
        dst.flags.writeable = False
        src = np.arange(16, dtype=np.uint8)
    elif kind == "broadcast":
        dst = np.broadcast_to(np.zeros(1, np.uint8), (16,))
        src = np.arange(16, dtype=np.uint8)
    elif kind == "readonly_memoryview":
        dst = memoryview(bytearray(16)).toreadonly()
    elif kind == "memoryview_of_bytes":
        dst = memoryview(bytes(16))
    else:
        path = tmp_path / "ro.bin"
        path.write_bytes(bytes(16))
        f = open(path, "rb")
        dst = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    expect_error(ValueError, ["dst", "read-only"], dst, src)
    if kind == "readonly_mmap":
        dst.close()
        f.close()
        assert path.read_bytes() == bytes(16)


def test_read_only_array_even_when_empty():
    dst = np.zeros(0)
    dst.flags.writeable = False
    expect_error(ValueError, ["dst", "read-only"], dst, np.zeros(0))


def test_read_only_src_is_fine():
    src = np.arange(8.0)
    src.flags.writeable = False
    dst = np.zeros(8)
    fastcopy.copy(dst, src)
    np.testing.assert_array_equal(dst, src)


@pytest.mark.parametrize("which", ["dst", "src"])
def test_released_memoryview(which):
    mv = memoryview(bytearray(8))
    mv.release()
    good = bytearray(b"abcdefgh")
    args = (mv, b"12345678") if which == "dst" else (good, mv)
    expect_error(ValueError, [which, "released"], *args)
    assert good == bytearray(b"abcdefgh")


@pytest.mark.parametrize("which", ["dst", "src"])
def test_closed_mmap(which):
    mm = mmap.mmap(-1, 8)
    mm.close()
    good = bytearray(b"abcdefgh")
    args = (mm, b"12345678") if which == "dst" else (good, mm)
    expect_error(ValueError, [which, "closed"], *args)
    assert good == bytearray(b"abcdefgh")


@no_subprocess  # SharedMemory starts the resource_tracker process
@pytest.mark.parametrize("which", ["dst", "src"])
def test_closed_shared_memory(which):
    shm = shared_memory.SharedMemory(create=True, size=64)
    buf = shm.buf  # a reference taken before close is released by close()
    shm.close()
    shm.unlink()
    good = bytearray(64)
    good[:] = b"z" * 64
    for closed, words, exc in [(shm.buf, [which, "NoneType"], TypeError), (buf, [which, "released"], ValueError)]:
        args = (closed, bytes(64)) if which == "dst" else (good, closed)
        expect_error(exc, words, *args)
    assert good == bytearray(b"z" * 64)


@pytest.mark.parametrize("bad", [None, "text", 42, 3.5, [1, 2, 3], {"a": 1}, object()], ids=repr)
@pytest.mark.parametrize("which", ["dst", "src"])
def test_not_a_buffer(bad, which):
    good = bytearray(b"abc")
    args = (bad, b"abc") if which == "dst" else (good, bad)
    expect_error(TypeError, [which, "buffer", type(bad).__name__], *args)
    assert good == bytearray(b"abc")


def test_object_and_string_dtypes_refused():
    src = np.array([object(), 1, "x"], dtype=object)
    dst = np.array([None, None, None], dtype=object)
    expect_error(TypeError, ["dtype", "object", "np.copyto"], dst, src)
    assert list(dst) == [None, None, None]
    expect_error(TypeError, ["src", "object"], bytearray(24), src)
    if not hasattr(getattr(np, "dtypes", None), "StringDType"):
        return  # numpy < 2 (e.g. Debian bookworm's 1.24 under emulation) has no StringDType
    sdt = np.dtypes.StringDType()
    expect_error(TypeError, ["dtype"], np.array(["", ""], dtype=sdt), np.array(["a", "b"], dtype=sdt))


def test_argument_errors():
    dst = bytearray(3)
    with pytest.raises(TypeError, match="missing required argument 'src'"):
        fastcopy.copy(dst)
    with pytest.raises(TypeError, match="positional"):
        fastcopy.copy(dst, b"abc", b"abc")
    with pytest.raises(TypeError, match="unexpected keyword"):
        fastcopy.copy(dst, b"abc", out=1)
    with pytest.raises(TypeError, match="multiple values"):
        fastcopy.copy(dst, src=b"abc", dst=dst)
    assert dst == bytearray(3)


def test_errors_through_kernel_callables(kernel):
    f = fastcopy.kernel(kernel)
    expect_error(ValueError, ["shape", "dst", "src"], np.zeros(3), np.zeros(4), copy=f)
    expect_error(ValueError, ["dst", "read-only"], b"abc", b"xyz", copy=f)
    expect_error(TypeError, ["src", "buffer"], bytearray(3), None, copy=f)


def test_array_array_read_only_is_not_an_issue_but_size_is():
    a = array.array("i", [1, 2, 3])
    expect_error(ValueError, ["bytes", "12", "16"], a, array.array("i", [1, 2, 3, 4]))
    assert list(a) == [1, 2, 3]


def test_raw_buffer_of_objects_refused_but_field_names_with_O_are_fine():
    objs = np.array([1, None], dtype=object)
    dst = bytearray(b"q" * objs.nbytes)
    expect_error(TypeError, ["src", "object"], dst, memoryview(objs))
    rec = np.zeros(3, dtype=[("Other", "i4"), ("Obj", "f8")])
    rec["Other"] = [1, 2, 3]
    out = bytearray(rec.nbytes)
    fastcopy.copy(out, memoryview(rec))  # format "T{i:Other:d:Obj:}" holds no objects
    assert bytes(out) == rec.tobytes()
