// What the Python bindings of Channel (PyRing) and Topic (PyTopic) share: the support objects
// fastcopy.shm sets at import, arguments, the base objects of loans and views (ShmSlot), dtype
// conversions, message headers, and PyEnd, the loan/publish/discard/recv(out=) paths of both.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/copy_errors.h"
#include "core/read_only_ranges.h"
#include "policy/store_modes.h"
#include "python/pyerr.h"
#include "shm/channel.h"
#include "shm/topic.h"

namespace fastcopy {
namespace shmpy {

namespace py = pybind11;
using shm::MsgHeader;
using shm::MsgInfo;

// Python-side support set by fastcopy.shm at import: exception classes and dtype helpers.
struct Support {
    py::object error, corrupted, peer_died, closed;   // ChannelError and subclasses
    py::object dtype_to_wire, dtype_from_wire;         // callables
    py::object ascontiguousarray;
    py::object generic_type, asarray;                  // numpy scalars travel as 0-d arrays
    py::object loaned_array_type;                      // fastcopy.shm.LoanedArray
    py::object messages_lost;                          // fastcopy.shm.MessagesLost(count, message)
    py::object bad_argument;                           // fastcopy.shm.ChannelValueError
    py::object space_error;                            // fastcopy.shm.ShmSpaceError
    py::object loan_args;                              // fastcopy.shm._loan_args(what, shape, dtype)
};
// Leaked on purpose: no Python calls at exit.
Support& support();

// Sets the Python error `type` (RuntimeError when it is not set yet) and throws.
[[noreturn]] void raise(py::handle type, const std::string& msg);

// timeout=None (wait for ever) or a real number of seconds (int, float, numpy scalars: anything
// with __float__ except bool and str). Wrong types raise TypeError naming the argument.
double timeout_arg(const py::object& timeout, const char* what);
std::string seconds_words(double t);
// The GilHooks of a call from Python: release and re-acquire the GIL (ctx: a PyThreadState*),
// and run the signal handlers.
shm::GilHooks python_gil_hooks(PyThreadState** ts);

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
    std::shared_ptr<policy::StoreModeLearner> write_mode;  // loans: how copies into them store (the ring's)
    // Copy-on-write views: the private pages the array lies in (shm::map_private_pages),
    // unmapped after the slot is released, when the last array over them is gone.
    std::unique_ptr<shm::Mapping> private_pages;
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


// Writes the header of a message (ndim, and its shape already at hdr + sizeof(MsgHeader)) with
// the dtype wire string and payload_len (ValueError naming `what` for a description longer than
// the wire allows); returns header_len.
std::size_t finish_header(std::uint8_t* hdr, std::uint32_t ndim, const std::string& wire, std::uint64_t payload_len,
                          const char* what);

// A numpy array over `obj`'s memory when obj is an array of another library (torch, JAX,
// pyarrow: python/foreign.h), else a null object; raises naming `what` when it cannot be read.
py::object foreign_as_numpy(const py::handle& obj, const char* what);

// Room for the longest message header.
constexpr std::size_t kHeaderRoom = shm::kMaxMsgHeaderBytes;

// fn(hdr_len, data, nbytes) while obj's buffer is held. TypeError/ValueError name `what`.
template <class Fn>
void with_message(DtypeCodec& codec, py::handle obj, const char* what, std::uint8_t* hdr, Fn fn) {
    std::uint32_t ndim = 0;
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
    } else if (py::object foreign = foreign_as_numpy(obj, what)) {
        arr = py::reinterpret_borrow<py::array>(foreign);  // keeps the producer alive until sent
        is_array = true;
    }
    if (is_array) {
        if (!(arr.flags() & py::array::c_style)) arr = support().ascontiguousarray(arr);
        wire = &codec.wire_of(arr.dtype(), what);
        std::size_t nd = static_cast<std::size_t>(arr.ndim());
        if (nd > shm::kMaxNdim) raise(PyExc_ValueError, std::string(what) + ": arrays with more than 64 dimensions are not supported");
        ndim = static_cast<std::uint32_t>(nd);
        for (std::size_t i = 0; i < nd; ++i) shape[i] = static_cast<std::uint64_t>(arr.shape(i));
        ptr = arr.data();
        nbytes = static_cast<std::size_t>(arr.nbytes());
    } else {
        if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
            if (!clear_ordinary_error()) throw py::error_already_set();
            raise(PyExc_TypeError, std::string(what) + ": expected a numpy array or a C-contiguous buffer, got " +
                                       Py_TYPE(obj.ptr())->tp_name);
        }
        have_view = true;
        static const std::string u1 = "|u1";
        wire = &u1;
        ndim = 1;
        shape[0] = static_cast<std::uint64_t>(view.len);
        ptr = view.buf;
        nbytes = static_cast<std::size_t>(view.len);
    }
    struct ViewRelease {
        Py_buffer* v;
        bool on;
        ~ViewRelease() { if (on) PyBuffer_Release(v); }
    } release_view{&view, have_view};
    fn(finish_header(hdr, ndim, *wire, nbytes, what), ptr, nbytes);
}


