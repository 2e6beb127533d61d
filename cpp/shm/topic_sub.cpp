// Shared-memory publish/subscribe, the subscriber's reads: next message, copy, view, loss.
// See topic.h for the protocol.
#include "shm/topic.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>

#include "core/dispatch.h"

namespace fastcopy {
namespace shm {

// ---- subscriber ----------------------------------------------------------------------------------
std::uint64_t Topic::read_head_checked() {
    std::uint64_t h = load_acquire_u64(word(kTOffHead));
    if (h < head_ || h > kMaxHead)
        corrupt("topic header is corrupt: head " + std::to_string(h) + " went back from " + std::to_string(head_));
    if (geo_.overflow == Overflow::Block && h > cursor_ + geo_.slots)
        corrupt("topic header is corrupt: head " + std::to_string(h) + " is more than " + std::to_string(geo_.slots) +
                " slots ahead of this subscriber (" + std::to_string(cursor_) + ") in block mode");
    head_ = h;
    return h;
}

void Topic::lose(std::uint64_t c, const char* how) {
    peeked_seq_ = ~std::uint64_t(0);
    if (geo_.overflow != Overflow::Drop)
        corrupt(std::string("topic is corrupt: message ") + std::to_string(c) + " was " + how +
                " although the topic blocks for its subscribers");
    const std::uint64_t h = read_head_checked();
    // The slot of c was rewritten for c + N or later, which the publisher starts at head c + N.
    if (h < c + geo_.slots)
        corrupt("topic is corrupt: message " + std::to_string(c) + " was " + how + " but head is only " +
                std::to_string(h));
    const std::uint64_t next = std::max(c + 1, h - geo_.slots);  // the oldest one that may be intact
    const std::uint64_t n = next - c;
    cursor_ = next;
    lost_ += n;
    store_release_u64(ledger_->record + kSubCursor, cursor_);
    throw ShmMessagesLost(n, std::to_string(n) + (n == 1 ? " message was" : " messages were") +
                                 " overwritten before this subscriber read " + (n == 1 ? "it" : "them") +
                                 " (overflow='drop'); the next recv continues with message " + std::to_string(next));
}

bool Topic::next(TopicMsg& msg, double timeout_s, const GilHooks& hooks) {
    TopicBusy busy(*this);
    check_usable(false);
    check_header();
    peeked_seq_ = ~std::uint64_t(0);
    const double deadline = timeout_s < 0 ? std::numeric_limits<double>::infinity() : monotonic_seconds() + timeout_s;
    if (read_head_checked() <= cursor_) {  // read every time: validates head (cheap, one line)
        auto ready = [&] { return read_head_checked() > cursor_; };
        const double start = monotonic_seconds();
        if (!spin_.spin(ready, start, std::min(deadline - start, spin_.budget()), true)) {
            GilGuard gil(hooks);
            gil.release();
            void* fut = word(kTOffDataFutex);
            fetch_add_u32(word(kTOffSubWaiting), 1);
            struct Leave {
                void* w;
                ~Leave() { __atomic_fetch_sub(static_cast<std::uint32_t*>(w), 1u, __ATOMIC_SEQ_CST); }
            } leave{word(kTOffSubWaiting)};
            double last_check = monotonic_seconds();
            for (;;) {
                std::uint32_t v = load_acquire_u32(fut);
                __atomic_thread_fence(__ATOMIC_SEQ_CST);
                check_header();
                if (ready()) break;
                if (load_acquire_u32(word(kTOffPubClosed)) != 0) {
                    if (ready()) break;
                    throw ShmClosed("the publisher closed the topic (every message was received)");
                }
                double now = monotonic_seconds();
                if (now >= deadline) return false;
                if (now - last_check >= kLivenessSlice) {
                    last_check = now;
                    std::uint32_t pid = load_acquire_u32(word(kTOffPubPid));
                    if (!process_alive(pid, load_acquire_u64(word(kTOffPubStart)))) {
                        if (ready()) break;
                        throw ShmPeerDied("the publisher (pid " + std::to_string(pid) +
                                          ") died before sending the next message");
                    }
                }
                gil.check_signals_after(futex_wait(fut, v, std::min(deadline - now, kLivenessSlice)));
            }
            spin_.slept(monotonic_seconds() - start);
        }
    }
    const std::uint64_t c = cursor_;
    const std::uint8_t* s = slot(c);
    const std::uint64_t s1 = load_acquire_u64(s);
    if (s1 != 2 * c + 2) {
        if (s1 > 2 * c + 2) lose(c, "overwritten");
        corrupt("topic is corrupt: slot state " + std::to_string(s1) + " for published message " + std::to_string(c));
    }
    // Copy the header out (bounded whatever it says), confirm the snapshot, then validate it.
    MsgHeader h;
    std::memcpy(&h, s + kSlotMsgHdrOff, sizeof h);
    std::uint8_t extra[8 * kMaxNdim + kMaxDtypeLen];
    const std::size_t extra_len = std::min<std::size_t>(sizeof extra, 8ull * std::min(h.ndim, kMaxNdim) +
                                                                          std::min(h.dtype_len, kMaxDtypeLen));
    std::memcpy(extra, s + kSlotMsgHdrOff + sizeof h, extra_len);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(reinterpret_cast<const std::uint64_t*>(s), __ATOMIC_RELAXED) != s1) lose(c, "overwritten");
    std::string why = check_msg_header(h, c, " in the slot of " + std::to_string(c), geo_.slot_bytes,
                                       " > slot_bytes " + std::to_string(geo_.slot_bytes));
    if (why.empty()) why = read_msg_extra(h, extra, msg.info);
    if (!why.empty()) corrupt("message header is corrupt: " + why);
    msg.seq = c;
    msg.state = s1;
    msg.payload = s + kSlotHdrBytes;
    peeked_seq_ = c;
    return true;
}

void Topic::consume(const TopicMsg& msg, void* dst, const GilHooks& hooks) {
    TopicBusy busy(*this);
    check_usable(false);
    if (peeked_seq_ != msg.seq || msg.seq != cursor_) throw ShmError("internal error: consume() without next()");
    peeked_seq_ = ~std::uint64_t(0);
    const std::uint64_t c = cursor_;
    const std::uint8_t* s = slot(c);
    {
        GilGuard gil(hooks);
        if (msg.info.payload_len >= kShmReleaseGilBytes) gil.release();
        if (msg.info.payload_len) copy_bytes(dst, msg.payload, msg.info.payload_len, Region::FromShared);
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(reinterpret_cast<const std::uint64_t*>(s), __ATOMIC_RELAXED) != msg.state)
        lose(c, "overwritten while it was copied");
    cursor_ = c + 1;
    store_release_u64(ledger_->record + kSubCursor, cursor_);
    if (geo_.overflow == Overflow::Block) {
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        wake_publisher();
    }
}

std::uint64_t Topic::take_view(const TopicMsg& msg) {
    TopicBusy busy(*this);
    check_usable(false);
    if (peeked_seq_ != msg.seq || msg.seq != cursor_) throw ShmError("internal error: take_view() without next()");
    peeked_seq_ = ~std::uint64_t(0);
    const std::uint64_t c = cursor_;
    std::uint64_t id;
    bool pinned;
    {
        std::lock_guard<std::mutex> lock(ledger_->mu);
        id = ledger_->next_id++;
        ledger_->held[id] = c;
        // The subscriber's half of the handshake: pin (seq_cst), then look at the slot again.
        store_seq_cst_u64(ledger_->record + kSubFloor, ledger_->floor_locked());
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        pinned = load_seq_cst_u64(slot(c)) == msg.state;
        if (pinned) {
            ledger_->held_bytes[id] = msg.info.payload_len;
            ledger_->held_bytes_total += msg.info.payload_len;
        } else {
            ledger_->held.erase(id);
            ledger_->settle_locked();
        }
    }
    if (!pinned) lose(c, "overwritten before the view was pinned");
    cursor_ = c + 1;
    store_release_u64(ledger_->record + kSubCursor, cursor_);
    if (geo_.overflow == Overflow::Block) {
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        wake_publisher();
    }
    return id;
}

}  // namespace shm
}  // namespace fastcopy
