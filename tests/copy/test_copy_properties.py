"""Hypothesis: random shapes, strides (steps, signs, axis orders), byte offsets and overlaps;
fastcopy.copy leaves exactly the bytes np.copyto leaves."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import fastcopy

pytestmark = pytest.mark.kernels

DTYPES = [np.dtype(t) for t in ["u1", "<i2", ">i4", "f4", "f8", "c16", "V3", "S5", "M8[us]"]]

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def view_spec(draw, shape):
    """How to cut a view of `shape` out of a flat byte buffer: byte offset, per-axis step
    (sign included) and axis order. The views never overlap themselves."""
    nd = len(shape)
    perm = draw(st.permutations(list(range(nd))))
    steps = [draw(st.sampled_from([1, 1, 2, 3, -1, -2])) for _ in range(nd)]
    offset = draw(st.integers(0, 40))
    return perm, steps, offset


def needed_bytes(shape, spec, itemsize):
    perm, steps, offset = spec
    phys = [shape[p] for p in perm]
    full = [(n - 1) * abs(k) + 1 if n else 0 for n, k in zip(phys, steps)]
    return offset + int(np.prod(full, dtype=np.int64)) * itemsize


def make_view(base, shape, spec, dtype):
    perm, steps, offset = spec
    phys = [shape[p] for p in perm]
    full = tuple((n - 1) * abs(k) + 1 if n else 0 for n, k in zip(phys, steps))
    count = int(np.prod(full, dtype=np.int64))
    block = base[offset:offset + count * dtype.itemsize].view(dtype).reshape(full)
    sliced = block[tuple(slice(None, None, k) for k in steps) + (Ellipsis,)]
    view = sliced.transpose(np.argsort(perm)) if shape else sliced
    assert view.shape == tuple(shape)
    return view


@st.composite
def copy_case(draw):
    dtype = draw(st.sampled_from(DTYPES))
    nd = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=nd, max_size=nd)))
    dspec = draw(view_spec(shape))
    sspec = draw(view_spec(shape))
    same_base = draw(st.booleans())
    wrap = draw(st.sampled_from(["none", "none", "mv_dst", "mv_src"]))
    seed = draw(st.integers(0, 2**32 - 1))
    return dtype, shape, dspec, sspec, same_base, wrap, seed


def run_case(dtype, shape, dspec, sspec, same_base, wrap, seed, copy):
    rng = np.random.default_rng(seed)
    nd_bytes = needed_bytes(shape, dspec, dtype.itemsize)
    ns_bytes = needed_bytes(shape, sspec, dtype.itemsize)
    if same_base:
        n = max(nd_bytes, ns_bytes)
        base = rng.integers(0, 256, n, dtype=np.uint8)
        bases = [base]
        views = lambda bs: (make_view(bs[0], shape, dspec, dtype), make_view(bs[0], shape, sspec, dtype))
    else:
        bases = [rng.integers(0, 256, nd_bytes, dtype=np.uint8), rng.integers(0, 256, ns_bytes, dtype=np.uint8)]
        views = lambda bs: (make_view(bs[0], shape, dspec, dtype), make_view(bs[1], shape, sspec, dtype))
    refs = [b.copy() for b in bases]
    rd, rs = views(refs)
    np.copyto(rd, rs.copy())  # np.copyto's overlap semantics: as if src went through a temporary
    d, s = views(bases)
    if wrap == "mv_dst" and dtype.kind not in "VMS":
        d = memoryview(d)  # a raw (possibly strided) buffer: byte counts must match, C-order bytes
    elif wrap == "mv_src" and dtype.kind not in "VMS":
        s = memoryview(s)
    copy(d, s)
    for b, r in zip(bases, refs):
        assert b.tobytes() == r.tobytes()


@SETTINGS
@given(copy_case())
def test_random_views_match_copyto(case):
    run_case(*case, copy=fastcopy.copy)


# `kernel` (conftest.py) is a constant name per test id, so reusing it across examples is safe.
# data_too_large: under qemu, generation sometimes overruns its budget (a generator limit, not a
# copy result); the examples that do run are checked in full.
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@given(copy_case())
def test_random_views_each_kernel(kernel, case):
    run_case(*case, copy=fastcopy.kernel(kernel))


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 3000), st.integers(-200, 200), st.sampled_from([1, 2, 4, 8]), st.integers(0, 2**32 - 1))
def test_contiguous_shift_overlap(n, shift, itemsize, seed):
    # Contiguous views of one buffer shifted by `shift` bytes (either direction).
    rng = np.random.default_rng(seed)
    size = n * itemsize
    base = rng.integers(0, 256, size + abs(shift) + 16, dtype=np.uint8)
    ref = base.copy()
    d0, s0 = (shift, 0) if shift >= 0 else (0, -shift)
    ref[d0:d0 + size] = ref[s0:s0 + size].copy()
    fastcopy.copy(base[d0:d0 + size], base[s0:s0 + size])
    assert base.tobytes() == ref.tobytes()


@st.composite
def raw_case(draw):
    """A strided array src and a strided uint8 raw buffer dst of another shape, same bytes."""
    dtype = draw(st.sampled_from([np.dtype(t) for t in ["u1", "<i2", ">i4", "f8", "c16"]]))
    nd = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=nd, max_size=nd)))
    total = int(np.prod(shape)) * dtype.itemsize
    divisors = [k for k in range(1, total + 1) if total % k == 0]
    rows = draw(st.sampled_from(divisors))
    dshape = (rows, total // rows)
    return dtype, shape, dshape, draw(view_spec(dshape)), draw(view_spec(shape)), draw(st.booleans()), \
        draw(st.sampled_from(["mv_dst", "mv_src", "mv_both"])), draw(st.integers(0, 2**32 - 1))


@settings(max_examples=200, deadline=None)
@given(raw_case())
def test_raw_buffers_of_other_shapes_copy_c_order_bytes(case):
    dtype, shape, dshape, dspec, sspec, same_base, wrap, seed = case
    u1 = np.dtype("u1")
    rng = np.random.default_rng(seed)
    nd_bytes, ns_bytes = needed_bytes(dshape, dspec, 1), needed_bytes(shape, sspec, dtype.itemsize)
    if same_base:
        bases = [rng.integers(0, 256, max(nd_bytes, ns_bytes), dtype=np.uint8)]
        views = lambda bs: (make_view(bs[0], dshape, dspec, u1), make_view(bs[0], shape, sspec, dtype))
    else:
        bases = [rng.integers(0, 256, nd_bytes, dtype=np.uint8), rng.integers(0, 256, ns_bytes, dtype=np.uint8)]
        views = lambda bs: (make_view(bs[0], dshape, dspec, u1), make_view(bs[1], shape, sspec, dtype))
    refs = [b.copy() for b in bases]
    rd, rs = views(refs)
    rd[...] = np.frombuffer(np.ascontiguousarray(rs).tobytes(), np.uint8).reshape(dshape)
    d, s = views(bases)
    if wrap in ("mv_dst", "mv_both"):
        d = memoryview(d)
    if wrap in ("mv_src", "mv_both"):
        s = memoryview(s)
    fastcopy.copy(d, s)
    for b, r in zip(bases, refs):
        assert b.tobytes() == r.tobytes()


# ---------------------------------------------------------------- extents that touch by one byte

def view_extent(shape, spec, itemsize):
    """[first, end) byte range of make_view(...)'s view: the view touches both ends of its block."""
    return spec[2], needed_bytes(shape, spec, itemsize)


