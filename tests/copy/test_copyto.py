"""fastcopy.copyto is a drop-in for np.copyto: same results (bytes in dst), same exception
types, for numpy's documented behaviours and for random dtypes, shapes, strides,
broadcasting, casting rules and masks. Reference: np.copyto itself, on a twin of dst."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastcopy

from conftest import random_array

pytestmark = [pytest.mark.kernels, pytest.mark.sanitize]

# Fewer examples under emulation (.ci/arm_pytest.sh sets FASTCOPY_NO_SUBPROCESS=1 under qemu).
EMULATED = os.environ.get("FASTCOPY_NO_SUBPROCESS") == "1"


def examples(n: int) -> int:
    return max(n // 4, 20) if EMULATED else n

CASTINGS = ["no", "equiv", "safe", "same_kind", "unsafe"]


def outcome(fn, *args, **kwargs):
    """('ok', None) or ('error', exception type); numpy's warnings are silenced alike."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the type is what we compare
            return ("error", type(e))
    return ("ok", None)


def raw(a) -> bytes:
    """Every byte of an array's memory, padding included (dst is compared whole)."""
    if a is None:
        return b""
    if a.dtype.kind == "O":
        return repr(a.tolist()).encode()
    return np.ascontiguousarray(a).tobytes()


def check_like_numpy(make, **kwargs):
    """make() -> (dst, src, base-of-dst); runs np.copyto and fastcopy.copyto on twins."""
    d1, s1, b1 = make()
    d2, s2, b2 = make()
    r1 = outcome(np.copyto, d1, s1, **kwargs)
    r2 = outcome(fastcopy.copyto, d2, s2, **kwargs)
    assert r2 == r1
    assert raw(b2) == raw(b1)


# ---- numpy's documented behaviours --------------------------------------------------------------

def test_same_shape_and_dtype_copies():
    src = np.arange(12.0).reshape(3, 4)
    dst = np.zeros((3, 4))
    assert fastcopy.copyto(dst, src) is None
    assert np.array_equal(dst, src)


def test_broadcasts_like_numpy():
    dst = np.zeros((3, 4))
    fastcopy.copyto(dst, np.arange(4.0))
    assert np.array_equal(dst, np.broadcast_to(np.arange(4.0), (3, 4)))
    with pytest.raises(ValueError):
        fastcopy.copyto(np.zeros((3, 4)), np.arange(3.0))


@pytest.mark.parametrize("src_shape", [(1, 4), (3, 1), (1, 1)])
def test_broadcasts_length_one_axes_like_numpy(src_shape):
    # Same number of dimensions, a length-1 axis in src: numpy repeats it. A byte copy of src's
    # bytes only would leave the rest of dst as it was.
    src = np.arange(float(np.prod(src_shape))).reshape(src_shape) + 1
    dst, expected = np.full((3, 4), -1.0), np.full((3, 4), -1.0)
    fastcopy.copyto(dst, src)
    np.copyto(expected, src)
    assert np.array_equal(dst, expected)


def test_scalars_lists_and_0d():
    dst = np.zeros(5, np.int64)
    fastcopy.copyto(dst, 7)
    assert (dst == 7).all()
    fastcopy.copyto(dst, [1, 2, 3, 4, 5])
    assert dst.tolist() == [1, 2, 3, 4, 5]
    d0 = np.zeros((), np.float32)
    fastcopy.copyto(d0, np.array(2.5, np.float32))
    assert d0 == 2.5
    fastcopy.copyto(dst, np.array(9))  # 0-d src broadcasts
    assert (dst == 9).all()


def test_dst_must_be_an_ndarray():
    for bad in ([0, 0], bytearray(16), memoryview(bytearray(16)), 3.0, None):
        with pytest.raises(TypeError):
            np.copyto(bad, np.zeros(2))
        with pytest.raises(TypeError):
            fastcopy.copyto(bad, np.zeros(2))


def test_read_only_dst_raises_valueerror_and_is_untouched():
    dst = np.zeros(4)
    dst.flags.writeable = False
    with pytest.raises(ValueError):
        fastcopy.copyto(dst, np.ones(4))
    assert (dst == 0).all()


