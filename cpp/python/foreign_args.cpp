// The numpy drop-ins called with arrays of other libraries (foreign.h): the call's foreign
// arguments become numpy arrays over the same memory.
#include <Python.h>

#include <algorithm>
#include <string>
#include <vector>

#include "python/copy_gil.h"
#include "python/foreign.h"

namespace fastcopy {

namespace {

bool is_out_keyword(PyObject* key) {
    static PyObject* out = PyUnicode_InternFromString("out");
    if (key == out) return true;
    const int r = PyUnicode_Compare(key, out);
    if (r == -1 && PyErr_Occurred()) PyErr_Clear();
    return r == 0;
}

// `o` itself, or a numpy array over its memory when it is a foreign array (held by `held`);
// nullptr with an exception set when the foreign array cannot be read.
PyObject* as_numpy(PyObject* o, const char* who, Held& held) {
    if (!is_foreign_array(o)) return o;
    PyObject* arr = foreign_array(o, who);
    if (!arr) return nullptr;
    held.refs.push_back(arr);  // steals the new reference
    return arr;
}

// The call's arguments with foreign arrays replaced: dst and src (positions 0 and 1) for
// copyto, or (join = true: stack, concatenate) the items of the arrays sequence and out=
// (positional 2 or keyword). `out_given` is the caller's out= object when it was foreign.
// 1: something was replaced (`out` holds the new arguments); 0: nothing foreign; -1: error.
int without_foreign(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, bool join, const char* fn,
                    std::vector<PyObject*>& out, PyObject*& out_given, Held& held) {
    const Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    out.assign(args, args + nargs + nk);
    bool replaced = false;
    auto replace = [&](Py_ssize_t i, const std::string& who) {
        PyObject* r = as_numpy(out[static_cast<std::size_t>(i)], who.c_str(), held);
        if (!r) return false;
        if (r != out[static_cast<std::size_t>(i)]) {
            if (join && (i == 2 || (i >= nargs && is_out_keyword(PyTuple_GET_ITEM(kwnames, i - nargs)))))
                out_given = out[static_cast<std::size_t>(i)];
            out[static_cast<std::size_t>(i)] = r;
            replaced = true;
        }
        return true;
    };
    const std::string site = std::string("fastcopy.") + fn + ": ";
    if (!join) {
        for (Py_ssize_t i = 0; i < std::min<Py_ssize_t>(nargs, 2); ++i)
            if (!replace(i, site + (i == 0 ? "dst" : "src"))) return -1;
        return replaced ? 1 : 0;
    }
    if (nargs >= 3 && !replace(2, site + "out")) return -1;
    for (Py_ssize_t k = 0; k < nk; ++k)
        if (is_out_keyword(PyTuple_GET_ITEM(kwnames, k)) && !replace(nargs + k, site + "out")) return -1;
    if (nargs >= 1 && (PyList_Check(args[0]) || PyTuple_Check(args[0]))) {
        const Py_ssize_t n = PySequence_Size(args[0]);
        PyObject* items = nullptr;
        for (Py_ssize_t i = 0; i < n; ++i) {
            PyObject* item = PySequence_GetItem(args[0], i);
            if (!item) {
                Py_XDECREF(items);
                return -1;
            }
            if (is_foreign_array(item)) {
                if (!items) {
                    items = PySequence_List(args[0]);
                    if (!items) {
                        Py_DECREF(item);
                        return -1;
                    }
                }
                PyObject* arr = foreign_array(item, site + "arrays[" + std::to_string(i) + "]");
                if (!arr) {
                    Py_DECREF(item);
                    Py_DECREF(items);
                    return -1;
                }
                PyList_SetItem(items, i, arr);  // steals arr
            }
            Py_DECREF(item);
        }
        if (items) {
            held.refs.push_back(items);  // steals the new reference
            out[0] = items;
            replaced = true;
        }
    }
    return replaced ? 1 : 0;
}

}  // namespace

// A numpy array exports the buffer protocol, so the buffer check covers it.
bool is_foreign_array(PyObject* o) {
    return o != Py_None && !PyObject_CheckBuffer(o) && exports_foreign_array(o);
}

PyObject* call_on_numpy_views(DropInFunction fn, const char* name, bool join, PyObject* const* args,
                               Py_ssize_t nargs, PyObject* kwnames) {
    std::vector<PyObject*> plain;
    PyObject* out_given = nullptr;
    Held held;
    const int r = without_foreign(args, nargs, kwnames, join, name, plain, out_given, held);
    if (r <= 0) return nullptr;
    PyObject* result = fn(nullptr, plain.data(), nargs, kwnames);
    if (!result || !out_given) return result;
    Py_DECREF(result);
    Py_INCREF(out_given);
    return out_given;
}

}  // namespace fastcopy
