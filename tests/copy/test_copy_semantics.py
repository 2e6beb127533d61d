"""fastcopy.copy gives exactly the bytes np.copyto gives: dtypes x shapes x layouts,
overlapping views, every kind of buffer, and every kernel through fastcopy.kernel(name)."""

from __future__ import annotations

import array
import itertools
import mmap
from multiprocessing import shared_memory

import numpy as np
import pytest

import fastcopy
from conftest import (DTYPES, LAYOUTS, NO_SUBPROCESS, SHAPES, assert_same_bytes, compare_on_base, make_layout,
                      no_subprocess, random_array, random_bytes)

pytestmark = pytest.mark.kernels


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matrix_against_copyto(dtype, shape):
    for i, (dk, sk) in enumerate(itertools.product(LAYOUTS, LAYOUTS)):
        src = make_layout(sk, shape, dtype, seed=2 * i)
        dst = make_layout(dk, shape, dtype, seed=2 * i + 1)
        ref_view = make_layout(dk, shape, dtype, seed=2 * i + 1)
        np.copyto(ref_view, src, casting="no")
        fastcopy.copy(dst, src)
        assert dst.shape == shape
        assert_same_bytes(dst, ref_view)
        # Logical (C-order) bytes of dst are now those of src.
        assert_same_bytes(dst, src)


def test_returns_none_and_keywords():
    src = np.arange(10)
    dst = np.zeros(10, dtype=src.dtype)
    assert fastcopy.copy(dst, src) is None
    np.testing.assert_array_equal(dst, src)
    dst2 = np.zeros(10, dtype=src.dtype)
    fastcopy.copy(src=src, dst=dst2)
    np.testing.assert_array_equal(dst2, src)


def test_large_and_odd_sizes():
    for n in [1, 3, 31, 32, 33, 255, 4097, 65535, 65536, 65537, (1 << 20) + 3, 9 << 20]:
        src = np.frombuffer(random_bytes(n, n), np.uint8)
        dst = np.zeros(n, np.uint8)
        fastcopy.copy(dst, src)
        assert dst.tobytes() == src.tobytes()


def test_large_strided_releases_and_copies():
    src = random_array((1024, 512), np.float32, 5)
    dst = np.zeros((512, 1024), np.float32).T
    fastcopy.copy(dst, src)
    np.testing.assert_array_equal(dst, src)
    dst2 = np.zeros((1024, 256), np.float32)
    fastcopy.copy(dst2, src[:, ::-2])
    np.testing.assert_array_equal(dst2, src[:, ::-2])


def test_subclass_and_0d():
    src = np.ma.masked_array(np.arange(6.0))
    dst = np.zeros(6)
    fastcopy.copy(dst, src.data)
    np.testing.assert_array_equal(dst, np.arange(6.0))
    class Sub(np.ndarray):
        pass

    m = np.arange(6).reshape(2, 3).view(Sub)
    d = np.zeros((3, 2), dtype=m.dtype).view(Sub).T
    fastcopy.copy(d, m)
    np.testing.assert_array_equal(d, m)
    a, b = np.array(3.5), np.array(0.0)
    fastcopy.copy(b, a)
    assert b == 3.5


# ---------------------------------------------------------------- overlapping views

