"""Arrays of other libraries in every copy entry point: torch CPU tensors, JAX and pyarrow
arrays, and any object exporting DLPack or __array_interface__, read as numpy arrays over
their memory. GPU memory, a tensor that requires grad, a dtype numpy lacks and a read-only
destination are refused with an exception naming the object, and nothing is written."""
from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest
from _child import explain, run_script
from conftest import no_subprocess

import fastcopy


class InterfaceArray:
    """Exports only __array_interface__ (as numba and older libraries do), over a numpy array."""

    def __init__(self, base: np.ndarray):
        self.base = base
        self.__array_interface__ = base.__array_interface__


class DeviceArray:
    """Claims memory on DLPack device `device_type` (2: CUDA); exporting it must not be tried."""

    def __init__(self, device_type: int = 2):
        self.device_type = device_type

    def __dlpack_device__(self):
        return (self.device_type, 0)

    def __dlpack__(self, **kwargs):
        raise AssertionError("a GPU array must be refused before its export is asked for")


def test_array_interface_objects_are_read_and_written_in_place():
    base = np.zeros(6, np.int32)
    fastcopy.copy(InterfaceArray(base), np.arange(6, dtype=np.int32))
    assert base.tolist() == [0, 1, 2, 3, 4, 5]
    out = np.zeros(6, np.int32)
    fastcopy.copy(out, InterfaceArray(np.arange(6, dtype=np.int32) * 2))
    assert out.tolist() == [0, 2, 4, 6, 8, 10]
    fastcopy.copyto(InterfaceArray(base), 9)
    assert base.tolist() == [9] * 6


@pytest.mark.parametrize("entry", ["copy", "copyto", "copy_many", "stack-out"])
@pytest.mark.parametrize("side", ["dst", "src"])
def test_gpu_memory_is_refused_naming_the_object_and_nothing_is_written(entry, side):
    gpu = DeviceArray(2)
    host = np.arange(4, dtype=np.float32)
    before = host.copy()
    dst, src = (gpu, host) if side == "dst" else (host, gpu)
    with pytest.raises(TypeError, match=r"DeviceArray\) is in memory of CUDA \(DLPack device type 2\).*CPU"):
        if entry == "copy":
            fastcopy.copy(dst, src)
        elif entry == "copyto":
            fastcopy.copyto(dst, src)
        elif entry == "copy_many":
            fastcopy.copy_many([np.zeros(4, np.float32), dst], [np.ones(4, np.float32), src])
        else:
            fastcopy.stack([src, src], out=dst) if side == "dst" else fastcopy.stack([src, src], out=np.zeros((2, 4)))
    assert np.array_equal(host, before)


def test_copy_many_names_the_pair_and_copies_nothing_when_one_is_on_a_gpu():
    first = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match=r"copy_many: pair 1: dst"):
        fastcopy.copy_many([first, DeviceArray(2)], [np.ones(4, np.float32), np.ones(4, np.float32)])
    assert not first.any()


# ---- torch ------------------------------------------------------------------------------------


def _torch():
    return pytest.importorskip("torch")


# every dtype torch and numpy share
TORCH_DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16",
                "float32", "float64", "complex64", "complex128"]


@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_torch_tensors_of_every_shared_dtype(name):
    torch = _torch()
    dt = getattr(torch, name)
    src = (torch.arange(24) % 2).to(dt).reshape(2, 3, 4) if name == "bool" else torch.arange(24).to(dt).reshape(2, 3, 4)
    dst = torch.zeros_like(src)
    fastcopy.copy(dst, src)
    assert torch.equal(dst, src)
    dst2 = torch.zeros_like(src)
    fastcopy.copyto(dst2, src)
    assert torch.equal(dst2, src)
    n = np.zeros(src.shape, src.numpy().dtype)
    fastcopy.copy(n, src)
    assert np.array_equal(n, src.numpy())


