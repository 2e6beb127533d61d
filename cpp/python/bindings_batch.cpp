// The numpy drop-ins of the extension module `_core` (copy_many: bindings_copy_many.cpp):
//   copyto(dst, src, casting='same_kind', where=True)      np.copyto's contract
//   stack(arrays, axis=0, out=None, *, dtype=None, casting='same_kind')
//   concatenate(arrays, axis=0, out=None, *, dtype=None, casting='same_kind')
//
// No policy here: the argument checks decide whether a call is one this file serves (the
// "fast path"); the bytes then go to copy_bytes() or the batch engine (core/batch.h). Every
// call the fast path does not serve is forwarded, arguments untouched, to numpy's own function, captured when the module is initialised
// (numpy._core.multiarray.copyto etc., not the attributes of the numpy module), so numpy
// gives its results and its exceptions, and `np.copyto = fastcopy.copyto` cannot recurse.
//
// Arrays of other libraries (torch, JAX, pyarrow: foreign.h) in dst/src, the arrays or out=
// are read as numpy arrays over their memory and the call runs as it would with those;
// stack and concatenate then return the caller's own out= object.
//
// Buffer lifetimes: while the GIL is released, every array taking part is held by a
// reference of ours (numpy's ndarray.resize(refcheck=True) refuses to resize an array
// whose reference count says someone else holds it) and every other buffer by a Py_buffer
// export (bytearray and friends refuse to resize while exported).
#include <pybind11/pybind11.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "core/batch.h"
#include "core/copy_errors.h"
#include "core/dispatch.h"
#include "core/layout.h"
#include "core/read_only_ranges.h"
#include "pool/pool.h"
#include "python/copy_gil.h"
#include "python/foreign.h"
#include "python/gil.h"

namespace py = pybind11;

