// The copy API of the extension module `_core`: fastcopy.copy(dst, src), copy_region() for
// the shared-memory channel, and kernel_callable() for fastcopy.kernel(name).
//
// Bindings only: arguments are parsed here, operands resolved by python/operand.h (errors:
// core/copy_errors.h), the pair planned and copied by core/layout.h and core/strided_copy.h,
// each contiguous run handed to copy_bytes()/copy_bytes_with() (dispatch picks the kernel).
//
// The three entry points are raw CPython METH_FASTCALL functions, not pybind11 functions:
// pybind11's argument machinery costs several hundred ns per call, more than np.copyto
// for small arrays. Exact numpy.ndarray arguments are read through the numpy C-API struct
// layout (no buffer export); every other object goes through PyObject_GetBuffer with
// PyBUF_RECORDS(_RO) and the Py_buffer is held until the copy ends.
#include <pybind11/pybind11.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <pthread.h>

#include <atomic>
#include <cstring>
#include <string>

#include "core/dispatch.h"
#include "core/layout.h"
#include "core/read_only_ranges.h"
#include "core/strided_copy.h"
#include "pool/pool.h"
#include "python/copy_gil.h"
#include "python/foreign.h"
#include "python/gil.h"
#include "python/operand.h"

namespace py = pybind11;