def test_torch_non_contiguous_tensors_and_numpy_mixed():
    torch = _torch()
    src = torch.arange(60, dtype=torch.float64).reshape(5, 12)
    dst = torch.zeros(12, 5, dtype=torch.float64)
    fastcopy.copy(dst, src.t())                      # transposed source
    assert torch.equal(dst, src.t())
    dst = torch.zeros(5, 12, dtype=torch.float64)
    fastcopy.copy(dst[:, ::3], src[:, 1::3])         # strided both sides
    expected = torch.zeros(5, 12, dtype=torch.float64)
    expected[:, ::3] = src[:, 1::3]
    assert torch.equal(dst, expected)


def test_torch_views_sharing_storage_give_np_copyto_results():
    torch = _torch()
    for shift in (2, -2):
        t = torch.arange(20, dtype=torch.int32)
        ref = t.numpy().copy()
        if shift > 0:
            fastcopy.copy(t[shift:], t[:-shift])
            np.copyto(ref[shift:], ref[:-shift])
        else:
            fastcopy.copy(t[:shift], t[-shift:])
            np.copyto(ref[:shift], ref[-shift:])
        assert t.numpy().tolist() == ref.tolist()


def test_torch_refusals_name_the_tensor_and_write_nothing():
    torch = _torch()
    grad = torch.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"fastcopy.copy: dst \(torch.Tensor\).*requires grad"):
        fastcopy.copy(grad, torch.ones(3))
    assert not grad.detach().any()
    bf = torch.zeros(3, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"BFloat16.*view it as an integer type"):
        fastcopy.copy(bf, torch.ones(3, dtype=torch.bfloat16))
    # bfloat16 viewed as int16 is copied bit for bit
    fastcopy.copy(bf.view(torch.int16), torch.ones(3, dtype=torch.bfloat16).view(torch.int16))
    assert bf.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(RuntimeError, match=r"src \(torch.Tensor\).*conjugate"):
        fastcopy.copy(np.zeros(1, np.complex64), torch.tensor([1 + 2j], dtype=torch.complex64).conj())


def test_copyto_stack_and_concatenate_take_and_return_tensors():
    torch = _torch()
    dst = torch.zeros(2, 3)
    fastcopy.copyto(dst, torch.ones(3))              # broadcast: numpy serves it, into the tensor
    assert dst.sum().item() == 6
    parts = [torch.full((2, 3), float(i)) for i in range(3)]
    out = torch.empty(3, 2, 3)
    assert fastcopy.stack(parts, out=out) is out
    assert torch.equal(out, torch.stack(parts))
    res = fastcopy.stack(parts)
    assert isinstance(res, np.ndarray) and np.array_equal(res, torch.stack(parts).numpy())
    out = torch.empty(6, 3)
    assert fastcopy.concatenate(parts, out=out) is out
    assert torch.equal(out, torch.cat(parts))
    res = fastcopy.concatenate((parts[0], np.zeros((1, 3), np.float32)), axis=0)
    assert isinstance(res, np.ndarray) and res.shape == (3, 3)


def test_a_failed_stack_into_a_tensor_leaves_it_untouched():
    torch = _torch()
    out = torch.full((2, 2, 3), 5.0)
    with pytest.raises(RuntimeError, match="requires grad"):
        fastcopy.stack([torch.ones(2, 3), torch.ones(2, 3, requires_grad=True)], out=out)
    assert (out == 5).all()


def test_copy_many_with_tensors():
    torch = _torch()
    a, b = torch.zeros(4), torch.zeros(2, 2, dtype=torch.int64)
    fastcopy.copy_many([a, b], [torch.arange(4.0), torch.ones(2, 2, dtype=torch.int64)])
    assert a.tolist() == [0, 1, 2, 3] and b.sum().item() == 4


def test_no_warning_from_torch_on_the_way():
    torch = _torch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fastcopy.copy(torch.zeros(4), torch.ones(4))