struct LoanRequest {
    std::vector<std::int64_t> shape;
    py::dtype dtype;
};
// The (shape, dtype) of a loan request (see the .cpp); TypeError naming `what` otherwise.
LoanRequest loan_request(const char* what, const py::object& shape, const py::object& dtype);

template <class Check>
std::size_t loan_header(DtypeCodec& codec, const py::dtype& dt, const std::vector<std::int64_t>& shape_in,
                        std::uint8_t* hdr, std::uint64_t& nbytes, Check check_size) {
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
    return finish_header(hdr, static_cast<std::uint32_t>(shape_in.size()), codec.wire_of(dt, "loan"), nbytes, "loan");
}

// The time left of a timeout (negative: none) for each wait of one call.
struct TimeLeft {
    double t, deadline;
    explicit TimeLeft(double timeout) : t(timeout), deadline(timeout < 0 ? 0 : shm::monotonic_seconds() + timeout) {}
    double operator()() const { return t < 0 ? -1.0 : std::max(0.0, deadline - shm::monotonic_seconds()); }
};

// The array of a received view at p (the message `info` of dtype `de`) whose base is the
// slot `base` (a ShmSlot that holds the slot already): read-only over the segment, or with cow,
// writable over private copy-on-write pages of the message (shm::map_private_pages), which the
// slot keeps mapped. `name`: the segment's, for errors.
py::object view_array(const py::object& base, const DtypeEntry& de, const MsgInfo& info, const std::uint8_t* p,
                      bool cow, const std::string& name);
// An array over segment memory whose base is `base` (a ShmSlot); read-only unless writable.
py::object make_array(const py::object& dtype, const std::vector<py::ssize_t>& shape, void* ptr,
                      const py::object& base, bool writable, PyObject* subtype);
std::string shape_words(const MsgInfo& info);
// Clears the array's WRITEABLE flag (a published, discarded or received slot).
void make_read_only(const py::object& arr);
// The message's dtype checked against its payload length: why it is corrupt ("" when not).
std::string payload_mismatch(const MsgInfo& info, const DtypeEntry& de);

