// Shared-memory publish/subscribe, the segment and the publisher (topic_sub.cpp: the
// subscriber's reads). See topic.h for the protocol, docs/shm.md for the user view.
#include "shm/topic.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <sys/mman.h>
#include <unistd.h>

#include "core/dispatch.h"

namespace fastcopy {
namespace shm {

namespace {

constexpr std::uint64_t kMaxSlotBytes = std::uint64_t(1) << 40;
constexpr std::uint64_t kMaxTopicBytes = std::uint64_t(1) << 41;

std::string geometry_error(const TopicGeometry& g) {
    if (g.slots < 2 || g.slots > kTopicMaxSlots)
        return "slots must be 2 to " + std::to_string(kTopicMaxSlots) + ", got " + std::to_string(g.slots);
    if (g.slot_bytes < 1 || g.slot_bytes > kMaxSlotBytes)
        return "slot_bytes must be 1 to 2**40, got " + std::to_string(g.slot_bytes);
    if (g.max_subs < 1 || g.max_subs > kTopicMaxSubscribers)
        return "max_subscribers must be 1 to " + std::to_string(kTopicMaxSubscribers) + ", got " +
               std::to_string(g.max_subs);
    if (g.history > g.slots - 1)
        return "history must be 0 to slots - 1 (" + std::to_string(g.slots - 1) + "), got " +
               std::to_string(g.history);
    if (static_cast<std::uint32_t>(g.overflow) > 1) return "overflow mode " + std::to_string(static_cast<std::uint32_t>(g.overflow));
    // slots <= 2^20 and stride <= 2^40 + 4 KiB: the product fits, the sum is bounded below.
    if (g.total_bytes() > kMaxTopicBytes) return "the segment would exceed 2 TiB";
    return "";
}

// Reads the geometry in a topic's header into g: why it is not valid for a segment of `size`
// bytes ("" when it is).
std::string geometry_error_of(const std::uint8_t* b, std::uint64_t size, TopicGeometry& g) {
    g.slots = load_acquire_u32(b + kTOffSlots);
    g.max_subs = load_acquire_u32(b + kTOffMaxSubs);
    g.slot_bytes = load_acquire_u64(b + kTOffSlotBytes);
    g.history = load_acquire_u32(b + kTOffHistory);
    const std::uint32_t ov = load_acquire_u32(b + kTOffOverflow);
    g.overflow = static_cast<Overflow>(ov);
    if (ov > 1) return "overflow mode " + std::to_string(ov);
    std::string why = geometry_error(g);
    if (!why.empty()) return why;
    if (g.total_bytes() != size || load_acquire_u64(b + kTOffTotalBytes) != size)
        return "geometry (" + std::to_string(g.slots) + " slots of " + std::to_string(g.slot_bytes) +
               " bytes) does not match the segment size " + std::to_string(size);
    return "";
}

}  // namespace

std::uint64_t default_topic_slots(std::uint64_t slot_bytes, std::uint64_t history) {
    const std::uint64_t fill = kTopicDefaultBytes / std::max<std::uint64_t>(slot_bytes, 1);
    const std::uint64_t slots =
        std::min<std::uint64_t>(kTopicDefaultMaxSlots, std::max<std::uint64_t>(kTopicDefaultMinSlots, fill));
    return std::max(slots, history + 1);  // history < 2**32 (Topic.create checks it)
}


// ---- ledger -----------------------------------------------------------------------------------
std::uint64_t TopicLedger::floor_locked() const {
    std::uint64_t f = kNoFloor;
    for (const auto& kv : held) f = std::min(f, kv.second);
    return f;
}

void TopicLedger::settle_locked() {
    if (record && mapping && generation == fork_generation()) {
        store_seq_cst_u64(record + kSubFloor, floor_locked());
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (!open && held.empty()) {
            cas_u32(record + kSubState, kSubPinsOnly, kSubFree);
            record = nullptr;
        }
        if (__atomic_load_n(reinterpret_cast<std::uint32_t*>(header + kTOffPubWaiting), __ATOMIC_RELAXED)) {
            fetch_add_u32(header + kTOffSpaceFutex, 1);
            futex_wake(header + kTOffSpaceFutex, 1);
        }
    }
    if (!open && held.empty() && loan_id == 0) {
        record = nullptr;
        mapping.reset();
    }
}

void TopicLedger::release_view(std::uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = held.find(id);
    if (it == held.end()) return;
    held.erase(it);
    auto b = held_bytes.find(id);
    if (b != held_bytes.end()) {
        held_bytes_total -= b->second;
        held_bytes.erase(b);
    }
    settle_locked();
}

void TopicLedger::end_loan(std::uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    if (loan_id == id) loan_id = 0;
    settle_locked();
}

std::uint64_t TopicLedger::views() {
    std::lock_guard<std::mutex> lock(mu);
    return held.size();
}

std::uint64_t TopicLedger::bytes() {
    std::lock_guard<std::mutex> lock(mu);
    return held_bytes_total;
}

// ---- segment ------------------------------------------------------------------------------------
Topic* Topic::create(const std::string& name, std::uint64_t slot_bytes, std::uint32_t slots, std::uint32_t history,
                     Overflow overflow, std::uint32_t max_subscribers) {
    check_segment_name(name, "topic");
    TopicGeometry g;
    g.slots = slots;
    g.slot_bytes = slot_bytes;
    g.history = history;
    g.overflow = overflow;
    g.max_subs = max_subscribers;
    std::string why = geometry_error(g);
    if (!why.empty()) throw ShmError("Topic.create: " + why);
    const std::uint64_t total = g.total_bytes();
    const std::uint32_t me = static_cast<std::uint32_t>(::getpid());
    const std::uint64_t my_start = process_start_time(me);
    const MappedSegment seg = create_segment(name, total, kTopicSegment, [&](std::uint8_t* b) {
        store_release_u32(b + kTOffSlots, slots);
        store_release_u32(b + kTOffMaxSubs, max_subscribers);
        store_release_u64(b + kTOffSlotBytes, slot_bytes);
        store_release_u32(b + kTOffHistory, history);
        store_release_u32(b + kTOffOverflow, static_cast<std::uint32_t>(overflow));
        store_release_u64(b + kTOffTotalBytes, total);
        store_release_u32(b + kTOffPubPid, me);
        store_release_u64(b + kTOffPubStart, my_start);
    });
    Topic* t = new Topic();
    t->name_ = name;
    t->base_ = seg.base;
    t->map_bytes_ = total;
    t->geo_ = g;
    t->publisher_ = true;
    t->generation_ = fork_generation();
    t->pid_ = me;
    t->start_time_ = my_start;
    t->ledger_ = std::make_shared<TopicLedger>();
    t->ledger_->mapping = std::make_shared<Mapping>(t->base_, total, seg.fd);
    t->ledger_->header = t->base_;
    t->ledger_->generation = t->generation_;
    return t;
}

Topic* Topic::subscribe(const std::string& name) {
    check_segment_name(name, "topic");
    const MappedSegment seg = open_segment(name, kHeaderBytes + kTopicSubBytes + 2 * kSlotHdrBytes, kMaxTopicBytes,
                                           kTopicSegment, [](const std::uint8_t* header, std::uint64_t size) {
                                               TopicGeometry g;
                                               return geometry_error_of(header, size, g);
                                           });
    const std::uint64_t size = seg.bytes;
    auto* b = seg.base;
    TopicGeometry g;
    std::string why = check_prefix(b, kTopicSegment);
    if (why.empty()) why = geometry_error_of(b, size, g);
    if (!why.empty()) {
        release_segment(seg);
        throw ShmCorrupted("shared memory segment '" + name + "': " + why);
    }
    // The slots are the publisher's to write: a subscriber reads them through a read-only mapping.
    try {
        protect_data(b, g.data_offset(), size, true, name);
    } catch (...) {
        release_segment(seg);
        throw;
    }
    std::unique_ptr<Topic> t(new Topic());
    t->name_ = name;
    t->base_ = b;
    t->map_bytes_ = size;
    t->geo_ = g;
    t->generation_ = fork_generation();
    t->pid_ = static_cast<std::uint32_t>(::getpid());
    t->start_time_ = process_start_time(t->pid_);
    t->ledger_ = std::make_shared<TopicLedger>();
    t->ledger_->mapping = std::make_shared<Mapping>(b, size, seg.fd);
    t->ledger_->header = b;
    t->ledger_->generation = t->generation_;
    // Claim a free record: free -> 3 (being claimed, ignored by the publisher) together with our
    // pid in one 64-bit CAS of the word [state | pid << 32], fill it, then active. Records of
    // processes that are gone are freed on the way, also one whose claimer died half-way (its
    // start time may not be written yet: only the pid is checked for those).
    constexpr std::uint32_t kClaiming = 3;
    const std::uint64_t mine = (std::uint64_t(t->pid_) << 32) | kClaiming;
    std::uint8_t* rec = nullptr;
    for (std::uint32_t i = 0; i < g.max_subs && !rec; ++i) {
        std::uint8_t* r = t->record(i);
        auto* word64 = reinterpret_cast<std::uint64_t*>(r + kSubState);
        std::uint64_t w = __atomic_load_n(word64, __ATOMIC_SEQ_CST);
        const std::uint32_t st_now = static_cast<std::uint32_t>(w);
        const std::uint32_t pid_now = static_cast<std::uint32_t>(w >> 32);
        if (st_now == kSubActive || st_now == kSubPinsOnly || st_now == kClaiming) {
            std::uint64_t start = st_now == kClaiming ? 0 : load_acquire_u64(r + kSubStart);
            if (process_alive(pid_now, start)) continue;
            const std::uint64_t freed = w & ~std::uint64_t(0xffffffffu);
            if (!__atomic_compare_exchange_n(word64, &w, freed, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) continue;
            w = freed;
        } else if (st_now != kSubFree) {
            continue;  // garbage: leave it
        }
        if (__atomic_compare_exchange_n(word64, &w, mine, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
            rec = r;
            t->record_index_ = i;
        }
    }
    if (!rec)
        throw ShmError("topic '" + name + "' has " + std::to_string(g.max_subs) +
                       " subscribers already (its max_subscribers)");
    store_release_u64(rec + kSubStart, t->start_time_);
    store_release_u64(rec + kSubCursor, 0);  // holds a blocking publisher back until the real cursor is set
    store_release_u64(rec + kSubFloor, kNoFloor);
    if (!cas_u32(rec + kSubState, kClaiming, kSubActive))
        throw ShmError("topic '" + name + "': the subscriber record was taken while it was being claimed");
    const std::uint64_t h = load_seq_cst_u64(b + kTOffHead);
    if (h > kMaxHead) {
        store_release_u32(rec + kSubState, kSubFree);
        throw ShmCorrupted("shared memory segment '" + name + "': head " + std::to_string(h) + " is out of range");
    }
    std::uint64_t start = h >= g.slots - 1 ? h - (g.slots - 1) : 0;
    if (h >= g.history) start = std::max(start, h - g.history);
    t->head_ = h;
    t->cursor_ = start;
    t->ledger_->record = rec;
    store_seq_cst_u64(rec + kSubCursor, start);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    t->wake_publisher();
    return t.release();
}

Topic::~Topic() {
    try {
        busy_.store(false);
        close();
    } catch (...) {
    }
}

void Topic::close() {
    if (!base_) return;
    // A flag set before a fork by a thread the child does not have is stale (see BusyGuard).
    if (busy_.load(std::memory_order_acquire) && busy_generation_ == fork_generation())
        throw ShmError("cannot close a Topic while another thread is using it");
    const bool mine = generation_ == fork_generation();
    std::lock_guard<std::mutex> lock(ledger_->mu);
    ledger_->open = false;
    if (mine && publisher_) {
        store_release_u32(word(kTOffPubClosed), 1);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        fetch_add_u32(word(kTOffDataFutex), 1);
        futex_wake(word(kTOffDataFutex), 1 << 30);
    } else if (mine && ledger_->record) {
        // Views still held keep pinning their slots (state 2) until they are gone.
        std::uint8_t* rec = ledger_->record;
        if (ledger_->held.empty()) {
            cas_u32(rec + kSubState, kSubActive, kSubFree);
            ledger_->record = nullptr;
        } else {
            cas_u32(rec + kSubState, kSubActive, kSubPinsOnly);
        }
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        fetch_add_u32(word(kTOffSpaceFutex), 1);
        futex_wake(word(kTOffSpaceFutex), 1);
    }
    if (!mine) ledger_->record = nullptr;  // a forked child's copy: the record is the parent's
    ledger_->settle_locked();
    base_ = nullptr;
}

bool Topic::unlink() {
    if (unlinked_) return false;
    unlinked_ = true;
    return unlink_segment(name_);
}

void Topic::corrupt(const std::string& why) {
    broken_ = why;
    throw ShmCorrupted(why);
}

void Topic::check_usable(bool want_publisher) {
    if (!base_) throw ShmUseAfterClose(std::string("operation on a closed Topic ") +
                                       (publisher_ ? "publisher" : "subscriber"));
    if (!broken_.empty()) throw ShmCorrupted("topic is broken: " + broken_);
    if (generation_ != fork_generation())
        throw ShmError(std::string("this Topic ") + (publisher_ ? "publisher" : "subscriber") +
                       " belongs to the process that opened it; after fork, subscribe again in the child");
    if (want_publisher != publisher_)
        throw ShmError(publisher_ ? "this is the Topic's publisher; use Topic.subscribe(name) to receive"
                                  : "this is a Topic subscriber; only the publisher (Topic.create) sends");
}

void Topic::check_header() {
    const std::uint8_t* b = base_;
    if (load_acquire_u64(b + kTOffMagic) != kTopicMagic || load_acquire_u32(b + kTOffVersion) != kTopicVersion ||
        load_acquire_u32(b + kTOffSlots) != geo_.slots || load_acquire_u64(b + kTOffSlotBytes) != geo_.slot_bytes ||
        load_acquire_u32(b + kTOffMaxSubs) != geo_.max_subs ||
        load_acquire_u32(b + kTOffOverflow) != static_cast<std::uint32_t>(geo_.overflow))
        corrupt("topic header is corrupt: magic, version or geometry changed after attach");
    if (publisher_ && load_acquire_u64(b + kTOffHead) != head_)
        corrupt("topic header is corrupt: head changed by someone other than the publisher");
}

// ---- publisher ------------------------------------------------------------------------------------
bool Topic::slot_free(std::uint64_t k, bool floors_only, bool check_liveness) {
    if (k < geo_.slots) return true;  // the slot was never written
    const std::uint64_t old = k - geo_.slots;
    const bool cursors = !floors_only && geo_.overflow == Overflow::Block;
    for (std::uint32_t i = 0; i < geo_.max_subs; ++i) {
        std::uint8_t* r = record(i);
        std::uint32_t st = __atomic_load_n(reinterpret_cast<std::uint32_t*>(r + kSubState), __ATOMIC_SEQ_CST);
        if (st != kSubActive && st != kSubPinsOnly) continue;  // free, being claimed, or garbage
        bool blocked = false;
        if (cursors && st == kSubActive && load_seq_cst_u64(r + kSubCursor) <= old) blocked = true;
        if (!blocked) {
            std::uint64_t floor = load_seq_cst_u64(r + kSubFloor);
            if (floor != kNoFloor && floor <= old) blocked = true;
        }
        if (!blocked) continue;
        if (check_liveness && !process_alive(load_acquire_u32(r + kSubPid), load_acquire_u64(r + kSubStart))) {
            cas_u32(r + kSubState, st, kSubFree);  // dead: drop it (a concurrent detach wins the CAS, fine)
            continue;
        }
        return false;
    }
    return true;
}

bool Topic::acquire_slot(double deadline, const GilHooks& hooks) {
    const std::uint64_t k = head_;
    auto wait_free = [&](bool floors_only) -> bool {
        if (slot_free(k, floors_only, false)) return true;
        const double start = monotonic_seconds();
        auto free_now = [&] { return slot_free(k, floors_only, false); };
        if (spin_.spin(free_now, start, std::min(deadline - start, spin_.budget()), true)) return true;
        GilGuard gil(hooks);
        gil.release();
        void* fut = word(kTOffSpaceFutex);
        void* flag = word(kTOffPubWaiting);
        struct FlagReset {
            void* f;
            ~FlagReset() { __atomic_store_n(static_cast<std::uint32_t*>(f), 0u, __ATOMIC_SEQ_CST); }
        } reset{flag};
        double last_check = 0;
        for (;;) {
            std::uint32_t v = load_acquire_u32(fut);
            __atomic_store_n(static_cast<std::uint32_t*>(flag), 1u, __ATOMIC_SEQ_CST);
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            check_header();
            double now = monotonic_seconds();
            bool liveness = now - last_check >= kLivenessSlice;
            if (liveness) last_check = now;
            if (slot_free(k, floors_only, liveness)) {
                spin_.slept(monotonic_seconds() - start);
                return true;
            }
            if (now >= deadline) return false;
            gil.check_signals_after(futex_wait(fut, v, std::min(deadline - now, kLivenessSlice)));
        }
    };
    if (!loan_marked_) {
        if (!wait_free(false)) return false;
        // Mark the slot, then look at the pins again (the publisher's half of the handshake).
        store_seq_cst_u64(slot(k), 2 * k + 1);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        loan_marked_ = true;
    }
    // The mark stays on a timeout: the old message is given up, the next send reuses the mark.
    return wait_free(true);
}

void Topic::finish_slot(const void* hdr, std::size_t hdr_len) {
    const std::uint64_t k = head_;
    std::uint8_t* s = slot(k);
    std::memcpy(s + kSlotMsgHdrOff, hdr, hdr_len);
    reinterpret_cast<MsgHeader*>(s + kSlotMsgHdrOff)->seq = k;
    store_release_u64(s, 2 * k + 2);
    loan_marked_ = false;
    head_ = k + 1;
    store_release_u64(word(kTOffHead), head_);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    wake_subscribers();
}

void Topic::wake_subscribers() {
    if (__atomic_load_n(reinterpret_cast<std::uint32_t*>(word(kTOffSubWaiting)), __ATOMIC_RELAXED)) {
        fetch_add_u32(word(kTOffDataFutex), 1);
        futex_wake(word(kTOffDataFutex), 1 << 30);
    }
}

void Topic::wake_publisher() {
    if (__atomic_load_n(reinterpret_cast<std::uint32_t*>(word(kTOffPubWaiting)), __ATOMIC_RELAXED)) {
        fetch_add_u32(word(kTOffSpaceFutex), 1);
        futex_wake(word(kTOffSpaceFutex), 1);
    }
}

bool Topic::send(const void* hdr, std::size_t hdr_len, const void* payload, std::size_t payload_len,
                 double timeout_s, const GilHooks& hooks) {
    TopicBusy busy(*this);
    check_usable(true);
    check_header();
    if (hdr_len > kSlotHdrBytes - kSlotMsgHdrOff || hdr_len % kAlign != 0)
        throw ShmError("internal error: message header length " + std::to_string(hdr_len));
    if (payload_len > geo_.slot_bytes)
        throw ShmError("message of " + std::to_string(payload_len) + " bytes is larger than slot_bytes (" +
                       std::to_string(geo_.slot_bytes) + ")");
    {
        std::lock_guard<std::mutex> lock(ledger_->mu);
        if (ledger_->loan_id != 0)
            throw ShmError("a loaned array is outstanding on this topic: publish() or discard() it before send()");
    }
    const double deadline = timeout_s < 0 ? std::numeric_limits<double>::infinity() : monotonic_seconds() + timeout_s;
    if (!acquire_slot(deadline, hooks)) return false;
    {
        GilGuard gil(hooks);
        if (payload_len >= kShmReleaseGilBytes) gil.release();
        if (payload_len) copy_bytes(slot(head_) + kSlotHdrBytes, payload, payload_len, Region::ToShared);
    }
    finish_slot(hdr, hdr_len);
    return true;
}

std::uint8_t* Topic::loan(const void* hdr, std::size_t hdr_len, std::size_t payload_len, double timeout_s,
                          const GilHooks& hooks, std::uint64_t& id) {
    TopicBusy busy(*this);
    check_usable(true);
    check_header();
    if (hdr_len > kSlotHdrBytes - kSlotMsgHdrOff || hdr_len % kAlign != 0)
        throw ShmError("internal error: message header length " + std::to_string(hdr_len));
    if (payload_len > geo_.slot_bytes)
        throw ShmError("a loan of " + std::to_string(payload_len) + " bytes is larger than slot_bytes (" +
                       std::to_string(geo_.slot_bytes) + ")");
    {
        std::lock_guard<std::mutex> lock(ledger_->mu);
        if (ledger_->loan_id != 0)
            throw ShmError("a loaned array is outstanding on this topic: publish() or discard() it first "
                           "(one loan at a time)");
    }
    const double deadline = timeout_s < 0 ? std::numeric_limits<double>::infinity() : monotonic_seconds() + timeout_s;
    if (!acquire_slot(deadline, hooks)) return nullptr;
    std::memcpy(loan_hdr_, hdr, hdr_len);
    loan_hdr_len_ = hdr_len;
    std::lock_guard<std::mutex> lock(ledger_->mu);
    id = ledger_->next_id++;
    ledger_->loan_id = id;
    return slot(head_) + kSlotHdrBytes;
}

void Topic::publish_loan(std::uint64_t id) {
    TopicBusy busy(*this);
    {
        std::lock_guard<std::mutex> lock(ledger_->mu);
        if (id == 0 || ledger_->loan_id != id)
            throw ShmError("this array is not the topic's outstanding loan (it was published or discarded "
                           "already, or belongs to another topic)");
        ledger_->loan_id = 0;
    }
    check_usable(true);
    check_header();
    if (!loan_marked_) throw ShmError("internal error: publish without a reserved slot");
    finish_slot(loan_hdr_, loan_hdr_len_);
}

std::uint32_t Topic::subscriber_count() {
    if (!base_) return 0;
    std::uint32_t n = 0;
    for (std::uint32_t i = 0; i < geo_.max_subs; ++i) {
        std::uint8_t* r = record(i);
        std::uint32_t st = load_acquire_u32(r + kSubState);
        if (st != kSubActive) continue;
        if (process_alive(load_acquire_u32(r + kSubPid), load_acquire_u64(r + kSubStart))) ++n;
        else cas_u32(r + kSubState, st, kSubFree);
    }
    return n;
}

}  // namespace shm
}  // namespace fastcopy