namespace fastcopy {
void bind_batch(py::module_& m);
void bind_copy_many(py::module_& m);

namespace {

PyObject* g_np_copyto = nullptr;
PyObject* g_np_stack = nullptr;
PyObject* g_np_concatenate = nullptr;
PyObject* g_copy = nullptr;  // fastcopy._core.copy: strided pairs go through it
PyObject* g_casting[5] = {};  // 'no', 'equiv', 'safe', 'same_kind', 'unsafe'
PyObject* g_name_casting = nullptr;
PyObject* g_name_where = nullptr;
PyObject* g_name_axis = nullptr;
PyObject* g_name_out = nullptr;
PyObject* g_name_dtype = nullptr;
// The builtin descriptors of the numeric types (native byte order, no metadata). stack and
// concatenate allocate their result with the inputs' descriptor only when it is one of
// these: numpy canonicalises others (`>f8` inputs give a `<f8` result).
PyArray_Descr* g_builtin[NPY_HALF + 1] = {};

// Calls served by the fast path and calls handed to numpy, per function (changed with the GIL
// held): lets the tests check which cases the fast path takes (_core._drop_in_stats()).
struct DropInStats {
    unsigned long long copyto_fast = 0, copyto_numpy = 0;
    unsigned long long stack_fast = 0, stack_numpy = 0;
    unsigned long long concatenate_fast = 0, concatenate_numpy = 0;
} g_stats;

// ---- small helpers ------------------------------------------------------------------------

bool is_exact_array(PyObject* o) { return Py_TYPE(o) == &PyArray_Type; }

// A casting argument numpy accepts; with identical dtypes every rule allows the copy.
bool valid_casting(PyObject* c) {
    for (PyObject* name : g_casting)
        if (c == name) return true;
    if (!PyUnicode_CheckExact(c)) return false;
    for (PyObject* name : g_casting)
        if (PyUnicode_Compare(c, name) == 0) return true;  // both exact str: cannot fail
    return false;
}

bool key_is(PyObject* key, PyObject* name) {
    if (key == name) return true;
    int r = PyUnicode_Compare(key, name);
    if (r == -1 && PyErr_Occurred()) PyErr_Clear();
    return r == 0;
}

bool builtin_descr(PyArray_Descr* d) {
    int t = d->type_num;
    return t >= 0 && t <= NPY_HALF && g_builtin[t] == d;
}


// ---- batches and overlap ------------------------------------------------------------------

using core::Batch;

core::OperandDesc array_desc(PyArrayObject* a) {
    core::OperandDesc d;
    d.ptr = static_cast<char*>(PyArray_DATA(a));
    d.itemsize = PyArray_ITEMSIZE(a);
    d.ndim = PyArray_NDIM(a);
    d.shape = PyArray_DIMS(a);
    d.strides = PyArray_STRIDES(a);
    d.nbytes = static_cast<std::size_t>(PyArray_SIZE(a)) * static_cast<std::size_t>(d.itemsize);
    return d;
}

bool arrays_overlap(PyArrayObject* a, PyArrayObject* b) {
    if (PyArray_SIZE(a) == 0 || PyArray_SIZE(b) == 0) return false;
    std::uintptr_t alo, ahi, blo, bhi;
    core::operand_extent(array_desc(a), alo, ahi);
    core::operand_extent(array_desc(b), blo, bhi);
    return alo < bhi && blo < ahi;
}


// ---- destinations in received views ----------------------------------------------------------

// True, with ValueError set, when `dst` is a numpy array over pages fastcopy.shm maps read-only
// (core/read_only_ranges.h): numpy would write them and crash, so the call is refused first.
bool refuse_read_only_shared(PyObject* dst, const char* fn, const char* which) {
    if (core::g_read_only_range_count.load(std::memory_order_relaxed) == 0 || !dst || !PyArray_Check(dst))
        return false;
    std::uintptr_t lo, hi;
    core::operand_extent(array_desc(reinterpret_cast<PyArrayObject*>(dst)), lo, hi);
    if (!core::dst_is_read_only_shared(lo, hi)) return false;
    const std::string msg = std::string("fastcopy.") + fn + ": " + which + " (" + qualified_type_name(dst) + ") " +
                            core::kReadOnlySharedText + "; nothing was copied";
    PyErr_SetString(PyExc_ValueError, msg.c_str());
    return true;
}

// out= of stack or concatenate: positional 2, or the keyword.
PyObject* join_out(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    if (nargs >= 3) return args[2];
    const Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nk; ++k)
        if (key_is(PyTuple_GET_ITEM(kwnames, k), g_name_out)) return args[nargs + k];
    return nullptr;
}

// ---- copyto ---------------------------------------------------------------------------------

// 1: copied; 0: not a fast-path case (nothing done); -1: exception set.
int copyto_fast(PyObject* dst, PyObject* src) {
    if (!is_exact_array(dst) || !is_exact_array(src)) return 0;
    PyArrayObject* d = reinterpret_cast<PyArrayObject*>(dst);
    PyArrayObject* s = reinterpret_cast<PyArrayObject*>(src);
    PyArray_Descr* dd = PyArray_DESCR(d);
    PyArray_Descr* sd = PyArray_DESCR(s);
    // The same dtype: the same descriptor object, or an equivalent one (non-native byte order,
    // strings and datetimes get a new descriptor per array). Every casting rule allows those.
    if (PyDataType_REFCHK(dd) || (dd != sd && !PyArray_EquivTypes(dd, sd))) return 0;
    // Structured dtypes: np.copyto copies field by field and leaves dst's padding bytes,
    // a byte copy would not; numpy serves them.
    if (PyDataType_HASFIELDS(dd)) return 0;
    if (!PyArray_ISWRITEABLE(d)) return 0;  // numpy raises its own ValueError
    const int nd = PyArray_NDIM(d);
    if (nd != PyArray_NDIM(s)) return 0;
    const npy_intp* ds = PyArray_DIMS(d);
    const npy_intp* ss = PyArray_DIMS(s);
    std::size_t n = static_cast<std::size_t>(PyArray_ITEMSIZE(d));
    for (int i = 0; i < nd; ++i) {
        if (ds[i] != ss[i]) return 0;
        n *= static_cast<std::size_t>(ds[i]);
    }
    if (PyArray_FLAGS(d) & PyArray_FLAGS(s) & NPY_ARRAY_C_CONTIGUOUS) {
        void* dp = PyArray_DATA(d);
        const void* sp = PyArray_DATA(s);
        if (n < kCopyReleaseGilBytes) {
            copy_bytes(dp, sp, n);
            return 1;
        }
        // Larger copies go through copy() (below), for its GIL rules: released, Ctrl-C between
        // steps of a huge copy, references held, the interpreter's exit survived (copy_gil.h).
    } else if (arrays_overlap(d, s)) {
        // Overlapping strided views: np.copyto's result depends on its loop order (numpy 2.4
        // only reverses the loop for some 1-d cases instead of buffering), which copy() does
        // not imitate; numpy serves them. Other strided pairs: copy() gives np.copyto's bytes.
        return 0;
    }
    PyObject* args[2] = {dst, src};
    PyObject* r = PyObject_Vectorcall(g_copy, args, 2, nullptr);
    if (!r) return -1;
    Py_DECREF(r);
    return 1;
}

PyObject* py_copyto(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    if (nargs >= 1 && refuse_read_only_shared(args[0], "copyto", "dst")) return nullptr;
    // The fast path takes (dst, src[, casting[, where]]) with casting/where also as keywords,
    // a valid casting name and where=True; anything else is numpy's to judge.
    if (nargs >= 2 && nargs <= 4) {
        PyObject* casting = nargs >= 3 ? args[2] : nullptr;
        PyObject* where = nargs >= 4 ? args[3] : nullptr;
        bool fast = true;
        if (kwnames) {
            const Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
            for (Py_ssize_t k = 0; k < nk && fast; ++k) {
                PyObject* key = PyTuple_GET_ITEM(kwnames, k);
                PyObject* value = args[nargs + k];
                if (!casting && key_is(key, g_name_casting)) casting = value;
                else if (!where && key_is(key, g_name_where)) where = value;
                else fast = false;
            }
        }
        if (fast && (!casting || valid_casting(casting)) && (!where || where == Py_True)) {
            const int r = copyto_fast(args[0], args[1]);
            if (r > 0) {
                ++g_stats.copyto_fast;
                Py_RETURN_NONE;
            }
            if (r < 0) return nullptr;
            // Two small contiguous torch tensors of one dtype and shape, with the GIL held.
            void* dp;
            const void* sp;
            std::size_t n;
            if (torch_contiguous_pair(args[0], args[1], dp, sp, n) == 1 && n < kCopyReleaseGilBytes &&
                !core::dst_is_read_only_shared(dp, n)) {
                copy_bytes(dp, sp, n, Region::Private);
                ++g_stats.copyto_fast;
                Py_RETURN_NONE;
            }
        }
    }
    if (nargs >= 2 && (!PyArray_Check(args[0]) || !PyArray_Check(args[1])))
        if (PyObject* r = call_on_numpy_views(py_copyto, "copyto", false, args, nargs, kwnames); r || PyErr_Occurred())
            return r;
    ++g_stats.copyto_numpy;
    return PyObject_Vectorcall(g_np_copyto, args, static_cast<size_t>(nargs), kwnames);
}

// ---- stack and concatenate ------------------------------------------------------------------

// (arrays, axis=0, out=None, *, dtype=None, casting='same_kind') when the call is one the fast
// path may serve: positional arrays, int axis, out None or an exact ndarray, dtype None.
struct JoinArgs {
    PyObject* arrays = nullptr;
    PyObject* axis = nullptr;  // nullptr = default 0
    PyObject* out = nullptr;   // nullptr or Py_None = allocate
};

bool parse_join(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, JoinArgs& a) {
    if (nargs < 1 || nargs > 3) return false;
    a.arrays = args[0];
    if (nargs >= 2) a.axis = args[1];
    if (nargs >= 3) a.out = args[2];
    if (kwnames) {
        const Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        bool have_dtype = false, have_casting = false;
        for (Py_ssize_t k = 0; k < nk; ++k) {
            PyObject* key = PyTuple_GET_ITEM(kwnames, k);
            PyObject* value = args[nargs + k];
            if (!a.axis && key_is(key, g_name_axis)) a.axis = value;
            else if (!a.out && key_is(key, g_name_out)) a.out = value;
            else if (!have_dtype && key_is(key, g_name_dtype)) {
                have_dtype = true;
                if (value != Py_None) return false;
            } else if (!have_casting && key_is(key, g_name_casting)) {
                have_casting = true;
                if (!valid_casting(value)) return false;
            } else {
                return false;
            }
        }
    }
    if (!PyList_CheckExact(a.arrays) && !PyTuple_CheckExact(a.arrays)) return false;
    if (a.out == Py_None) a.out = nullptr;
    if (a.out && !is_exact_array(a.out)) return false;
    if (a.axis && a.axis != Py_None && !PyLong_CheckExact(a.axis)) return false;
    return true;
}

// The inputs, checked for the fast path: exact, C-contiguous ndarrays of one builtin
// descriptor, each held by `held` from here on (allocating the result may run a garbage
// collection, and with it Python code that could change the list). Returns false when
// numpy must serve the call.
bool gather_inputs(PyObject* seq, std::vector<PyArrayObject*>& arrays, PyArray_Descr*& descr, Held& held) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject** items = PySequence_Fast_ITEMS(seq);
    if (n < 1) return false;
    arrays.resize(static_cast<std::size_t>(n));
    held.refs.reserve(static_cast<std::size_t>(n) + 1);
    descr = nullptr;
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* o = items[i];
        if (!is_exact_array(o)) return false;
        PyArrayObject* a = reinterpret_cast<PyArrayObject*>(o);
        if (!(PyArray_FLAGS(a) & NPY_ARRAY_C_CONTIGUOUS)) return false;
        if (i == 0) {
            descr = PyArray_DESCR(a);
            if (!builtin_descr(descr)) return false;
        } else if (PyArray_DESCR(a) != descr) {
            return false;
        }
        arrays[static_cast<std::size_t>(i)] = a;
    }
    for (PyArrayObject* a : arrays) held.hold(reinterpret_cast<PyObject*>(a));
    return true;
}

