"""Hypothesis: random shapes, strides (steps, signs, axis orders), byte offsets and overlaps;
fastcopy.copy leaves exactly the bytes np.copyto leaves."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastcopy

DTYPES = [np.dtype(t) for t in ["u1", "<i2", ">i4", "f4", "f8", "c16", "V3", "S5", "M8[us]"]]

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


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
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
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
