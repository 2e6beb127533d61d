// The copy API of the extension module `_core`: fastcopy.copy(dst, src), copy_region() for
// the shared-memory channel, and kernel_callable() for fastcopy.kernel(name).
//
// No policy here: this file resolves the two Python objects into memory layouts, checks the
// arguments, decomposes the layouts into contiguous runs and hands each run to
// copy_bytes()/copy_bytes_with() (dispatch picks the kernel).
//
// The three entry points are raw CPython METH_FASTCALL functions, not pybind11 functions:
// pybind11's argument machinery costs several hundred ns per call, more than np.copyto
// for small arrays. Exact numpy.ndarray arguments are read through the numpy C-API struct
// layout (no buffer export); every other object goes through PyObject_GetBuffer with
// PyBUF_RECORDS(_RO) and the Py_buffer is held until the copy ends.
#include <pybind11/pybind11.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "python/copy_gil.h"
#include "core/dispatch.h"
#include "python/gil.h"
#include "pool/pool.h"

namespace py = pybind11;

namespace fastcopy {

// Set by bindings_shm.cpp when fastcopy.shm is imported: the store mode of an outstanding loan
// (copy_general below), nullptr for anything else.
policy::SharedWriteMode* (*g_loan_write_mode)(PyObject* dst) = nullptr;
void bind_info(py::module_& m);
void bind_shm(py::module_& m);
void bind_batch(py::module_& m);  // bindings_batch.cpp
void bind_reference(py::module_& m);  // bindings_reference.cpp

namespace {

// A contiguous copy larger than this, on the main thread, runs in steps of this many bytes and
// takes the GIL back between steps to run Python's signal handlers (PyErr_CheckSignals), so
// Ctrl-C interrupts one huge copy within a step (about 10-60 ms at 2-12 GB/s). Only the main
// thread runs signal handlers, so other threads never stop. Retaking the GIL costs ~0.1 us
// uncontended, nothing against a step; when another Python thread holds it, the wait is at most
// its switch interval (5 ms), which the step size keeps small against the step's copy.
constexpr std::size_t kSignalCheckBytes = std::size_t(128) << 20;

// Dimensions of a layout: numpy's maximum (64) plus the byte dimension we append.
constexpr int kMaxDims = 66;

PyTypeObject* g_ndarray_type = nullptr;

// A strided byte layout: C-order traversal of `shape` gives the logical byte sequence.
struct Layout {
    char* ptr = nullptr;
    int nd = 0;
    Py_ssize_t shape[kMaxDims];
    Py_ssize_t strides[kMaxDims];
};

// One resolved argument. For ndarrays the array itself keeps its memory (and any buffer
// it was made from) exported while we hold the argument; other objects are exported by
// `view`, released by the destructor.
struct Operand {
    const char* which = "";
    PyArrayObject* arr = nullptr;  // set for numpy arrays (and subclasses)
    bool has_view = false;
    Py_buffer view;
    char* ptr = nullptr;
    int ndim = 0;
    const Py_ssize_t* shape = nullptr;
    const Py_ssize_t* strides = nullptr;  // nullptr = C-contiguous
    Py_ssize_t itemsize = 1;
    std::size_t nbytes = 0;
    Py_ssize_t one_shape = 0, one_stride = 1;  // for 0-d raw buffers seen as bytes