// `out` must be an exact, C-contiguous, writeable ndarray of `descr` and `shape`, sharing no
// byte with an input (numpy then copies input by input; we copy all at once).
bool usable_out(PyArrayObject* out, PyArray_Descr* descr, int nd, const npy_intp* shape,
                const std::vector<PyArrayObject*>& arrays) {
    if (PyArray_DESCR(out) != descr || PyArray_NDIM(out) != nd) return false;
    if (!(PyArray_FLAGS(out) & NPY_ARRAY_C_CONTIGUOUS) || !PyArray_ISWRITEABLE(out)) return false;
    for (int i = 0; i < nd; ++i)
        if (PyArray_DIM(out, i) != shape[i]) return false;
    for (PyArrayObject* a : arrays)
        if (arrays_overlap(out, a)) return false;
    return true;
}

// Allocates the result (or takes `out`), fills the batch from `fill` and runs it.
// Returns a new reference, or nullptr with an exception set.
template <class Fill>
PyObject* join_into(JoinArgs& a, Held& held, PyArray_Descr* descr, int nd, npy_intp* shape, Fill&& fill) {
    PyArrayObject* result;
    if (a.out) {
        result = reinterpret_cast<PyArrayObject*>(a.out);
        Py_INCREF(a.out);
    } else {
        Py_INCREF(descr);  // PyArray_NewFromDescr steals it
        result = reinterpret_cast<PyArrayObject*>(
            PyArray_NewFromDescr(&PyArray_Type, descr, nd, shape, nullptr, nullptr, 0, nullptr));
        if (!result) return nullptr;
    }
    Batch batch;
    try {
        batch.blocks.reserve(held.refs.size());
        fill(static_cast<char*>(PyArray_DATA(result)), batch);
        held.hold(reinterpret_cast<PyObject*>(result));
    } catch (const std::bad_alloc&) {
        Py_DECREF(result);
        return PyErr_NoMemory();
    }
    if (!run_batch_gil(batch)) {  // a signal handler raised between steps
        Py_DECREF(result);
        return nullptr;
    }
    return reinterpret_cast<PyObject*>(result);
}

