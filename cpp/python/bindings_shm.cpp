// Python bindings for the shared-memory Channel and Topic (fastcopy.shm) and their primitives:
// the module's classes, exception translation and functions. The ends themselves are in
// shm_ring.h (PyRing) and shm_topic.h (PyTopic), what they share in shm_common.h.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <sys/mman.h>

#include "python/gil.h"
#include "python/shm_common.h"
#include "python/shm_ring.h"
#include "python/shm_topic.h"
#include "python/store_modes_dict.h"
#include "shm/segment.h"

namespace py = pybind11;

namespace fastcopy {
// Defined in bindings.cpp: how fastcopy.copy finds the store mode of a loan it writes into.
extern policy::StoreModeLearner* (*g_loan_write_mode)(PyObject* dst);
namespace shmpy {
namespace {

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
policy::StoreModeLearner* loan_write_mode(PyObject* dst) {
    PyObject* sub = support().loaned_array_type.ptr();
    if (!sub || !PyType_Check(sub) || !PyObject_TypeCheck(dst, reinterpret_cast<PyTypeObject*>(sub))) return nullptr;
    PyObject* base = py::detail::array_proxy(dst)->base;
    if (!base || !py::isinstance<ShmSlot>(base)) return nullptr;
    ShmSlot& slot = py::handle(base).cast<ShmSlot&>();
    return slot.is_loan && slot.id != 0 ? slot.write_mode.get() : nullptr;
}

}  // namespace
}  // namespace shmpy

void bind_shm(py::module_& m) {
    using namespace shmpy;
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
    // call: reading the slot's properties from Python costs more per message when the caches are
    // cold after a large fill. evidence: shm-loan-request-in-cpp
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
    m.def("_shm_set_space_error_type", [](py::object t) { support().space_error = t; });
    m.def("shm_preflight", [](std::uint64_t nbytes) { return shm::preflight(nbytes, "not enough shared memory"); },
          py::arg("nbytes"),
          "Raises fastcopy.shm.ShmSpaceError unless nbytes (rounded up to whole pages) fit in the free space "
          "of /dev/shm now; returns the free bytes (0 when they cannot be read). Creates nothing.");
    m.def("shm_space", [] {
        const shm::ShmSpace s = shm::shm_space();
        py::dict d;
        d["path"] = s.path;
        d["total"] = s.ok ? py::object(py::int_(s.total)) : py::object(py::none());
        d["free"] = s.ok ? py::object(py::int_(s.free)) : py::object(py::none());
        return d;
    }, "The filesystem that holds shared-memory segments: {'path', 'total', 'free'} in bytes (free: what an "
       "unprivileged process may still allocate; None when statvfs fails).");
    // Registered after the translator above, so it is tried first; anything else falls through.
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const shm::ShmNoSpace& e) {
            PyObject* exc = support().space_error
                ? PyObject_CallFunction(support().space_error.ptr(), "isKKs", e.err, e.what(),
                                        static_cast<unsigned long long>(e.needed),
                                        static_cast<unsigned long long>(e.free), e.path.c_str())
                : PyObject_CallFunction(PyExc_OSError, "is", e.err, e.what());
            if (exc) {
                PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
                Py_DECREF(exc);
            }
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
        .def("recv_view", &PyTopic::recv_view, py::arg("timeout") = py::none(), py::kw_only(), py::arg("cow") = false,
             "Receive the next message as an array pinning its slot (subscriber): read-only, or with cow=True\n"
             "writable, a write copying only the pages it touches into this process (the slot never changes).")
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
        .def("recv_view", &PyRing::recv_view, py::arg("timeout") = py::none(), py::kw_only(), py::arg("cow") = false,
             "Receive the next message as a read-only array pointing into the ring; its slot is freed when\n"
             "the array and everything derived from it are gone. cow=True: a writable array whose writes copy\n"
             "only the pages they touch into this process (the ring never changes).")
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