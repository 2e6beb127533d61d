// Python bindings for the shared-memory channel (fastcopy.shm) and its primitives.
//
// _core.ShmRing is the fast path: send() and recv() each do validation, the copy into or
// out of the ring (fastcopy's ToShared / FromShared policy entries) and the index publish
// in one call, releasing the GIL only for waits and large copies. fastcopy.shm.Channel
// subclasses it in Python.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <sys/mman.h>
#include <unordered_map>
#include <vector>

#include "python/gil.h"
#include "shm/shm_sync.h"
#include "shm/shm_topic.h"

namespace py = pybind11;

namespace fastcopy {
// Defined in bindings.cpp: how fastcopy.copy finds the store mode of a loan it writes into.
extern policy::SharedWriteMode* (*g_loan_write_mode)(PyObject* dst);
namespace {

using shm::MsgHeader;
using shm::MsgInfo;
using shm::Ring;

// Python-side support set by fastcopy.shm at import: exception classes and dtype helpers.
struct Support {
    py::object error, corrupted, peer_died, closed;   // ChannelError and subclasses
    py::object dtype_to_wire, dtype_from_wire;         // callables
    py::object ascontiguousarray;
    py::object generic_type, asarray;                  // numpy scalars travel as 0-d arrays
    py::object loaned_array_type;                      // fastcopy.shm.LoanedArray
    py::object messages_lost;                          // fastcopy.shm.MessagesLost(count, message)
    py::object bad_argument;                           // fastcopy.shm.ChannelValueError
    py::object loan_args;                              // fastcopy.shm._loan_args(what, shape, dtype)
};
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
        PyErr_Clear();
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

void gil_release(void* ctx) { *static_cast<PyThreadState**>(ctx) = PyEval_SaveThread(); }
// Parks the thread at interpreter exit instead of unwinding it through the ring's C++ frames
// and destructors (gil.h): a daemon thread blocked in a channel call used to abort the exit.
void gil_acquire(void* ctx) { restore_thread_or_park(*static_cast<PyThreadState**>(ctx)); }
int check_signals(void*) { return PyErr_CheckSignals() != 0; }

// The base object of a loaned array or a received view: holds its slot of the ring (and the
// mapping) until numpy drops the last array that depends on it, then releases the slot. It
// exports no buffer, so numpy cannot find a writable base behind a view and refuses
// `arr.flags.writeable = True` (see docs/shm.md, "Views are read-only").
struct ShmSlot {
    std::shared_ptr<shm::SlotLedger> ledger;
    // The array's memory: mapped for as long as this object (the array's base) lives, also
    // after the slot is released (a published or discarded loan stays readable).
    std::shared_ptr<shm::Mapping> mapping;
    std::uint64_t id = 0;
    bool is_loan = false;
    std::uint64_t nbytes = 0;
    py::object channel;  // loans: the Channel (or Topic), for `with` and publish
    std::shared_ptr<shm::TopicLedger> topic;  // set instead of ledger for a Topic's loans and views
    std::shared_ptr<policy::SharedWriteMode> write_mode;  // loans: how copies into them store (the ring's)
    ShmSlot() = default;
    ShmSlot(const ShmSlot&) = delete;
    ShmSlot& operator=(const ShmSlot&) = delete;
    // Runs in the dealloc of the Python object, with the GIL, on any thread, possibly after the
    // Channel was closed or at interpreter exit: touches only the ledger (its own mutex) and
    // the shared header words, which stay mapped as long as the ledger holds the mapping.
    ~ShmSlot() { release(); }
    void release() {
        if (topic && id != 0) {
            if (is_loan) topic->end_loan(id);
            else topic->release_view(id);
            id = 0;
            return;
        }
        if (!ledger || id == 0) return;
        if (is_loan) ledger->end_loan(id);
        else ledger->release_view(id);
        id = 0;
    }
};

struct DtypeEntry {
    py::object dtype;
    std::size_t itemsize;
};

// The dtype <-> wire string conversions of one Channel or Topic end, cached.
class DtypeCodec {
public:
    // TypeError naming `what` (send, loan) for a dtype no header text describes exactly.
    const std::string& wire_of(const py::dtype& dt, const char* what) {
        auto it = wire_cache_.find(dt.ptr());
        if (it != wire_cache_.end()) return it->second.second;
        std::string w = support().dtype_to_wire(dt, what).cast<std::string>();
        // Longer texts are refused by finish_header (ValueError), with each message.
        if (w.size() <= shm::kMaxDtypeLen && !shm::dtype_text_ok(w.data(), w.size()))
            raise(PyExc_TypeError, std::string(what) + ": the description of this dtype cannot be sent: it is not "
                                       "printable ASCII");
        if (wire_cache_.size() < 64) return wire_cache_.emplace(dt.ptr(), std::make_pair(py::object(dt), w)).first->second.second;
        scratch_wire_ = w;
        return scratch_wire_;
    }
    // nullptr when the wire string cannot be decoded (the caller reports it as corrupt).
    const DtypeEntry* dtype_of(const std::string& wire, std::string& why) {
        auto it = dtype_cache_.find(wire);
        if (it != dtype_cache_.end()) return &it->second;
        py::object dt;
        try {
            dt = support().dtype_from_wire(wire);
        } catch (py::error_already_set& e) {
            why = "message header is corrupt: dtype '" + wire.substr(0, 80) + "' cannot be decoded (" +
                  std::string(e.what()).substr(0, 200) + ")";
            return nullptr;
        }
        DtypeEntry entry{dt, dt.attr("itemsize").cast<std::size_t>()};
        if (dtype_cache_.size() < 256) return &dtype_cache_.emplace(wire, std::move(entry)).first->second;
        scratch_dtype_ = std::move(entry);
        return &scratch_dtype_;
    }

private:
    std::unordered_map<PyObject*, std::pair<py::object, std::string>> wire_cache_;
    std::unordered_map<std::string, DtypeEntry> dtype_cache_;
    std::string scratch_wire_;
    DtypeEntry scratch_dtype_;
};

// Finishes a message header whose magic, ndim and shape (after MsgHeader) are set: writes
// the dtype wire string, the lengths and the zero padding into hdr; returns header_len.
std::size_t finish_header(MsgHeader& h, std::uint8_t* hdr, const std::string& wire, std::uint64_t payload_len,
                          const char* what) {
    if (wire.size() > shm::kMaxDtypeLen)
        raise(PyExc_ValueError, std::string(what) + ": dtype description longer than 1024 characters is not supported");
    h.dtype_len = static_cast<std::uint32_t>(wire.size());
    std::size_t raw = sizeof(MsgHeader) + 8 * h.ndim + h.dtype_len;
    std::size_t hdr_len = shm::pad64(raw);
    h.header_len = static_cast<std::uint32_t>(hdr_len);
    h.payload_len = payload_len;
    std::memcpy(hdr, &h, sizeof h);
    std::memcpy(hdr + sizeof(MsgHeader) + 8 * h.ndim, wire.data(), wire.size());
    std::memset(hdr + raw, 0, hdr_len - raw);
    return hdr_len;
}

// Builds the message header (MsgHeader, shape, dtype) of `obj` into hdr and calls
// fn(hdr_len, data, nbytes) while obj's buffer is held. TypeError/ValueError name `what`.
template <class Fn>
void with_message(DtypeCodec& codec, py::handle obj, const char* what, std::uint8_t* hdr, Fn fn) {
    MsgHeader h{};
    h.magic = shm::kMsgMagic;
    auto* shape = reinterpret_cast<std::uint64_t*>(hdr + sizeof(MsgHeader));
    const void* ptr = nullptr;
    std::size_t nbytes = 0;
    const std::string* wire = nullptr;
    Py_buffer view;
    bool have_view = false;
    py::array arr;
    bool is_array = py::isinstance<py::array>(obj);
    if (!is_array && support().generic_type && PyObject_IsInstance(obj.ptr(), support().generic_type.ptr()) == 1) {
        arr = support().asarray(obj);
        is_array = true;
    } else if (is_array) {
        arr = py::reinterpret_borrow<py::array>(obj);
    }
    if (is_array) {
        if (!(arr.flags() & py::array::c_style)) arr = support().ascontiguousarray(arr);
        wire = &codec.wire_of(arr.dtype(), what);
        std::size_t nd = static_cast<std::size_t>(arr.ndim());
        if (nd > shm::kMaxNdim) raise(PyExc_ValueError, std::string(what) + ": arrays with more than 64 dimensions are not supported");
        h.ndim = static_cast<std::uint32_t>(nd);
        for (std::size_t i = 0; i < nd; ++i) shape[i] = static_cast<std::uint64_t>(arr.shape(i));
        ptr = arr.data();
        nbytes = static_cast<std::size_t>(arr.nbytes());
    } else {
        if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
            PyErr_Clear();
            raise(PyExc_TypeError, std::string(what) + ": expected a numpy array or a C-contiguous buffer, got " +
                                       Py_TYPE(obj.ptr())->tp_name);
        }
        have_view = true;
        static const std::string u1 = "|u1";
        wire = &u1;
        h.ndim = 1;
        shape[0] = static_cast<std::uint64_t>(view.len);
        ptr = view.buf;
        nbytes = static_cast<std::size_t>(view.len);
    }
    struct ViewRelease {
        Py_buffer* v;
        bool on;
        ~ViewRelease() { if (on) PyBuffer_Release(v); }
    } release_view{&view, have_view};
    fn(finish_header(h, hdr, *wire, nbytes, what), ptr, nbytes);
}

// One dimension of a loan's shape: an int that fits in 64 bits (negative ones are refused by
// loan_header, with the other shape checks).
std::int64_t loan_dim(PyObject* d) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(d, &overflow);
    if (overflow) raise(PyExc_ValueError, "loan: shape too large");
    if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
    return v;
}