OVERLAP_CASES = {
    # name: function(base uint8 array of 4096 bytes) -> (dst, src)
    "contig_fwd": lambda b: (b[8:1008], b[0:1000]),
    "contig_back": lambda b: (b[0:1000], b[8:1008]),
    "contig_fwd_1": lambda b: (b[1:4096], b[0:4095]),
    "contig_same": lambda b: (b[0:4096], b[0:4096]),
    "f8_shift_fwd": lambda b: (b[8:4008].view(np.float64), b[0:4000].view(np.float64)),
    "f8_unaligned": lambda b: (b[3:4003].view(np.float64), b[0:4000].view(np.float64)),
    "i4_2d_rows_down": lambda b: (b.view(np.int32).reshape(32, 32)[1:], b.view(np.int32).reshape(32, 32)[:-1]),
    "i4_2d_rows_up": lambda b: (b.view(np.int32).reshape(32, 32)[:-1], b.view(np.int32).reshape(32, 32)[1:]),
    "i4_2d_cols_right": lambda b: (b.view(np.int32).reshape(32, 32)[:, 1:], b.view(np.int32).reshape(32, 32)[:, :-1]),
    "i4_2d_cols_left": lambda b: (b.view(np.int32).reshape(32, 32)[:, :-1], b.view(np.int32).reshape(32, 32)[:, 1:]),
    "transpose_self": lambda b: (b.view(np.int32).reshape(32, 32), b.view(np.int32).reshape(32, 32).T),
    "reverse_self": lambda b: (b.view(np.int16), b.view(np.int16)[::-1]),
    "reverse_half": lambda b: (b[:2048], b[1024:3072][::-1]),
    "strided_interleave": lambda b: (b.view(np.int16)[::2], b.view(np.int16)[1::2]),
    "strided_shift": lambda b: (b.view(np.int32)[2::3], b.view(np.int32)[0:-2:3]),
    "strided_vs_contig": lambda b: (b.view(np.int64)[:256], b.view(np.int64)[::2]),
    "contig_vs_strided": lambda b: (b.view(np.int64)[::2], b.view(np.int64)[:256]),
    "neg_stride_overlap": lambda b: (b.view(np.uint16)[100:1100], b.view(np.uint16)[1099:99:-1]),
    "c16_struct_shift": lambda b: (b[16:4000].view(np.complex128)[:240], b[0:3984].view(np.complex128)[:240]),
    "3d_perm": lambda b: (b.view(np.uint32).reshape(8, 8, 16)[:, :, :8], b.view(np.uint32).reshape(8, 8, 16)[:, :, 4:12].transpose(1, 0, 2)),
    # Extents that share exactly one byte: the strided side's last byte is the other's first.
    "touch_1_src_strided": lambda b: (b[6:10], b[0:7:2]),
    "touch_1_dst_strided": lambda b: (b[0:7:2], b[6:10]),
    "touch_1_src_reversed": lambda b: (b[6:10], b[6::-2]),
    "touch_1_2d": lambda b: (b[15:27].reshape(2, 6), b[0:16].reshape(2, 8)[:, 2:]),
    # Extents one byte apart (adjacent, no shared byte) on either side.
    "adjacent_after": lambda b: (b[7:11], b[0:7:2]),
    "adjacent_before": lambda b: (b[0:7:2], b[7:11]),
}


@pytest.mark.parametrize("case", sorted(OVERLAP_CASES))
def test_overlap_matches_copyto(case):
    base = np.frombuffer(random_bytes(4096, 11), np.uint8).copy()
    compare_on_base(base, OVERLAP_CASES[case])


def test_overlap_plain_copyto_agrees_where_numpy_buffers():
    # Against np.copyto(dst, src) itself (no explicit temporary): numpy buffers these cases.
    for case in ["contig_fwd", "contig_back", "transpose_self", "i4_2d_cols_right", "i4_2d_rows_up",
                 "neg_stride_overlap", "reverse_self", "3d_perm"]:
        base = np.frombuffer(random_bytes(4096, 12), np.uint8).copy()
        ref = base.copy()
        rd, rs = OVERLAP_CASES[case](ref)
        np.copyto(rd, rs)
        d, s = OVERLAP_CASES[case](base)
        fastcopy.copy(d, s)
        assert base.tobytes() == ref.tobytes(), case


def test_numpy_1d_strided_overlap_quirk():
    # dst = a[::2], src = a[:256]: fastcopy gives the "as if through a temporary" result.
    a = np.arange(512, dtype=np.int64)
    expected = a.copy()
    expected[::2] = a[:256].copy()
    fastcopy.copy(a[::2], a[:256])
    np.testing.assert_array_equal(a, expected)


@pytest.mark.parametrize("case", ["contig_fwd", "contig_back", "transpose_self", "strided_interleave", "reverse_self"])
def test_overlap_large_releases_gil_path(case):
    # Same cases at > 64 KiB, so the copy runs with the GIL released (and through the pool).
    n = 1 << 20
    base = np.frombuffer(random_bytes(n, 3), np.uint8).copy()
    scale = {
        "contig_fwd": lambda b: (b[64:n - 64], b[0:n - 128]),
        "contig_back": lambda b: (b[0:n - 128], b[64:n - 64]),
        "transpose_self": lambda b: (b.view(np.int32).reshape(512, 512), b.view(np.int32).reshape(512, 512).T),
        "strided_interleave": lambda b: (b.view(np.int16)[::2], b.view(np.int16)[1::2]),
        "reverse_self": lambda b: (b.view(np.int64), b.view(np.int64)[::-1]),
    }[case]
    compare_on_base(base, scale)


# ---------------------------------------------------------------- buffer kinds