// recv(out=...) of the message `info` of dtype `de`: checks `out` (None, a numpy array, a
// writable C-contiguous buffer or an array of another library, read as a numpy array) against the message (ValueError naming the `noun`, "channel"
// or "topic", where it stays), then fill(dst, own) copies the payload into dst; `own` is the
// new array dst lies in when out is None (`fresh`, when given, is that array; else a new one).
// Returns out or the new array, or a null object when fill returned false.
template <class Fill>
py::object deliver(const MsgInfo& info, const DtypeEntry& de, const py::object& out, const char* noun,
                   py::object fresh, Fill fill) {
    if (out.is_none()) {
        py::array result;
        if (fresh) {
            result = py::reinterpret_steal<py::array>(fresh.release());
        } else {
            std::vector<py::ssize_t> shape(info.shape, info.shape + info.ndim);
            result = py::array(py::reinterpret_borrow<py::dtype>(de.dtype), shape);
        }
        if (!fill(result.mutable_data(), py::object(result))) return py::object();
        return std::move(result);
    }
    const std::string stays = std::string("the message stays in the ") + noun;
    const py::object foreign = foreign_as_numpy(out, "recv: out");
    if (foreign || py::isinstance<py::array>(out)) {
        py::array o = py::reinterpret_borrow<py::array>(foreign ? foreign : out);
        bool shape_ok = static_cast<std::uint32_t>(o.ndim()) == info.ndim;
        for (std::uint32_t i = 0; shape_ok && i < info.ndim; ++i)
            shape_ok = static_cast<std::uint64_t>(o.shape(i)) == info.shape[i];
        if (!shape_ok || !o.dtype().equal(de.dtype))
            raise(PyExc_ValueError, "recv: out has dtype " + py::str(o.dtype()).cast<std::string>() + " and shape " +
                                        py::str(o.attr("shape")).cast<std::string>() + " but the message is " +
                                        py::str(de.dtype).cast<std::string>() + " with shape " + shape_words(info) +
                                        " (" + stays + ")");
        if (!(o.flags() & py::array::c_style)) raise(PyExc_ValueError, "recv: out must be C-contiguous");
        if (!o.writeable()) raise(PyExc_ValueError, "recv: out is read-only");
        if (core::dst_is_read_only_shared(o.mutable_data(), info.payload_len))
            raise(PyExc_ValueError, std::string("recv: out ") + core::kReadOnlySharedText + " (" + stays + ")");
        return fill(o.mutable_data(), py::object()) ? out : py::object();
    }
    Py_buffer view;
    if (PyObject_GetBuffer(out.ptr(), &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
        if (!clear_ordinary_error()) throw py::error_already_set();
        raise(PyExc_TypeError, std::string("recv: out must be a writable C-contiguous buffer, got ") +
                                   Py_TYPE(out.ptr())->tp_name);
    }
    struct ViewRelease {
        Py_buffer* v;
        ~ViewRelease() { PyBuffer_Release(v); }
    } release_view{&view};
    if (static_cast<std::uint64_t>(view.len) != info.payload_len)
        raise(PyExc_ValueError, "recv: out has " + std::to_string(view.len) + " bytes but the message has " +
                                    std::to_string(info.payload_len) + " (dtype " + py::str(de.dtype).cast<std::string>() +
                                    ", shape " + shape_words(info) + "; " + stays + ")");
    if (core::dst_is_read_only_shared(view.buf, info.payload_len))
        raise(PyExc_ValueError, std::string("recv: out ") + core::kReadOnlySharedText + " (" + stays + ")");
    return fill(view.buf, py::object()) ? out : py::object();
}

// TypeError unless recv's `out` is None or exports a buffer (checked before any wait: its size
// can only be checked against a message).
void check_out_type(const py::object& out);

// What PyRing and PyTopic do alike: loans (loan, publish, discard) and the checks of recv.
// `End` is shm::Ring or shm::Topic; `Derived` provides
//   static const char* loan_what()          "Channel.loan" / "Topic.loan"
//   static const char* noun()               "channel" / "topic"
//   void check_loan_size(dt, overflow, count, nbytes)   raises when the payload cannot be loaned
//   void check_loan_message(hdr_len, nbytes)            raises when the message cannot be loaned
//   const char* full_words()                why a loan timed out
//   bool owns(const ShmSlot&)                the slot is a loan of this end
//   void attach_slot(ShmSlot&)               sets the slot's ledger and mapping
template <class End, class Derived>
class PyEnd {
public:
    End& end() { return *end_; }

    // A writable array of (shape, dtype) in the segment; publish() sends it.
    py::object loan(const py::object& self, const py::object& shape, const py::object& dtype,
                    const py::object& timeout) {
        Derived& d = static_cast<Derived&>(*this);
        const LoanRequest req = loan_request(Derived::loan_what(), shape, dtype);
        const py::dtype& dt = req.dtype;
        double t = timeout_arg(timeout, "loan");
        alignas(64) std::uint8_t hdr[kHeaderRoom];
        std::uint64_t nbytes = 0;
        const std::size_t hdr_len = loan_header(codec_, dt, req.shape, hdr, nbytes,
                                                [&](bool overflow, std::uint64_t count, std::uint64_t n) {
            d.check_loan_size(dt, overflow, count, n);
        });
        d.check_loan_message(hdr_len, nbytes);
        PyThreadState* ts = nullptr;
        const shm::GilHooks hooks = python_gil_hooks(&ts);
        std::uint64_t id = 0;
        std::uint8_t* p = end_->loan(hdr, hdr_len, nbytes, t, hooks, id);
        if (!p) raise(PyExc_TimeoutError, "loan timed out after " + seconds_words(t) + ": " + d.full_words());
        auto slot = std::make_unique<ShmSlot>();
        d.attach_slot(*slot);
        slot->id = id;
        slot->is_loan = true;
        slot->nbytes = nbytes;
        slot->channel = self;
        slot->write_mode = end_->write_mode();
        py::object base = py::cast(std::move(slot));  // from here its destructor ends the loan
        std::vector<py::ssize_t> shp(req.shape.begin(), req.shape.end());
        PyObject* sub = support().loaned_array_type ? support().loaned_array_type.ptr() : nullptr;
        return make_array(dt, shp, p, base, true, sub);
    }

    // Sends a loaned array without copying it (it becomes read-only: the receivers may be
    // reading it).
    void publish(const py::object& arr) {
        ShmSlot& slot = loan_slot_of(arr, "publish");
        if (slot.id == 0) raise(support().error, "publish: this loan was published or discarded already");
        std::uint64_t id = slot.id;
        slot.id = 0;  // over, whatever happens below
        make_read_only(arr);
        end_->publish_loan(id);
    }

    // Gives a loaned array back unsent (it becomes read-only; nothing is sent).
    void discard(const py::object& arr) {
        ShmSlot& slot = loan_slot_of(arr, "discard");
        make_read_only(arr);
        slot.release();
    }

protected:
    // The ShmSlot of a loaned array of this end (ValueError otherwise).
    ShmSlot& loan_slot_of(const py::object& arr, const char* what) {
        py::object base = py::none();
        if (py::isinstance<py::array>(arr)) base = arr.attr("base");
        if (base.is_none() || !py::isinstance<ShmSlot>(base))
            raise(PyExc_ValueError, std::string(what) + ": expected the array that loan() returned (not a copy, "
                                                        "slice or view of it)");
        ShmSlot& slot = base.cast<ShmSlot&>();
        if (!slot.is_loan || !static_cast<Derived&>(*this).owns(slot))
            raise(PyExc_ValueError, std::string(what) + ": this array is not a loan of this " + Derived::noun());
        return slot;
    }

    std::unique_ptr<End> end_;
    DtypeCodec codec_;
};

}  // namespace shmpy
}  // namespace fastcopy