namespace fastcopy {

// Set by bindings_shm.cpp when fastcopy.shm is imported: the store mode of an outstanding loan
// (copy_general below), nullptr for anything else.
policy::StoreModeLearner* (*g_loan_write_mode)(PyObject* dst) = nullptr;
void bind_info(py::module_& m);
void bind_shm(py::module_& m);
void bind_batch(py::module_& m);  // bindings_batch.cpp
void bind_reference(py::module_& m);  // bindings_reference.cpp

namespace {

// The ident of the thread that runs Python's signal handlers: threading.main_thread() read once,
// at import. A fork leaves the child one thread, the one that forked, which os.fork makes the
// child's main thread; the pthread_atfork handler records it. No Python code runs when the copy
// asks: a signal handler run inside such code would raise an exception the copy must then
// keep, and on_main_thread() has no way to hand one back.
std::atomic<unsigned long> g_main_thread_ident{0};

void record_forking_thread_as_main() { g_main_thread_ident.store(PyThread_get_thread_ident(), std::memory_order_relaxed); }

// Reads threading.main_thread().ident and registers the fork handler. False with a Python
// exception set when threading cannot tell.
bool init_main_thread_ident() {
    PyObject* threading = PyImport_ImportModule("threading");
    PyObject* main = threading ? PyObject_CallMethod(threading, "main_thread", nullptr) : nullptr;
    PyObject* ident = main ? PyObject_GetAttrString(main, "ident") : nullptr;
    const unsigned long value = ident ? PyLong_AsUnsignedLong(ident) : 0;
    Py_XDECREF(ident);
    Py_XDECREF(main);
    Py_XDECREF(threading);
    if (PyErr_Occurred()) return false;
    g_main_thread_ident.store(value, std::memory_order_relaxed);
    pthread_atfork(nullptr, nullptr, record_forking_thread_as_main);
    return true;
}

}  // namespace

bool on_main_thread() {
    return PyThread_get_thread_ident() == g_main_thread_ident.load(std::memory_order_relaxed);
}

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

namespace {

using core::CopyCtx;
using core::CopyStatus;
using core::Layout;

PyTypeObject* g_ndarray_type = nullptr;

// What a fastcopy.kernel(name, threads=N) callable holds (in its capsule).
struct ForcedKernel {
    CopyFn fn;
    unsigned threads;
};

// core::copy_layouts() with the GIL released. Other threads run meanwhile, so both objects
// get a reference of their own for the whole copy: numpy's ndarray.resize() (refcheck) and
// similar checks then see the array in use and refuse, as they do for np.copyto, instead of
// freeing the memory being copied. Buffer exports (non-ndarray operands) are held by their
// PyOperand. A copy of more than kSignalCheckBytes on the main thread runs the signal handlers
// between steps (copy_gil.h); a loan's copy (cp.shared) runs in one piece.
CopyStatus copy_without_gil(PyObject* dst, PyObject* src, const Layout& d, const Layout& s, std::size_t total,
                            const CopyCtx& cp, bool joint) {
    const HeldRef hold_dst(dst), hold_src(src);
    CopyStatus st;
    if (total > kSignalCheckBytes && !cp.shared && on_main_thread()) {
        SignalCheck check{PyEval_SaveThread()};
        const core::StepCheck step{kSignalCheckBytes, check_signals_between_steps, &check};
        st = core::copy_layouts(d, s, total, cp, joint, &step);
        // An interrupted copy holds the GIL already, with the handler's exception set.
        if (!check.interrupted) restore_thread_or_park(check.ts);  // parks at interpreter exit (gil.h)
    } else {
        PyThreadState* ts = PyEval_SaveThread();
        st = core::copy_layouts(d, s, total, cp, joint);
        restore_thread_or_park(ts);  // parks at interpreter exit instead of unwinding (gil.h)
    }
    return st;
}

// The general path. Returns nullptr with an exception set, or None.
PyObject* do_copy(const char* fn, PyObject* dst, PyObject* src, CopyFn forced, Region region,
                  unsigned forced_threads = 1, policy::StoreModeLearner* shared = nullptr) {
    const core::ErrorSite site{fn};
    PyOperand d, s;
    if (!resolve_operand(site, dst, true, d) || !resolve_operand(site, src, false, s) ||
        !check_operands(site, dst, src, d, s))
        return nullptr;
    const std::size_t total = d.desc.nbytes;
    if (total == 0) Py_RETURN_NONE;
    Layout dl, sl;
    const bool joint = core::plan_pair(d.desc, s.desc, dl, sl);
    const CopyCtx cp{forced, region, forced_threads, shared};
    CopyStatus st;
    if (total >= kCopyReleaseGilBytes) st = copy_without_gil(dst, src, dl, sl, total, cp, joint);
    else st = core::copy_layouts(dl, sl, total, cp, joint);
    if (st == CopyStatus::NoMemory) return PyErr_NoMemory();
    if (st == CopyStatus::Interrupted) return nullptr;  // a signal handler's exception (KeyboardInterrupt)
    if (st == CopyStatus::Failed) return raise_copy_error(site, core::CopyError::NativeFailure, {});
    Py_RETURN_NONE;
}

// Fast path: two exact, C-contiguous ndarrays with identical shapes and the same dtype
// object. Returns 1 when it copied, 0 to fall back to the general path (which also
// produces every error message), -1 with an exception set.
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
    if (core::dst_is_read_only_shared(dp, n)) return 0;  // the general path refuses it
    if (n < kCopyReleaseGilBytes) {
        if (forced && forced_threads > 1) CopyCtx{forced, region, forced_threads}(dp, sp, n);
        else if (forced) copy_bytes_with(forced, dp, sp, n);
        else copy_bytes(dp, sp, n, region);
        return 1;
    }
    const CopyCtx cp{forced, region, forced_threads};
    Layout dl, sl;
    dl.ptr = static_cast<char*>(dp);
    sl.ptr = const_cast<char*>(static_cast<const char*>(sp));
    dl.nd = sl.nd = 1;
    dl.shape[0] = sl.shape[0] = static_cast<std::ptrdiff_t>(n);
    dl.strides[0] = sl.strides[0] = 1;
    CopyStatus st = copy_without_gil(dst, src, dl, sl, n, cp, true);
    if (st == CopyStatus::Interrupted) return -1;  // a signal handler's exception (KeyboardInterrupt)
    if (st != CopyStatus::Ok) {
        raise_copy_error(core::ErrorSite{"copy"}, core::CopyError::NativeFailure, {});
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
    policy::StoreModeLearner* shared = g_loan_write_mode && Py_TYPE(dst) != g_ndarray_type ? g_loan_write_mode(dst) : nullptr;
    return do_copy("copy", dst, src, nullptr, shared ? Region::ToShared : Region::Private, 1, shared);
}

// Two small contiguous torch tensors of one dtype and shape (foreign.h): copied with the GIL
// held, like try_fast's small copies. True when it copied.
bool try_small_tensors(PyObject* dst, PyObject* src) {
    void* dp;
    const void* sp;
    std::size_t n;
    if (torch_contiguous_pair(dst, src, dp, sp, n) != 1 || n >= kCopyReleaseGilBytes ||
        core::dst_is_read_only_shared(dp, n))
        return false;
    copy_bytes(dp, sp, n, Region::Private);
    return true;
}

PyObject* py_copy(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    if (nargs == 2 && !kwnames) {
        int r = try_fast(args[0], args[1], nullptr, Region::Private);
        if (r > 0) Py_RETURN_NONE;
        if (r < 0) return nullptr;
        if (try_small_tensors(args[0], args[1])) Py_RETURN_NONE;
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
                     Py_TYPE(a[2])->tp_name);
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
    // The context holds the same pointer as the capsule: reading it skips the name compare
    // PyCapsule_GetPointer makes, a call to strcmp on every copy.
    const ForcedKernel* fk = static_cast<const ForcedKernel*>(PyCapsule_GetContext(self));
    if (!fk) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_SystemError, "fastcopy.kernel: callable without its kernel");
        return nullptr;
    }
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
    "copies of 64 KiB and more. On the main thread a copy of more than 128 MiB (SIGNAL_CHECK_BYTES),\n"
    "contiguous or strided, runs the signal handlers every 128 MiB: Ctrl-C raises KeyboardInterrupt\n"
    "with dst partly written."};

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
    if (_import_array() < 0 || !operand_init() || !init_main_thread_ident()) throw py::error_already_set();
    g_ndarray_type = &PyArray_Type;

    py::object modname = m.attr("__name__");
    auto add = [&](PyMethodDef* def, PyObject* self) {
        PyObject* f = PyCFunction_NewEx(def, self, modname.ptr());
        if (!f) throw py::error_already_set();
        m.add_object(def->ml_name, py::reinterpret_steal<py::object>(f));
    };
    add(&g_copy_def, nullptr);
    add(&g_copy_region_def, nullptr);
    m.attr("SIGNAL_CHECK_BYTES") = kSignalCheckBytes;

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
            if (PyCapsule_SetContext(cap, held) != 0) throw py::error_already_set();
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
    void bind_net(py::module_&); bind_net(m);  // bindings_net.cpp
}
