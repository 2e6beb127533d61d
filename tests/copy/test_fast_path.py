"""Which calls fastcopy's drop-ins serve themselves and which they hand to numpy: the cases
docs/usage.md promises for the fast path take it, the others reach numpy (counted by
_core._drop_in_stats())."""
from __future__ import annotations

import numpy as np
import pytest

import fastcopy
from fastcopy import _core

pytestmark = [pytest.mark.kernels, pytest.mark.sanitize]


def served(fn, *args, **kwargs):
    """'fast' or 'numpy': who served fn(*args, **kwargs) (errors allowed)."""
    name = fn.__name__
    before = _core._drop_in_stats()
    try:
        fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - numpy's errors are the point of some cases
        pass
    after = _core._drop_in_stats()
    fast = after[f"{name}_fast"] - before[f"{name}_fast"]
    slow = after[f"{name}_numpy"] - before[f"{name}_numpy"]
    assert fast + slow == 1
    return "fast" if fast else "numpy"


def test_copyto_fast_path_cases():
    a, b = np.zeros((3, 4)), np.ones((3, 4))
    assert served(fastcopy.copyto, a, b) == "fast"
    for casting in ("no", "equiv", "safe", "same_kind", "unsafe"):
        assert served(fastcopy.copyto, a, b, casting=casting) == "fast"
        assert served(fastcopy.copyto, a, b, casting) == "fast"
    assert served(fastcopy.copyto, a, b, where=True) == "fast"
    assert served(fastcopy.copyto, a, b, "unsafe", True) == "fast"
    assert served(fastcopy.copyto, a.T, b.T) == "fast"                 # strided, no overlap
    assert served(fastcopy.copyto, np.zeros(1 << 20, np.uint8), np.ones(1 << 20, np.uint8)) == "fast"
    assert served(fastcopy.copyto, np.zeros(4, ">f8"), np.ones(4, ">f8")) == "fast"
    assert served(fastcopy.copyto, np.zeros(3, "U4"), np.array(["a", "b", "c"], "U4")) == "fast"


def test_copyto_numpy_cases():
    a, b = np.zeros((3, 4)), np.ones((3, 4))
    ro = np.zeros((3, 4))
    ro.flags.writeable = False
    base = np.arange(40.0)
    padded = np.dtype([("x", "u1"), ("y", "<i4")], align=True)
    for args, kwargs in [
        ((a, np.ones(4)), {}),                       # broadcasting
        ((a, np.ones((1, 4))), {}), ((a, np.ones((3, 1))), {}),  # broadcasting, same ndim
        ((a, b.astype(np.float32)), {}),             # casting
        ((a, np.ones((3, 4), ">f8")), {}),           # byte order differs: a different dtype
        ((a, 1.0), {}), ((a, b.tolist()), {}),       # scalar, list
        ((a, b), {"where": a > 0}), ((a, b), {"where": False}), ((a, b), {"where": np.True_}),
        ((a, b), {"casting": "bogus"}),
        ((ro, b), {}), ((bytearray(96), b), {}),     # read-only dst, dst not an array
        ((np.ma.masked_array(a), b), {}),            # subclass
        ((np.empty(3, object), np.empty(3, object)), {}),
        ((np.zeros(3, padded), np.zeros(3, padded)), {}),
        ((base[::2], base[:20]), {}),                # overlapping strided views
    ]:
        assert served(fastcopy.copyto, *args, **kwargs) == "numpy", (args, kwargs)


def test_stack_and_concatenate_fast_path_cases():
    xs = [np.ones((2, 3), np.float32) * i for i in range(4)]
    assert served(fastcopy.stack, xs) == "fast"
    assert served(fastcopy.stack, tuple(xs), axis=-1) == "fast"
    assert served(fastcopy.stack, xs, 1, np.empty((2, 4, 3), np.float32)) == "fast"
    assert served(fastcopy.stack, xs, out=np.empty((4, 2, 3), np.float32), casting="no", dtype=None) == "fast"
    assert served(fastcopy.concatenate, xs) == "fast"
    assert served(fastcopy.concatenate, xs, axis=None) == "fast"
    assert served(fastcopy.concatenate, xs, axis=1, out=np.empty((2, 12), np.float32)) == "fast"
    assert served(fastcopy.concatenate, [np.zeros(3, np.bool_)] * 2) == "fast"


@pytest.mark.parametrize("name", ["stack", "concatenate"])
def test_stack_and_concatenate_numpy_cases(name):
    fn = getattr(fastcopy, name)
    xs = [np.ones((2, 3), np.float32) * i for i in range(4)]
    for args, kwargs in [
        ((xs,), {"dtype": np.float64}),
        ((xs + [np.ones((2, 3))],), {}),                          # mixed dtypes
        (([x.T for x in xs],), {}),                               # not C-contiguous
        (([[1, 2], [3, 4]],), {}),                                # lists
        (((x for x in xs),), {}),                                 # generator
        (([np.ones(3, ">f8")] * 2,), {}),                         # non-native byte order
        (([np.array(["a"], "U1")] * 2,), {}),                     # not a numeric dtype
        ((xs,), {"out": np.empty((4, 2, 3), np.float64)}),        # out of another dtype
        ((xs,), {"out": np.empty((99,), np.float32)}),            # out of the wrong shape
        (([],), {}),
        ((xs,), {"axis": 7}),
        ((xs,), {"axis": np.int64(0)}),
        (([np.ma.masked_array(x) for x in xs],), {}),
    ]:
        if name == "concatenate" and "out" in kwargs and kwargs["out"].shape == (4, 2, 3):
            kwargs = {"out": np.empty((8, 3), np.float64)}
        assert served(fn, *args, **kwargs) == "numpy", (args, kwargs)
    # out shares memory with an input: numpy copies input by input, so numpy serves it
    base = np.zeros(12, np.float32)
    out = base.reshape(2, 6)
    assert served(fastcopy.stack, [base[:6], base[3:9]], out=out) == "numpy"
