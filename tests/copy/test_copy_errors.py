"""Bad inputs: exception type, the key words of the message, and dst left unchanged."""

from __future__ import annotations

import array
import mmap
from multiprocessing import shared_memory

import numpy as np
import pytest

import fastcopy
from conftest import no_subprocess, snapshot

pytestmark = [pytest.mark.kernels, pytest.mark.sanitize]


def expect_error(exc, words, dst, src, copy=None):
    """Calls copy(dst, src); asserts the exception type, that each word is in the message,
    and that dst's bytes did not change.

    When both are readable buffers, dst must differ from src at every byte they share
    (positions 0 .. min(len) - 1): a zero-filled dst and src would hide a copy made before
    the error was raised."""
    copy = copy or fastcopy.copy
    before = snapshot(dst) if _is_buffer(dst) else None
    if before is not None and _is_buffer(src) and not _holds_objects(src):
        src_bytes = snapshot(src)
        same = [i for i, (a, b) in enumerate(zip(before, src_bytes)) if a == b]
        assert not same, f"test setup: dst equals src at byte {same[0]}; a write before the error would go unseen"
    with pytest.raises(exc) as info:
        copy(dst, src)
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    if before is not None:
        assert snapshot(dst) == before
    return msg


def _holds_objects(obj):
    fmt = getattr(obj, "format", None) if isinstance(obj, memoryview) else None
    dtype = getattr(obj, "dtype", None)
    return (dtype is not None and dtype.hasobject) or (fmt is not None and "O" in fmt)


