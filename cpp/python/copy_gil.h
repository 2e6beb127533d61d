// When copy(), copy_many() and the numpy drop-ins (bindings.cpp, bindings_batch.cpp) release
// the GIL, and how a long copy lets Ctrl-C in.
#pragma once
#include <Python.h>

#include <cstddef>
#include <vector>

#include "core/batch.h"

namespace fastcopy {

// Copies (and batches) of at least this many bytes release the GIL: at 64 KiB one uncontended
// release and re-acquire is a few percent of the call; for smaller copies it could be most of
// it, and under contention re-acquiring can wait for another thread's switch interval, so
// small copies keep the GIL (evidence: copy-gil-release-threshold).
constexpr std::size_t kCopyReleaseGilBytes = 64 * 1024;

// A copy or batch larger than this, on the main thread, runs in steps of this many bytes (by
// bytes done, contiguous, strided or batched) and takes the GIL back between steps to run
// Python's signal handlers (PyErr_CheckSignals), so Ctrl-C interrupts it within a step (about
// 10-60 ms at 2-12 GB/s). Only the main thread runs signal handlers, so other threads never
// stop. Retaking the GIL uncontended costs nothing against a step; when another Python thread
// holds it, the wait is at most its switch interval (5 ms), small against the step's copy.
constexpr std::size_t kSignalCheckBytes = std::size_t(128) << 20;

// True on the thread that runs Python's signal handlers (threading.main_thread(), and after a
// fork the thread that forked). Runs no Python code, so no signal handler runs inside it.
bool on_main_thread();

// The state of core::StepCheck's stop() below: the thread state saved when the GIL was released.
struct SignalCheck {
    PyThreadState* ts;
    bool interrupted = false;
};

// Between steps of a long copy: takes the GIL, runs the signal handlers, and releases the GIL
// again unless a handler raised (then it returns true, the exception stays set and the GIL
// stays held: interrupted is set). `ctx` is a SignalCheck.
bool check_signals_between_steps(void* ctx);

// One reference held for a scope (a copy with the GIL released), dropped with the GIL held.
struct HeldRef {
    PyObject* o;
    explicit HeldRef(PyObject* obj) : o(obj) { Py_INCREF(o); }
    HeldRef(const HeldRef&) = delete;
    HeldRef& operator=(const HeldRef&) = delete;
    ~HeldRef() { Py_DECREF(o); }
};

// References held while the GIL is released, dropped (with the GIL) by the destructor: numpy
// refuses to resize an array whose reference count says someone else holds it.
struct Held {
    std::vector<PyObject*> refs;
    ~Held() {
        for (PyObject* o : refs) Py_DECREF(o);
    }
    void hold(PyObject* o) {
        Py_INCREF(o);
        refs.push_back(o);
    }
};

// core::run_batch() under copy()'s GIL rules: released from kCopyReleaseGilBytes, and on the
// main thread a batch of more than kSignalCheckBytes runs the signal handlers between steps.
// False with the handler's exception set when one raised (bindings_batch.cpp).
bool run_batch_gil(core::Batch& batch);

}  // namespace fastcopy