# ---- small torch tensor pairs: the direct route ------------------------------------------------
# Two small C-contiguous tensors of one dtype and shape are copied from torch's DLPack exchange
# table and three tensor attributes, without building numpy arrays. Every pair the route must pass on gets the general path's
# answer: the same exception, and nothing written.

def _direct_route_refusals(torch):
    """{case: (dst, src, exception of copy(), exception of copyto() or None when it copies)}"""
    return {
        "dst-requires-grad": (lambda: (torch.zeros(3, requires_grad=True), torch.ones(3)),
                              (RuntimeError, "requires grad"), (RuntimeError, "requires grad")),
        "src-requires-grad": (lambda: (torch.zeros(3), torch.ones(3, requires_grad=True)),
                              (RuntimeError, "requires grad"), (RuntimeError, "requires grad")),
        "parameter": (lambda: (torch.nn.Parameter(torch.zeros(3)), torch.ones(3)),
                      (RuntimeError, "requires grad"), (RuntimeError, "requires grad")),
        # a contiguous view with the negative bit (t.conj().imag has it too, but is strided)
        "negative-bit": (lambda: (torch.zeros(3), torch._neg_view(torch.tensor([1.0, 2.0, 3.0]))),
                         (RuntimeError, "negative bit"), (RuntimeError, "negative bit")),
        "conjugate-bit": (lambda: (torch.zeros(2, dtype=torch.complex64),
                                   torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex64).conj()),
                          (RuntimeError, "conjugate bit"), (RuntimeError, "conjugate bit")),
        "meta-device": (lambda: (torch.zeros(3), torch.empty(3, device="meta")),
                        (TypeError, "meta device"), (TypeError, "meta device")),
        "sparse": (lambda: (torch.zeros(3), torch.ones(3).to_sparse()),
                   (TypeError, "Sparse layout"), (TypeError, "Sparse layout")),
        "bfloat16": (lambda: (torch.zeros(3, dtype=torch.bfloat16), torch.ones(3, dtype=torch.bfloat16)),
                     (TypeError, "view it as an integer type"), (TypeError, "view it as an integer type")),
        "other-dtype": (lambda: (torch.zeros(3), torch.tensor([1, 2, 3], dtype=torch.int32)),
                        (TypeError, "dtype mismatch"), None),
        "other-shape": (lambda: (torch.zeros(1, 3), torch.tensor([1.0, 2.0, 3.0])),
                        (ValueError, "shape mismatch"), None),
        # one dimension count and one element count, two shapes
        "transposed-shape": (lambda: (torch.zeros(2, 3), torch.arange(6.0).reshape(3, 2)),
                             (ValueError, "shape mismatch"), (ValueError, "broadcast")),
        # an attribute set on one tensor does not stand in for torch's own answer
        "negative-bit-shadowed": (lambda: (torch.zeros(3), _shadowed_neg_view(torch)),
                                  (RuntimeError, "negative bit"), (RuntimeError, "negative bit")),
        "sparse-csr": (lambda: (torch.zeros(2, 2), torch.eye(2).to_sparse_csr()),
                       (TypeError, "Sparse"), (TypeError, "Sparse")),
    }


def _shadowed_neg_view(torch):
    t = torch._neg_view(torch.tensor([1.0, 2.0, 3.0]))
    t.is_neg = lambda: False
    return t


@pytest.mark.parametrize("case", ["dst-requires-grad", "src-requires-grad", "parameter", "negative-bit",
                                  "conjugate-bit", "meta-device", "sparse", "bfloat16", "other-dtype",
                                  "other-shape", "transposed-shape", "negative-bit-shadowed", "sparse-csr"])
