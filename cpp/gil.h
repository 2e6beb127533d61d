// Releasing and re-taking the GIL around native work, safely at interpreter exit.
//
// CPython 3.11-3.13 end a daemon thread that tries to take the GIL while the interpreter is
// finalizing with pthread_exit(), which unwinds the thread's stack with a forced unwind
// (abi::__forced_unwind). Through a noexcept C++ frame or a destructor (where fastcopy re-takes
// the GIL when it leaves a wait early) that unwind calls std::terminate: "terminate called
// without an active exception", exit status 134. Destructors that would run on the way also
// touch Python objects without the GIL. Instead, a thread that finds the interpreter
// finalizing parks here for good, as CPython 3.14 itself does (PyThread_hang_thread); the
// process exit then ends it. Nothing it referenced is released: the process is ending.
#pragma once
#include <Python.h>

#include <cxxabi.h>
#include <unistd.h>

namespace fastcopy {

[[noreturn]] inline void park_thread_forever() noexcept {
    for (;;) ::pause();
}

inline bool interpreter_finalizing() noexcept {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing() != 0;
#else
    return _Py_IsFinalizing() != 0;
#endif
}

// PyEval_RestoreThread(ts), or park the thread when the interpreter is finalizing. The check
// comes first; the catch covers finalization that starts between the check and the take.
inline void restore_thread_or_park(PyThreadState* ts) noexcept {
    if (interpreter_finalizing()) park_thread_forever();
    try {
        PyEval_RestoreThread(ts);
    } catch (abi::__forced_unwind&) {
        park_thread_forever();  // never returns, so the forced unwind is not swallowed
    }
}

}  // namespace fastcopy
