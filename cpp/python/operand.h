// The one operand resolver of copy(), copy_region(), kernel callables and copy_many(): a
// Python object becomes a core::OperandDesc (numpy arrays through the numpy C-API struct
// layout, buffers through PyObject_GetBuffer with PyBUF_RECORDS(_RO), the export held until
// the operand is destroyed; arrays of other libraries through DLPack or __array_interface__ as
// a numpy array over their memory, foreign.h). Which checks apply and what the errors say is
// core/copy_errors.h; this file reads the Python facts and raises.
#pragma once
#include <Python.h>

#include "core/copy_errors.h"
#include "core/layout.h"

namespace fastcopy {

struct PyOperand {
    core::OperandDesc desc;
    PyObject* array = nullptr;  // the numpy array (or subclass) itself, else nullptr
    PyObject* owned = nullptr;  // the numpy array over a foreign array's memory (foreign.h), held
    bool has_view = false;
    Py_buffer view;
    std::ptrdiff_t one_shape = 0, one_stride = 1;  // 0-d and unshaped buffers, seen as one run

    PyOperand() = default;
    PyOperand(const PyOperand&) = delete;
    PyOperand& operator=(const PyOperand&) = delete;
    ~PyOperand() {
        if (has_view) PyBuffer_Release(&view);
        Py_XDECREF(owned);
    }
};

// Loads the numpy C-API for this file's functions; false with an exception set.
bool operand_init();

// Fills `op` from `obj` ("dst" when writable, else "src"). False with the exception set.
bool resolve_operand(const core::ErrorSite& site, PyObject* obj, bool writable, PyOperand& op);

// copy()'s pair rules (core::check_pair) for two resolved operands; false with the exception set.
bool check_operands(const core::ErrorSite& site, PyObject* dst, PyObject* src, const PyOperand& d,
                    const PyOperand& s);

// Raises `e` as its Python exception type with core::error_message's text; returns nullptr.
PyObject* raise_copy_error(const core::ErrorSite& site, core::CopyError e, const core::ErrorFacts& f);

}  // namespace fastcopy
