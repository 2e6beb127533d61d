// What the Python bindings of Channel and Topic share: see shm_common.h.
#include "python/shm_common.h"

#include <cmath>
#include <optional>

#include "python/foreign.h"
#include "python/gil.h"

namespace fastcopy {
namespace shmpy {

Support& support() {
    static Support* s = new Support();  // leaked on purpose: no Python calls at exit
    return *s;
}


[[noreturn]] void raise(py::handle type, const std::string& msg) {
    PyErr_SetString(type ? type.ptr() : PyExc_RuntimeError, msg.c_str());
    throw py::error_already_set();
}

// timeout=None (wait for ever) or a real number of seconds (int, float, numpy scalars: anything
// with __float__ except bool and str). Wrong types raise TypeError naming the argument.
double timeout_arg(const py::object& timeout, const char* what) {
    if (timeout.is_none()) return -1.0;
    PyObject* o = timeout.ptr();
    if (PyBool_Check(o) || PyUnicode_Check(o) || PyBytes_Check(o) ||
        !(PyFloat_Check(o) || PyLong_Check(o) || (Py_TYPE(o)->tp_as_number && Py_TYPE(o)->tp_as_number->nb_float)))
        raise(PyExc_TypeError, std::string(what) + ": timeout must be None or a number of seconds, got " +
                                   Py_TYPE(o)->tp_name);
    double t = PyFloat_AsDouble(o);
    if (t == -1.0 && PyErr_Occurred()) {
        if (!clear_ordinary_error()) throw py::error_already_set();  // __float__ was interrupted
        raise(PyExc_TypeError, std::string(what) + ": timeout must be None or a number of seconds, got " +
                                   Py_TYPE(o)->tp_name);
    }
    if (std::isnan(t) || t < 0) raise(PyExc_ValueError, std::string(what) + ": timeout must be None or >= 0");
    return t;
}

std::string seconds_words(double t) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g s", t);
    return buf;
}

namespace {
void gil_release(void* ctx) { *static_cast<PyThreadState**>(ctx) = PyEval_SaveThread(); }
// Parks the thread at interpreter exit instead of unwinding it through the ring's C++ frames
// and destructors (gil.h): a daemon thread blocked in a channel call would abort the exit.
void gil_acquire(void* ctx) { restore_thread_or_park(*static_cast<PyThreadState**>(ctx)); }
int check_signals(void*) { return PyErr_CheckSignals() != 0; }
}  // namespace

shm::GilHooks python_gil_hooks(PyThreadState** ts) { return shm::GilHooks{gil_release, gil_acquire, ts, check_signals}; }

std::size_t finish_header(std::uint8_t* hdr, std::uint32_t ndim, const std::string& wire, std::uint64_t payload_len,
                          const char* what) {
    if (wire.size() > shm::kMaxDtypeLen)
        raise(PyExc_ValueError, std::string(what) + ": dtype description longer than 1024 characters is not supported");
    return shm::build_msg_header(hdr, ndim, reinterpret_cast<const std::uint64_t*>(hdr + sizeof(MsgHeader)), wire,
                                 payload_len);
}

namespace {
// One dimension of a loan's shape: an int that fits in 64 bits (negative ones are refused by
// loan_header, with the other shape checks).
std::int64_t loan_dim(PyObject* d) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(d, &overflow);
    if (overflow) raise(PyExc_ValueError, "loan: shape too large");
    if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
    return v;
}

// The dtype a loan asks for, when numpy converts it without complaint: a dtype object as it is,
// a type (np.float32, float) or a name ("<f4", "float32") through numpy's own converter (the one
// np.dtype() uses). None for anything else, and for a failed conversion (its error dropped):
// shm.py's _loan_args then raises the error that names the call.
std::optional<py::dtype> plain_loan_dtype(const py::object& dtype) {
    if (py::isinstance<py::dtype>(dtype)) return py::reinterpret_borrow<py::dtype>(dtype);
    if (!PyType_Check(dtype.ptr()) && !PyUnicode_CheckExact(dtype.ptr())) return std::nullopt;
    try {
        return py::dtype::from_args(dtype);
    } catch (py::error_already_set&) {
        return std::nullopt;  // the error is dropped with the exception object
    }
}
}  // namespace