    Operand() = default;
    Operand(const Operand&) = delete;
    Operand& operator=(const Operand&) = delete;
    ~Operand() {
        if (has_view) PyBuffer_Release(&view);
    }
};

const char* type_name(PyObject* o) { return Py_TYPE(o)->tp_name; }

bool dtype_has_objects(PyArray_Descr* d) { return PyDataType_REFCHK(d); }

std::string shape_str(int nd, const Py_ssize_t* shape) {
    std::string s = "(";
    for (int i = 0; i < nd; ++i) {
        if (i) s += ", ";
        s += std::to_string(static_cast<long long>(shape[i]));
    }
    if (nd == 1) s += ",";
    return s + ")";
}

std::string obj_str(PyObject* o) {
    PyObject* s = PyObject_Str(o);
    if (!s) {
        PyErr_Clear();
        return "?";
    }
    const char* c = PyUnicode_AsUTF8(s);
    std::string out = c ? c : "?";
    if (!c) PyErr_Clear();
    Py_DECREF(s);
    return out;
}

// True when a struct-module / PEP 3118 format contains 'O' (Python object) items. Field
// names (between colons, e.g. "T{<i:Other:}") are skipped.
bool format_has_objects(const char* fmt) {
    if (!fmt) return false;
    bool in_name = false;
    for (const char* c = fmt; *c; ++c) {
        if (*c == ':') in_name = !in_name;
        else if (!in_name && *c == 'O') return true;
    }
    return false;
}

// Re-raises the pending exception with the same type and "fastcopy.<fn>: <which>: " in front.
void prefix_error(const char* fn, const char* which) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    std::string msg = value ? obj_str(value) : std::string("error");
    PyErr_Format(type ? type : PyExc_TypeError, "fastcopy.%s: %s: %s", fn, which, msg.c_str());
    if (value) {
        // Keep the original as __cause__ for debugging.
        PyObject *t2, *v2, *tb2;
        PyErr_Fetch(&t2, &v2, &tb2);
        PyErr_NormalizeException(&t2, &v2, &tb2);
        PyException_SetCause(v2, value);  // steals value
        PyErr_Restore(t2, v2, tb2);
        value = nullptr;
    }
    Py_XDECREF(type);
    Py_XDECREF(tb);
}

// Fills `op` from `obj`. Returns false with an exception set.
bool resolve(const char* fn, PyObject* obj, const char* which, bool writable, Operand& op) {
    op.which = which;
    if (PyArray_Check(obj)) {
        PyArrayObject* a = reinterpret_cast<PyArrayObject*>(obj);
        if (writable && !PyArray_ISWRITEABLE(a)) {
            PyErr_Format(PyExc_ValueError,
                         "fastcopy.%s: dst is a read-only array (flags.writeable is False); nothing was copied",
                         fn);
            return false;
        }
        if (dtype_has_objects(PyArray_DESCR(a))) {
            std::string d = obj_str(reinterpret_cast<PyObject*>(PyArray_DESCR(a)));
            PyErr_Format(PyExc_TypeError,
                         "fastcopy.%s: %s has dtype %s, which holds Python object references and cannot be "
                         "copied as bytes; use np.copyto(dst, src)",
                         fn, which, d.c_str());
            return false;
        }
        op.arr = a;
        op.ptr = static_cast<char*>(PyArray_DATA(a));
        op.ndim = PyArray_NDIM(a);
        op.shape = PyArray_DIMS(a);
        op.strides = PyArray_STRIDES(a);
        op.itemsize = PyArray_ITEMSIZE(a);
        std::size_t n = static_cast<std::size_t>(op.itemsize);
        for (int i = 0; i < op.ndim; ++i) n *= static_cast<std::size_t>(op.shape[i]);
        op.nbytes = n;
        return true;
    }
    if (obj == Py_None || PyUnicode_Check(obj) || !PyObject_CheckBuffer(obj)) {
        PyErr_Format(PyExc_TypeError,
                     "fastcopy.%s: %s must be an object exporting the buffer protocol (numpy array, "
                     "bytearray, memoryview, array.array, mmap, SharedMemory.buf%s), got %s",
                     fn, which, writable ? "" : ", bytes", type_name(obj));
        return false;
    }
    if (PyObject_GetBuffer(obj, &op.view, writable ? PyBUF_RECORDS : PyBUF_RECORDS_RO) != 0) {
        if (writable) {
            // Distinguish "read-only" from "not usable at all".
            PyObject *t, *v, *tb;
            PyErr_Fetch(&t, &v, &tb);
            Py_buffer probe;
            if (PyObject_GetBuffer(obj, &probe, PyBUF_RECORDS_RO) == 0) {
                PyBuffer_Release(&probe);
                Py_XDECREF(t);
                Py_XDECREF(v);
                Py_XDECREF(tb);
                PyErr_Format(PyExc_ValueError, "fastcopy.%s: dst (%s) is read-only; nothing was copied", fn,
                             type_name(obj));
                return false;
            }
            PyErr_Clear();
            PyErr_Restore(t, v, tb);
        }
        prefix_error(fn, which);
        return false;
    }
    op.has_view = true;
    if (format_has_objects(op.view.format)) {
        PyErr_Format(PyExc_TypeError,
                     "fastcopy.%s: %s holds Python object references (buffer format '%s') and cannot be "
                     "copied as bytes",
                     fn, which, op.view.format);
        return false;
    }
    if (op.view.ndim > 64) {
        PyErr_Format(PyExc_ValueError, "fastcopy.%s: %s has %d dimensions; at most 64 are supported", fn, which,
                     op.view.ndim);
        return false;
    }
    op.ptr = static_cast<char*>(op.view.buf);
    op.itemsize = op.view.itemsize > 0 ? op.view.itemsize : 1;
    op.nbytes = static_cast<std::size_t>(op.view.len);
    if (op.view.ndim == 0 || op.view.shape == nullptr) {
        // One item, or an unshaped contiguous buffer: a single run of len bytes.
        op.ndim = 1;
        op.one_shape = op.view.len / op.itemsize;
        op.one_stride = op.itemsize;
        op.shape = &op.one_shape;
        op.strides = &op.one_stride;
    } else {
        op.ndim = op.view.ndim;
        op.shape = op.view.shape;
        op.strides = op.view.strides;  // may be nullptr: C-contiguous
    }
    return true;
}

// Fills `l` with the element layout of `op` (no byte dimension yet).
void element_layout(const Operand& op, Layout& l) {
    l.ptr = op.ptr;
    l.nd = op.ndim;
    Py_ssize_t stride = op.itemsize;
    for (int i = op.ndim - 1; i >= 0; --i) {
        l.shape[i] = op.shape[i];
        l.strides[i] = op.strides ? op.strides[i] : stride;
        stride *= op.shape[i];
    }
}

// For two layouts of the same shape: drops size-1 dimensions, flips dimensions where dst
// runs backwards, orders dimensions by dst stride (largest outermost) and merges adjacent
// dimensions that are contiguous in both. Every step applies the same change to both
// layouts, so element i of dst still pairs with element i of src (np.copyto's pairing).
void normalize_joint(Layout& d, Layout& s) {
    int nd = 0;
    for (int i = 0; i < d.nd; ++i) {
        if (d.shape[i] == 1) continue;
        d.shape[nd] = d.shape[i];
        s.shape[nd] = s.shape[i];
        d.strides[nd] = d.strides[i];
        s.strides[nd] = s.strides[i];
        ++nd;
    }
    d.nd = s.nd = nd;
    for (int i = 0; i < nd; ++i) {
        if (d.strides[i] < 0 || (d.strides[i] == 0 && s.strides[i] < 0)) {
            d.ptr += (d.shape[i] - 1) * d.strides[i];
            s.ptr += (s.shape[i] - 1) * s.strides[i];
            d.strides[i] = -d.strides[i];
            s.strides[i] = -s.strides[i];
        }
    }
    // Stable insertion sort: descending dst stride, ties by descending |src stride|.
    for (int i = 1; i < nd; ++i) {
        Py_ssize_t ds = d.strides[i], ss = s.strides[i], sh = d.shape[i];
        int j = i - 1;
        auto before = [&](int k) {
            if (d.strides[k] != ds) return d.strides[k] < ds;
            Py_ssize_t a = s.strides[k] < 0 ? -s.strides[k] : s.strides[k];
            Py_ssize_t b = ss < 0 ? -ss : ss;
            return a < b;
        };
        while (j >= 0 && before(j)) {
            d.strides[j + 1] = d.strides[j];
            s.strides[j + 1] = s.strides[j];
            d.shape[j + 1] = d.shape[j];
            s.shape[j + 1] = s.shape[j];
            --j;
        }
        d.strides[j + 1] = ds;
        s.strides[j + 1] = ss;
        d.shape[j + 1] = sh;
        s.shape[j + 1] = sh;
    }
    // Merge (i, i+1) when both layouts step through dim i exactly as a continuation of i+1.
    int out = 0;
    for (int i = 1; i < nd; ++i) {
        if (d.strides[out] == d.shape[i] * d.strides[i] && s.strides[out] == s.shape[i] * s.strides[i]) {
            d.shape[out] *= d.shape[i];
            s.shape[out] = d.shape[out];
            d.strides[out] = d.strides[i];
            s.strides[out] = s.strides[i];
        } else {
            ++out;
            d.shape[out] = d.shape[i];
            s.shape[out] = s.shape[i];
            d.strides[out] = d.strides[i];
            s.strides[out] = s.strides[i];
        }
    }
    d.nd = s.nd = nd ? out + 1 : 0;
}

// Appends the byte dimension (itemsize bytes, stride 1) and merges dimensions that are
// contiguous continuations of the next one. The C-order byte sequence is unchanged; the
// innermost dimension is then always a contiguous run of shape[nd-1] bytes.
void to_byte_runs(Layout& l, Py_ssize_t itemsize) {
    Layout t;
    t.ptr = l.ptr;
    int nd = 0;
    for (int i = 0; i < l.nd; ++i) {
        if (l.shape[i] == 1) continue;
        t.shape[nd] = l.shape[i];
        t.strides[nd] = l.strides[i];
        ++nd;
    }
    t.shape[nd] = itemsize;
    t.strides[nd] = 1;
    ++nd;
    // Merge from the inside out.
    int out = nd - 1;
    l.ptr = t.ptr;
    Py_ssize_t shape[kMaxDims], strides[kMaxDims];
    shape[out] = t.shape[nd - 1];
    strides[out] = t.strides[nd - 1];
    for (int i = nd - 2; i >= 0; --i) {
        if (t.strides[i] == shape[out] * strides[out]) {
            shape[out] *= t.shape[i];
        } else {
            --out;
            shape[out] = t.shape[i];
            strides[out] = t.strides[i];
        }
    }
    l.nd = nd - out;
    for (int i = 0; i < l.nd; ++i) {
        l.shape[i] = shape[out + i];
        l.strides[i] = strides[out + i];
    }
}

// Lowest and one-past-highest byte a layout touches (nonempty layouts only).
void extent(const Layout& l, std::uintptr_t& lo, std::uintptr_t& hi) {
    std::intptr_t a = 0, b = 0;
    for (int i = 0; i < l.nd; ++i) {
        std::intptr_t span = static_cast<std::intptr_t>(l.shape[i] - 1) * l.strides[i];
        if (span < 0) a += span;
        else b += span;
    }
    lo = reinterpret_cast<std::uintptr_t>(l.ptr) + a;
    hi = reinterpret_cast<std::uintptr_t>(l.ptr) + b + 1;
}

// Walks the contiguous runs (innermost dimension, stride 1) of a byte layout in C order.
struct RunIter {
    const Layout* l;
    Py_ssize_t idx[kMaxDims];
    char* run;             // start of the current run
    Py_ssize_t run_len;    // bytes in a run
    Py_ssize_t left;       // bytes left in the current run