def test_casting_rules():
    f = np.arange(4.0)
    i = np.zeros(4, np.int64)
    with pytest.raises(TypeError):
        fastcopy.copyto(i, f)  # same_kind refuses float -> int
    fastcopy.copyto(i, f, casting="unsafe")
    assert i.tolist() == [0, 1, 2, 3]
    with pytest.raises(TypeError):
        fastcopy.copyto(np.zeros(4, np.float32), f, casting="safe")
    with pytest.raises(ValueError):
        fastcopy.copyto(np.zeros(4), f, casting="nonsense")
    # Equal dtypes: every rule allows the copy (the fast path serves it).
    for casting in CASTINGS:
        d = np.zeros(4)
        fastcopy.copyto(d, f, casting=casting)
        assert np.array_equal(d, f)
        d = np.zeros(4)
        fastcopy.copyto(d, f, casting)  # positional, as numpy allows
        assert np.array_equal(d, f)


def test_byte_order_variants_are_different_dtypes():
    big = np.arange(6, dtype=">f8")
    for casting in CASTINGS:
        check_like_numpy(lambda: _twin(np.zeros(6, "<f8"), big), casting=casting)
    d = np.zeros(6, "<f8")
    fastcopy.copyto(d, big)
    assert d.tolist() == big.tolist()
    d = np.zeros(6, ">f8")
    fastcopy.copyto(d, big, casting="no")
    assert d.tobytes() == big.tobytes()


def _twin(dst, src):
    dst = dst.copy()
    return dst, src, dst


def test_where_mask():
    src = np.arange(6.0)
    dst = np.full(6, -1.0)
    mask = np.array([True, False] * 3)
    fastcopy.copyto(dst, src, where=mask)
    assert dst.tolist() == [0, -1, 2, -1, 4, -1]
    dst = np.full(6, -1.0)
    fastcopy.copyto(dst, src, where=False)
    assert (dst == -1).all()
    dst = np.full(6, -1.0)
    fastcopy.copyto(dst, src, where=np.True_)
    assert np.array_equal(dst, src)
    with pytest.raises(ValueError):
        fastcopy.copyto(np.zeros(6), src, where=np.ones(4, bool))


def test_overlapping_arrays_like_numpy():
    def contiguous():
        a = np.arange(20.0)
        return a[1:], a[:-1], a
    check_like_numpy(contiguous)

    def strided():
        a = np.arange(40.0)
        return a[::2], a[:20], a  # numpy 2.4's loop-order case: numpy serves it
    check_like_numpy(strided)

    def reversed_view():
        a = np.arange(20.0)
        return a, a[::-1], a
    check_like_numpy(reversed_view)


def test_subclasses():
    m = np.ma.masked_array(np.zeros(4), mask=[False, True, False, False])
    fastcopy.copyto(m, np.arange(4.0))
    m2 = np.ma.masked_array(np.zeros(4), mask=[False, True, False, False])
    np.copyto(m2, np.arange(4.0))
    assert m.data.tolist() == m2.data.tolist()
    assert m.mask.tolist() == m2.mask.tolist()

    class Sub(np.ndarray):
        pass
    d = np.zeros(3).view(Sub)
    fastcopy.copyto(d, np.ones(3).view(Sub))
    assert (d == 1).all() and type(d) is Sub


def test_structured_dtypes_keep_numpys_padding_behaviour():
    dt = np.dtype([("x", "u1"), ("y", "<i4")], align=True)  # 3 padding bytes per item

    def make():
        # frombuffer on a bytearray: every padding byte defined (.copy() leaves it uninitialised)
        dst = np.frombuffer(bytearray(range(40)), dt)
        src = np.frombuffer(bytearray(range(100, 140)), dt)
        return dst, src, dst
    for casting in CASTINGS:
        check_like_numpy(make, casting=casting)
    unpadded = np.dtype([("a", "<i4"), ("b", "f8")])
    check_like_numpy(lambda: _twin(np.zeros(3, unpadded), np.ones(3, unpadded)))


def test_object_dtype():
    src = np.array([[1], "a", None], dtype=object)
    dst = np.empty(3, dtype=object)
    fastcopy.copyto(dst, src)
    assert dst[0] is src[0] and dst[1] == "a" and dst[2] is None