@pytest.mark.parametrize("entry", ["copy", "copyto"])
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_small_tensor_pairs_the_direct_route_passes_on_get_the_general_answer(case, entry):
    torch = _torch()
    make, copy_error, copyto_error = _direct_route_refusals(torch)[case]
    dst, src = make()
    before = dst.detach().clone() if dst.device.type == "cpu" and dst.layout == torch.strided else None
    error = copy_error if entry == "copy" else copyto_error
    if error is None:                                # copyto casts or broadcasts, as np.copyto does
        fastcopy.copyto(dst, src)
        expected = before.numpy().copy()
        np.copyto(expected, src.numpy())
        assert np.array_equal(dst.detach().numpy(), expected)
        return
    with pytest.raises(error[0], match=error[1]):
        getattr(fastcopy, entry)(dst, src)
    if before is not None:
        assert torch.equal(dst.detach(), before)


def test_small_tensor_pairs_take_the_direct_route_and_copy_every_shared_dtype():
    torch = _torch()
    from fastcopy import _core

    for name in TORCH_DTYPES:
        dt = getattr(torch, name)
        src = (torch.arange(6) % 2).to(dt) if name == "bool" else (torch.arange(6) + 1).to(dt)
        for shape in ((6,), (2, 3), (1, 6, 1)):
            s = src.reshape(shape)
            dst = torch.zeros_like(s)
            fastcopy.copy(dst, s)
            assert torch.equal(dst, s), (name, shape)
            dst = torch.zeros_like(s)
            before = _core._drop_in_stats()["copyto_fast"]
            fastcopy.copyto(dst, s)
            assert torch.equal(dst, s), (name, shape)
            assert _core._drop_in_stats()["copyto_fast"] == before + 1, (name, shape)


def test_small_tensor_pairs_that_are_not_contiguous_or_overlap_are_copied_right():
    torch = _torch()
    base = torch.arange(12, dtype=torch.float32)
    dst = torch.zeros(6)
    fastcopy.copy(dst, base[::2])                    # same shape and dtype, not contiguous
    assert dst.tolist() == base[::2].tolist()
    dst = torch.zeros(6)
    fastcopy.copyto(dst, base[1::2])
    assert dst.tolist() == base[1::2].tolist()
    dst = torch.zeros(2, 3)
    fastcopy.copy(dst, base[:6].reshape(3, 2).t())   # transposed: strides (1, 2)
    assert dst.tolist() == base[:6].reshape(3, 2).t().tolist()
    dst = torch.zeros(4)
    fastcopy.copy(dst, torch.tensor([7.0]).expand(4))  # one element seen four times: stride 0
    assert dst.tolist() == [7.0] * 4
    wide = torch.zeros(3, 4)
    fastcopy.copy(wide[:, 1:3], base[:6].reshape(3, 2))  # a strided destination
    assert wide.tolist() == [[0, 0, 1, 0], [0, 2, 3, 0], [0, 4, 5, 0]]
    t = torch.arange(10, dtype=torch.int64)          # one storage, shifted either way
    ref = t.numpy().copy()
    fastcopy.copy(t[2:], t[:-2])
    np.copyto(ref[2:], ref[:-2])
    assert t.tolist() == ref.tolist()
    fastcopy.copyto(t[:-3], t[3:])
    np.copyto(ref[:-3], ref[3:])
    assert t.tolist() == ref.tolist()


@pytest.mark.parametrize("change", ["none", "no-exchange-table", "python-property", "newer-major-version",
                                    "newer-major-version-chaining-version-1"])