def filled(shape, dtype, byte: int) -> np.ndarray:
    """An array whose every byte is `byte` (dst and src of the error tests differ everywhere)."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(bytes([byte]) * (count * dtype.itemsize), dtype=dtype).reshape(shape).copy()


def _is_buffer(obj):
    try:
        memoryview(obj).release()
        return True
    except (TypeError, ValueError):
        return False


def test_shape_mismatch_names_both_and_points_to_copyto():
    dst = filled(6, np.float64, 0xAA)
    msg = expect_error(ValueError, ["shape", "dst", "src", "(6,)", "(2, 3)", "np.copyto", "broadcast"], dst,
                       filled((2, 3), np.float64, 0x55))
    assert msg.index("(6,)") < msg.index("(2, 3)")
    expect_error(ValueError, ["shape", "(3, 1)", "(3,)"], filled((3, 1), "f8", 0xAA), filled(3, "f8", 0x55))  # no broadcasting
    expect_error(ValueError, ["shape", "()", "(1,)"], filled((), "f8", 0xAA), filled(1, "f8", 0x55))


@pytest.mark.parametrize("dt_dst,dt_src", [
    ("f8", "f4"), ("i4", ">i4"), ("M8[s]", "M8[ms]"), ("i8", "u8"), ("S4", "U1"), ("V4", "i4"),
    ([("a", "i4")], [("b", "i4")]),
])
def test_dtype_mismatch_names_both(dt_dst, dt_src):
    dst = filled(4, dt_dst, 0xAA)
    src = filled(4, dt_src, 0x55)
    expect_error(TypeError, ["dtype", "dst", "src", str(dst.dtype), str(src.dtype), "np.copyto", "cast"], dst, src)


def test_byte_count_mismatch_raw_buffers():
    expect_error(ValueError, ["size", "bytes", "dst", "src", "10", "11"], bytearray(10), b"x" * 11)
    expect_error(ValueError, ["dst", "src", "bytes", "24", "16"], filled(3, "f8", 0xAA), bytearray(b"U" * 16))
    expect_error(ValueError, ["dst", "src", "bytes"], memoryview(bytearray(b"\xaa" * 8)).cast("i"),
                 filled(3, np.int32, 0x55))


@pytest.mark.parametrize("kind", ["bytes", "readonly_array", "broadcast", "readonly_memoryview", "memoryview_of_bytes",
                                  "readonly_mmap"])
def test_read_only_destination(kind, tmp_path):
    src = bytes(range(1, 17))  # differs from the zero-filled dst at every byte
    if kind == "bytes":
        dst = bytes(16)
    elif kind == "readonly_array":
        dst = np.zeros(16, np.uint8)
        dst.flags.writeable = False
        src = np.arange(1, 17, dtype=np.uint8)
    elif kind == "broadcast":
        dst = np.broadcast_to(np.zeros(1, np.uint8), (16,))
        src = np.arange(1, 17, dtype=np.uint8)
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
    expect_error(ValueError, ["shape", "dst", "src"], filled(3, "f8", 0xAA), filled(4, "f8", 0x55), copy=f)
    expect_error(ValueError, ["dst", "read-only"], b"abc", b"xyz", copy=f)
    expect_error(TypeError, ["src", "buffer"], bytearray(3), None, copy=f)


def test_array_array_read_only_is_not_an_issue_but_size_is():
    a = array.array("i", [1, 2, 3])
    expect_error(ValueError, ["bytes", "12", "16"], a, array.array("i", [-1, -1, -1, -1]))
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


# ---------------------------------------------------------------- every error branch, every entry point

def _error_cases():
    """(name, exception, words, make) with make() -> (dst, src, keep): dst differs from src at
    every byte; `keep` is the writable memory behind dst that must stay unchanged."""
    def arrays(dshape, dtype_d, sshape, dtype_s):
        def make():
            d = filled(dshape, dtype_d, 0xAA)
            return d, filled(sshape, dtype_s, 0x55), d
        return make

    def readonly_array():
        d = filled(16, "u1", 0xAA)
        d.flags.writeable = False  # the memory itself is writable: a write would land
        return d, filled(16, "u1", 0x55), d

    def readonly_view():
        mem = bytearray(b"\xaa" * 16)
        return memoryview(mem).toreadonly(), bytes(b"\x55" * 16), mem

    def strided_shape():
        base = filled((4, 6), "i2", 0xAA)
        return base[:, ::2], filled((3, 3), "i2", 0x55), base

    def strided_size():
        base = bytearray(b"\xaa" * 24)
        return memoryview(base)[::2], b"\x55" * 13, base

    def released_src():
        mv = memoryview(bytearray(b"\x55" * 8))
        mv.release()
        d = bytearray(b"\xaa" * 8)
        return d, mv, d

    def object_src():
        d = filled(2, "u1", 0xAA).repeat(8)
        return d, np.array([1, None], dtype=object), d

    def object_buffer_src():
        d = bytearray(b"\xaa" * 16)
        return d, memoryview(np.array([1, None], dtype=object)), d

    def not_a_buffer():
        d = bytearray(b"\xaa" * 3)
        return d, [1, 2, 3], d

    return [
        ("shape", ValueError, ["shape"], arrays((6,), "f8", (2, 3), "f8")),
        ("shape_2d", ValueError, ["shape"], arrays((3, 4), "i4", (4, 3), "i4")),
        ("dtype", TypeError, ["dtype"], arrays((4,), "f8", (4,), "i8")),
        ("dtype_byteorder", TypeError, ["dtype"], arrays((4,), "<i4", (4,), ">i4")),
        ("size_raw", ValueError, ["bytes"], lambda: (lambda d: (d, b"\x55" * 11, d))(bytearray(b"\xaa" * 10))),
        ("size_array_vs_raw", ValueError, ["bytes"], lambda: (lambda d: (d, bytearray(b"\x55" * 16), d))(
            filled(3, "f8", 0xAA))),
        ("size_strided", ValueError, ["bytes"], strided_size),
        ("shape_strided", ValueError, ["shape"], strided_shape),
        ("readonly_array", ValueError, ["read-only"], readonly_array),
        ("readonly_view", ValueError, ["read-only"], readonly_view),
        ("released_src", ValueError, ["released"], released_src),
        ("object_src", TypeError, ["object"], object_src),
        ("object_buffer_src", TypeError, ["object"], object_buffer_src),
        ("not_a_buffer_src", TypeError, ["buffer"], not_a_buffer),
    ]


def _entry_points():
    points = [("copy", fastcopy.copy)]
    for region in (0, 1, 2):
        points.append((f"copy_region{region}", lambda d, s, r=region: fastcopy._core.copy_region(d, s, r)))
    for name in fastcopy.kernels():
        points.append((f"kernel:{name}", fastcopy.kernel(name)))
    return points


@pytest.mark.parametrize("case", _error_cases(), ids=lambda c: c[0])
@pytest.mark.parametrize("entry", _entry_points(), ids=lambda e: e[0])
def test_every_error_leaves_dst_unchanged(case, entry):
    _, exc, words, make = case
    dst, src, keep = make()
    if _is_buffer(src) and not _holds_objects(src):
        shared = min(len(snapshot(dst)), len(snapshot(src)))
        assert all(a != b for a, b in zip(snapshot(dst)[:shared], snapshot(src)[:shared]))
    before = bytes(memoryview(keep).cast("B")) if not isinstance(keep, np.ndarray) else keep.tobytes()
    with pytest.raises(exc) as info:
        entry[1](dst, src)
    for w in words:
        assert w in str(info.value)
    after = bytes(memoryview(keep).cast("B")) if not isinstance(keep, np.ndarray) else keep.tobytes()
    assert after == before, "dst changed although the copy raised"


@pytest.mark.parametrize("region", [3, -1, 2**40])
def test_copy_region_bad_region_leaves_dst_unchanged(region):
    dst = bytearray(b"\xaa" * 8)
    with pytest.raises((ValueError, OverflowError), match="region|int"):
        fastcopy._core.copy_region(dst, b"\x55" * 8, region)
    with pytest.raises(TypeError):
        fastcopy._core.copy_region(dst, b"\x55" * 8, "private")
    assert dst == bytearray(b"\xaa" * 8)


# ---------------------------------------------------------------- buffer exports are released

@pytest.mark.parametrize("entry", _entry_points(), ids=lambda e: e[0])
def test_buffer_exports_released_after_copy_and_errors(entry):
    """A bytearray cannot be resized while a buffer export of it is held: after every call,
    successful or not, both arguments must be free again."""
    copy = entry[1]
    dst, src = bytearray(b"\xaa" * 16), bytearray(b"\x55" * 16)
    copy(dst, src)
    dst.extend(b"x")  # BufferError if the dst export leaked
    src.extend(b"y")  # ... or the src export
    for bad_src, exc in [(None, TypeError), (bytearray(3), ValueError)]:
        with pytest.raises(exc):
            copy(dst, bad_src)
        dst.extend(b"x")
        if isinstance(bad_src, bytearray):
            bad_src.extend(b"z")
    mv = memoryview(bytearray(b"\xaa" * 8))
    copy(mv, b"\x55" * 8)
    mv.release()  # BufferError if an export of mv leaked
