"""Shared helpers for the copy tests: reference results from np.copyto, array layouts."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from typing import Callable, Tuple

import numpy as np
import pytest

import fastcopy
from _assertions import pytest_assertrepr_compare  # noqa: F401 (a pytest hook, found here by its name)

# Every dtype the semantic matrix uses: all numeric kinds, bool, complex, structured,
# datetime/timedelta, void, bytes/str, and non-native byte order.
DTYPES = [
    np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
    np.float16, np.float32, np.float64, np.longdouble, np.complex64, np.complex128, np.clongdouble,
    np.dtype("M8[ns]"), np.dtype("m8[s]"), np.dtype("V7"), np.dtype("S5"), np.dtype("U3"),
    np.dtype(">i4"), np.dtype(">f8"), np.dtype("<c8"),
    np.dtype([("a", "<i4"), ("b", "f8"), ("c", "S3")]),
    np.dtype([("x", ">u2"), ("y", "u1")], align=True),
]

SHAPES = [(), (0,), (1,), (7,), (3, 4), (2, 3, 5), (2, 0, 3), (1, 1, 6)]

@pytest.fixture(params=fastcopy.kernels(), ids=str)
def kernel(request) -> str:
    """The name of each kernel usable on this CPU (fastcopy.kernels(), the registry's order).

    A test that takes ``kernel`` runs once per kernel, and its id names the kernel, e.g.
    ``test_each_kernel[avx2_nt]``: a failure says which kernel broke.
    """
    return request.param


def streaming_kernels() -> set:
    """Names of the usable kernels with non-temporal stores (the registry's streaming flag)."""
    return {k["name"] for k in fastcopy._core.kernel_table() if k["supported"] and k["streaming"]}


NO_SUBPROCESS = os.environ.get("FASTCOPY_NO_SUBPROCESS") == "1"
no_subprocess = pytest.mark.skipif(
    NO_SUBPROCESS,
    reason="FASTCOPY_NO_SUBPROCESS=1: tests that start processes are skipped (e.g. under qemu)",
)


if NO_SUBPROCESS:
    @pytest.fixture(autouse=True)
    def _python_children_skip(monkeypatch):
        """Under qemu-user (CI's aarch64 runs set FASTCOPY_NO_SUBPROCESS=1) the emulated
        interpreter cannot start itself: the host has no binfmt handler for it, so the child
        exits 255 before running a line. A test that starts a child Python skips at that
        point, whichever helper starts it; host programs (x86 binaries) still run."""
        real_init = subprocess.Popen.__init__

        def init(self, args, *rest, **kwargs):
            argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
            if kwargs.get("executable") == sys.executable or any(str(a) == sys.executable for a in argv):
                pytest.skip("FASTCOPY_NO_SUBPROCESS=1: this test starts a Python child process, "
                            "which the emulated interpreter cannot do")
            real_init(self, args, *rest, **kwargs)

        monkeypatch.setattr(subprocess.Popen, "__init__", init)


def kernel_with_streaming_twin():
    """(kernel, its streaming twin) for the first usable kernel whose twin is usable too, in
    the registry's order (avx2 and avx2_nt on every x86 CPU seen so far); None where no kernel
    has one (aarch64: NEON and SVE have no streaming twin)."""
    table = {k["name"]: k for k in fastcopy._core.kernel_table()}
    for k in table.values():
        twin = table.get(k["twin"]) if k["twin"] else None
        if k["supported"] and not k["streaming"] and twin and twin["supported"]:
            return k["name"], twin["name"]
    return None


@contextlib.contextmanager
def builtin_policy_without(*variables: str):
    """Runs the block on the built-in profile with these FASTCOPY_* variables unset (the
    policy rebuilt without them), then puts them back and loads the profile import would."""
    from fastcopy import _profile

    saved = {k: os.environ.pop(k, None) for k in variables}
    fastcopy._core.init_policy()
    fastcopy._core.use_builtin_profile()
    try:
        yield
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v
        fastcopy._core.init_policy()
        _profile.load_at_import()


@contextlib.contextmanager
def profile_forced(profile: dict, source: str = "test: forced profile"):
    """Runs the block with `profile` (a dict in the profile format) as the active dispatch
    profile, and then puts back the profile that was active before (the environment's
    overrides stay on top of both). A test that needs a kernel in some band forces it this
    way instead of depending on the CPU's built-in profile."""
    before = fastcopy._core.active_profile()
    before_json = fastcopy._core.base_profile_json()
    fastcopy._core.load_profile(json.dumps(profile), source)
    try:
        yield
    finally:
        if before["source"] == "built-in":
            fastcopy._core.use_builtin_profile(before["name"])
        else:
            fastcopy._core.load_profile(before_json, before["source"])


def generic_profile() -> dict:
    """The active profile with the C library everywhere, no NT stores and no thread pool."""
    p = json.loads(fastcopy._core.base_profile_json())
    for region in p["regions"].values():
        for cls in ("page_aligned", "near", "far", "backward"):
            region[cls] = [{"from": 0, "kernel": "generic", "why": "forced by the test"}]
        region["nt"] = {"threshold": None, "kernel": None, "why": "forced by the test"}
        region.pop("rep_movsb_on", None)
    p["parallel"] = {"threshold": None, "threads": 0, "why": "forced by the test"}
    return p


@pytest.fixture
def loan_fills_can_stream():
    """The active profile, changed so that a copy into shared memory (a loan's fill) runs a
    kernel with a streaming twin at every size and distance: the store mode of loans then has
    two modes to choose between on every CPU (the built-in Intel profiles pick `generic` or
    `erms` there, which have none). Its NT rule forbids streaming stores at page distances 1-127,
    and streams no copy below 1 GiB by size. Yields (kernel, twin); skips where no kernel has
    a streaming twin (aarch64)."""
    pair = kernel_with_streaming_twin()
    if pair is None:
        pytest.skip("no kernel here has a streaming twin: loan fills always store cached")
    cached, streaming = pair
    profile = json.loads(fastcopy._core.base_profile_json())
    region = profile["regions"]["to_shared"]
    why = "forced by the test: a kernel with a streaming twin"
    for cls in ("page_aligned", "near", "far", "backward"):
        region[cls] = [{"from": 0, "kernel": cached, "why": why}]
    region["nt"] = {"threshold": 1 << 30, "kernel": streaming, "min_page_distance": 128, "why": why}
    region.pop("rep_movsb_on", None)
    with profile_forced(profile):
        yield cached, streaming


def random_bytes(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8).tobytes()


def random_array(shape, dtype, seed: int) -> np.ndarray:
    """A C-contiguous array of `shape` filled with random bytes (any dtype but object).

    Every byte is set, padding between struct fields included: the bytes are written as
    uint8 and then viewed as `dtype` (numpy's copy of a padded structured array copies the
    fields only, so the padding would hold whatever the allocation held, and two calls with
    the same seed would differ there)."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.empty(count * dtype.itemsize, np.uint8)
    raw[...] = np.frombuffer(random_bytes(count * dtype.itemsize, seed), np.uint8)
    return raw.view(dtype).reshape(shape)


def make_layout(kind: str, shape, dtype, seed: int) -> np.ndarray:
    """An array of `shape` and `dtype` with the memory layout `kind`, random contents."""
    shape = tuple(shape)
    if kind == "C" or shape == ():  # 0-d: every layout is the same (np.asfortranarray makes 1-d)
        return random_array(shape, dtype, seed)
    if kind == "C":
        return random_array(shape, dtype, seed)
    if kind == "F":
        return np.asfortranarray(random_array(shape, dtype, seed))
    if kind == "T":  # transposed C array
        return random_array(shape[::-1], dtype, seed).T
    if kind in ("step", "negstep", "neg"):
        step = {"step": 2, "negstep": -2, "neg": -1}[kind]
        big = tuple((n - 1) * abs(step) + 1 if n else 0 for n in shape)
        base = random_array(big, dtype, seed)
        view = base[tuple(slice(None, None, step) for _ in shape)]
        assert view.shape == shape
        return view
    raise ValueError(kind)


LAYOUTS = ["C", "F", "T", "step", "negstep", "neg"]


def assert_same_bytes(a, b) -> None:
    """Byte-wise equality of two arrays or buffers (NaN payloads included).

    Padding bytes of structured dtypes are left out: np.copyto copies field by field and
    leaves dst's padding, fastcopy copies whole items (padding from src). Documented.
    """
    ab = _comparable_bytes(a)
    bb = _comparable_bytes(b)
    assert ab == bb


def has_padding(dtype) -> bool:
    dtype = np.dtype(dtype)
    if dtype.names is None:
        return False
    return sum(dtype.fields[n][0].itemsize for n in dtype.names) != dtype.itemsize or any(
        has_padding(dtype.fields[n][0]) for n in dtype.names)


def _comparable_bytes(a) -> bytes:
    if not isinstance(a, np.ndarray):
        return bytes(a)
    a = np.ascontiguousarray(a)
    if has_padding(a.dtype):
        from numpy.lib import recfunctions

        a = recfunctions.repack_fields(a)
    return a.tobytes()


def compare_on_base(base: np.ndarray, make_views: Callable[[np.ndarray], Tuple[np.ndarray, np.ndarray]],
                    copy=None) -> None:
    """Builds (dst, src) views of `base` twice: np.copyto on one copy, fastcopy on the other;
    the whole base must end up byte-identical (this covers overlapping views).

    The reference is np.copyto(dst, src.copy()): np.copyto's documented semantics for
    overlap ("as if src were copied to a temporary first"). np.copyto(dst, src) itself
    misses that for 1-d views with different strides of the same sign (numpy 2.4: it only
    reverses the loop direction there), e.g. dst = a[::2], src = a[:n//2]; see
    test_numpy_1d_strided_overlap_quirk.
    """
    copy = copy or fastcopy.copy
    ref = base.copy()
    rd, rs = make_views(ref)
    np.copyto(rd, rs.copy(), casting="no")
    d, s = make_views(base)
    copy(d, s)
    assert base.tobytes() == ref.tobytes()


def snapshot(obj) -> bytes:
    """The bytes of a buffer or array, for "dst unchanged" checks."""
    if isinstance(obj, np.ndarray):
        return obj.tobytes()
    return bytes(memoryview(obj).cast("B")) if memoryview(obj).contiguous else memoryview(obj).tobytes()
