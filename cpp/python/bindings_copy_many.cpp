// copy_many(dsts, srcs) of the extension module `_core`: many copy()s in one call, every
// pair resolved and checked with copy()'s rules (python/operand.h) before any byte moves.
// Independent contiguous pairs go to the batch engine (core/batch.h) in one GIL release;
// strided pairs, and all pairs when some share memory, go through copy() in order.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "core/batch.h"
#include "core/layout.h"
#include "python/copy_gil.h"
#include "python/operand.h"

namespace py = pybind11;

namespace fastcopy {
void bind_copy_many(py::module_& m);

namespace {

using core::Batch;

PyObject* g_copy = nullptr;  // fastcopy._core.copy: strided pairs go through it

PyObject* call_copy(PyObject* dst, PyObject* src) {
    PyObject* args[2] = {dst, src};
    return PyObject_Vectorcall(g_copy, args, 2, nullptr);
}

PyObject* py_copy_many(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    PyObject* dsts_arg = nargs >= 1 ? args[0] : nullptr;
    PyObject* srcs_arg = nargs >= 2 ? args[1] : nullptr;
    if (nargs > 2) {
        PyErr_Format(PyExc_TypeError, "fastcopy.copy_many() takes 2 positional arguments but %zd were given", nargs);
        return nullptr;
    }
    if (kwnames) {
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); ++k) {
            PyObject* key = PyTuple_GET_ITEM(kwnames, k);
            PyObject** slot = PyUnicode_CompareWithASCIIString(key, "dsts") == 0   ? &dsts_arg
                              : PyUnicode_CompareWithASCIIString(key, "srcs") == 0 ? &srcs_arg
                                                                                   : nullptr;
            if (!slot) {
                PyErr_Format(PyExc_TypeError, "fastcopy.copy_many() got an unexpected keyword argument '%U'", key);
                return nullptr;
            }
            if (*slot) {
                PyErr_Format(PyExc_TypeError, "fastcopy.copy_many() got multiple values for argument '%U'", key);
                return nullptr;
            }
            *slot = args[nargs + k];
        }
    }
    if (!dsts_arg || !srcs_arg) {
        PyErr_Format(PyExc_TypeError, "fastcopy.copy_many() missing required argument '%s'",
                     dsts_arg ? "srcs" : "dsts");
        return nullptr;
    }
    // Tuples of our own: another thread cannot change them under us.
    py::object dsts = py::reinterpret_steal<py::object>(PySequence_Tuple(dsts_arg));
    if (!dsts) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {  // not iterable; other errors pass through
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "fastcopy.copy_many: dsts must be a sequence of buffers, got %s",
                         Py_TYPE(dsts_arg)->tp_name);
        }
        return nullptr;
    }
    py::object srcs = py::reinterpret_steal<py::object>(PySequence_Tuple(srcs_arg));
    if (!srcs) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {  // not iterable; other errors pass through
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "fastcopy.copy_many: srcs must be a sequence of buffers, got %s",
                         Py_TYPE(srcs_arg)->tp_name);
        }
        return nullptr;
    }
    const Py_ssize_t n = PyTuple_GET_SIZE(dsts.ptr());
    if (PyTuple_GET_SIZE(srcs.ptr()) != n) {
        PyErr_Format(PyExc_ValueError,
                     "fastcopy.copy_many: dsts has %zd buffers but srcs has %zd; nothing was copied", n,
                     PyTuple_GET_SIZE(srcs.ptr()));
        return nullptr;
    }
    const core::ErrorSite site{"copy_many"};
    // One allocation per pair: its two operands (which must not move: they hold buffer exports).
    struct Pair {
        PyOperand d, s;
        bool batched = false;
    };
    std::vector<std::unique_ptr<Pair>> pairs;
    std::vector<core::Span> spans;
    Held held;
    Batch batch;
    try {
        pairs.reserve(static_cast<std::size_t>(n));
        spans.reserve(static_cast<std::size_t>(2 * n));
        held.refs.reserve(static_cast<std::size_t>(2 * n));
        // Every pair is checked (and its buffers held) before any byte moves.
        for (Py_ssize_t i = 0; i < n; ++i) {
            PyObject* dst = PyTuple_GET_ITEM(dsts.ptr(), i);
            PyObject* src = PyTuple_GET_ITEM(srcs.ptr(), i);
            pairs.emplace_back(new Pair);
            Pair& p = *pairs.back();
            const core::ErrorSite where{site.fn, i};
            if (!resolve_operand(where, dst, true, p.d) || !resolve_operand(where, src, false, p.s) ||
                !check_operands(where, dst, src, p.d, p.s))
                return nullptr;
            if (p.d.array) held.hold(dst);
            if (p.s.array) held.hold(src);
            if (p.d.desc.nbytes == 0) continue;
            core::Span ds{0, 0, true}, ss{0, 0, false};
            core::operand_extent(p.d.desc, ds.lo, ds.hi);
            core::operand_extent(p.s.desc, ss.lo, ss.hi);
            spans.push_back(ds);
            spans.push_back(ss);
        }
    } catch (const std::bad_alloc&) {
        return PyErr_NoMemory();
    }
    // Pairs that go through copy() one by one: on the main thread the signal handlers run
    // whenever kSignalCheckBytes more bytes are done (copy() checks within each pair).
    int main_thread = -1;  // asked once, when the first step is done
    std::size_t since_check = 0;
    auto copy_pair = [&](Py_ssize_t i) {
        PyObject* r = call_copy(PyTuple_GET_ITEM(dsts.ptr(), i), PyTuple_GET_ITEM(srcs.ptr(), i));
        if (!r) return false;
        Py_DECREF(r);
        since_check += pairs[static_cast<std::size_t>(i)]->d.desc.nbytes;
        if (since_check >= kSignalCheckBytes && i + 1 < n) {
            since_check = 0;
            if (main_thread < 0) main_thread = on_main_thread();
            if (main_thread && PyErr_CheckSignals() != 0) return false;
        }
        return true;
    };
    if (core::pairs_interfere(spans)) {
        // Some pairs share bytes: copy pair after pair, in order, as a loop of copy() would.
        for (Py_ssize_t i = 0; i < n; ++i)
            if (!copy_pair(i)) return nullptr;
        Py_RETURN_NONE;
    }
    // Independent pairs: the contiguous ones in one batch (one GIL release), then the
    // strided ones through copy().
    try {
        for (const auto& p : pairs) {
            const core::OperandDesc& ds = p->d.desc;
            const core::OperandDesc& ss = p->s.desc;
            if (ds.nbytes == 0 || !core::is_c_contiguous(ds) || !core::is_c_contiguous(ss)) continue;
            batch.blocks.push_back({ds.ptr, ss.ptr, ds.nbytes, 1, 0, 0});
            batch.total += ds.nbytes;
            p->batched = true;
        }
    } catch (const std::bad_alloc&) {
        return PyErr_NoMemory();
    }
    if (!run_batch_gil(batch)) return nullptr;
    for (Py_ssize_t i = 0; i < n; ++i) {
        const Pair& p = *pairs[static_cast<std::size_t>(i)];
        if (p.d.desc.nbytes == 0 || p.batched) continue;
        if (!copy_pair(i)) return nullptr;
    }
    Py_RETURN_NONE;
}

