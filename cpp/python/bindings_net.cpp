// fastcopy.net's wire format for Python (the format itself: net/wire.h). net_encode and
// net_piece build a message's payloads as bytes, the array's bytes copied once by fastcopy's
// kernels; net_send_whole builds a whole message and hands it to Zenoh's put in one call;
// net_read checks a payload; net_wire_layout gives the layout to the Python code and the tests,
// which never restate it. net_keep_freed_memory: net/heap.h.
#include <pybind11/pybind11.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <cstring>
#include <string>

#include "core/dispatch.h"
#include "net/heap.h"
#include "net/wire.h"
#include "python/copy_gil.h"
#include "python/layout_fields.h"

namespace py = pybind11;

namespace fastcopy {
namespace {

// A buffer export released on every path.
struct Export {
    Py_buffer view{};
    Export(PyObject* obj, int flags) {
        if (PyObject_GetBuffer(obj, &view, flags) != 0) throw py::error_already_set();
    }
    ~Export() { PyBuffer_Release(&view); }
    Export(const Export&) = delete;
    Export& operator=(const Export&) = delete;
};

// `head` (head_len bytes, written by `write`), then src[0:n] copied by fastcopy's kernels, the
// GIL released from kCopyReleaseGilBytes (the caller's export keeps src in place): in a new bytes
// object (not shared yet), or, when `into` is a bytearray, in it, resized to the payload. A
// publisher reuses one bytearray for every payload, since Zenoh's put copies a bytearray before
// it returns: a new object per message from 256-512 KiB up has glibc hand its pages back and
// fault them in again at every message (evidence: net-send-buffer-reused). The bytearray stays
// exported while its bytes are written, so no other thread can resize it meanwhile.
template <class Write>
py::object payload(const py::handle& into, std::size_t head_len, Write write, const void* src, std::size_t n) {
    const auto fill = [&](std::uint8_t* dst) {
        write(dst);
        if (n >= kCopyReleaseGilBytes) {
            py::gil_scoped_release unlocked;
            copy_bytes(dst + head_len, src, n);
        } else if (n) {
            copy_bytes(dst + head_len, src, n);
        }
    };
    if (!into.is_none()) {
        if (!PyByteArray_Check(into.ptr()))
            throw py::type_error(std::string("fastcopy.net: into must be a bytearray or None, got ") +
                                 Py_TYPE(into.ptr())->tp_name);
        if (PyByteArray_Resize(into.ptr(), static_cast<Py_ssize_t>(head_len + n)) != 0)
            throw py::error_already_set();
        Export held(into.ptr(), PyBUF_WRITABLE);
        fill(static_cast<std::uint8_t*>(held.view.buf));
        return py::reinterpret_borrow<py::object>(into);
    }
    PyObject* out = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(head_len + n));
    if (!out) throw py::error_already_set();
    py::object owned = py::reinterpret_steal<py::object>(out);
    fill(reinterpret_cast<std::uint8_t*>(PyBytes_AS_STRING(out)));
    return owned;
}

// The array's order on the wire: 'C' or 'F' (C when it is both); BufferError when it is
// neither (the Python caller then sends a C-contiguous copy).
char memory_order(Py_buffer& v) {
    if (PyBuffer_IsContiguous(&v, 'C')) return 'C';
    if (PyBuffer_IsContiguous(&v, 'F')) return 'F';
    throw py::buffer_error("fastcopy.net: the array is neither C- nor Fortran-contiguous");
}

py::object net_encode(const py::handle& block, const py::bytes& dtype_text, std::uint64_t source, std::uint64_t seq,
                      long long piece_bytes, const py::handle& into) {
    Export e(block.ptr(), PyBUF_STRIDES);
    Py_buffer& v = e.view;
    const char order = memory_order(v);
    if (v.ndim < 0 || static_cast<unsigned>(v.ndim) > net::kMaxNdim)
        throw py::value_error("fastcopy.net: " + std::to_string(v.ndim) + " dimensions, at most " +
                              std::to_string(net::kMaxNdim));
    const char* dt = PyBytes_AS_STRING(dtype_text.ptr());
    const std::size_t dt_len = static_cast<std::size_t>(PyBytes_GET_SIZE(dtype_text.ptr()));
    if (dt_len == 0 || dt_len > net::kMaxDtypeText)
        throw py::value_error("fastcopy.net: a dtype text of " + std::to_string(dt_len) + " bytes (1 to " +
                              std::to_string(net::kMaxDtypeText) + ")");
    const std::size_t nbytes = static_cast<std::size_t>(v.len);
    if (piece_bytes < (nbytes ? 1 : 0)) throw py::value_error("fastcopy.net: piece_bytes must be at least 1");
    std::uint64_t shape[net::kMaxNdim];
    for (int i = 0; i < v.ndim; ++i) shape[i] = static_cast<std::uint64_t>(v.shape[i]);
    const bool whole = nbytes <= static_cast<unsigned long long>(piece_bytes);
    const std::size_t n = whole ? nbytes : static_cast<std::size_t>(piece_bytes);
    const unsigned ndim = static_cast<unsigned>(v.ndim);
    return payload(
        into, net::head_bytes(ndim, dt_len),
        [&](std::uint8_t* out) {
            net::write_head(out, whole ? net::kWhole : net::kFirst, order, ndim, shape, dt, dt_len, source, seq, nbytes);
        },
        v.buf, n);
}

// Publisher.send's common case in one call: an exact ndarray, C- or Fortran-contiguous, of at most
// `whole_max` bytes and of a dtype that `texts` maps to its wire text (dtype -> text, each checked by
// the Python side), goes to `put` (the Zenoh publisher's put) as one whole-message payload, the
// same bytes net_encode builds. False, with nothing sent, for anything else, which the Python side
// sends its full way.
bool net_send_whole(const py::handle& put, const py::handle& arr, const py::dict& texts, std::uint64_t source,
                    std::uint64_t seq, long long whole_max, const py::handle& into) {
    if (Py_TYPE(arr.ptr()) != &PyArray_Type) return false;
    auto* a = reinterpret_cast<PyArrayObject*>(arr.ptr());
    const long long nbytes = static_cast<long long>(PyArray_NBYTES(a));
    const int ndim = PyArray_NDIM(a);
    if (nbytes > whole_max || ndim > static_cast<int>(net::kMaxNdim)) return false;
    const int flags = PyArray_FLAGS(a);
    const char order = (flags & NPY_ARRAY_C_CONTIGUOUS) ? 'C' : (flags & NPY_ARRAY_F_CONTIGUOUS) ? 'F' : 0;
    if (!order) return false;
    PyObject* text = PyDict_GetItemWithError(texts.ptr(), reinterpret_cast<PyObject*>(PyArray_DESCR(a)));  // borrowed
    if (!text) {
        if (PyErr_Occurred()) throw py::error_already_set();
        return false;
    }
    if (!PyBytes_Check(text)) return false;
    const char* dt = PyBytes_AS_STRING(text);
    const std::size_t dt_len = static_cast<std::size_t>(PyBytes_GET_SIZE(text));
    if (dt_len == 0 || dt_len > net::kMaxDtypeText) return false;
    std::uint64_t shape[net::kMaxNdim];
    for (int i = 0; i < ndim; ++i) shape[i] = static_cast<std::uint64_t>(PyArray_DIM(a, i));
    const std::size_t n = static_cast<std::size_t>(nbytes);
    py::object message = payload(
        into, net::head_bytes(static_cast<unsigned>(ndim), dt_len),
        [&](std::uint8_t* out) {
            net::write_head(out, net::kWhole, order, static_cast<unsigned>(ndim), shape, dt, dt_len, source, seq, n);
        },
        PyArray_DATA(a), n);
    PyObject* done = PyObject_CallOneArg(put.ptr(), message.ptr());
    if (!done) throw py::error_already_set();
    Py_DECREF(done);
    return true;
}

py::object net_piece(const py::handle& block, std::uint64_t source, std::uint64_t seq, long long offset,
                     long long piece_bytes, const py::handle& into) {
    Export e(block.ptr(), PyBUF_ANY_CONTIGUOUS);
    const long long nbytes = static_cast<long long>(e.view.len);
    if (offset < 1 || offset >= nbytes || piece_bytes < 1)
        throw py::value_error("fastcopy.net: a piece at byte " + std::to_string(offset) + " of " +
                              std::to_string(piece_bytes) + " bytes, of a message of " + std::to_string(nbytes) +
                              " bytes (pieces start after the head's bytes and before the end)");
    const std::size_t n = static_cast<std::size_t>(std::min(piece_bytes, nbytes - offset));
    return payload(
        into, net::kPieceHeadBytes,
        [&](std::uint8_t* out) { net::write_piece_head(out, source, seq, static_cast<std::uint64_t>(offset)); },
        static_cast<const std::uint8_t*>(e.view.buf) + offset, n);
}

py::tuple net_read(const py::handle& buf) {
    Export e(buf.ptr(), PyBUF_SIMPLE);
    net::Parsed p;
    const auto* data = static_cast<const std::uint8_t*>(e.view.buf);
    const std::string why = net::parse(data, static_cast<std::size_t>(e.view.len), p);
    if (!why.empty()) throw py::value_error(why);
    if (p.kind == net::kPiece) return py::make_tuple(std::string(1, p.kind), p.source, p.seq, p.offset, p.data_at);
    py::tuple shape(p.ndim);
    for (unsigned i = 0; i < p.ndim; ++i) shape[i] = py::int_(p.shape[i]);
    return py::make_tuple(std::string(1, p.kind), p.source, p.seq,
                          py::bytes(reinterpret_cast<const char*>(data) + p.dtype_at, p.dtype_len), shape,
                          std::string(1, p.order), p.nbytes, p.count, p.data_at);
}

// The receiver's per-message path: (source, seq, read-only array over `payload`) for a valid
// whole message whose dtype text is a key of `dtypes` (text -> dtype, the texts the Python side
// has checked) and whose shape needs exactly its bytes; None for anything else (a head of a
// message in pieces, a piece, a dtype not checked yet, a size that disagrees), which the
// Python side then reads and checks in full. ValueError saying what is wrong for a payload
// that is not a valid head or piece.
py::object net_take(const py::bytes& payload, const py::dict& dtypes) {
    const auto* data = reinterpret_cast<const std::uint8_t*>(PyBytes_AS_STRING(payload.ptr()));
    const std::size_t n = static_cast<std::size_t>(PyBytes_GET_SIZE(payload.ptr()));
    net::Parsed p;
    const std::string why = net::parse(data, n, p);
    if (!why.empty()) throw py::value_error(why);
    if (p.kind != net::kWhole) return py::none();
    py::bytes text(reinterpret_cast<const char*>(data) + p.dtype_at, p.dtype_len);
    PyObject* found = PyDict_GetItemWithError(dtypes.ptr(), text.ptr());  // borrowed
    if (!found) {
        if (PyErr_Occurred()) throw py::error_already_set();
        return py::none();
    }
    if (!PyArray_DescrCheck(found)) return py::none();
    auto* descr = reinterpret_cast<PyArray_Descr*>(found);
    npy_intp dims[net::kMaxNdim];
    for (unsigned i = 0; i < p.ndim; ++i) dims[i] = static_cast<npy_intp>(p.shape[i]);
    Py_INCREF(descr);  // PyArray_NewFromDescr steals it
    PyObject* arr = PyArray_NewFromDescr(&PyArray_Type, descr, static_cast<int>(p.ndim), dims, nullptr,
                                         const_cast<std::uint8_t*>(data) + p.data_at,
                                         p.order == 'F' ? NPY_ARRAY_F_CONTIGUOUS : 0, nullptr);
    if (!arr) {  // a shape numpy refuses (too large): the Python side says what is wrong
        PyErr_Clear();
        return py::none();
    }
    py::object owned = py::reinterpret_steal<py::object>(arr);
    // The array must span exactly the announced bytes, all of which the payload holds.
    if (static_cast<std::uint64_t>(PyArray_NBYTES(reinterpret_cast<PyArrayObject*>(arr))) != p.nbytes)
        return py::none();
    Py_INCREF(payload.ptr());  // the array keeps the bytes alive; SetBaseObject steals it
    if (PyArray_SetBaseObject(reinterpret_cast<PyArrayObject*>(arr), payload.ptr()) < 0) throw py::error_already_set();
    return py::make_tuple(p.source, p.seq, owned);
}

constexpr LayoutField kHeadFields[] = {
    {"magic", net::kOffMagic, sizeof net::kMagic},
    {"version", net::kOffVersion, 1},
    {"kind", net::kOffKind, 1},
    {"order", net::kOffOrder, 1},
    {"ndim", net::kOffNdim, 1},
    {"dtype_len", net::kOffDtypeLen, 1},
    {"source", net::kOffSource, 8},
    {"seq", net::kOffSeq, 8},
    {"nbytes", net::kOffNbytes, 8},
};

constexpr LayoutField kPieceFields[] = {
    {"magic", net::kOffMagic, sizeof net::kMagic},
    {"version", net::kOffVersion, 1},
    {"kind", net::kOffKind, 1},
    {"source", net::kOffPieceSource, 8},
    {"seq", net::kOffPieceSeq, 8},
    {"offset", net::kOffPieceOffset, 8},
};

py::dict net_wire_layout() {
    py::dict out;
    out["magic"] = py::bytes(net::kMagic, sizeof net::kMagic);
    out["version"] = net::kVersion;
    out["whole"] = py::bytes(&net::kWhole, 1);
    out["first"] = py::bytes(&net::kFirst, 1);
    out["piece"] = py::bytes(&net::kPiece, 1);
    out["head_bytes"] = net::kHeadBytes;
    out["piece_head_bytes"] = net::kPieceHeadBytes;
    out["max_ndim"] = net::kMaxNdim;
    out["max_dtype_text"] = net::kMaxDtypeText;
    out["head_fields"] = layout_fields(kHeadFields);
    out["piece_fields"] = layout_fields(kPieceFields);
    return out;
}

}  // namespace
}  // namespace fastcopy