def test_bad_arguments_like_numpy():
    a = np.zeros(3)
    for args, kwargs in [((a,), {}), ((), {}), ((a, a, "same_kind", True, 1), {}),
                         ((a, a), {"bogus": 1}), ((a, a, "no"), {"casting": "no"}),
                         ((a,), {"src": a}), ((), {"dst": a, "src": a})]:
        assert outcome(fastcopy.copyto, *args, **kwargs) == outcome(np.copyto, *args, **kwargs)


def test_large_copy_releases_gil_and_is_correct():
    src = random_array((1 << 20,), np.uint8, 1)
    dst = np.zeros_like(src)
    fastcopy.copyto(dst, src)
    assert dst.tobytes() == src.tobytes()


# ---- property tests against np.copyto ---------------------------------------------------------

PROPERTY_DTYPES = [np.dtype(t) for t in
                   ["?", "i1", "u2", "<i4", ">i4", "i8", "f2", "f4", "<f8", ">f8", "c8", "c16",
                    "M8[s]", "m8[ms]", "S3", "U2", "V5", "O"]] + [
    np.dtype([("a", "u1"), ("b", "<i2")], align=True), np.dtype([("a", "<i4"), ("b", "f4")])]


def filled(shape, dtype, seed):
    if dtype.kind == "O":
        return (np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64) + seed).astype(object).reshape(shape)
    if dtype.kind == "U":  # valid code points
        rng = np.random.default_rng(seed)
        codes = rng.integers(32, 0x2FFF, size=tuple(shape) + (dtype.itemsize // 4,), dtype=np.uint32)
        return codes.view(dtype).reshape(shape)
    return random_array(shape, dtype, seed)


def strided_view(shape, dtype, seed, steps, transpose):
    """A fresh base and a view of `shape` into it with `steps` (signs included), optionally
    in transposed memory order. Deterministic: called twice it gives byte-identical twins."""
    full = tuple((n - 1) * abs(k) + 1 if n else 0 for n, k in zip(shape, steps))
    cut = tuple(slice(None, None, k) for k in steps) + (Ellipsis,)  # a view even for 0-d
    if transpose and len(shape) > 1:
        swapped = full[-1:] + full[1:-1] + full[:1]
        base = filled(swapped, dtype, seed)
        return np.swapaxes(base, 0, -1)[cut], base
    base = filled(full, dtype, seed)
    return base[cut], base


@st.composite
def layout(draw, nd):
    return [draw(st.sampled_from([1, 1, 2, -1, -2])) for _ in range(nd)], draw(st.booleans())


@st.composite
def copyto_case(draw):
    nd = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=nd, max_size=nd)))
    ddt = draw(st.sampled_from(PROPERTY_DTYPES))
    sdt = ddt if draw(st.integers(0, 2)) else draw(st.sampled_from(PROPERTY_DTYPES))
    # src shape: equal, broadcastable (drop leading dims, ones), or anything.
    form = draw(st.sampled_from(["equal", "equal", "equal", "suffix", "ones", "other"]))
    if form == "suffix":
        sshape = shape[draw(st.integers(0, nd)):]
    elif form == "ones":
        sshape = tuple(1 if draw(st.booleans()) else n for n in shape)
    elif form == "other":
        sshape = tuple(draw(st.lists(st.integers(0, 4), min_size=0, max_size=3)))
    else:
        sshape = shape
    casting = draw(st.sampled_from([None] + CASTINGS))
    where = draw(st.sampled_from(["absent", "true", "false", "array", "np_true"]))
    wshape = tuple(1 if draw(st.booleans()) else n for n in shape)
    dspec = (shape, ddt, draw(st.integers(0, 1000))) + tuple(draw(layout(len(shape))))
    sspec = (sshape, sdt, draw(st.integers(0, 1000))) + tuple(draw(layout(len(sshape))))
    src_kind = draw(st.sampled_from(["array", "array", "array", "scalar", "list"]))
    read_only = draw(st.integers(0, 9)) == 0
    return dspec, sspec, casting, where, wshape, src_kind, read_only, draw(st.integers(0, 2**31))


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(copyto_case())
def test_random_calls_match_np_copyto(case):
    dspec, sspec, casting, where, wshape, src_kind, read_only, seed = case
    sview, _ = strided_view(*sspec)
    src = sview
    if src_kind == "scalar" and sview.size:
        src = sview.flat[0]
    elif src_kind == "list" and sview.dtype.kind != "V":
        src = sview.tolist()
    kwargs = {}
    if casting is not None:
        kwargs["casting"] = casting
    if where == "true":
        kwargs["where"] = True
    elif where == "false":
        kwargs["where"] = False
    elif where == "np_true":
        kwargs["where"] = np.True_
    elif where == "array":
        kwargs["where"] = np.random.default_rng(seed).integers(0, 2, size=wshape).astype(bool)

    def make():
        view, base = strided_view(*dspec)
        if read_only:
            view.flags.writeable = False
        return view, src, base
    check_like_numpy(make, **kwargs)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 40), st.integers(-8, 8), st.sampled_from([1, 2, -1, -2]), st.sampled_from([1, 2, -1]),
       st.sampled_from(["u1", "<i4", "f8", "c16"]))
