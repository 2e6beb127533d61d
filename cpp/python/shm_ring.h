// The Python binding of a Channel end (_core.ShmRing; fastcopy.shm.Channel subclasses it):
// send() and recv() each do validation, the copy into or out of the ring (fastcopy's ToShared /
// FromShared policy entries) and the index publish in one call, releasing the GIL only for
// waits and large copies. Included by bindings_shm.cpp only.
#pragma once
#include "python/shm_common.h"

namespace fastcopy {
namespace shmpy {

using shm::Ring;

class PyRing : public PyEnd<Ring, PyRing> {
public:
    PyRing(const std::string& name, std::size_t capacity, bool create) {
        end_.reset(create ? Ring::create(name, capacity) : Ring::attach(name));
    }
    Ring& ring() { return *end_; }

    void send(py::handle obj, const py::object& timeout) {
        double t = timeout_arg(timeout, "send");
        alignas(64) std::uint8_t hdr[kHeaderRoom];
        with_message(codec_, obj, "send", hdr, [&](std::size_t hdr_len, const void* ptr, std::size_t nbytes) {
            PyThreadState* ts = nullptr;
            const shm::GilHooks hooks = python_gil_hooks(&ts);
            if (!end_->send(hdr, hdr_len, ptr, nbytes, t, hooks))
                raise(PyExc_TimeoutError, "send timed out after " + seconds_words(t) +
                                              ": the ring is full (is the consumer reading?)");
        });
    }

    py::object recv(const py::object& out, const py::object& timeout) {
        double t = timeout_arg(timeout, "recv");
        check_out_type(out);
        PyThreadState* ts = nullptr;
        const shm::GilHooks hooks = python_gil_hooks(&ts);
        const TimeLeft left(t);
        // Again after a message the producer cut while it was read (consume() false).
        for (;;) {
            MsgInfo info;
            if (!end_->peek(info, left(), hooks))
                raise(PyExc_TimeoutError, "recv timed out after " + seconds_words(t) + ": no message arrived");
            if (py::object got = recv_one(info, out, left(), hooks)) return got;
        }
    }

private:
    // The message peeked, copied into `out` (returned) or a new array; a null object when
    // the producer cut it (then `out` may hold part of it).
    py::object recv_one(const MsgInfo& info, const py::object& out, double t, const shm::GilHooks& hooks) {
        const DtypeEntry& de = checked_dtype(info);
        if (!end_->resuming()) drop_partial();  // skipped: the producer cut it
        // The array the last recv filled part of, when it gave up in the middle of this message.
        const bool has_partial = out.is_none() && end_->resuming() && partial_array_;
        py::object fresh = has_partial ? std::move(partial_array_) : py::object();
        return deliver(info, de, out, "channel", std::move(fresh), [&](void* dst, const py::object& own) {
            return consume_into(info, dst, own, has_partial, t, hooks);
        });
    }

    // consume() into dst, resuming a message a recv gave up half way (Ring::resuming): unless
    // dst already holds them (has_partial), its first bytes come from where that recv kept
    // them. When this one times out or is interrupted half way in turn, it keeps what it
    // received: `own` (the new array dst is in) as it is, a caller's buffer as a copy (the
    // caller may reuse it meanwhile). Out of memory for the copy gives the message up.
    bool consume_into(const MsgInfo& info, void* dst, const py::object& own, bool has_partial, double t,
                      const shm::GilHooks& hooks) {
        if (end_->resuming() && !has_partial) {
            const void* from = partial_array_ ? py::reinterpret_borrow<py::array>(partial_array_).data()
                                              : static_cast<const void*>(partial_bytes_.data());
            std::memcpy(dst, from, end_->partial_bytes());
        }
        drop_partial();  // dst holds the first bytes now
        try {
            return end_->consume(info, dst, t, hooks);
        } catch (const shm::ShmError& e) {
            if (end_->resuming() && !keep_partial(dst, own)) {
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
                partial_bytes_.assign(d, d + end_->partial_bytes());
            }
            return true;
        } catch (const std::bad_alloc&) {
            end_->give_up_partial();
            return false;
        }
    }

    void drop_partial() {
        partial_array_ = py::object();
        std::vector<std::uint8_t>().swap(partial_bytes_);
    }

public:

    // The next message as a read-only array pointing into the ring (see ShmSlot).
    py::object recv_view(const py::object& timeout, bool cow) {
        double t = timeout_arg(timeout, "recv_view");
        PyThreadState* ts = nullptr;
        const shm::GilHooks hooks = python_gil_hooks(&ts);
        const TimeLeft left(t);
        MsgInfo info;
        const std::uint8_t* p = nullptr;
        std::uint64_t id = 0;
        const DtypeEntry* de = nullptr;
        for (;;) {  // again after a message the producer cut while it was read
            if (!end_->peek(info, left(), hooks))
                raise(PyExc_TimeoutError, "recv_view timed out after " + seconds_words(t) + ": no message arrived");
            de = &checked_dtype(info);
            bool timed_out = false;
            p = end_->take_view(info, left(), hooks, id, timed_out);
            if (timed_out)
                raise(PyExc_TimeoutError, "recv_view timed out after " + seconds_words(t) +
                                              ": the message was not complete (it stays in the channel)");
            if (p) break;
            // Not one piece of the ring (a sent message that wraps, or one larger than the
            // ring): a copy, which holds no slot (read-only, unless a cow view was asked for).
            py::object result = recv_one(info, py::none(), left(), hooks);
            if (!result) continue;
            if (!cow) make_read_only(result);
            return result;
        }
        auto slot = std::make_unique<ShmSlot>();
        slot->ledger = end_->ledger();
        slot->mapping = end_->ledger()->mapping_ref();
        slot->id = id;
        slot->nbytes = info.payload_len;
        py::object base = py::cast(std::move(slot));  // from here its destructor releases the view
        return view_array(base, *de, info, p, cow, end_->name());
    }

    // PyEnd's hooks.
    static const char* loan_what() { return "Channel.loan"; }
    static const char* noun() { return "channel"; }
    const char* full_words() const { return "the ring is full (is the consumer reading, or holding views?)"; }
    bool owns(const ShmSlot& slot) const { return slot.ledger == end_->ledger(); }
    void attach_slot(ShmSlot& slot) {
        slot.ledger = end_->ledger();
        slot.mapping = end_->ledger()->mapping_ref();
    }
    void check_loan_size(const py::dtype& dt, bool overflow, std::uint64_t count, std::uint64_t n) {
        const std::size_t cap = end_->capacity();
        if (overflow || n > cap)
            raise(PyExc_ValueError, "loan: " + std::to_string(count) + " elements of " +
                                        std::to_string(dt.itemsize()) + " bytes do not fit in the ring (capacity " +
                                        std::to_string(cap) + " bytes; use send() for larger messages)");
    }
    void check_loan_message(std::size_t hdr_len, std::uint64_t nbytes) {
        const std::size_t cap = end_->capacity();
        if (hdr_len + shm::pad64(nbytes) > cap)
            raise(PyExc_ValueError, "loan: the message (" + std::to_string(hdr_len + shm::pad64(nbytes)) +
                                        " bytes with its header) does not fit in the ring (capacity " +
                                        std::to_string(cap) + " bytes; use send() for larger messages)");
    }

    // The next message's (dtype, shape) without consuming it; None on timeout.
    py::object peek(const py::object& timeout) {
        double t = timeout_arg(timeout, "peek");
        PyThreadState* ts = nullptr;
        const shm::GilHooks hooks = python_gil_hooks(&ts);
        MsgInfo info;
        if (!end_->peek(info, t, hooks)) return py::none();
        const DtypeEntry& de = dtype_of(info.dtype);
        py::tuple shape(info.ndim);
        for (std::uint32_t i = 0; i < info.ndim; ++i) shape[i] = py::int_(info.shape[i]);
        return py::make_tuple(de.dtype, shape);
    }

private:
    // The message's dtype, checked against its payload length (ChannelCorrupted otherwise).
    const DtypeEntry& checked_dtype(const MsgInfo& info) {
        const DtypeEntry& de = dtype_of(info.dtype);
        const std::string why = payload_mismatch(info, de);
        if (!why.empty()) {
            end_->mark_broken(why);
            raise(support().corrupted, why);
        }
        return de;
    }

    const DtypeEntry& dtype_of(const std::string& wire) {
        std::string why;
        const DtypeEntry* de = codec_.dtype_of(wire, why);
        if (!de) {
            end_->mark_broken(why);
            raise(support().corrupted, why);
        }
        return *de;
    }

    // What a recv that timed out or was interrupted in the middle of a message received of it
    // (Ring::resuming): the array it was filling, or a copy of the caller's buffer.
    py::object partial_array_;
    std::vector<std::uint8_t> partial_bytes_;
};

}  // namespace shmpy
}  // namespace fastcopy