// Global: bindings.cpp declares it where it calls it, in PYBIND11_MODULE.
void bind_net(py::module_& m) {
    using namespace fastcopy;
    if (_import_array() < 0) throw py::error_already_set();
    m.def("net_encode", &net_encode, py::arg("block"), py::arg("dtype_text"), py::arg("source"), py::arg("seq"),
          py::arg("piece_bytes"), py::arg("into") = py::none(),
          "fastcopy.net: the first payload of message `seq` of publisher `source`: the whole message when "
          "the array `block` (C- or Fortran-contiguous; BufferError otherwise) holds at most `piece_bytes` "
          "bytes, else its head with the first `piece_bytes` of them. `dtype_text`: numpy's dtype.str, "
          "checked by the caller. A new bytes object, or `into` (a bytearray) resized and filled.");
    m.def("net_send_whole", &net_send_whole, py::arg("put"), py::arg("arr"), py::arg("texts"), py::arg("source"),
          py::arg("seq"), py::arg("whole_max"), py::arg("into") = py::none(),
          "fastcopy.net: Publisher.send's common case: an exact ndarray, C- or Fortran-contiguous, of at most "
          "`whole_max` bytes and of a dtype `texts` maps to its checked wire text, goes to `put` as one "
          "whole-message payload (net_encode's bytes, in `into` when it is a bytearray); False, with "
          "nothing sent, for anything else.");
    m.def("net_piece", &net_piece, py::arg("block"), py::arg("source"), py::arg("seq"), py::arg("offset"),
          py::arg("piece_bytes"), py::arg("into") = py::none(),
          "fastcopy.net: the piece of message `seq` holding `block`'s bytes from `offset` (up to "
          "`piece_bytes` of them), in memory order: a new bytes object, or `into` (a bytearray) resized "
          "and filled.");
    m.def("net_read", &net_read, py::arg("payload"),
          "fastcopy.net: a payload checked: ('M' or 'H', source, seq, dtype text, shape, order, nbytes, "
          "element count, data offset) for a whole message or a head, ('P', source, seq, offset, data "
          "offset) for a piece; ValueError saying what is wrong otherwise.");
    m.def("net_take", &net_take, py::arg("payload"), py::arg("dtypes"),
          "fastcopy.net: (source, seq, read-only array over `payload`) of a valid whole message whose "
          "dtype text is a key of `dtypes` (text -> checked dtype) and whose shape needs exactly its "
          "bytes; None for anything else (read it with net_read); ValueError for a payload that is "
          "not a valid head or piece.");
    m.def("net_wire_layout", &net_wire_layout,
          "fastcopy.net's wire format: magic, version, kind bytes, the head's and a piece's sizes and "
          "fields (name -> (byte offset, size); little-endian), the most dimensions and dtype text bytes.");
    m.def("net_keep_freed_memory", &net::keep_freed_memory, py::arg("max_bytes") = net::kKeepFreedBytes,
          "fastcopy.net.keep_freed_memory: blocks below `max_bytes` (at most the default, glibc's ceiling) "
          "come from the C library's heap and up to twice that of freed memory stays there for reuse; "
          "True when the C library took the setting (glibc), False otherwise.");
}