def test_overlapping_views_match_np_copyto(n, shift, dstep, sstep, dt):
    """Two views of one buffer (any overlap, steps and directions): np.copyto's exact bytes."""
    dt = np.dtype(dt)
    size = n * 2 + 20

    def make():
        base = np.arange(size * 3).astype(dt)
        mid = size + shift
        d = base[size:size + n * abs(dstep):dstep] if dstep > 0 else base[size + n * abs(dstep) - 1:size - 1:dstep]
        s = base[mid:mid + n * abs(sstep):sstep] if sstep > 0 else base[mid + n * abs(sstep) - 1:mid - 1:sstep]
        assert d.shape == s.shape == (n,)
        return d, s, base
    check_like_numpy(make)


# ---- np.copyto = fastcopy.copyto --------------------------------------------------------------

def _pipeline(copyto):
    """A realistic numpy workload written against np.copyto: a ring of frames, normalisation
    into preallocated buffers, masked updates, dtype conversion, broadcasting fills."""
    rng = np.random.default_rng(0)
    ring = np.zeros((8, 64, 64), np.float32)
    acc = np.zeros((64, 64), np.float64)
    out_u8 = np.zeros((64, 64), np.uint8)
    for step in range(40):
        frame = rng.random((64, 64), dtype=np.float32)
        copyto(ring[step % 8], frame)                       # fast path
        copyto(acc, ring.mean(axis=0))                       # float32 -> float64 (numpy)
        mask = frame > 0.9
        copyto(acc, 0.0, where=mask)                         # scalar + mask (numpy)
        copyto(out_u8, np.clip(acc * 255, 0, 255), casting="unsafe")
        copyto(ring[:, 0, :], frame[0])                      # broadcast (numpy)
        copyto(ring[(step + 1) % 8][::2], ring[step % 8][1::2])  # strided, same dtype
    big = np.empty((512, 1024))
    copyto(big, rng.random((512, 1024)))                     # large: GIL released
    return ring, acc, out_u8, big


def test_patching_np_copyto_runs_a_numpy_workload(monkeypatch):
    expected = _pipeline(np.copyto)
    monkeypatch.setattr(np, "copyto", fastcopy.copyto)
    assert np.copyto is fastcopy.copyto
    got = _pipeline(lambda *a, **k: np.copyto(*a, **k))
    for e, g in zip(expected, got):
        assert e.dtype == g.dtype and e.tobytes() == g.tobytes()
    # Every fallback kind still reaches numpy's own copyto (no recursion through np.copyto).
    d = np.zeros((2, 3), np.int32)
    np.copyto(d, 1.0, casting="unsafe", where=[[True, False, True]] * 2)
    assert d.tolist() == [[1, 0, 1], [1, 0, 1]]
    with pytest.raises(TypeError):
        np.copyto([1, 2], np.zeros(2))
    # numpy functions built on copyto keep working.
    x = np.array([1.0, np.nan, np.inf])
    assert np.nan_to_num(x, posinf=5.0).tolist() == [1.0, 0.0, 5.0]
    assert np.stack([np.ones(2), np.zeros(2)]).shape == (2, 2)