def test_the_direct_route_stays_off_when_torch_lacks_what_it_reads(tmp_path, change):
    # In a child: each case changes torch.Tensor itself before fastcopy first looks at it
    # ("none" shows that the count below sees the direct route).
    if not hasattr(_torch().Tensor, "__dlpack_c_exchange_api__"):
        pytest.skip("this torch has no DLPack exchange table (torch 2.13 has one)")
    code = f"""
import ctypes
import torch
import fastcopy
change = {change!r}
if change == "none":
    pass
elif change == "no-exchange-table":
    del torch.Tensor.__dlpack_c_exchange_api__
elif change == "python-property":
    torch.Tensor.requires_grad = property(lambda self: torch._C.TensorBase.requires_grad.__get__(self))
else:
    # torch's own table, its major version set to 2: a layout this reader does not know,
    # whatever the functions in it; with torch's real table chained as the older version it
    # provides, or with none
    name = b"dlpack_exchange_api"
    capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    capsule_pointer.restype = ctypes.c_void_p
    capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    real = capsule_pointer(torch.Tensor.__dlpack_c_exchange_api__, name)
    table = (ctypes.c_char * 56)()
    ctypes.memmove(table, real, 56)
    ctypes.c_uint32.from_buffer(table, 0).value = 2
    ctypes.c_void_p.from_buffer(table, 8).value = real if change.endswith("chaining-version-1") else None
    capsule_new = ctypes.pythonapi.PyCapsule_New
    capsule_new.restype = ctypes.py_object
    capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    torch.Tensor.__dlpack_c_exchange_api__ = capsule_new(ctypes.addressof(table), name, None)
# The general path reads each tensor through Tensor.numpy(); the direct route never calls it.
numpy_calls = [0]
tensor_numpy = torch.Tensor.numpy
def counted_numpy(self, *args, **kwargs):
    numpy_calls[0] += 1
    return tensor_numpy(self, *args, **kwargs)
torch.Tensor.numpy = counted_numpy
src = torch.arange(6, dtype=torch.float32).reshape(2, 3)
dst = torch.zeros(2, 3)
fastcopy.copy(dst, src)
ok = torch.equal(dst, src)
fastcopy.copyto(dst, src + 1)
print(ok and torch.equal(dst, src + 1), numpy_calls[0])
"""
    proc = run_script(tmp_path, code, timeout=120)
    assert proc.returncode == 0, explain(proc)
    on = change in ("none", "newer-major-version-chaining-version-1")
    expected = "0" if on else "4"                    # two tensors in each of two calls
    assert proc.stdout.split() == ["True", expected], explain(proc)


# ---- pyarrow and JAX --------------------------------------------------------------------------
def test_pyarrow_arrays_buffers_and_tensors_as_sources():
    pa = pytest.importorskip("pyarrow")
    out = np.zeros(4, np.int64)
    fastcopy.copy(out, pa.array([1, 2, 3, 4], type=pa.int64()))
    assert out.tolist() == [1, 2, 3, 4]
    t = pa.Tensor.from_numpy(np.arange(6.0).reshape(2, 3))
    out = np.zeros((2, 3))
    fastcopy.copy(out, t)
    assert out.tolist() == [[0, 1, 2], [3, 4, 5]]
    buf = pa.py_buffer(b"abcdefgh")
    raw = bytearray(8)
    fastcopy.copy(raw, buf)
    assert raw == b"abcdefgh"
    with pytest.raises(ValueError, match="read-only"):   # pyarrow memory is immutable
        fastcopy.copy(pa.array([0, 0], type=pa.int64()), np.ones(2, np.int64))


@no_subprocess
def test_jax_arrays_as_sources_and_refused_as_destinations(tmp_path):
    # In a child: JAX starts threads at import, and every later os.fork() of this test process
    # (other tests fork) would then warn that it may deadlock.
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    code = """
import numpy as np
import jax.numpy as jnp
import fastcopy
src = jnp.arange(5, dtype=jnp.float32)
out = np.zeros(5, np.float32)
fastcopy.copy(out, src)
print("read", out.tolist())
dst = jnp.zeros(5, dtype=jnp.float32)
try:
    fastcopy.copy(dst, np.ones(5, np.float32))
    print("written")
except ValueError as exc:
    print("refused", "read-only" in str(exc), bool(np.asarray(dst).any()))
"""
    proc = run_script(tmp_path, code, timeout=120)
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.splitlines() == ["read [0.0, 1.0, 2.0, 3.0, 4.0]", "refused True False"], explain(proc)