def _check(dst, src, expected: bytes):
    fastcopy.copy(dst, src)
    got = dst.tobytes() if isinstance(dst, np.ndarray) else bytes(memoryview(dst).cast("B")) if memoryview(dst).contiguous else memoryview(dst).tobytes()
    assert got == expected


def test_bytes_src_into_bytearray_and_array():
    data = random_bytes(100, 1)
    ba = bytearray(100)
    _check(ba, data, data)
    arr = np.zeros(25, np.int32)
    _check(arr, data, data)
    assert arr.tobytes() == data


def test_memoryview_slices_and_casts():
    data = random_bytes(256, 2)
    ba = bytearray(512)
    mv = memoryview(ba)[100:356]
    _check(mv, data, data)
    assert bytes(ba[100:356]) == data and bytes(ba[:100]) == bytes(100) and bytes(ba[356:]) == bytes(156)
    ints = memoryview(bytearray(256)).cast("i")
    _check(ints, memoryview(data).cast("d"), data)
    shaped = memoryview(bytearray(256)).cast("B", (16, 16))
    _check(shaped, data, data)


def test_memoryview_of_strided_array_both_sides():
    src = random_array((8, 10), np.int16, 4)
    dst_base = np.zeros((8, 20), np.int16)
    fastcopy.copy(memoryview(dst_base[:, ::2]), src)
    np.testing.assert_array_equal(dst_base[:, ::2], src)
    assert not dst_base[:, 1::2].any()
    out = np.zeros((8, 5), np.int16)
    fastcopy.copy(out, memoryview(src[:, ::2]))
    np.testing.assert_array_equal(out, src[:, ::2])
    # Raw buffer vs array with a different shape: the C-order bytes are copied.
    flat = np.zeros(20, np.int16)
    fastcopy.copy(flat, memoryview(src[::-2, ::2]))
    assert flat.tobytes() == np.ascontiguousarray(src[::-2, ::2]).tobytes()


def test_array_array_and_raw_vs_array():
    a = array.array("d", range(50))
    b = array.array("d", [0.0]) * 50
    fastcopy.copy(b, a)
    assert b == a
    arr = np.zeros(100, np.float32)  # same byte count, different dtype and shape
    fastcopy.copy(arr, a)
    assert arr.tobytes() == a.tobytes()
    c = array.array("b", bytes(400))
    fastcopy.copy(c, np.arange(50, dtype=np.float64))
    assert c.tobytes() == np.arange(50, dtype=np.float64).tobytes()


def test_mmap_both_directions(tmp_path):
    data = random_bytes(1 << 17, 5)
    with mmap.mmap(-1, len(data)) as mm:
        fastcopy.copy(mm, data)
        assert mm[:] == data
        out = bytearray(len(data))
        fastcopy.copy(out, mm)
        assert out == data
    path = tmp_path / "file.bin"
    path.write_bytes(bytes(4096))
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        fastcopy.copy(mm, data[:4096])
        mm.flush()
    assert path.read_bytes() == data[:4096]


@no_subprocess  # SharedMemory starts the resource_tracker process, which dies under qemu
def test_shared_memory_buf():
    shm = shared_memory.SharedMemory(create=True, size=1 << 16)
    try:
        data = random_bytes(1 << 16, 6)
        fastcopy.copy(shm.buf, data)
        assert bytes(shm.buf) == data
        out = np.zeros(1 << 13, np.float64)
        fastcopy.copy(out, shm.buf)
        assert out.tobytes() == data
        view = np.ndarray((1 << 12,), np.int16, buffer=shm.buf, strides=(4,))
        fastcopy.copy(view, np.arange(1 << 12, dtype=np.int16))
        np.testing.assert_array_equal(view, np.arange(1 << 12, dtype=np.int16))
        del view
    finally:
        shm.close()
        shm.unlink()


def test_copy_region_uses_same_contract():
    src = random_array((64, 64), np.float64, 7)
    for region in (0, 1, 2):
        dst = np.zeros((64, 64))
        fastcopy._core.copy_region(dst, src, region)
        np.testing.assert_array_equal(dst, src)
        dst2 = np.zeros((64, 32))
        fastcopy._core.copy_region(dst2, src[:, ::2], region)
        np.testing.assert_array_equal(dst2, src[:, ::2])
    with pytest.raises(ValueError, match="region"):
        fastcopy._core.copy_region(np.zeros(3), np.zeros(3), 3)


# ---------------------------------------------------------------- every kernel