std::size_t nbytes_of(PyArrayObject* a) {
    return static_cast<std::size_t>(PyArray_SIZE(a)) * static_cast<std::size_t>(PyArray_ITEMSIZE(a));
}

// nullptr with no exception: not a fast-path call.
PyObject* stack_fast(JoinArgs& a) {
    long axis = 0;
    if (a.axis) {
        if (a.axis == Py_None) return nullptr;  // numpy's error
        int overflow = 0;
        axis = PyLong_AsLongAndOverflow(a.axis, &overflow);
        if (overflow || (axis == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return nullptr;
        }
    }
    std::vector<PyArrayObject*> arrays;
    PyArray_Descr* descr;
    Held held;
    if (!gather_inputs(a.arrays, arrays, descr, held)) return nullptr;
    PyArrayObject* first = arrays[0];
    const int nd = PyArray_NDIM(first);
    if (nd + 1 > NPY_MAXDIMS) return nullptr;
    if (axis < 0) axis += nd + 1;
    if (axis < 0 || axis > nd) return nullptr;
    for (PyArrayObject* arr : arrays) {
        if (PyArray_NDIM(arr) != nd) return nullptr;
        for (int i = 0; i < nd; ++i)
            if (PyArray_DIM(arr, i) != PyArray_DIM(first, i)) return nullptr;
    }
    const std::size_t count = arrays.size();
    npy_intp shape[NPY_MAXDIMS];
    std::size_t outer = 1, inner = static_cast<std::size_t>(PyArray_ITEMSIZE(first));
    for (int i = 0, j = 0; i <= nd; ++i) {
        if (i == axis) {
            shape[i] = static_cast<npy_intp>(count);
            continue;
        }
        shape[i] = PyArray_DIM(first, j);
        if (i < axis) outer *= static_cast<std::size_t>(shape[i]);
        else inner *= static_cast<std::size_t>(shape[i]);
        ++j;
    }
    if (a.out && !usable_out(reinterpret_cast<PyArrayObject*>(a.out), descr, nd + 1, shape, arrays))
        return nullptr;
    return join_into(a, held, descr, nd + 1, shape, [&](char* base, Batch& batch) {
        if (inner == 0 || outer == 0) return;
        for (std::size_t i = 0; i < count; ++i) {
            batch.blocks.push_back({base + i * inner, static_cast<const char*>(PyArray_DATA(arrays[i])), inner,
                                    outer, static_cast<std::ptrdiff_t>(count * inner),
                                    static_cast<std::ptrdiff_t>(inner)});
            batch.total += inner * outer;
        }
    });
}

PyObject* concatenate_fast(JoinArgs& a) {
    std::vector<PyArrayObject*> arrays;
    PyArray_Descr* descr;
    Held held;
    if (!gather_inputs(a.arrays, arrays, descr, held)) return nullptr;
    npy_intp shape[NPY_MAXDIMS];
    if (a.axis == Py_None) {  // flattened, in C order
        npy_intp total = 0;
        for (PyArrayObject* arr : arrays) total += PyArray_SIZE(arr);
        shape[0] = total;
        if (a.out && !usable_out(reinterpret_cast<PyArrayObject*>(a.out), descr, 1, shape, arrays))
            return nullptr;
        return join_into(a, held, descr, 1, shape, [&](char* base, Batch& batch) {
            std::size_t off = 0;
            for (PyArrayObject* arr : arrays) {
                const std::size_t n = nbytes_of(arr);
                if (n == 0) continue;
                batch.blocks.push_back({base + off, static_cast<const char*>(PyArray_DATA(arr)), n, 1, 0, 0});
                off += n;
                batch.total += n;
            }
        });
    }
    long axis = 0;
    if (a.axis) {
        int overflow = 0;
        axis = PyLong_AsLongAndOverflow(a.axis, &overflow);
        if (overflow || (axis == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return nullptr;
        }
    }
    PyArrayObject* first = arrays[0];
    const int nd = PyArray_NDIM(first);
    if (nd == 0) return nullptr;  // numpy: zero-dimensional arrays cannot be concatenated
    if (axis < 0) axis += nd;
    if (axis < 0 || axis >= nd) return nullptr;
    npy_intp along = 0;
    for (PyArrayObject* arr : arrays) {
        if (PyArray_NDIM(arr) != nd) return nullptr;
        for (int i = 0; i < nd; ++i)
            if (i != axis && PyArray_DIM(arr, i) != PyArray_DIM(first, i)) return nullptr;
        along += PyArray_DIM(arr, static_cast<int>(axis));
    }
    std::size_t outer = 1, inner_rest = static_cast<std::size_t>(PyArray_ITEMSIZE(first));
    for (int i = 0; i < nd; ++i) {
        shape[i] = i == axis ? along : PyArray_DIM(first, i);
        if (i < axis) outer *= static_cast<std::size_t>(shape[i]);
        else if (i > axis) inner_rest *= static_cast<std::size_t>(shape[i]);
    }
    if (a.out && !usable_out(reinterpret_cast<PyArrayObject*>(a.out), descr, nd, shape, arrays)) return nullptr;
    const std::size_t row = static_cast<std::size_t>(along) * inner_rest;  // bytes of one output row
    return join_into(a, held, descr, nd, shape, [&](char* base, Batch& batch) {
        if (outer == 0 || row == 0) return;
        std::size_t off = 0;
        for (PyArrayObject* arr : arrays) {
            const std::size_t run = static_cast<std::size_t>(PyArray_DIM(arr, static_cast<int>(axis))) * inner_rest;
            if (run == 0) continue;
            batch.blocks.push_back({base + off, static_cast<const char*>(PyArray_DATA(arr)), run, outer,
                                    static_cast<std::ptrdiff_t>(row), static_cast<std::ptrdiff_t>(run)});
            off += run;
            batch.total += run * outer;
        }
    });
}

PyObject* py_stack(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    if (refuse_read_only_shared(join_out(args, nargs, kwnames), "stack", "out")) return nullptr;
    JoinArgs a;
    if (parse_join(args, nargs, kwnames, a)) {
        PyObject* r = stack_fast(a);
        if (r) ++g_stats.stack_fast;
        if (r || PyErr_Occurred()) return r;
    }
    if (PyObject* r = call_on_numpy_views(py_stack, "stack", true, args, nargs, kwnames); r || PyErr_Occurred()) return r;
    ++g_stats.stack_numpy;
    return PyObject_Vectorcall(g_np_stack, args, static_cast<size_t>(nargs), kwnames);
}

PyObject* py_concatenate(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    if (refuse_read_only_shared(join_out(args, nargs, kwnames), "concatenate", "out")) return nullptr;
    JoinArgs a;
    if (parse_join(args, nargs, kwnames, a)) {
        PyObject* r = concatenate_fast(a);
        if (r) ++g_stats.concatenate_fast;
        if (r || PyErr_Occurred()) return r;
    }
    if (PyObject* r = call_on_numpy_views(py_concatenate, "concatenate", true, args, nargs, kwnames); r || PyErr_Occurred())
        return r;
    ++g_stats.concatenate_numpy;
    return PyObject_Vectorcall(g_np_concatenate, args, static_cast<size_t>(nargs), kwnames);
}

// ---- registration ---------------------------------------------------------------------------

PyMethodDef g_copyto_def = {
    "copyto", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_copyto)), METH_FASTCALL | METH_KEYWORDS,
    "copyto(dst, src, casting='same_kind', where=True)\n--\n\n"
    "Drop-in for np.copyto: numpy's signature, results and exceptions.\n\n"
    "Two exact numpy arrays of equal shape and dtype, with where=True and any valid casting,\n"
    "are copied by fastcopy (its kernels; the GIL is released from 64 KiB). Every other call\n"
    "(broadcasting, casting, masks, scalars, lists, subclasses, object dtypes) goes to numpy's\n"
    "own copyto, captured at import, so `np.copyto = fastcopy.copyto` is safe."};