    explicit RunIter(const Layout& layout) : l(&layout) {
        std::fill(idx, idx + l->nd, 0);
        run = l->ptr;
        run_len = l->shape[l->nd - 1];
        left = run_len;
    }
    char* pos() const { return run + (run_len - left); }
    // Moves to the next run (call when left == 0 and more bytes remain).
    void next() {
        for (int i = l->nd - 2; i >= 0; --i) {
            run += l->strides[i];
            if (++idx[i] < l->shape[i]) break;
            run -= l->strides[i] * l->shape[i];
            idx[i] = 0;
        }
        left = run_len;
    }
};

// True when [d, d+n) and [s, s+n) share a byte.
inline bool runs_overlap(const void* d, const void* s, std::size_t n) {
    std::uintptr_t a = reinterpret_cast<std::uintptr_t>(d), b = reinterpret_cast<std::uintptr_t>(s);
    return (a > b ? a - b : b - a) < n;
}

struct CopyCtx {
    CopyFn forced;
    Region region;
    unsigned forced_threads = 1;  // fastcopy.kernel(name, threads=N): N > 1 splits over the pool
    policy::SharedWriteMode* shared = nullptr;  // dst is a loan in shared memory: its ring's store mode
    void operator()(void* d, const void* s, std::size_t n) const {
        if (!forced && shared) copy_bytes_to_shared(d, s, n, shared);
        else if (!forced) copy_bytes(d, s, n, region);
        else if (forced_threads > 1 && !runs_overlap(d, s, n)) pool::parallel_copy_threads(d, s, n, forced, forced_threads);
        else copy_bytes_with(forced, d, s, n);
    }
};

// What a fastcopy.kernel(name, threads=N) callable holds (in its capsule).
struct ForcedKernel {
    CopyFn fn;
    unsigned threads;
};

// Copies the byte sequence of s into the byte sequence of d (equal lengths `total`).
void copy_runs(const Layout& d, const Layout& s, std::size_t total, const CopyCtx& cp) {
    RunIter di(d), si(s);
    std::size_t done = 0;
    if (di.run_len == si.run_len) {  // common case: runs pair up one to one
        std::size_t n = static_cast<std::size_t>(di.run_len);
        for (;;) {
            cp(di.run, si.run, n);
            done += n;
            if (done >= total) return;
            di.next();
            si.next();
        }
    }
    for (;;) {
        Py_ssize_t n = std::min(di.left, si.left);
        cp(di.pos(), si.pos(), static_cast<std::size_t>(n));
        done += static_cast<std::size_t>(n);
        if (done >= total) return;
        di.left -= n;
        si.left -= n;
        if (di.left == 0) di.next();
        if (si.left == 0) si.next();
    }
}

// For layouts already normalized together (normalize_joint): appends the byte dimension
// to both and merges it with the last element dimension when both are contiguous there.
// The two layouts keep identical shapes, so they can be walked together.
void append_byte_dim_joint(Layout& d, Layout& s, Py_ssize_t itemsize) {
    int nd = d.nd;
    if (nd > 0 && d.strides[nd - 1] == itemsize && s.strides[nd - 1] == itemsize) {
        d.shape[nd - 1] *= itemsize;
        s.shape[nd - 1] = d.shape[nd - 1];
        d.strides[nd - 1] = s.strides[nd - 1] = 1;
        return;
    }
    d.shape[nd] = s.shape[nd] = itemsize;
    d.strides[nd] = s.strides[nd] = 1;
    d.nd = s.nd = nd + 1;
}

// Gives a contiguous byte layout `c` the shape of byte layout `o` (C order, same bytes).
void reshape_contiguous_like(Layout& c, const Layout& o) {
    c.nd = o.nd;
    Py_ssize_t stride = 1;
    for (int i = o.nd - 1; i >= 0; --i) {
        c.shape[i] = o.shape[i];
        c.strides[i] = stride;
        stride *= o.shape[i];
    }
}

// Calls f(dp, sp) for every index of dimensions [0, nouter) of two same-shaped layouts.
template <class F>
void for_each_outer(const Layout& d, const Layout& s, int nouter, F&& f) {
    char* dp = d.ptr;
    char* sp = s.ptr;
    if (nouter <= 0) {
        f(dp, sp);
        return;
    }
    Py_ssize_t idx[kMaxDims];
    std::fill(idx, idx + nouter, 0);
    for (;;) {
        f(dp, sp);
        int i = nouter - 1;
        for (; i >= 0; --i) {
            dp += d.strides[i];
            sp += s.strides[i];
            if (++idx[i] < d.shape[i]) break;
            dp -= d.strides[i] * d.shape[i];
            sp -= s.strides[i] * s.shape[i];
            idx[i] = 0;
        }
        if (i < 0) return;
    }
}

template <std::size_t K>
void small_loop(char* dp, const char* sp, Py_ssize_t count, Py_ssize_t dstep, Py_ssize_t sstep) {
    for (Py_ssize_t i = 0; i < count; ++i, dp += dstep, sp += sstep) std::memcpy(dp, sp, K);
}

// Runs shorter than this are the elements of an element-wise strided copy (e.g. a[::2] of
// float64: 8-byte runs). They are moved inline with fixed-size moves, as numpy's strided
// loops do, instead of one copy_bytes() call each (~15 ns of call and dispatch per element,
// 20-45x slower than np.copyto). Every run of this length or more goes to copy_bytes().
// Copies through a forced kernel (fastcopy.kernel(name)) always call that kernel.
constexpr Py_ssize_t kInlineRunBytes = 64;

// Copies between two same-shaped byte layouts whose innermost dimension is a contiguous
// run (stride 1) in both. Precondition: no overlap unless both are one contiguous run.
void copy_joint(const Layout& d, const Layout& s, const CopyCtx& cp) {
    int nd = d.nd;
    Py_ssize_t run = d.shape[nd - 1];
    if (nd == 1) {
        cp(d.ptr, s.ptr, static_cast<std::size_t>(run));
        return;
    }
    if (run >= kInlineRunBytes || cp.forced) {
        for_each_outer(d, s, nd - 1, [&](char* dp, char* sp) { cp(dp, sp, static_cast<std::size_t>(run)); });
        return;
    }
    Py_ssize_t count = d.shape[nd - 2], dstep = d.strides[nd - 2], sstep = s.strides[nd - 2];
    for_each_outer(d, s, nd - 2, [&](char* dp, char* sp) {
        switch (run) {
            case 1: small_loop<1>(dp, sp, count, dstep, sstep); break;
            case 2: small_loop<2>(dp, sp, count, dstep, sstep); break;
            case 4: small_loop<4>(dp, sp, count, dstep, sstep); break;
            case 8: small_loop<8>(dp, sp, count, dstep, sstep); break;
            case 16: small_loop<16>(dp, sp, count, dstep, sstep); break;
            default:
                for (Py_ssize_t i = 0; i < count; ++i, dp += dstep, sp += sstep)
                    std::memcpy(dp, sp, static_cast<std::size_t>(run));
        }
    });
}

enum class CopyStatus { Ok, NoMemory, Failed, Interrupted };

// The part without Python: layouts are resolved, sizes checked. `joint`: d and s have
// identical shapes (copy_joint), else their byte sequences are paired run by run.
CopyStatus copy_layouts(Layout& d, Layout& s, std::size_t total, const CopyCtx& cp, bool joint) noexcept {
    try {
        if (d.nd == 1 && s.nd == 1) {  // one contiguous run each: memmove semantics cover any overlap
            cp(d.ptr, s.ptr, total);
            return CopyStatus::Ok;
        }
        std::uintptr_t dlo, dhi, slo, shi;
        extent(d, dlo, dhi);
        extent(s, slo, shi);
        if (dlo < shi && slo < dhi) {
            // The extents overlap and at least one side is strided: copy src out to a
            // temporary first, which gives np.copyto's result for any overlap.
            char* tmp = static_cast<char*>(std::malloc(total));
            if (!tmp) return CopyStatus::NoMemory;
            Layout t;
            t.ptr = tmp;
            if (joint) {
                reshape_contiguous_like(t, s);
                copy_joint(t, s, cp);
                copy_joint(d, t, cp);
            } else {
                t.nd = 1;
                t.shape[0] = static_cast<Py_ssize_t>(total);
                t.strides[0] = 1;
                copy_runs(t, s, total, cp);
                copy_runs(d, t, total, cp);
            }
            std::free(tmp);
            return CopyStatus::Ok;
        }
        if (joint) copy_joint(d, s, cp);
        else copy_runs(d, s, total, cp);
        return CopyStatus::Ok;
    } catch (...) {
        return CopyStatus::Failed;
    }
}

// copy_layouts() with the GIL released. Other threads run meanwhile, so both objects get a
// reference of their own for the whole copy: numpy's ndarray.resize() (refcheck) and
// similar checks then see the array in use and refuse, as they do for np.copyto, instead of
// freeing the memory being copied (a resize from another thread would make the copy write
// into freed memory). Buffer exports (non-ndarray operands) are held by their Operand.
// Small copies keep the GIL, so nothing can change under them and they pay nothing here.
// True on the thread that runs Python's signal handlers (threading.main_thread()). Asked on
// every call, as threading itself knows it after a fork from another thread. Needs the GIL.
bool on_main_thread() {
    PyObject* threading = PyImport_ImportModule("threading");
    PyObject* main = threading ? PyObject_CallMethod(threading, "main_thread", nullptr) : nullptr;
    PyObject* ident = main ? PyObject_GetAttrString(main, "ident") : nullptr;
    bool yes = ident && PyLong_Check(ident) && PyLong_AsUnsignedLong(ident) == PyThread_get_thread_ident();
    Py_XDECREF(ident);
    Py_XDECREF(main);
    Py_XDECREF(threading);
    if (PyErr_Occurred()) PyErr_Clear();  // no answer: copy in one piece, as before
    return yes;
}

// Between steps of a large copy: takes the GIL, runs the signal handlers, and releases the
// GIL again unless a handler raised (then the exception stays set and the GIL stays held).
struct SignalCheck {
    PyThreadState* ts;
    bool interrupted = false;
};

bool check_signals_between_steps(void* ctx) {
    auto* c = static_cast<SignalCheck*>(ctx);
    restore_thread_or_park(c->ts);
    if (PyErr_CheckSignals() != 0) {
        c->interrupted = true;
        return true;
    }
    c->ts = PyEval_SaveThread();
    return false;
}

// One contiguous copy in steps of kSignalCheckBytes with the signal handlers run in between
// (the GIL is released on entry and held on return). A handler that raised ends the copy:
// Interrupted, with the exception set and dst written up to a step boundary.
CopyStatus copy_in_steps(const Layout& d, const Layout& s, std::size_t total, const CopyCtx& cp) {
    SignalCheck check{PyEval_SaveThread()};
    CopyStatus st = CopyStatus::Ok;
    try {
        if (!cp.forced) {
            copy_bytes_in_steps(d.ptr, s.ptr, total, cp.region, kSignalCheckBytes, check_signals_between_steps,
                                &check);
        } else if (runs_overlap(d.ptr, s.ptr, total)) {
            cp(d.ptr, s.ptr, total);  // memmove semantics need the whole range at once
        } else {
            for (std::size_t done = 0; done < total;) {
                const std::size_t m = std::min(kSignalCheckBytes, total - done);
                cp(d.ptr + done, s.ptr + done, m);
                done += m;
                if (done < total && check_signals_between_steps(&check)) break;
            }
        }
    } catch (...) {
        st = CopyStatus::Failed;
    }
    if (check.interrupted) return CopyStatus::Interrupted;
    restore_thread_or_park(check.ts);  // parks at interpreter exit instead of unwinding (gil.h)
    return st;
}

CopyStatus copy_without_gil(PyObject* dst, PyObject* src, Layout& d, Layout& s, std::size_t total,
                            const CopyCtx& cp, bool joint) {
    Py_INCREF(dst);
    Py_INCREF(src);
    CopyStatus st;
    if (d.nd == 1 && s.nd == 1 && total > kSignalCheckBytes && !cp.shared && on_main_thread()) {
        st = copy_in_steps(d, s, total, cp);
    } else {
        PyThreadState* ts = PyEval_SaveThread();
        st = copy_layouts(d, s, total, cp, joint);
        restore_thread_or_park(ts);  // parks at interpreter exit instead of unwinding (gil.h)
    }
    Py_DECREF(src);
    Py_DECREF(dst);
    return st;
}

bool same_dtype(PyArrayObject* a, PyArrayObject* b) {
    PyArray_Descr* da = PyArray_DESCR(a);
    PyArray_Descr* db = PyArray_DESCR(b);
    return da == db || PyArray_EquivTypes(da, db);
}

// The general path. Returns nullptr with an exception set, or None.
PyObject* do_copy(const char* fn, PyObject* dst, PyObject* src, CopyFn forced, Region region,
                  unsigned forced_threads = 1, policy::SharedWriteMode* shared = nullptr) {
    Operand d, s;
    if (!resolve(fn, dst, "dst", true, d)) return nullptr;
    if (!resolve(fn, src, "src", false, s)) return nullptr;
    Layout dl, sl;
    element_layout(d, dl);
    element_layout(s, sl);
    bool same_shape = d.ndim == s.ndim && std::memcmp(d.shape, s.shape, sizeof(Py_ssize_t) * d.ndim) == 0;
    if (d.arr && s.arr) {
        if (!same_shape) {
            PyErr_Format(PyExc_ValueError,
                         "fastcopy.%s: shape mismatch: dst has shape %s but src has shape %s; fastcopy does not "
                         "broadcast, use np.copyto(dst, src) for that",
                         fn, shape_str(d.ndim, d.shape).c_str(), shape_str(s.ndim, s.shape).c_str());
            return nullptr;
        }
        if (!same_dtype(d.arr, s.arr)) {
            std::string dd = obj_str(reinterpret_cast<PyObject*>(PyArray_DESCR(d.arr)));
            std::string sd = obj_str(reinterpret_cast<PyObject*>(PyArray_DESCR(s.arr)));
            PyErr_Format(PyExc_TypeError,
                         "fastcopy.%s: dtype mismatch: dst has dtype %s but src has dtype %s; fastcopy does not "
                         "cast, use np.copyto(dst, src, casting=...) for that",
                         fn, dd.c_str(), sd.c_str());
            return nullptr;
        }
    } else if (d.nbytes != s.nbytes) {
        PyErr_Format(PyExc_ValueError,
                     "fastcopy.%s: size mismatch: dst (%s) has %zu bytes but src (%s) has %zu bytes; "
                     "byte counts must be equal",
                     fn, type_name(dst), d.nbytes, type_name(src), s.nbytes);
        return nullptr;
    }
    if (d.nbytes == 0) Py_RETURN_NONE;
    bool joint;
    if (same_shape && d.itemsize == s.itemsize) {
        // Element i of dst pairs with element i of src: normalize both together.
        normalize_joint(dl, sl);
        append_byte_dim_joint(dl, sl, d.itemsize);
        joint = true;
    } else {
        // Different shapes (raw buffers): pair the C-order byte sequences. When one side is
        // contiguous it takes the other's shape, so the two can still be walked together.
        to_byte_runs(dl, d.itemsize);
        to_byte_runs(sl, s.itemsize);
        joint = true;
        if (dl.nd == 1) reshape_contiguous_like(dl, sl);
        else if (sl.nd == 1) reshape_contiguous_like(sl, dl);
        else joint = false;
    }
    CopyCtx cp{forced, region, forced_threads, shared};
    CopyStatus st;
    if (d.nbytes >= kCopyReleaseGilBytes) {
        st = copy_without_gil(dst, src, dl, sl, d.nbytes, cp, joint);
    } else {
        st = copy_layouts(dl, sl, d.nbytes, cp, joint);
    }
    if (st == CopyStatus::NoMemory) return PyErr_NoMemory();
    if (st == CopyStatus::Interrupted) return nullptr;  // a signal handler's exception (KeyboardInterrupt)
    if (st == CopyStatus::Failed) {
        PyErr_Format(PyExc_RuntimeError, "fastcopy.%s: the copy failed inside the native core", fn);
        return nullptr;
    }
    Py_RETURN_NONE;
}

// Fast path: two exact, C-contiguous ndarrays with identical shapes and the same dtype
// object. Returns 1 when it copied, 0 to fall back to the general path (which also
// produces every error message).
inline int try_fast(PyObject* dst, PyObject* src, CopyFn forced, Region region, unsigned forced_threads = 1) {
    if (Py_TYPE(dst) != g_ndarray_type || Py_TYPE(src) != g_ndarray_type) return 0;
    PyArrayObject* d = reinterpret_cast<PyArrayObject*>(dst);
    PyArrayObject* s = reinterpret_cast<PyArrayObject*>(src);
    if (!(PyArray_FLAGS(d) & PyArray_FLAGS(s) & NPY_ARRAY_C_CONTIGUOUS)) return 0;
    if (!(PyArray_FLAGS(d) & NPY_ARRAY_WRITEABLE)) return 0;
    PyArray_Descr* dd = PyArray_DESCR(d);
    if (dd != PyArray_DESCR(s) || PyDataType_REFCHK(dd)) return 0;
    int nd = PyArray_NDIM(d);
    if (nd != PyArray_NDIM(s)) return 0;
    const npy_intp* ds = PyArray_DIMS(d);
    const npy_intp* ss = PyArray_DIMS(s);
    std::size_t n = static_cast<std::size_t>(PyArray_ITEMSIZE(d));
    for (int i = 0; i < nd; ++i) {
        if (ds[i] != ss[i]) return 0;
        n *= static_cast<std::size_t>(ds[i]);
    }
    void* dp = PyArray_DATA(d);
    const void* sp = PyArray_DATA(s);
    if (n < kCopyReleaseGilBytes) {
        if (forced && forced_threads > 1) CopyCtx{forced, region, forced_threads}(dp, sp, n);
        else if (forced) copy_bytes_with(forced, dp, sp, n);
        else copy_bytes(dp, sp, n, region);
        return 1;
    }
    CopyCtx cp{forced, region, forced_threads};
    Layout dl, sl;
    dl.ptr = static_cast<char*>(dp);
    sl.ptr = const_cast<char*>(static_cast<const char*>(sp));
    dl.nd = sl.nd = 1;
    dl.shape[0] = sl.shape[0] = static_cast<Py_ssize_t>(n);
    dl.strides[0] = sl.strides[0] = 1;
    CopyStatus st = copy_without_gil(dst, src, dl, sl, n, cp, true);
    if (st == CopyStatus::Interrupted) return -1;  // a signal handler's exception (KeyboardInterrupt)
    if (st != CopyStatus::Ok) {
        PyErr_SetString(PyExc_RuntimeError, "fastcopy.copy: the copy failed inside the native core");
        return -1;
    }
    return 1;
}

// Parses (dst, src[, region]) from FASTCALL arguments with optional keywords.
bool parse_args(const char* fn, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, int nwant,
                PyObject** out) {
    static const char* names[3] = {"dst", "src", "region"};
    if (nargs > nwant) {
        PyErr_Format(PyExc_TypeError, "fastcopy.%s() takes %d positional arguments but %zd were given", fn, nwant,
                     nargs);
        return false;
    }
    for (int i = 0; i < nwant; ++i) out[i] = i < nargs ? args[i] : nullptr;
    if (kwnames) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nk; ++k) {
            PyObject* key = PyTuple_GET_ITEM(kwnames, k);
            int slot = -1;
            for (int i = 0; i < nwant; ++i)
                if (PyUnicode_CompareWithASCIIString(key, names[i]) == 0) slot = i;
            if (slot < 0) {
                PyErr_Format(PyExc_TypeError, "fastcopy.%s() got an unexpected keyword argument '%U'", fn, key);
                return false;
            }
            if (out[slot]) {
                PyErr_Format(PyExc_TypeError, "fastcopy.%s() got multiple values for argument '%s'", fn,
                             names[slot]);
                return false;
            }
            out[slot] = args[nargs + k];
        }
    }
    for (int i = 0; i < nwant; ++i) {
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "fastcopy.%s() missing required argument '%s'", fn, names[i]);
            return false;
        }
    }
    return true;
}