def test_each_kernel(kernel):
    f = fastcopy.kernel(kernel)
    for n in [0, 1, 15, 64, 1000, 65536 + 7, 3 << 20]:
        src = np.frombuffer(random_bytes(n, n + 1), np.uint8)
        dst = np.zeros(n, np.uint8)
        assert f(dst, src) is None
        assert dst.tobytes() == src.tobytes()
    base = np.frombuffer(random_bytes(1 << 18, 9), np.uint8).copy()
    for views in [lambda b: (b[5:], b[:-5]), lambda b: (b[:-5], b[5:]),
                  lambda b: (b.view(np.int32)[::2], b.view(np.int32)[1::2]),
                  lambda b: (b.view(np.int32).reshape(256, 256), b.view(np.int32).reshape(256, 256).T)]:
        compare_on_base(base, views, copy=f)
    with pytest.raises(TypeError, match="dtype"):
        f(np.zeros(3), np.zeros(3, np.float32))


def test_kernel_unknown_names_valid_ones():
    with pytest.raises(ValueError) as e:
        fastcopy.kernel("no_such_kernel")
    for name in fastcopy.kernels():
        assert name in str(e.value)


# ---------------------------------------------------------------- docs examples run

def _doc_blocks():
    import re
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "usage.md"
    if not path.exists():
        return []
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("block", _doc_blocks())
def test_usage_doc_examples_run(block):
    import ast
    import re

    # An example that shows an error must fail when no error is raised: every try/except has an else.
    for node in ast.walk(ast.parse(block)):
        if isinstance(node, ast.Try) and node.handlers:
            assert node.orelse, f"docs/usage.md: a try block without else passes when nothing is raised:\n{block}"
    if "shared_memory" in block and NO_SUBPROCESS:
        pytest.skip("FASTCOPY_NO_SUBPROCESS=1: SharedMemory starts the resource_tracker process, which dies under qemu")
    # Examples of the optional integrations run where their library is installed.
    for module in ("torch", "jax", "pyarrow", "zenoh"):
        if re.search(rf"^(import|from) {module}\b", block, re.M):
            pytest.importorskip(module)
    if "fastcopy.torch import Loader" in block and NO_SUBPROCESS:
        pytest.skip("FASTCOPY_NO_SUBPROCESS=1: the Loader starts worker processes")
    exec(compile(block, "docs/usage.md", "exec"), {"__name__": "usage_example"})


def test_call_overhead_benchmark_runs(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "call_overhead.py"
    spec = importlib.util.spec_from_file_location("call_overhead", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--number", "200", "--repeats", "3"]) == 0
    out = capsys.readouterr().out
    assert "8B" in out and "64B" in out and "np.copyto" in out


def _call_overhead_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "call_overhead.py"
    spec = importlib.util.spec_from_file_location("call_overhead_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_call_overhead_kernels_times_auto_and_every_kernel_at_each_placed_point(capsys):
    import json

    mod = _call_overhead_module()
    assert mod.main(["--kernels", "--json", "--number", "50", "--repeats", "2"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len(mod.PLACED_POINTS)
    for point, times in rows.items():
        assert set(times) == {"auto", *fastcopy.kernels()}, point
        assert all(t > 0 for t in times.values()), point
    # No placed range crosses a page: the builds compared run the same code paths.
    for size, src_off, dst_off in mod.PLACED_POINTS:
        assert src_off + size <= 4096 and dst_off + size <= 4096


def test_call_overhead_uniform_changes_only_the_shortcut_and_restores_the_profile(capsys):
    from fastcopy import _core

    mod = _call_overhead_module()
    before = _core.active_profile_json()
    before_info = fastcopy.info()["profile_source"]
    without = mod.without_uniform_sizes(_core.base_profile_json())
    # The profile without the shortcut plans every copy of at least 1 byte as the active one.
    base = 1 << 40
    for n in (1, 3, 4, 63, 64, 237, 1000, 1279, 1280, 3000, 20000, 1 << 20):
        for dst, src in ((base + (1 << 32), base), (base + (1 << 32) + 16, base), (base + (1 << 32) + 2080, base),
                         (base + 1, base)):
            assert _core.choose_for(without, dst, src, n) == _core.choose_for(before, dst, src, n), (n, dst - src)
    assert mod.main(["--uniform", "--number", "50", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "64 B" in out and "237 B" in out and "1000 B" in out
    assert _core.active_profile_json() == before
    assert fastcopy.info()["profile_source"] == before_info