PyMethodDef g_stack_def = {
    "stack", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_stack)), METH_FASTCALL | METH_KEYWORDS,
    "stack(arrays, axis=0, out=None, *, dtype=None, casting='same_kind')\n--\n\n"
    "Drop-in for np.stack: numpy's results and exceptions.\n\n"
    "A list or tuple of exact, C-contiguous numpy arrays of one shape and one native numeric\n"
    "dtype, with dtype=None and out None or a C-contiguous array of the result's shape and\n"
    "dtype that shares no memory with the inputs, is copied block by block with one GIL\n"
    "release, over the thread pool when large. numpy's np.stack serves every other call."};

PyMethodDef g_concatenate_def = {
    "concatenate", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_concatenate)),
    METH_FASTCALL | METH_KEYWORDS,
    "concatenate(arrays, axis=0, out=None, *, dtype=None, casting='same_kind')\n--\n\n"
    "Drop-in for np.concatenate: numpy's results and exceptions.\n\n"
    "Same fast path as stack() (axis=None flattens); numpy's np.concatenate serves every other call."};

PyObject* attr_path(const char* module, const char* name) {
    PyObject* m = PyImport_ImportModule(module);
    if (!m) {
        PyErr_Clear();
        return nullptr;
    }
    PyObject* f = PyObject_GetAttrString(m, name);
    Py_DECREF(m);
    if (!f) PyErr_Clear();
    return f;
}