struct LoanRequest {
    std::vector<std::int64_t> shape;
    py::dtype dtype;
};

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

// The (shape, dtype) of a loan request. The common case (an int or a tuple of ints, and a dtype,
// a scalar type or a dtype name without Python objects in it) is read here; anything else goes
// through shm.py's _loan_args, which converts it or raises TypeError naming `what`. A loan is a
// per-message call, and the caches are cold when it follows a large copy: on the Zen 3 VM, after
// a 16 MiB copy, Channel.loan cost 51 us with its checks in Python and 24.5 us with them here
// (medians of 60). With the dtype given as np.uint8 or "uint8", a 64-byte loan + discard took
// 3.7-4.2 us with the conversion in Python and 2.2-2.8 us with it here, as a dtype object does
// (medians of 9 runs of 50000, two interleaved rounds of both builds).
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
// sets nbytes. `check_size(overflow, count, nbytes)` raises when the payload cannot be loaned.
template <class Check>
std::size_t loan_header(DtypeCodec& codec, const py::dtype& dt, const std::vector<std::int64_t>& shape_in,
                        std::uint8_t* hdr, std::uint64_t& nbytes, Check check_size) {
    MsgHeader h{};
    h.magic = shm::kMsgMagic;
    if (shape_in.size() > shm::kMaxNdim) raise(PyExc_ValueError, "loan: more than 64 dimensions are not supported");
    auto* shape = reinterpret_cast<std::uint64_t*>(hdr + sizeof(MsgHeader));
    std::uint64_t count = 1;
    for (std::size_t i = 0; i < shape_in.size(); ++i) {
        if (shape_in[i] < 0) raise(PyExc_ValueError, "loan: negative dimension in shape");
        shape[i] = static_cast<std::uint64_t>(shape_in[i]);
        if (__builtin_mul_overflow(count, shape[i], &count)) raise(PyExc_ValueError, "loan: shape too large");
    }
    nbytes = 0;
    bool overflow = __builtin_mul_overflow(count, static_cast<std::uint64_t>(dt.itemsize()), &nbytes);
    check_size(overflow, count, nbytes);
    h.ndim = static_cast<std::uint32_t>(shape_in.size());
    return finish_header(h, hdr, codec.wire_of(dt, "loan"), nbytes, "loan");
}

class PyRing {
public:
    PyRing(const std::string& name, std::size_t capacity, bool create)
        : ring_(create ? Ring::create(name, capacity) : Ring::attach(name)) {}

    void send(py::handle obj, const py::object& timeout) {
        double t = timeout_arg(timeout, "send");
        alignas(64) std::uint8_t hdr[sizeof(MsgHeader) + 8 * shm::kMaxNdim + shm::kMaxDtypeLen + 64];
        with_message(codec_, obj, "send", hdr, [&](std::size_t hdr_len, const void* ptr, std::size_t nbytes) {
            PyThreadState* ts = nullptr;
            Ring::GilHooks hooks{gil_release, gil_acquire, &ts, check_signals};
            if (!ring_->send(hdr, hdr_len, ptr, nbytes, t, hooks))
                raise(PyExc_TimeoutError, "send timed out after " + seconds_words(t) +
                                              ": the ring is full (is the consumer reading?)");
        });
    }

    py::object recv(const py::object& out, const py::object& timeout) {
        double t = timeout_arg(timeout, "recv");
        // Check the type of `out` before waiting (its size can only be checked against a message).
        if (!out.is_none() && !PyObject_CheckBuffer(out.ptr()))
            raise(PyExc_TypeError, std::string("recv: out must be None, a numpy array or a writable C-contiguous "
                                               "buffer, got ") + Py_TYPE(out.ptr())->tp_name);
        PyThreadState* ts = nullptr;
        Ring::GilHooks hooks{gil_release, gil_acquire, &ts, check_signals};
        const TimeLeft left(t);
        // Again after a message the producer cut while it was read (consume() false).
        for (;;) {
            MsgInfo info;
            if (!ring_->peek(info, left(), hooks))
                raise(PyExc_TimeoutError, "recv timed out after " + seconds_words(t) + ": no message arrived");
            if (py::object got = recv_one(info, out, left(), hooks)) return got;
        }
    }

private:
    // The time left of a timeout (negative: none) for each wait of one call.
    struct TimeLeft {
        double t, deadline;
        explicit TimeLeft(double timeout) : t(timeout), deadline(timeout < 0 ? 0 : shm::monotonic_seconds() + timeout) {}
        double operator()() const { return t < 0 ? -1.0 : std::max(0.0, deadline - shm::monotonic_seconds()); }
    };