// fastcopy.copy's general path. A loan (fastcopy.shm) is shared memory another process will
// read: copies into it follow the ToShared policy and its ring's store mode.
PyObject* copy_general(PyObject* dst, PyObject* src) {
    policy::SharedWriteMode* shared = g_loan_write_mode && Py_TYPE(dst) != g_ndarray_type ? g_loan_write_mode(dst) : nullptr;
    return do_copy("copy", dst, src, nullptr, shared ? Region::ToShared : Region::Private, 1, shared);
}

PyObject* py_copy(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    if (nargs == 2 && !kwnames) {
        int r = try_fast(args[0], args[1], nullptr, Region::Private);
        if (r > 0) Py_RETURN_NONE;
        if (r < 0) return nullptr;
        return copy_general(args[0], args[1]);
    }
    PyObject* a[2];
    if (!parse_args("copy", args, nargs, kwnames, 2, a)) return nullptr;
    return copy_general(a[0], a[1]);
}

PyObject* py_copy_region(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    PyObject* a[3];
    if (!parse_args("copy_region", args, nargs, kwnames, 3, a)) return nullptr;
    if (!PyLong_Check(a[2]) || PyBool_Check(a[2])) {
        PyErr_Format(PyExc_TypeError, "fastcopy.copy_region: region must be an int (0, 1 or 2), got %s",
                     type_name(a[2]));
        return nullptr;
    }
    long r = PyLong_AsLong(a[2]);
    if (r == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        r = -1;  // far out of range: reported below
    }
    if (r < 0 || r > 2) {
        PyErr_Format(PyExc_ValueError,
                     "fastcopy.copy_region: region must be 0 (private), 1 (to shared) or 2 (from shared), got %ld", r);
        return nullptr;
    }
    Region region = static_cast<Region>(r);
    int fr = try_fast(a[0], a[1], nullptr, region);
    if (fr > 0) Py_RETURN_NONE;
    if (fr < 0) return nullptr;
    return do_copy("copy_region", a[0], a[1], nullptr, region);
}