// numpy's own function: from its defining module first (assigning np.copyto = ... leaves
// that alone), the numpy namespace as the last resort.
PyObject* numpy_function(const char* const* modules, const char* name) {
    for (const char* const* m = modules; *m; ++m)
        if (PyObject* f = attr_path(*m, name)) return f;
    PyObject* f = attr_path("numpy", name);
    if (!f) PyErr_Format(PyExc_ImportError, "fastcopy: numpy.%s not found", name);
    return f;
}

}  // namespace

bool run_batch_gil(core::Batch& batch) {
    if (batch.total < kCopyReleaseGilBytes) {
        core::run_batch(batch);
        return true;
    }
    if (batch.total > kSignalCheckBytes && on_main_thread()) {
        SignalCheck check{PyEval_SaveThread()};
        const core::StepCheck step{kSignalCheckBytes, check_signals_between_steps, &check};
        core::run_batch(batch, &step);
        if (check.interrupted) return false;  // the GIL is held, the exception set
        restore_thread_or_park(check.ts);
        return true;
    }
    PyThreadState* ts = PyEval_SaveThread();
    core::run_batch(batch);
    restore_thread_or_park(ts);
    return true;
}

void bind_batch(py::module_& m) {
    if (_import_array() < 0) throw py::error_already_set();
    static const char* const multiarray[] = {"numpy._core.multiarray", "numpy.core.multiarray", nullptr};
    static const char* const shape_base[] = {"numpy._core.shape_base", "numpy.core.shape_base", nullptr};
    g_np_copyto = numpy_function(multiarray, "copyto");
    g_np_concatenate = g_np_copyto ? numpy_function(multiarray, "concatenate") : nullptr;
    g_np_stack = g_np_concatenate ? numpy_function(shape_base, "stack") : nullptr;
    if (!g_np_stack) throw py::error_already_set();
    g_copy = m.attr("copy").ptr();
    Py_INCREF(g_copy);
    const char* castings[5] = {"no", "equiv", "safe", "same_kind", "unsafe"};
    for (int i = 0; i < 5; ++i) g_casting[i] = PyUnicode_InternFromString(castings[i]);
    g_name_casting = PyUnicode_InternFromString("casting");
    g_name_where = PyUnicode_InternFromString("where");
    g_name_axis = PyUnicode_InternFromString("axis");
    g_name_out = PyUnicode_InternFromString("out");
    g_name_dtype = PyUnicode_InternFromString("dtype");
    for (int t = 0; t <= NPY_HALF; ++t) {
        if (t > NPY_CLONGDOUBLE && t != NPY_HALF) continue;
        g_builtin[t] = PyArray_DescrFromType(t);  // kept: the builtin singletons
        if (!g_builtin[t]) throw py::error_already_set();
    }
    m.def(
        "_drop_in_stats",
        [] {
            py::dict d;
            d["copyto_fast"] = g_stats.copyto_fast;
            d["copyto_numpy"] = g_stats.copyto_numpy;
            d["stack_fast"] = g_stats.stack_fast;
            d["stack_numpy"] = g_stats.stack_numpy;
            d["concatenate_fast"] = g_stats.concatenate_fast;
            d["concatenate_numpy"] = g_stats.concatenate_numpy;
            return d;
        },
        "Calls of copyto/stack/concatenate served by the fast path and handed to numpy (for tests).");
    py::object modname = m.attr("__name__");
    for (PyMethodDef* def : {&g_copyto_def, &g_stack_def, &g_concatenate_def}) {
        PyObject* f = PyCFunction_NewEx(def, nullptr, modname.ptr());
        if (!f) throw py::error_already_set();
        m.add_object(def->ml_name, py::reinterpret_steal<py::object>(f));
    }
    bind_copy_many(m);  // bindings_copy_many.cpp
}

}  // namespace fastcopy
