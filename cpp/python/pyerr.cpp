// Reading and re-raising Python exceptions (pyerr.h).
#include "python/pyerr.h"

namespace fastcopy {

std::string str_or(PyObject* o, const char* fallback) {
    PyObject* s = o ? PyObject_Str(o) : nullptr;
    if (!s) {
        PyErr_Clear();
        return fallback;
    }
    const char* c = PyUnicode_AsUTF8(s);
    std::string out = c ? c : fallback;
    if (!c) PyErr_Clear();
    Py_DECREF(s);
    return out;
}

bool clear_ordinary_error() {
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception)) return false;
    PyErr_Clear();
    return true;
}

void reraise_with_message(const std::function<std::string(const std::string& original)>& message) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    const std::string msg = message(str_or(value, "error"));
    PyErr_SetString(type ? type : PyExc_TypeError, msg.c_str());
    if (value) {
        PyObject *t2, *v2, *tb2;
        PyErr_Fetch(&t2, &v2, &tb2);
        PyErr_NormalizeException(&t2, &v2, &tb2);
        PyException_SetCause(v2, value);  // steals value
        PyErr_Restore(t2, v2, tb2);
    }
    Py_XDECREF(type);
    Py_XDECREF(tb);
}

}  // namespace fastcopy
