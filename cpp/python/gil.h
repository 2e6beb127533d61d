// Releasing and re-taking the GIL around native work, safely at interpreter exit.
//
// CPython 3.11-3.13 end a daemon thread that tries to take the GIL while the interpreter is
// finalizing with pthread_exit(), which unwinds the thread's stack with a forced unwind
// (abi::__forced_unwind). Through a noexcept C++ frame or a destructor (where fastcopy re-takes
// the GIL when it leaves a wait early) that unwind calls std::terminate: "terminate called
// without an active exception", exit status 134. Destructors that would run on the way also
// touch Python objects without the GIL. Instead, a thread that CPython ends that way parks
// here for good, as CPython 3.14 itself does (PyThread_hang_thread); the process exit then
// ends it. Nothing it referenced is released: the process is ending.
#pragma once
#include <Python.h>

#include <cxxabi.h>
#include <unistd.h>

namespace fastcopy {

[[noreturn]] inline void park_thread_forever() noexcept {
    for (;;) ::pause();
}

// PyEval_RestoreThread(ts), or park the thread where CPython would end it. No check of
// Py_IsFinalizing() first: the thread that runs the finalization (its __del__ methods may
// copy) takes the GIL normally, and parking it would hang the exit; CPython itself decides
// who must exit, and only those threads see the forced unwind caught here.
inline void restore_thread_or_park(PyThreadState* ts) noexcept {
    try {
        PyEval_RestoreThread(ts);
    } catch (abi::__forced_unwind&) {
        park_thread_forever();  // never returns, so the forced unwind is not swallowed
    }
}

}  // namespace fastcopy