// `self` is a capsule holding the CopyFn of the kernel.
PyObject* py_kernel_copy(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    const ForcedKernel* fk = static_cast<const ForcedKernel*>(PyCapsule_GetPointer(self, "fastcopy.kernel"));
    if (!fk) return nullptr;
    CopyFn fn = fk->fn;
    PyObject* a[2];
    if (nargs == 2 && !kwnames) {
        a[0] = args[0];
        a[1] = args[1];
    } else if (!parse_args("kernel", args, nargs, kwnames, 2, a)) {
        return nullptr;
    }
    int r = try_fast(a[0], a[1], fn, Region::Private, fk->threads);
    if (r > 0) Py_RETURN_NONE;
    if (r < 0) return nullptr;
    return do_copy("kernel", a[0], a[1], fn, Region::Private, fk->threads);
}

PyMethodDef g_copy_def = {
    "copy", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_copy)), METH_FASTCALL | METH_KEYWORDS,
    "copy(dst, src)\n--\n\n"
    "Copy the contents of buffer ``src`` into buffer ``dst`` (returns None).\n\n"
    "Two numpy arrays must have equal shapes (ValueError) and dtypes (TypeError); there is no\n"
    "broadcasting or casting (use np.copyto for those). Otherwise the byte counts must be equal.\n"
    "Any strides and any overlap give the bytes np.copyto gives. The GIL is released for\n"
    "copies of 64 KiB and more. On the main thread a contiguous copy of more than 128 MiB runs\n"
    "the signal handlers every 128 MiB: Ctrl-C raises KeyboardInterrupt with dst partly written."};