@st.composite
def touching_case(draw):
    """dst and src views of one buffer whose extents share exactly one byte (either order)."""
    dtype, shape, dspec, sspec, _, wrap, seed = draw(copy_case())
    if not shape or 0 in shape:
        shape = (draw(st.integers(1, 6)),)
        dspec, sspec = draw(view_spec(shape)), draw(view_spec(shape))
    dperm, dsteps, _ = dspec
    sperm, ssteps, _ = sspec
    dlen = needed_bytes(shape, (dperm, dsteps, 0), dtype.itemsize)
    slen = needed_bytes(shape, (sperm, ssteps, 0), dtype.itemsize)
    if draw(st.booleans()):  # src starts on dst's last byte
        doff, soff = 0, dlen - 1
    else:                    # dst starts on src's last byte
        doff, soff = slen - 1, 0
    return dtype, shape, (dperm, dsteps, doff), (sperm, ssteps, soff), True, wrap, seed


@settings(max_examples=300, deadline=None)
@given(touching_case())
@example((np.dtype("u1"), (4,), ([0], [1], 6), ([0], [2], 0), True, "none", 0))  # copy(b[6:10], b[0:7:2])
def test_extents_touching_by_one_byte(case):
    dtype, shape, dspec, sspec = case[:4]
    d0, d1 = view_extent(shape, dspec, dtype.itemsize)
    s0, s1 = view_extent(shape, sspec, dtype.itemsize)
    assert min(d1, s1) - max(d0, s0) == 1  # exactly one shared byte
    run_case(*case, copy=fastcopy.copy)


def test_small_strided_views_exhaustive():
    """Every pair of 1-d uint8 / int16 views (steps -3..3, 1..4 items) in a 16-byte buffer whose
    extents share 0 to 2 bytes, against np.copyto through a temporary."""
    rng = np.random.default_rng(5)
    checked = 0
    for dtype in (np.dtype("u1"), np.dtype("<i2")):
        isz = dtype.itemsize
        for n in range(1, 5):
            for dstep in (1, 2, 3, -1, -2, -3):
                for sstep in (1, 2, 3, -1, -2, -3):
                    span_d = ((n - 1) * abs(dstep) + 1) * isz
                    span_s = ((n - 1) * abs(sstep) + 1) * isz
                    for doff in range(0, 17 - span_d):
                        for soff in range(0, 17 - span_s):
                            shared = min(doff + span_d, soff + span_s) - max(doff, soff)
                            if not 0 <= shared <= 2:
                                continue
                            base = rng.integers(0, 256, 16, dtype=np.uint8)
                            ref = base.copy()

                            def views(b):
                                d = b[doff:doff + span_d].view(dtype)[::dstep]
                                s = b[soff:soff + span_s].view(dtype)[::sstep]
                                return d, s

                            rd, rs = views(ref)
                            np.copyto(rd, rs.copy())
                            d, s = views(base)
                            fastcopy.copy(d, s)
                            assert base.tobytes() == ref.tobytes(), (dtype, n, dstep, sstep, doff, soff)
                            checked += 1
    assert checked > 1000