    // The message peeked, copied into `out` (returned) or a new array; a null object when
    // the producer cut it (then `out` may hold part of it).
    py::object recv_one(const MsgInfo& info, const py::object& out, double t, const Ring::GilHooks& hooks) {
        const DtypeEntry& de = checked_dtype(info);
        if (!ring_->resuming()) drop_partial();  // skipped: the producer cut it
        if (out.is_none()) {
            py::array result;
            const bool has_partial = ring_->resuming() && partial_array_;  // the array the last recv filled part of
            if (has_partial) {
                result = py::reinterpret_steal<py::array>(partial_array_.release());
            } else {
                std::vector<py::ssize_t> shape(info.shape, info.shape + info.ndim);
                result = py::array(py::reinterpret_borrow<py::dtype>(de.dtype), shape);
            }
            if (!consume_into(info, result.mutable_data(), result, has_partial, t, hooks)) return py::object();
            return std::move(result);
        }
        if (py::isinstance<py::array>(out)) {
            py::array o = py::reinterpret_borrow<py::array>(out);
            bool shape_ok = static_cast<std::uint32_t>(o.ndim()) == info.ndim;
            for (std::uint32_t i = 0; shape_ok && i < info.ndim; ++i)
                shape_ok = static_cast<std::uint64_t>(o.shape(i)) == info.shape[i];
            bool dtype_ok = o.dtype().equal(de.dtype);
            if (!shape_ok || !dtype_ok)
                raise(PyExc_ValueError, "recv: out has dtype " + py::str(o.dtype()).cast<std::string>() + " and shape " +
                                            py::str(o.attr("shape")).cast<std::string>() + " but the message is " +
                                            py::str(de.dtype).cast<std::string>() + " with shape " +
                                            shape_words(info) + " (the message stays in the channel)");
            if (!(o.flags() & py::array::c_style))
                raise(PyExc_ValueError, "recv: out must be C-contiguous");
            if (!o.writeable()) raise(PyExc_ValueError, "recv: out is read-only");
            return consume_into(info, o.mutable_data(), py::object(), false, t, hooks) ? out : py::object();
        }
        Py_buffer view;
        if (PyObject_GetBuffer(out.ptr(), &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
            PyErr_Clear();
            raise(PyExc_TypeError, std::string("recv: out must be a writable C-contiguous buffer, got ") +
                                       Py_TYPE(out.ptr())->tp_name);
        }
        struct ViewRelease {
            Py_buffer* v;
            ~ViewRelease() { PyBuffer_Release(v); }
        } release_view{&view};
        if (static_cast<std::uint64_t>(view.len) != info.payload_len)
            raise(PyExc_ValueError, "recv: out has " + std::to_string(view.len) + " bytes but the message has " +
                                        std::to_string(info.payload_len) + " (dtype " +
                                        py::str(de.dtype).cast<std::string>() + ", shape " + shape_words(info) +
                                        "; the message stays in the channel)");
        return consume_into(info, view.buf, py::object(), false, t, hooks) ? out : py::object();
    }

    // consume() into dst, resuming a message a recv gave up half way (Ring::resuming): unless
    // dst already holds them (has_partial), its first bytes come from where that recv kept
    // them. When this one times out or is interrupted half way in turn, it keeps what it
    // received: `own` (the new array dst is in) as it is, a caller's buffer as a copy (the
    // caller may reuse it meanwhile). Out of memory for the copy gives the message up.
    bool consume_into(const MsgInfo& info, void* dst, const py::object& own, bool has_partial, double t,
                      const Ring::GilHooks& hooks) {
        if (ring_->resuming() && !has_partial) {
            const void* from = partial_array_ ? py::reinterpret_borrow<py::array>(partial_array_).data()
                                              : static_cast<const void*>(partial_bytes_.data());
            std::memcpy(dst, from, ring_->partial_bytes());
        }
        drop_partial();  // dst holds the first bytes now
        try {
            return ring_->consume(info, dst, t, hooks);
        } catch (const shm::ShmError& e) {
            if (ring_->resuming() && !keep_partial(dst, own)) {
                // The timeout's own words promise that the next recv goes on: no longer true.
                if (dynamic_cast<const shm::ShmTimeout*>(&e))
                    throw shm::ShmTimeout("recv timed out in the middle of a message larger than the ring, and there "
                                          "was no memory to keep the part received of it: the message is given up "
                                          "and the channel is unusable (both ends get ChannelError from now on)");
            }
            throw;
        }
    }

    // Keeps the part of a message a recv received before it gave up half way (see
    // consume_into). False when there is no memory for the copy: the message is given up then.
    bool keep_partial(const void* dst, const py::object& own) {
        try {
            if (own) {
                partial_array_ = own;
            } else {
                const auto* d = static_cast<const std::uint8_t*>(dst);
                partial_bytes_.assign(d, d + ring_->partial_bytes());
            }
            return true;
        } catch (const std::bad_alloc&) {
            ring_->give_up_partial();
            return false;
        }
    }

    void drop_partial() {
        partial_array_ = py::object();
        std::vector<std::uint8_t>().swap(partial_bytes_);
    }

public:

    // The next message as a read-only array pointing into the ring (see ShmSlot).
    py::object recv_view(const py::object& timeout) {
        double t = timeout_arg(timeout, "recv_view");
        PyThreadState* ts = nullptr;
        Ring::GilHooks hooks{gil_release, gil_acquire, &ts, check_signals};
        const TimeLeft left(t);
        MsgInfo info;
        const std::uint8_t* p = nullptr;
        std::uint64_t id = 0;
        const DtypeEntry* de = nullptr;
        for (;;) {  // again after a message the producer cut while it was read
            if (!ring_->peek(info, left(), hooks))
                raise(PyExc_TimeoutError, "recv_view timed out after " + seconds_words(t) + ": no message arrived");
            de = &checked_dtype(info);
            bool timed_out = false;
            p = ring_->take_view(info, left(), hooks, id, timed_out);
            if (timed_out)
                raise(PyExc_TimeoutError, "recv_view timed out after " + seconds_words(t) +
                                              ": the message was not complete (it stays in the channel)");
            if (p) break;
            // Not one piece of the ring (a sent message that wraps, or one larger than the
            // ring): a read-only copy, which holds no slot.
            py::object result = recv_one(info, py::none(), left(), hooks);
            if (!result) continue;
            py::detail::array_proxy(result.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
            return result;
        }
        std::vector<py::ssize_t> shape(info.shape, info.shape + info.ndim);
        auto slot = std::make_unique<ShmSlot>();
        slot->ledger = ring_->ledger();
        slot->mapping = ring_->ledger()->mapping_ref();
        slot->id = id;
        slot->nbytes = info.payload_len;
        py::object base = py::cast(std::move(slot));  // from here its destructor releases the view
        return make_array(de->dtype, shape, const_cast<std::uint8_t*>(p), base, false, nullptr);
    }

    // A writable array of (shape, dtype) in the ring; publish_loan() sends it.
    py::object loan(const py::object& self, const py::object& shape, const py::object& dtype,
                    const py::object& timeout) {
        const LoanRequest req = loan_request("Channel.loan", shape, dtype);
        const std::vector<std::int64_t>& shape_in = req.shape;
        const py::dtype& dt = req.dtype;
        double t = timeout_arg(timeout, "loan");
        alignas(64) std::uint8_t hdr[sizeof(MsgHeader) + 8 * shm::kMaxNdim + shm::kMaxDtypeLen + 64];
        std::uint64_t nbytes = 0;
        const std::size_t cap = ring_->capacity();
        std::size_t hdr_len = loan_header(codec_, dt, shape_in, hdr, nbytes,
                                          [&](bool overflow, std::uint64_t count, std::uint64_t n) {
            if (overflow || n > cap)
                raise(PyExc_ValueError, "loan: " + std::to_string(count) + " elements of " +
                                            std::to_string(dt.itemsize()) + " bytes do not fit in the ring (capacity " +
                                            std::to_string(cap) + " bytes; use send() for larger messages)");
        });
        if (hdr_len + shm::pad64(nbytes) > cap)
            raise(PyExc_ValueError, "loan: the message (" + std::to_string(hdr_len + shm::pad64(nbytes)) +
                                        " bytes with its header) does not fit in the ring (capacity " +
                                        std::to_string(cap) + " bytes; use send() for larger messages)");
        PyThreadState* ts = nullptr;
        Ring::GilHooks hooks{gil_release, gil_acquire, &ts, check_signals};
        std::uint64_t id = 0;
        std::uint8_t* p = ring_->loan(hdr, hdr_len, nbytes, t, hooks, id);
        if (!p)
            raise(PyExc_TimeoutError, "loan timed out after " + seconds_words(t) +
                                          ": the ring is full (is the consumer reading, or holding views?)");
        auto slot = std::make_unique<ShmSlot>();
        slot->ledger = ring_->ledger();
        slot->mapping = ring_->ledger()->mapping_ref();
        slot->id = id;
        slot->is_loan = true;
        slot->nbytes = nbytes;
        slot->channel = self;
        slot->write_mode = ring_->write_mode();
        py::object base = py::cast(std::move(slot));  // from here its destructor ends the loan
        std::vector<py::ssize_t> shp(shape_in.begin(), shape_in.end());
        PyObject* sub = support().loaned_array_type ? support().loaned_array_type.ptr() : nullptr;
        return make_array(dt, shp, p, base, true, sub);
    }

    // The ShmSlot of a loaned array of this channel (ValueError otherwise).
    ShmSlot& loan_slot_of(const py::object& arr, const char* what) {
        py::object base = py::none();
        if (py::isinstance<py::array>(arr)) base = arr.attr("base");
        if (base.is_none() || !py::isinstance<ShmSlot>(base))
            raise(PyExc_ValueError, std::string(what) + ": expected the array that loan() returned (not a copy, "
                                                        "slice or view of it)");
        ShmSlot& slot = base.cast<ShmSlot&>();
        if (!slot.is_loan || slot.ledger != ring_->ledger())
            raise(PyExc_ValueError, std::string(what) + ": this array is not a loan of this channel");
        return slot;
    }

    void publish(const py::object& arr) {
        ShmSlot& slot = loan_slot_of(arr, "publish");
        if (slot.id == 0) raise(support().error, "publish: this loan was published or discarded already");
        std::uint64_t id = slot.id;
        slot.id = 0;  // over, whatever happens below
        // The array must not be written any more: the consumer may be reading it.
        py::detail::array_proxy(arr.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
        ring_->publish_loan(id);
    }

    void discard(const py::object& arr) {
        ShmSlot& slot = loan_slot_of(arr, "discard");
        py::detail::array_proxy(arr.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
        slot.release();
    }

    // The next message's (dtype, shape) without consuming it; None on timeout.
    py::object peek(const py::object& timeout) {
        double t = timeout_arg(timeout, "peek");
        PyThreadState* ts = nullptr;
        Ring::GilHooks hooks{gil_release, gil_acquire, &ts, check_signals};
        MsgInfo info;
        if (!ring_->peek(info, t, hooks)) return py::none();
        const DtypeEntry& de = dtype_of(info.dtype);
        py::tuple shape(info.ndim);
        for (std::uint32_t i = 0; i < info.ndim; ++i) shape[i] = py::int_(info.shape[i]);
        return py::make_tuple(de.dtype, shape);
    }

    Ring& ring() { return *ring_; }

    // An array over ring memory whose base is `base` (a ShmSlot); read-only unless writable.
    static py::object make_array(const py::object& dtype, const std::vector<py::ssize_t>& shape, void* ptr,
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

    static std::string shape_words(const MsgInfo& info) {
        std::string s = "(";
        for (std::uint32_t i = 0; i < info.ndim; ++i) {
            s += std::to_string(info.shape[i]);
            if (info.ndim == 1 || i + 1 < info.ndim) s += ",";
            if (i + 1 < info.ndim) s += " ";
        }
        return s + ")";
    }

private:
    // The message's dtype, checked against its payload length (ChannelCorrupted otherwise).
    const DtypeEntry& checked_dtype(const MsgInfo& info) {
        const DtypeEntry& de = dtype_of(info.dtype);
        std::uint64_t count = 1, bytes = 0;
        for (std::uint32_t i = 0; i < info.ndim; ++i) count *= info.shape[i];  // overflow checked by peek
        if (__builtin_mul_overflow(count, static_cast<std::uint64_t>(de.itemsize), &bytes) || bytes != info.payload_len) {
            std::string why = "message header is corrupt: shape product x itemsize (" + std::to_string(count) +
                              " x " + std::to_string(de.itemsize) + ") != payload length " +
                              std::to_string(info.payload_len);
            ring_->mark_broken(why);
            raise(support().corrupted, why);
        }
        return de;
    }

    const DtypeEntry& dtype_of(const std::string& wire) {
        std::string why;
        const DtypeEntry* de = codec_.dtype_of(wire, why);
        if (!de) {
            ring_->mark_broken(why);
            raise(support().corrupted, why);
        }
        return *de;
    }

    std::unique_ptr<Ring> ring_;
    DtypeCodec codec_;
    // What a recv that timed out or was interrupted in the middle of a message received of it
    // (Ring::resuming): the array it was filling, or a copy of the caller's buffer.
    py::object partial_array_;
    std::vector<std::uint8_t> partial_bytes_;
};

// ---- Topic (one publisher, many subscribers; see shm_topic.h) -----------------------------------
using shm::Topic;
using shm::TopicMsg;

class PyTopic {
public:
    // create: the publisher; otherwise a subscriber of the existing topic `name`.
    PyTopic(const std::string& name, std::uint64_t slot_bytes, std::uint32_t slots, std::uint32_t history,
            const std::string& overflow, std::uint32_t max_subscribers, bool create) {
        if (create) {
            if (overflow != "block" && overflow != "drop")
                raise(PyExc_ValueError, "Topic.create: overflow must be 'block' or 'drop', got '" + overflow + "'");
            try {
                topic_.reset(Topic::create(name, slot_bytes, slots, history,
                                           overflow == "drop" ? shm::Overflow::Drop : shm::Overflow::Block,
                                           max_subscribers));
            } catch (const shm::ShmOsError&) {
                throw;
            } catch (const shm::ShmError& e) {
                if (std::strncmp(e.what(), "Topic.create: ", 14) == 0) raise(PyExc_ValueError, e.what());
                throw;
            }
        } else {
            topic_.reset(Topic::subscribe(name));
        }
    }

    void send(py::handle obj, const py::object& timeout) {
        double t = timeout_arg(timeout, "send");
        alignas(64) std::uint8_t hdr[sizeof(MsgHeader) + 8 * shm::kMaxNdim + shm::kMaxDtypeLen + 64];
        with_message(codec_, obj, "send", hdr, [&](std::size_t hdr_len, const void* ptr, std::size_t nbytes) {
            if (topic_->closed()) throw shm::ShmUseAfterClose("operation on a closed Topic publisher");
            if (nbytes > topic_->geometry().slot_bytes)
                raise(PyExc_ValueError, "send: the message has " + std::to_string(nbytes) +
                                            " bytes, more than the topic's slot_bytes (" +
                                            std::to_string(topic_->geometry().slot_bytes) + "); nothing was sent");
            PyThreadState* ts = nullptr;
            Ring::GilHooks hooks{gil_release, gil_acquire, &ts, check_signals};
            if (!topic_->send(hdr, hdr_len, ptr, nbytes, t, hooks))
                raise(PyExc_TimeoutError, "send timed out after " + seconds_words(t) +
                                              ": a subscriber has not read the message in the slot (or holds a view of it)");
        });
    }

    py::object loan(const py::object& self, const py::object& shape, const py::object& dtype,
                    const py::object& timeout) {
        const LoanRequest req = loan_request("Topic.loan", shape, dtype);
        const std::vector<std::int64_t>& shape_in = req.shape;
        const py::dtype& dt = req.dtype;
        double t = timeout_arg(timeout, "loan");
        alignas(64) std::uint8_t hdr[sizeof(MsgHeader) + 8 * shm::kMaxNdim + shm::kMaxDtypeLen + 64];
        std::uint64_t nbytes = 0;
        std::size_t hdr_len = loan_header(codec_, dt, shape_in, hdr, nbytes,
                                          [&](bool overflow, std::uint64_t count, std::uint64_t n) {
            if (topic_->closed()) throw shm::ShmUseAfterClose("operation on a closed Topic publisher");
            const std::uint64_t limit = topic_->geometry().slot_bytes;
            if (overflow || n > limit)
                raise(PyExc_ValueError, "loan: " + std::to_string(count) + " elements of " +
                                            std::to_string(dt.itemsize()) + " bytes are more than the topic's slot_bytes (" +
                                            std::to_string(limit) + ")");
        });
        PyThreadState* ts = nullptr;
        Ring::GilHooks hooks{gil_release, gil_acquire, &ts, check_signals};
        std::uint64_t id = 0;
        std::uint8_t* p = topic_->loan(hdr, hdr_len, nbytes, t, hooks, id);
        if (!p)
            raise(PyExc_TimeoutError, "loan timed out after " + seconds_words(t) +
                                          ": a subscriber has not read the message in the slot (or holds a view of it)");
        auto slot = std::make_unique<ShmSlot>();
        slot->topic = topic_->ledger();
        slot->mapping = topic_->ledger()->mapping;
        slot->id = id;
        slot->is_loan = true;
        slot->nbytes = nbytes;
        slot->channel = self;
        slot->write_mode = topic_->write_mode();
        py::object base = py::cast(std::move(slot));
        std::vector<py::ssize_t> shp(shape_in.begin(), shape_in.end());
        PyObject* sub = support().loaned_array_type ? support().loaned_array_type.ptr() : nullptr;
        return PyRing::make_array(dt, shp, p, base, true, sub);
    }

    ShmSlot& loan_slot_of(const py::object& arr, const char* what) {
        py::object base = py::none();
        if (py::isinstance<py::array>(arr)) base = arr.attr("base");
        if (base.is_none() || !py::isinstance<ShmSlot>(base))
            raise(PyExc_ValueError, std::string(what) + ": expected the array that loan() returned (not a copy, "
                                                        "slice or view of it)");
        ShmSlot& slot = base.cast<ShmSlot&>();
        if (!slot.is_loan || slot.topic != topic_->ledger())
            raise(PyExc_ValueError, std::string(what) + ": this array is not a loan of this topic");
        return slot;
    }

    void publish(const py::object& arr) {
        ShmSlot& slot = loan_slot_of(arr, "publish");
        if (slot.id == 0) raise(support().error, "publish: this loan was published or discarded already");
        std::uint64_t id = slot.id;
        slot.id = 0;
        py::detail::array_proxy(arr.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
        topic_->publish_loan(id);
    }

    void discard(const py::object& arr) {
        ShmSlot& slot = loan_slot_of(arr, "discard");
        py::detail::array_proxy(arr.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
        slot.release();
    }

    py::object recv(const py::object& out, const py::object& timeout) {
        double t = timeout_arg(timeout, "recv");
        if (!out.is_none() && !PyObject_CheckBuffer(out.ptr()))
            raise(PyExc_TypeError, std::string("recv: out must be None, a numpy array or a writable C-contiguous "
                                               "buffer, got ") + Py_TYPE(out.ptr())->tp_name);
        PyThreadState* ts = nullptr;
        Ring::GilHooks hooks{gil_release, gil_acquire, &ts, check_signals};
        TopicMsg msg;
        if (!topic_->next(msg, t, hooks))
            raise(PyExc_TimeoutError, "recv timed out after " + seconds_words(t) + ": no message arrived");
        const MsgInfo& info = msg.info;
        const DtypeEntry& de = checked_dtype(info);
        if (out.is_none()) {
            std::vector<py::ssize_t> shape(info.shape, info.shape + info.ndim);
            py::array result(py::reinterpret_borrow<py::dtype>(de.dtype), shape);
            topic_->consume(msg, result.mutable_data(), hooks);
            return std::move(result);
        }
        if (py::isinstance<py::array>(out)) {
            py::array o = py::reinterpret_borrow<py::array>(out);
            bool shape_ok = static_cast<std::uint32_t>(o.ndim()) == info.ndim;
            for (std::uint32_t i = 0; shape_ok && i < info.ndim; ++i)
                shape_ok = static_cast<std::uint64_t>(o.shape(i)) == info.shape[i];
            if (!shape_ok || !o.dtype().equal(de.dtype))
                raise(PyExc_ValueError, "recv: out has dtype " + py::str(o.dtype()).cast<std::string>() + " and shape " +
                                            py::str(o.attr("shape")).cast<std::string>() + " but the message is " +
                                            py::str(de.dtype).cast<std::string>() + " with shape " +
                                            PyRing::shape_words(info) + " (the message stays in the topic)");
            if (!(o.flags() & py::array::c_style)) raise(PyExc_ValueError, "recv: out must be C-contiguous");
            if (!o.writeable()) raise(PyExc_ValueError, "recv: out is read-only");
            topic_->consume(msg, o.mutable_data(), hooks);
            return out;
        }
        Py_buffer view;
        if (PyObject_GetBuffer(out.ptr(), &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
            PyErr_Clear();
            raise(PyExc_TypeError, std::string("recv: out must be a writable C-contiguous buffer, got ") +
                                       Py_TYPE(out.ptr())->tp_name);
        }
        struct ViewRelease {
            Py_buffer* v;
            ~ViewRelease() { PyBuffer_Release(v); }
        } release_view{&view};
        if (static_cast<std::uint64_t>(view.len) != info.payload_len)
            raise(PyExc_ValueError, "recv: out has " + std::to_string(view.len) + " bytes but the message has " +
                                        std::to_string(info.payload_len) + " (the message stays in the topic)");
        topic_->consume(msg, view.buf, hooks);
        return out;
    }

    py::object recv_view(const py::object& timeout) {
        double t = timeout_arg(timeout, "recv_view");
        PyThreadState* ts = nullptr;
        Ring::GilHooks hooks{gil_release, gil_acquire, &ts, check_signals};
        TopicMsg msg;
        if (!topic_->next(msg, t, hooks))
            raise(PyExc_TimeoutError, "recv_view timed out after " + seconds_words(t) + ": no message arrived");
        const DtypeEntry& de = checked_dtype(msg.info);
        std::vector<py::ssize_t> shape(msg.info.shape, msg.info.shape + msg.info.ndim);
        // The base object exists before the pin, so a failure below cannot leak the pin.
        auto slot = std::make_unique<ShmSlot>();
        slot->topic = topic_->ledger();
        slot->mapping = topic_->ledger()->mapping;
        slot->nbytes = msg.info.payload_len;
        ShmSlot* raw = slot.get();
        py::object base = py::cast(std::move(slot));
        raw->id = topic_->take_view(msg);
        return PyRing::make_array(de.dtype, shape, const_cast<std::uint8_t*>(msg.payload), base, false, nullptr);
    }

    Topic& topic() { return *topic_; }

private:
    const DtypeEntry& checked_dtype(const MsgInfo& info) {
        std::string why;
        const DtypeEntry* de = codec_.dtype_of(info.dtype, why);
        std::uint64_t count = 1, bytes = 0;
        if (de) {
            for (std::uint32_t i = 0; i < info.ndim; ++i) count *= info.shape[i];  // overflow checked by next()
            if (__builtin_mul_overflow(count, static_cast<std::uint64_t>(de->itemsize), &bytes) ||
                bytes != info.payload_len)
                why = "message header is corrupt: shape product x itemsize (" + std::to_string(count) + " x " +
                      std::to_string(de->itemsize) + ") != payload length " + std::to_string(info.payload_len);
        }
        if (!why.empty()) {
            topic_->mark_broken(why);
            raise(support().corrupted, why);
        }
        return *de;
    }

    std::unique_ptr<Topic> topic_;
    DtypeCodec codec_;
};

std::uint8_t* word_ptr(py::buffer buf, std::size_t offset, std::size_t width, bool writable, py::buffer_info& bi) {
    bi = buf.request(writable);
    std::size_t len = static_cast<std::size_t>(bi.size * bi.itemsize);
    if (offset % width != 0) raise(PyExc_ValueError, "offset must be a multiple of " + std::to_string(width));
    if (offset > len || len - offset < width) raise(PyExc_IndexError, "offset out of range");
    auto* p = static_cast<std::uint8_t*>(bi.ptr) + offset;
    if (reinterpret_cast<std::uintptr_t>(p) % width != 0) raise(PyExc_ValueError, "word is not aligned in memory");
    return p;
}

// The store mode of the loan `dst`, when dst is an outstanding loan (the array loan() returned,
// not a slice of it), for fastcopy.copy (bindings.cpp); else nullptr. Called with the GIL.
policy::SharedWriteMode* loan_write_mode(PyObject* dst) {
    PyObject* sub = support().loaned_array_type.ptr();
    if (!sub || !PyType_Check(sub) || !PyObject_TypeCheck(dst, reinterpret_cast<PyTypeObject*>(sub))) return nullptr;
    PyObject* base = py::detail::array_proxy(dst)->base;
    if (!base || !py::isinstance<ShmSlot>(base)) return nullptr;
    ShmSlot& slot = py::handle(base).cast<ShmSlot&>();
    return slot.is_loan && slot.id != 0 ? slot.write_mode.get() : nullptr;
}

// Channel.store_modes / Topic.store_modes: one dict per size class that saw timed writes.
py::list store_modes(const policy::SharedWriteMode& m) {
    py::list out;
    for (int c = 0; c < policy::SharedWriteMode::kClasses; ++c) {
        const auto s = m.state(c);
        if (s.writes[0] + s.writes[1] == 0) continue;
        py::dict d;
        d["sizes"] = policy::SharedWriteMode::class_name(c);
        d["stores"] = s.current_streaming ? "streaming" : "cached";
        d["cached_gbps"] = s.rate[0] / 1e9;
        d["streaming_gbps"] = s.rate[1] / 1e9;
        d["cached_writes"] = s.writes[0];
        d["streaming_writes"] = s.writes[1];
        d["switches"] = s.switches;
        out.append(d);
    }
    return out;
}

}  // namespace

void bind_shm(py::module_& m) {
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const shm::ShmInterrupted&) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyboardInterrupt, "interrupted");
        } catch (const shm::ShmTimeout& e) {
            PyErr_SetString(PyExc_TimeoutError, e.what());
        } catch (const shm::ShmUseAfterClose& e) {
            PyErr_SetString(PyExc_ValueError, e.what());
        } catch (const shm::ShmBadArgument& e) {
            PyErr_SetString(support().bad_argument ? support().bad_argument.ptr() : PyExc_ValueError, e.what());
        } catch (const shm::ShmOsError& e) {
            PyObject* args = Py_BuildValue("(is)", e.err, e.what());
            PyErr_SetObject(PyExc_OSError, args);
            Py_XDECREF(args);
        } catch (const shm::ShmCorrupted& e) {
            PyErr_SetString(support().corrupted ? support().corrupted.ptr() : PyExc_RuntimeError, e.what());
        } catch (const shm::ShmPeerDied& e) {
            PyErr_SetString(support().peer_died ? support().peer_died.ptr() : PyExc_RuntimeError, e.what());
        } catch (const shm::ShmClosed& e) {
            PyErr_SetString(support().closed ? support().closed.ptr() : PyExc_RuntimeError, e.what());
        } catch (const shm::ShmError& e) {
            PyErr_SetString(support().error ? support().error.ptr() : PyExc_RuntimeError, e.what());
        }
    });

    // The segment layout's protocol versions (tests forge headers with them).
    m.attr("SHM_CHANNEL_VERSION") = shm::kVersion;
    m.attr("SHM_TOPIC_VERSION") = shm::kTopicVersion;
    m.def("_shm_set_support",
          [](py::object error, py::object corrupted, py::object peer_died, py::object closed, py::object to_wire,
             py::object from_wire, py::object ascontiguousarray, py::object generic_type, py::object asarray,
             py::object loan_args) {
              Support& s = support();
              s.error = error;
              s.corrupted = corrupted;
              s.peer_died = peer_died;
              s.closed = closed;
              s.dtype_to_wire = to_wire;
              s.dtype_from_wire = from_wire;
              s.ascontiguousarray = ascontiguousarray;
              s.generic_type = generic_type;
              s.asarray = asarray;
              s.loan_args = loan_args;
          });

    m.def("_shm_set_bad_argument_type", [](py::object t) { support().bad_argument = t; });
    m.def("_shm_set_loaned_array_type", [](py::object t) {
        support().loaned_array_type = t;
        g_loan_write_mode = loan_write_mode;
    });
    // LoanedArray.__exit__: publishes the loan (or discards it when the block raised) with one
    // call, where reading the slot's properties from Python cost 6 us more per message when the
    // caches are cold after a 16 MiB fill (31 against 25 us on the Zen 3 VM, medians of 60).
    m.def("_end_loan_block", [](const py::object& arr, bool publish) {
        PyObject* base = py::isinstance<py::array>(arr) ? py::detail::array_proxy(arr.ptr())->base : nullptr;
        ShmSlot* loan = base && py::isinstance<ShmSlot>(base) ? &py::handle(base).cast<ShmSlot&>() : nullptr;
        if (!loan || !loan->is_loan)
            raise(PyExc_ValueError, "with: only the array that Channel.loan() returned publishes on exit");
        ShmSlot& slot = *loan;
        if (slot.id == 0) return;  // published or discarded inside the block
        py::object owner = slot.channel;
        if (py::isinstance<PyRing>(owner)) {
            if (publish) owner.cast<PyRing&>().publish(arr);
            else owner.cast<PyRing&>().discard(arr);
        } else {
            if (publish) owner.cast<PyTopic&>().publish(arr);
            else owner.cast<PyTopic&>().discard(arr);
        }
    }, py::arg("arr"), py::arg("publish"));
    m.def("_shm_set_messages_lost_type", [](py::object t) { support().messages_lost = t; });
    // Registered after the translator above, so it is tried first; anything else falls through.
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const shm::ShmMessagesLost& e) {
            if (!support().messages_lost) {
                PyErr_SetString(support().error ? support().error.ptr() : PyExc_RuntimeError, e.what());
                return;
            }
            PyObject* exc = PyObject_CallFunction(support().messages_lost.ptr(), "Ks",
                                                  static_cast<unsigned long long>(e.count), e.what());
            if (exc) {
                PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
                Py_DECREF(exc);
            }
        }
    });

    py::class_<PyTopic>(m, "ShmTopic", py::dynamic_attr(),
                        "Shared-memory publish/subscribe topic end (internal; use fastcopy.shm.Topic).")
        .def(py::init<const std::string&, std::uint64_t, std::uint32_t, std::uint32_t, const std::string&,
                      std::uint32_t, bool>(),
             py::arg("name"), py::arg("slot_bytes"), py::arg("slots"), py::arg("history"), py::arg("overflow"),
             py::arg("max_subscribers"), py::arg("create"))
        .def("send", &PyTopic::send, py::arg("obj"), py::arg("timeout") = py::none(),
             "Publish a numpy array or C-contiguous buffer (at most slot_bytes bytes).")
        .def("_loan", [](py::object self, const py::object& shape, const py::object& dtype,
                         const py::object& timeout) { return self.cast<PyTopic&>().loan(self, shape, dtype, timeout); },
             py::arg("shape"), py::arg("dtype"), py::arg("timeout") = py::none())
        .def("publish", &PyTopic::publish, py::arg("arr"), "Publish a loaned array without copying it.")
        .def("discard", &PyTopic::discard, py::arg("arr"), "Give a loaned array back unpublished.")
        .def("recv", &PyTopic::recv, py::arg("out") = py::none(), py::arg("timeout") = py::none(),
             "Receive the next message (subscriber): a new array, or copied into out.")
        .def("recv_view", &PyTopic::recv_view, py::arg("timeout") = py::none(),
             "Receive the next message as a read-only array pinning its slot (subscriber).")
        .def("close", [](PyTopic& t) { t.topic().close(); })
        .def("unlink", [](PyTopic& t) { return t.topic().unlink(); })
        .def_property_readonly("name", [](PyTopic& t) { return t.topic().name(); })
        .def_property_readonly("closed", [](PyTopic& t) { return t.topic().closed(); })
        .def_property_readonly("slot_bytes", [](PyTopic& t) { return t.topic().geometry().slot_bytes; })
        .def_property_readonly("slots", [](PyTopic& t) { return t.topic().geometry().slots; })
        .def_property_readonly("history", [](PyTopic& t) { return t.topic().geometry().history; })
        .def_property_readonly("max_subscribers", [](PyTopic& t) { return t.topic().geometry().max_subs; })
        .def_property_readonly("overflow", [](PyTopic& t) {
            return t.topic().geometry().overflow == shm::Overflow::Drop ? "drop" : "block";
        })
        .def_property_readonly("is_publisher", [](PyTopic& t) { return t.topic().is_publisher(); })
        .def_property_readonly("subscribers", [](PyTopic& t) { return t.topic().subscriber_count(); },
                               "Active subscribers whose process is alive (dead ones are dropped).")
        .def_property_readonly("published", [](PyTopic& t) { return t.topic().published(); },
                               "Publisher: messages published so far.")
        .def_property_readonly("lost", [](PyTopic& t) { return t.topic().lost(); },
                               "Subscriber: messages lost so far (overflow='drop').")
        .def_property_readonly("position", [](PyTopic& t) { return t.topic().cursor(); },
                               "Subscriber: the number of the next message it reads.")
        .def_property_readonly("store_modes", [](PyTopic& t) { return store_modes(*t.topic().write_mode()); },
                               "How fills of the publisher's loans by fastcopy.copy of 256 KiB or more store, per size class (docs/shm.md).")
        .def_property_readonly("held_views", [](PyTopic& t) { return t.topic().ledger()->views(); })
        .def_property_readonly("held_bytes", [](PyTopic& t) { return t.topic().ledger()->bytes(); });

    py::class_<ShmSlot>(m, "ShmSlot",
                        "A slot of a shared-memory ring held by a loaned array or a received view (internal).")
        .def_property_readonly("nbytes", [](const ShmSlot& s) { return s.nbytes; })
        .def_property_readonly("is_loan", [](const ShmSlot& s) { return s.is_loan; })
        .def_property_readonly("active", [](const ShmSlot& s) { return s.id != 0; },
                               "True until the slot is released (view) or published/discarded (loan).")
        .def_property_readonly("channel", [](const ShmSlot& s) { return s.channel ? s.channel : py::none(); });

    py::class_<PyRing>(m, "ShmRing", py::dynamic_attr(),
                       "Shared-memory SPSC ring (internal; use fastcopy.shm.Channel).")
        .def(py::init<const std::string&, std::size_t, bool>(), py::arg("name"), py::arg("capacity"),
             py::arg("create"))
        .def("send", &PyRing::send, py::arg("obj"), py::arg("timeout") = py::none(),
             "Send a numpy array or any C-contiguous buffer; blocks while the ring is full.\n"
             "Raises TimeoutError (nothing sent), ChannelClosed, PeerDied, ChannelCorrupted.")
        .def("recv", &PyRing::recv, py::arg("out") = py::none(), py::arg("timeout") = py::none(),
             "Receive the next message: a new array (sent dtype and shape), or copied into out.")
        .def("recv_view", &PyRing::recv_view, py::arg("timeout") = py::none(),
             "Receive the next message as a read-only array pointing into the ring; its slot is freed when\n"
             "the array and everything derived from it are gone.")
        .def("_loan", [](py::object self, const py::object& shape, const py::object& dtype,
                         const py::object& timeout) { return self.cast<PyRing&>().loan(self, shape, dtype, timeout); },
             py::arg("shape"), py::arg("dtype"), py::arg("timeout") = py::none())
        .def("publish", &PyRing::publish, py::arg("arr"),
             "Send a loaned array without copying it (it becomes read-only).")
        .def("discard", &PyRing::discard, py::arg("arr"),
             "Give a loaned array back unsent (it becomes read-only; nothing is sent).")
        .def_property_readonly("held_bytes", [](PyRing& r) { return r.ring().ledger()->held_bytes(); },
                               "Ring bytes held by received views that are still alive.")
        .def_property_readonly("held_views", [](PyRing& r) { return r.ring().ledger()->held_views(); },
                               "Number of received views still alive (each holds its slot of the ring).")
        .def("peek", &PyRing::peek, py::arg("timeout") = py::none(),
             "(dtype, shape) of the next message without consuming it; None on timeout.")
        .def("close", [](PyRing& r) { r.ring().close(); }, "Unmap; tells the peer this end is closed.")
        .def("unlink", [](PyRing& r) { return r.ring().unlink(); },
             "Remove the name from /dev/shm (attached processes keep working). False if already gone.")
        .def_property_readonly("store_modes", [](PyRing& r) { return store_modes(*r.ring().write_mode()); },
                               "How fills of this end's loans by fastcopy.copy of 256 KiB or more store, per size class (docs/shm.md).")
        .def_property_readonly("name", [](PyRing& r) { return r.ring().name(); })
        .def_property_readonly("capacity", [](PyRing& r) { return r.ring().capacity(); })
        .def_property_readonly("closed", [](PyRing& r) { return r.ring().closed(); })
        .def_property_readonly("pending_bytes", [](PyRing& r) { return r.ring().pending_bytes(); },
                               "Bytes sent and not yet received (a snapshot).")
        .def_property_readonly("cut_messages", [](PyRing& r) { return r.ring().cut_messages(); },
                               "Consumer: messages larger than the ring whose send timed out or was interrupted half "
                               "way, skipped by this end (their send raised; nothing of them was received).")
        .def_property_readonly("role", [](PyRing& r) -> py::object {
            switch (r.ring().role()) {
                case shm::Role::Producer: return py::str("producer");
                case shm::Role::Consumer: return py::str("consumer");
                default: return py::none();
            }
        });

    m.def("_shm_set_spin", &shm::set_spin, py::arg("start_s"), py::arg("mid_message_s"),
          "Tuning: seconds a wait spins before it sleeps (per process).");
    m.def("_shm_default_topic_slots", &shm::default_topic_slots, py::arg("slot_bytes"), py::arg("history"),
          "Slots of a topic created without `slots` (see info()['shm'], topic_default_bytes).");
    m.def("_shm_rules", [] {
        py::list out;
        for (const shm::ShmRule& r : shm::rules()) {
            py::dict d;
            d["name"] = r.name;
            if (std::string(r.unit) == "bytes")
                d["value"] = py::int_(static_cast<std::uint64_t>(r.value));
            else
                d["value"] = py::float_(r.value);
            d["unit"] = r.unit;
            d["rule"] = r.rule;
            d["why"] = r.why;
            out.append(d);
        }
        return out;
    }, "The size and time rules of Channel and Topic in this process (for fastcopy.info()).");
    m.def("shm_unlink", [](const std::string& name) {
        shm::keep_on_fatal_signal(name);
        std::string path = "/" + name;
        return ::shm_unlink(path.c_str()) == 0;
    });
    // Primitives on words in a shared buffer (tests, and for anyone building on them).
    m.def("shm_load_acquire_u64", [](py::buffer b, std::size_t off) {
        py::buffer_info bi;
        return shm::load_acquire_u64(word_ptr(b, off, 8, false, bi));
    });
    m.def("shm_store_release_u64", [](py::buffer b, std::size_t off, std::uint64_t v) {
        py::buffer_info bi;
        shm::store_release_u64(word_ptr(b, off, 8, true, bi), v);
    });
    m.def("shm_load_acquire_u32", [](py::buffer b, std::size_t off) {
        py::buffer_info bi;
        return shm::load_acquire_u32(word_ptr(b, off, 4, false, bi));
    });
    m.def("shm_store_release_u32", [](py::buffer b, std::size_t off, std::uint32_t v) {
        py::buffer_info bi;
        shm::store_release_u32(word_ptr(b, off, 4, true, bi), v);
    });
    m.def("shm_futex_wait", [](py::buffer b, std::size_t off, std::uint32_t expected, py::object timeout) {
        py::buffer_info bi;
        std::uint8_t* p = word_ptr(b, off, 4, true, bi);
        double t = timeout_arg(timeout, "futex_wait");
        PyThreadState* ts = PyEval_SaveThread();  // the buffer stays exported by `bi` meanwhile
        int r = shm::futex_wait(p, expected, t);
        restore_thread_or_park(ts);
        return r == 0;  // False: timed out or interrupted
    }, "FUTEX_WAIT (shared) on a 32-bit word while it equals expected; False on timeout.");
    m.def("shm_futex_wake", [](py::buffer b, std::size_t off, int n) {
        py::buffer_info bi;
        return shm::futex_wake(word_ptr(b, off, 4, true, bi), n);
    });
    m.def("shm_process_alive", [](std::uint32_t pid, std::uint64_t start) { return shm::process_alive(pid, start); },
          py::arg("pid"), py::arg("start_time") = 0);
}

}  // namespace fastcopy
