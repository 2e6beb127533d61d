// The operand resolver (operand.h): Python objects in, core::OperandDesc out, errors raised
// with core/copy_errors.h's kinds and text.
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include "python/operand.h"
#include "python/foreign.h"
#include "python/pyerr.h"
#include "core/read_only_ranges.h"

#include <numpy/arrayobject.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace fastcopy {

using core::CopyError;
using core::ErrorFacts;
using core::ErrorSite;

namespace {

std::string descr_str(PyObject* arr) {
    return str_or(reinterpret_cast<PyObject*>(PyArray_DESCR(reinterpret_cast<PyArrayObject*>(arr))), "?");
}

PyObject* exception_type(core::ErrorType t) {
    switch (t) {
        case core::ErrorType::TypeError: return PyExc_TypeError;
        case core::ErrorType::ValueError: return PyExc_ValueError;
        default: return PyExc_RuntimeError;
    }
}

// ExportFailed: re-raises the pending exception with the same type and the site's text in
// front; the original stays as __cause__.
PyObject* reraise_export_error(const ErrorSite& site, const char* which) {
    reraise_with_message([&](const std::string& original) {
        ErrorFacts f;
        f.which = which;
        f.detail = original;
        return core::error_message(site, CopyError::ExportFailed, f);
    });
    return nullptr;
}

}  // namespace

bool operand_init() { return _import_array() >= 0; }

PyObject* raise_copy_error(const ErrorSite& site, CopyError e, const ErrorFacts& f) {
    const std::string msg = core::error_message(site, e, f);
    PyErr_SetString(exception_type(core::error_type(e)), msg.c_str());
    return nullptr;
}

namespace {
bool resolve_operand_facts(const ErrorSite& site, PyObject* obj, bool writable, PyOperand& op);
}  // namespace

bool resolve_operand(const ErrorSite& site, PyObject* obj, bool writable, PyOperand& op) {
    if (!resolve_operand_facts(site, obj, writable, op)) return false;
    if (writable && op.desc.nbytes) {
        std::uintptr_t lo, hi;
        core::operand_extent(op.desc, lo, hi);
        if (core::dst_is_read_only_shared(lo, hi)) {
            ErrorFacts f;
            f.which = "dst";
            f.dst_text = qualified_type_name(obj);
            return raise_copy_error(site, CopyError::ReadOnlyShared, f), false;
        }
    }
    return true;
}

namespace {

// The operand's facts and the checks of its kind (numpy array, buffer, foreign array).
bool resolve_operand_facts(const ErrorSite& site, PyObject* obj, bool writable, PyOperand& op) {
    const char* which = writable ? "dst" : "src";
    core::OperandDesc& d = op.desc;
    // The facts of an error, built only when one is raised.
    auto fail = [&](CopyError e, std::string text = std::string(), std::string detail = std::string(), int ndim = 0) {
        ErrorFacts f;
        f.which = which;
        f.writable = writable;
        f.dst_text = std::move(text);
        f.detail = std::move(detail);
        f.ndim = ndim;
        raise_copy_error(site, e, f);
        return false;
    };
    if (PyArray_Check(obj)) {
        PyArrayObject* a = reinterpret_cast<PyArrayObject*>(obj);
        if (writable && !PyArray_ISWRITEABLE(a)) return fail(CopyError::ReadOnlyArray);
        if (PyDataType_REFCHK(PyArray_DESCR(a))) return fail(CopyError::ObjectDtype, descr_str(obj));
        op.array = obj;
        d.ptr = static_cast<char*>(PyArray_DATA(a));
        d.ndim = PyArray_NDIM(a);
        d.shape = PyArray_DIMS(a);
        d.strides = PyArray_STRIDES(a);
        d.itemsize = PyArray_ITEMSIZE(a);
        std::size_t n = static_cast<std::size_t>(d.itemsize);
        for (int i = 0; i < d.ndim; ++i) n *= static_cast<std::size_t>(d.shape[i]);
        d.nbytes = n;
        d.readonly = !PyArray_ISWRITEABLE(a);
        return true;
    }
    if (obj == Py_None || PyUnicode_Check(obj) || !PyObject_CheckBuffer(obj)) {
        if (obj != Py_None && !PyUnicode_Check(obj) && !op.owned) {
            PyObject* arr = foreign_array(obj, [&] {
                std::string who = std::string("fastcopy.") + site.fn + ": ";
                if (site.pair >= 0) who += "pair " + std::to_string(static_cast<long long>(site.pair)) + ": ";
                return who + which;
            });
            if (arr) {
                op.owned = arr;
                return resolve_operand_facts(site, arr, writable, op);
            }
            if (PyErr_Occurred()) return false;
        }
        return fail(CopyError::NotBuffer, Py_TYPE(obj)->tp_name);
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
                return fail(CopyError::ReadOnlyBuffer, Py_TYPE(obj)->tp_name);
            }
            PyErr_Clear();
            PyErr_Restore(t, v, tb);
        }
        return reraise_export_error(site, which);
    }
    op.has_view = true;
    if (core::format_has_objects(op.view.format)) return fail(CopyError::ObjectFormat, "", op.view.format);
    if (op.view.ndim > core::kMaxOperandDims) return fail(CopyError::TooManyDims, "", "", op.view.ndim);
    d.ptr = static_cast<char*>(op.view.buf);
    d.itemsize = op.view.itemsize > 0 ? op.view.itemsize : 1;
    d.nbytes = static_cast<std::size_t>(op.view.len);
    d.readonly = op.view.readonly != 0;
    if (op.view.ndim == 0 || op.view.shape == nullptr) {
        // One item, or an unshaped contiguous buffer: a single run of len bytes.
        d.ndim = 1;
        op.one_shape = op.view.len / d.itemsize;
        op.one_stride = d.itemsize;
        d.shape = &op.one_shape;
        d.strides = &op.one_stride;
    } else {
        d.ndim = op.view.ndim;
        d.shape = op.view.shape;
        d.strides = op.view.strides;  // may be nullptr: C-contiguous
    }
    return true;
}

}  // namespace

bool check_operands(const ErrorSite& site, PyObject* dst, PyObject* src, const PyOperand& d, const PyOperand& s) {
    const bool both = d.array && s.array;
    bool same_dtype = false;
    if (both) {
        PyArray_Descr* dd = PyArray_DESCR(reinterpret_cast<PyArrayObject*>(d.array));
        PyArray_Descr* sd = PyArray_DESCR(reinterpret_cast<PyArrayObject*>(s.array));
        same_dtype = dd == sd || PyArray_EquivTypes(dd, sd);
    }
    const CopyError e = core::check_pair(d.desc, s.desc, both, same_dtype);
    if (e == CopyError::None) return true;
    std::string dn, sn;
    if (e == CopyError::DtypeMismatch) {
        dn = descr_str(d.array);
        sn = descr_str(s.array);
    } else {
        dn = Py_TYPE(dst)->tp_name;
        sn = Py_TYPE(src)->tp_name;
    }
    raise_copy_error(site, e, core::pair_facts(e, d.desc, s.desc, std::move(dn), std::move(sn)));
    return false;
}

}  // namespace fastcopy