PyMethodDef g_copy_region_def = {
    "copy_region", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_copy_region)),
    METH_FASTCALL | METH_KEYWORDS,
    "copy_region(dst, src, region)\n--\n\n"
    "copy() with the policy of one region: 0 private, 1 into shared memory, 2 out of shared memory."};

PyMethodDef g_kernel_copy_def = {
    "kernel_copy", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_kernel_copy)),
    METH_FASTCALL | METH_KEYWORDS,
    "kernel_copy(dst, src)\n--\n\n"
    "copy() that always uses one kernel (from fastcopy.kernel(name, threads)); threads > 1 splits\n"
    "non-overlapping copies over the thread pool."};

std::string valid_kernels() {
    std::string out;
    for (const auto& k : all_kernels()) {
        if (!k.supported) continue;
        if (!out.empty()) out += ", ";
        out += "'" + k.name + "'";
    }
    return out;
}

}  // namespace
}  // namespace fastcopy

PYBIND11_MODULE(_core, m) {
    using namespace fastcopy;
    if (_import_array() < 0) throw py::error_already_set();
    g_ndarray_type = &PyArray_Type;

    py::object modname = m.attr("__name__");
    auto add = [&](PyMethodDef* def, PyObject* self) {
        PyObject* f = PyCFunction_NewEx(def, self, modname.ptr());
        if (!f) throw py::error_already_set();
        m.add_object(def->ml_name, py::reinterpret_steal<py::object>(f));
    };
    add(&g_copy_def, nullptr);
    add(&g_copy_region_def, nullptr);

    m.def(
        "kernel_callable",
        [](const std::string& name, long threads) -> py::object {
            if (threads < 1 || threads > static_cast<long>(pool::kMaxThreads))
                throw py::value_error("fastcopy.kernel: threads must be 1 to " + std::to_string(pool::kMaxThreads) +
                                      ", got " + std::to_string(threads));
            const KernelInfo* k = find_kernel(name);
            if (!k || !k->supported) {
                std::string why = !k ? "is not a kernel of this build" : "is not usable on this CPU (" + k->why_not + ")";
                throw py::value_error("fastcopy.kernel: '" + name + "' " + why + "; valid kernels: " +
                                      valid_kernels());
            }
            auto* held = new ForcedKernel{k->fn, static_cast<unsigned>(threads)};
            PyObject* cap = PyCapsule_New(held, "fastcopy.kernel", [](PyObject* c) {
                delete static_cast<ForcedKernel*>(PyCapsule_GetPointer(c, "fastcopy.kernel"));
            });
            if (!cap) {
                delete held;
                throw py::error_already_set();
            }
            py::object capsule = py::reinterpret_steal<py::object>(cap);
            PyObject* f = PyCFunction_NewEx(&g_kernel_copy_def, capsule.ptr(), nullptr);
            if (!f) throw py::error_already_set();
            return py::reinterpret_steal<py::object>(f);
        },
        py::arg("name"), py::arg("threads") = 1,
        "A callable f(dst, src) with the contract of copy() that always uses kernel `name` "
        "(ValueError naming the valid kernels when it is not usable); threads > 1 splits non-overlapping "
        "copies over the thread pool with that many threads (the caller included).");

    bind_info(m);
    bind_shm(m);
    bind_batch(m);  // after copy: the batched calls use it
    bind_reference(m);
    void bind_shm_layout(py::module_&); bind_shm_layout(m);  // bindings_shm_layout.cpp
}
