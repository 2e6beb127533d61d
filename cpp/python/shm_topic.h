// The Python binding of a Topic end (_core.ShmTopic; fastcopy.shm.Topic wraps it): the
// publisher or one subscriber. Included by bindings_shm.cpp only.
#pragma once
#include <cstring>

#include "python/shm_common.h"

namespace fastcopy {
namespace shmpy {

using shm::Topic;
using shm::TopicMsg;

class PyTopic : public PyEnd<Topic, PyTopic> {
public:
    Topic& topic() { return *end_; }
    // create: the publisher; otherwise a subscriber of the existing topic `name`.
    PyTopic(const std::string& name, std::uint64_t slot_bytes, std::uint32_t slots, std::uint32_t history,
            const std::string& overflow, std::uint32_t max_subscribers, bool create) {
        if (create) {
            if (overflow != "block" && overflow != "drop")
                raise(PyExc_ValueError, "Topic.create: overflow must be 'block' or 'drop', got '" + overflow + "'");
            try {
                end_.reset(Topic::create(name, slot_bytes, slots, history,
                                           overflow == "drop" ? shm::Overflow::Drop : shm::Overflow::Block,
                                           max_subscribers));
            } catch (const shm::ShmOsError&) {
                throw;
            } catch (const shm::ShmError& e) {
                if (std::strncmp(e.what(), "Topic.create: ", 14) == 0) raise(PyExc_ValueError, e.what());
                throw;
            }
        } else {
            end_.reset(Topic::subscribe(name));
        }
    }

    void send(py::handle obj, const py::object& timeout) {
        double t = timeout_arg(timeout, "send");
        alignas(64) std::uint8_t hdr[kHeaderRoom];
        with_message(codec_, obj, "send", hdr, [&](std::size_t hdr_len, const void* ptr, std::size_t nbytes) {
            if (end_->closed()) throw shm::ShmUseAfterClose("operation on a closed Topic publisher");
            if (nbytes > end_->geometry().slot_bytes)
                raise(PyExc_ValueError, "send: the message has " + std::to_string(nbytes) +
                                            " bytes, more than the topic's slot_bytes (" +
                                            std::to_string(end_->geometry().slot_bytes) + "); nothing was sent");
            PyThreadState* ts = nullptr;
            const shm::GilHooks hooks = python_gil_hooks(&ts);
            if (!end_->send(hdr, hdr_len, ptr, nbytes, t, hooks))
                raise(PyExc_TimeoutError, "send timed out after " + seconds_words(t) +
                                              ": a subscriber has not read the message in the slot (or holds a view of it)");
        });
    }

    // PyEnd's hooks.
    static const char* loan_what() { return "Topic.loan"; }
    static const char* noun() { return "topic"; }
    const char* full_words() const {
        return "a subscriber has not read the message in the slot (or holds a view of it)";
    }
    bool owns(const ShmSlot& slot) const { return slot.topic == end_->ledger(); }
    void attach_slot(ShmSlot& slot) {
        slot.topic = end_->ledger();
        slot.mapping = end_->ledger()->mapping;
    }
    void check_loan_size(const py::dtype& dt, bool overflow, std::uint64_t count, std::uint64_t n) {
        if (end_->closed()) throw shm::ShmUseAfterClose("operation on a closed Topic publisher");
        const std::uint64_t limit = end_->geometry().slot_bytes;
        if (overflow || n > limit)
            raise(PyExc_ValueError, "loan: " + std::to_string(count) + " elements of " +
                                        std::to_string(dt.itemsize()) + " bytes are more than the topic's slot_bytes (" +
                                        std::to_string(limit) + ")");
    }
    void check_loan_message(std::size_t, std::uint64_t) {}  // a slot holds the largest header

    py::object recv(const py::object& out, const py::object& timeout) {
        double t = timeout_arg(timeout, "recv");
        check_out_type(out);
        PyThreadState* ts = nullptr;
        const shm::GilHooks hooks = python_gil_hooks(&ts);
        TopicMsg msg;
        if (!end_->next(msg, t, hooks))
            raise(PyExc_TimeoutError, "recv timed out after " + seconds_words(t) + ": no message arrived");
        const MsgInfo& info = msg.info;
        const DtypeEntry& de = checked_dtype(info);
        return deliver(info, de, out, "topic", py::object(), [&](void* dst, const py::object&) {
            end_->consume(msg, dst, hooks);
            return true;
        });
    }

    py::object recv_view(const py::object& timeout, bool cow) {
        double t = timeout_arg(timeout, "recv_view");
        PyThreadState* ts = nullptr;
        const shm::GilHooks hooks = python_gil_hooks(&ts);
        TopicMsg msg;
        if (!end_->next(msg, t, hooks))
            raise(PyExc_TimeoutError, "recv_view timed out after " + seconds_words(t) + ": no message arrived");
        const DtypeEntry& de = checked_dtype(msg.info);
        // The base object exists before the pin, so a failure below cannot leak the pin.
        auto slot = std::make_unique<ShmSlot>();
        slot->topic = end_->ledger();
        slot->mapping = end_->ledger()->mapping;
        slot->nbytes = msg.info.payload_len;
        ShmSlot* raw = slot.get();
        py::object base = py::cast(std::move(slot));
        raw->id = end_->take_view(msg);
        return view_array(base, de, msg.info, msg.payload, cow, end_->name());
    }



private:
    const DtypeEntry& checked_dtype(const MsgInfo& info) {
        std::string why;
        const DtypeEntry* de = codec_.dtype_of(info.dtype, why);
        if (de) why = payload_mismatch(info, *de);
        if (!why.empty()) {
            end_->mark_broken(why);
            raise(support().corrupted, why);
        }
        return *de;
    }

};

}  // namespace shmpy
}  // namespace fastcopy