PyMethodDef g_copy_many_def = {
    "copy_many", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_copy_many)),
    METH_FASTCALL | METH_KEYWORDS,
    "copy_many(dsts, srcs)\n--\n\n"
    "copy(dsts[i], srcs[i]) for every i, in one call (returns None).\n\n"
    "Every pair is checked with copy()'s rules before any byte moves: a bad pair raises and\n"
    "nothing is copied. Contiguous pairs are copied as one batch (one GIL release, spread over\n"
    "the thread pool when large); strided pairs go through copy(). When a destination shares\n"
    "memory with another pair (or its own source), the pairs are copied one after another, in\n"
    "order, so the result is always that of the loop. On the main thread a call moving more than\n"
    "128 MiB (SIGNAL_CHECK_BYTES) runs the signal handlers every 128 MiB: Ctrl-C raises\n"
    "KeyboardInterrupt with the destinations partly written."};

}  // namespace

void bind_copy_many(py::module_& m) {
    g_copy = m.attr("copy").ptr();
    Py_INCREF(g_copy);
    PyObject* f = PyCFunction_NewEx(&g_copy_many_def, nullptr, m.attr("__name__").ptr());
    if (!f) throw py::error_already_set();
    m.add_object(g_copy_many_def.ml_name, py::reinterpret_steal<py::object>(f));
}

}  // namespace fastcopy