// The (shape, dtype) of a loan request. The common case (an int or a tuple of ints, and a dtype,
// a scalar type or a dtype name without Python objects in it) is read here; anything else goes
// through shm.py's _loan_args, which converts it or raises TypeError naming `what`. A loan is a
// per-message call, and the caches are cold when it follows a large copy, so reading the common
// case here halves its cost. evidence: shm-loan-request-in-cpp
LoanRequest loan_request(const char* what, const py::object& shape, const py::object& dtype) {
    constexpr std::uint64_t kHasObject = 0x01;  // NPY_ITEM_HASOBJECT
    PyObject* sh = shape.ptr();
    bool plain_shape = PyLong_CheckExact(sh);
    if (!plain_shape && PyTuple_CheckExact(sh)) {
        plain_shape = true;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sh); ++i)
            if (!PyLong_CheckExact(PyTuple_GET_ITEM(sh, i))) plain_shape = false;
    }
    std::optional<py::dtype> plain_dtype;
    if (plain_shape) plain_dtype = plain_loan_dtype(dtype);
    if (plain_dtype) {
        py::dtype dt = *plain_dtype;
        if (!(dt.flags() & kHasObject)) {
            LoanRequest r{{}, dt};
            if (PyLong_CheckExact(sh)) {
                r.shape.push_back(loan_dim(sh));
            } else {
                r.shape.reserve(static_cast<std::size_t>(PyTuple_GET_SIZE(sh)));
                for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sh); ++i) r.shape.push_back(loan_dim(PyTuple_GET_ITEM(sh, i)));
            }
            return r;
        }
    }
    if (!support().loan_args) raise(PyExc_RuntimeError, std::string(what) + ": fastcopy.shm is not initialised");
    py::tuple checked = support().loan_args(what, shape, dtype);
    py::tuple dims = checked[0];
    LoanRequest r{{}, py::reinterpret_borrow<py::dtype>(checked[1])};
    for (py::handle d : dims) r.shape.push_back(loan_dim(d.ptr()));
    return r;
}

// Builds the header of a loan of `shape_in` elements of `dt` into hdr; returns its length and

py::object view_array(const py::object& base, const DtypeEntry& de, const MsgInfo& info, const std::uint8_t* p,
                      bool cow, const std::string& name) {
    std::vector<py::ssize_t> shape(info.shape, info.shape + info.ndim);
    auto* data = const_cast<std::uint8_t*>(p);
    // An empty message has no page to map: its array has no bytes to write either.
    if (cow && info.payload_len > 0) {
        ShmSlot& slot = base.cast<ShmSlot&>();
        slot.private_pages = shm::map_private_pages(*slot.mapping, p, info.payload_len, data, name);
    }
    return make_array(de.dtype, shape, data, base, cow, nullptr);
}

py::object make_array(const py::object& dtype, const std::vector<py::ssize_t>& shape, void* ptr,
                      const py::object& base, bool writable, PyObject* subtype) {
    auto& api = py::detail::npy_api::get();
    PyObject* descr = dtype.inc_ref().ptr();  // stolen by PyArray_NewFromDescr
    PyObject* arr = api.PyArray_NewFromDescr_(subtype ? reinterpret_cast<PyTypeObject*>(subtype) : api.PyArray_Type_, descr,
                                              static_cast<int>(shape.size()),
                                              const_cast<Py_intptr_t*>(shape.data()), nullptr, ptr,
                                              writable ? py::detail::npy_api::NPY_ARRAY_WRITEABLE_ : 0, nullptr);
    if (!arr) throw py::error_already_set();
    py::object result = py::reinterpret_steal<py::object>(arr);
    if (api.PyArray_SetBaseObject_(arr, base.inc_ref().ptr()) != 0) throw py::error_already_set();
    return result;
}

std::string shape_words(const MsgInfo& info) {
    std::string s = "(";
    for (std::uint32_t i = 0; i < info.ndim; ++i) {
        s += std::to_string(info.shape[i]);
        if (info.ndim == 1 || i + 1 < info.ndim) s += ",";
        if (i + 1 < info.ndim) s += " ";
    }
    return s + ")";
}

void make_read_only(const py::object& arr) {
    py::detail::array_proxy(arr.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
}

std::string payload_mismatch(const MsgInfo& info, const DtypeEntry& de) {
    std::uint64_t count = 1, bytes = 0;
    for (std::uint32_t i = 0; i < info.ndim; ++i) count *= info.shape[i];  // overflow checked by the reader
    if (!__builtin_mul_overflow(count, static_cast<std::uint64_t>(de.itemsize), &bytes) && bytes == info.payload_len)
        return "";
    return "message header is corrupt: shape product x itemsize (" + std::to_string(count) + " x " +
           std::to_string(de.itemsize) + ") != payload length " + std::to_string(info.payload_len);
}

void check_out_type(const py::object& out) {
    if (!out.is_none() && !PyObject_CheckBuffer(out.ptr()) && !exports_foreign_array(out.ptr()))
        raise(PyExc_TypeError, std::string("recv: out must be None, a numpy array, a writable C-contiguous "
                                           "buffer or a CPU array exporting DLPack (torch, JAX), got ") +
                                   Py_TYPE(out.ptr())->tp_name);
}

py::object foreign_as_numpy(const py::handle& obj, const char* what) {
    if (!is_foreign_array(obj.ptr())) return py::object();
    PyObject* arr = foreign_array(obj.ptr(), what);
    if (!arr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(arr);
}

}  // namespace shmpy
}  // namespace fastcopy
