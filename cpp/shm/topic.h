// Shared-memory publish/subscribe (fastcopy.shm.Topic): one publisher, many subscribers.
//
// ---- protocol ------------------------------------------------------------------------------
// Segment /dev/shm/<name>:
//   [0, 4096)            header: magic "FCOPTOP1", version, geometry, publisher pid/start/
//                        closed, head, futex words (hot words on separate 128-byte blocks);
//                        it starts with segment.h's prefix (magic, version, creator).
//   [4096, +128*S)       S subscriber records of 128 bytes (TopicSub offsets below).
//   then, from the next page (data_offset): N slots of kSlotHdrBytes + pad64(slot_bytes) bytes
//   each (from slot_bytes = 256 KiB: the slots start at a page plus 4096 - kSlotHdrBytes and
//   take whole pages, so every payload starts on a page; see TopicGeometry).
//   Subscribers map [data_offset, end) read-only and what comes before it writable: they write
//   only their records and the header's futex and waiting words; the publisher, alone to
//   write the slots, maps everything writable.
//   Each slot:
//     +0    state (u64 seqlock): 0 never written, 2k+1 while message k is being written,
//           2k+2 once message k is complete. Written only by the publisher.
//     +64   message header: MsgHeader (seq = k) | shape (ndim x u64) | dtype string
//     +kSlotHdrBytes  payload (at most slot_bytes bytes)
// head = number of messages published (written only by the publisher, release store after the
// slot's state became 2k+2). Message k lives in slot k mod N.
//
// Subscriber record: state (0 free, 1 active, 2 closed but views still pinned, 3 being
// claimed), pid and start time, cursor = next message it will read, view_floor = oldest
// message held by one of its views (kNoFloor: none). A subscriber claims a free record with
// one 64-bit CAS of [state | pid << 32] (0 -> 3 with its pid), fills it, then CASes 3 -> 1.
// Only the owner writes its record, except that anyone may free (CAS state -> 0) the record
// of a process that is gone (for state 3 the pid alone decides: its start time may be stale).
//
// Publisher, before writing message k (k >= N, slot holds k - N):
//   block mode: wait until every active record has cursor > k - N and every active or
//     pinning record has view_floor > k - N;  drop mode: only the view_floor condition.
//   While waiting it checks the liveness (pid + start time) of the records holding it back
//   and frees the dead ones (CAS, so a record that detaches meanwhile is fine).
//   Then: state = 2k+1 (seq_cst); full fence; check the floors again (the Dekker half of the
//   pin handshake; waits while a pin on k - N appears); write header and payload;
//   state = 2k+2 (release); head = k+1 (release); wake sleeping subscribers.
// Subscriber reading message c (c < head):
//   s1 = state (acquire); s1 != 2c+2 -> overwritten (drop) or corrupt (block); copy the
//   header, validate it, copy the payload; acquire fence; s2 = state; s2 != s1 -> the copy
//   may be torn: discarded, counted lost. Lost messages: the cursor jumps to
//   max(c + 1, head - N) (the oldest message that may still be in the ring) and
//   MessagesLost(jump) is raised; every message is either received or counted exactly once.
// Views (pins): the subscriber stores view_floor = min(held) (seq_cst), then re-reads the
// slot state; only if it is still 2c+2 does the view stand (else: lost). The publisher marks
// the slot before it checks floors, so at least one of the two sees the other.
// Late joiner: activate the record (cursor 0 holds the publisher back meanwhile), read head h,
// start at max(h - history, h - (N - 1), 0): the slot of h - N may already be being rewritten
// by a publisher that did not see the activation, h - N + 1 .. h - 1 are intact.
// Waiting: spin briefly, then FUTEX_WAIT (shared). Subscribers count themselves in
// sub_waiting while they sleep on data_futex (the publisher wakes all only when it is
// nonzero); the publisher sets pub_waiting while it sleeps on space_futex (subscribers wake it
// after moving a cursor or a floor). Sleepers wake every 50 ms to check liveness.
//
// Everything read from the segment is untrusted: geometry is validated at attach and
// compared at every call, positions are reduced modulo the N validated at attach, header
// fields are bounded before use, so no copy leaves its slot or the mapping (ShmCorrupted).
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "policy/store_modes.h"
#include "shm/errors.h"
#include "shm/os.h"
#include "shm/rules.h"
#include "shm/segment.h"
#include "shm/spin.h"
#include "shm/wire.h"

namespace fastcopy {
namespace shm {

constexpr std::uint64_t kTopicMagic = 0x31504f544f50434full;  // "FCOPTOP1" little-endian
// 2: slots of kPageAlignedLoanMin bytes or more are page-aligned (TopicGeometry).
// 3: the slots start on a page after the subscriber records (data_offset), so that subscribers
// map them read-only; a version-2 segment has them right after the records.
constexpr std::uint32_t kTopicVersion = 3;
constexpr SegmentKind kTopicSegment{"topic", kTopicMagic, kTopicVersion};
constexpr std::size_t kTopicSubBytes = 128;
constexpr std::size_t kSlotHdrBytes = 2048;   // state (64) + the largest message header
constexpr std::size_t kSlotMsgHdrOff = 64;
static_assert(kSlotMsgHdrOff + kMaxMsgHeaderBytes <= kSlotHdrBytes, "a slot holds the largest message header");
constexpr std::uint32_t kTopicMaxSlots = 1u << 20;
constexpr std::uint32_t kTopicMaxSubscribers = 1024;
constexpr std::uint64_t kNoFloor = ~std::uint64_t(0);
// The most messages a topic counts: a head beyond it is corrupt.
constexpr std::uint64_t kMaxHead = std::uint64_t(1) << 62;

// Topic.create() without `slots`: as many slots as hold kTopicDefaultBytes of payload, at
// least kTopicDefaultMinSlots and at most kTopicDefaultMaxSlots, and at least history + 1.
// Small messages run faster with many slots, large ones with few: more slots than this only
// add memory that falls out of the caches; fewer leave the publisher waiting on wake-ups.
// evidence: shm-topic-default-slots
constexpr std::uint64_t kTopicDefaultBytes = 4u << 20;
constexpr std::uint32_t kTopicDefaultMinSlots = 4;
constexpr std::uint32_t kTopicDefaultMaxSlots = 1024;
// May exceed kTopicMaxSlots (a history that large): the topic's constructor then refuses it.
std::uint64_t default_topic_slots(std::uint64_t slot_bytes, std::uint64_t history);
enum class Overflow : std::uint32_t { Block = 0, Drop = 1 };

enum TopicOff : std::size_t {
    kTOffMagic = kSegMagic, kTOffVersion = kSegVersion, kTOffHeaderBytes = kSegHeaderBytes, kTOffSlots = 16, kTOffMaxSubs = 20,
    kTOffSlotBytes = 24, kTOffHistory = 32, kTOffOverflow = 36, kTOffTotalBytes = 40,
    kTOffPubPid = 128, kTOffPubClosed = 132, kTOffPubStart = 136,
    kTOffHead = 512,
    kTOffDataFutex = 768, kTOffSubWaiting = 896,
    kTOffSpaceFutex = 1024, kTOffPubWaiting = 1152,
    kTOffCreatorPid = kSegCreatorPid, kTOffCreatorStart = kSegCreatorStart,
};
static_assert(outside_prefix(kTOffSlots, 28) && outside_prefix(kTOffTotalBytes, 8) && outside_prefix(kTOffPubPid, 16) &&
                  outside_prefix(kTOffHead, 8) && outside_prefix(kTOffDataFutex, 4) && outside_prefix(kTOffSubWaiting, 4) &&
                  outside_prefix(kTOffSpaceFutex, 4) && outside_prefix(kTOffPubWaiting, 4),
              "the topic's own header words lie outside the segment prefix");
enum TopicSubOff : std::size_t {
    kSubState = 0, kSubPid = 4, kSubStart = 8, kSubCursor = 16, kSubFloor = 64,
};
enum : std::uint32_t { kSubFree = 0, kSubActive = 1, kSubPinsOnly = 2 };

// Geometry of a topic segment (validated).
struct TopicGeometry {
    std::uint32_t slots = 0, max_subs = 0, history = 0;
    std::uint64_t slot_bytes = 0;
    Overflow overflow = Overflow::Block;
    // Slots of kPageAlignedLoanMin bytes or more start their payload on a page, like a
    // Channel's large loans (channel.h): the slots start so that the
    // first payload is page-aligned, and the stride is a whole number of pages.
    bool page_slots() const { return slot_bytes >= kPageAlignedLoanMin; }
    std::uint64_t slot_stride() const {
        return page_slots() ? round_up_to_page(kSlotHdrBytes + slot_bytes) : kSlotHdrBytes + pad64(slot_bytes);
    }
    // Where the slots' pages begin: the first page after the subscriber records. Subscribers
    // map from here on read-only (protect_data).
    std::uint64_t data_offset() const {
        return round_up_to_page(kHeaderBytes + std::uint64_t(max_subs) * kTopicSubBytes);
    }
    std::uint64_t slots_offset() const {
        return page_slots() ? data_offset() + kPageBytes - kSlotHdrBytes : data_offset();
    }
    static std::uint64_t round_up_to_page(std::uint64_t n) { return (n + kPageBytes - 1) / kPageBytes * kPageBytes; }
    std::uint64_t total_bytes() const { return slots_offset() + std::uint64_t(slots) * slot_stride(); }
};

// The views a subscriber holds, shared with their Python base objects (which release them from
// their destructors, possibly after the subscriber closed). Everything under mu.
struct TopicLedger {
    ForkSafeMutex mu;
    std::shared_ptr<Mapping> mapping;  // reset when closed and nothing is held
    std::uint8_t* record = nullptr;    // our subscriber record (null: none / freed)
    std::uint8_t* header = nullptr;
    bool open = true;
    std::uint64_t generation = 0;      // fork generation of the owning process
    std::map<std::uint64_t, std::uint64_t> held;  // view id -> message seq
    std::uint64_t next_id = 1;
    std::uint64_t held_bytes_total = 0;
    std::map<std::uint64_t, std::uint64_t> held_bytes;  // view id -> bytes
    std::uint64_t loan_id = 0;         // publisher: the outstanding loan
    // With mu held: the oldest held seq (kNoFloor if none).
    std::uint64_t floor_locked() const;
    // With mu held: stores the floor in the record and wakes a waiting publisher; frees the
    // record when the subscriber is closed and nothing is held any more.
    void settle_locked();
    void release_view(std::uint64_t id);
    void end_loan(std::uint64_t id);
    std::uint64_t views();
    std::uint64_t bytes();
};

struct TopicMsg {
    MsgInfo info;
    std::uint64_t seq = 0;
    std::uint64_t state = 0;   // the slot state seen when the header was read
    const std::uint8_t* payload = nullptr;
};

class Topic {
public:
    using GilHooks = shm::GilHooks;
    static Topic* create(const std::string& name, std::uint64_t slot_bytes, std::uint32_t slots,
                         std::uint32_t history, Overflow overflow, std::uint32_t max_subscribers);
    // Opens the segment as a subscriber (claims a record).
    static Topic* subscribe(const std::string& name);
    ~Topic();

    const std::string& name() const { return name_; }
    const TopicGeometry& geometry() const { return geo_; }
    bool is_publisher() const { return publisher_; }
    bool closed() const { return base_ == nullptr; }
    void close();
    bool unlink();

    // Publisher. Payload at most slot_bytes (ShmError otherwise; the binding checks first).
    // False on timeout (nothing written).
    bool send(const void* hdr, std::size_t hdr_len, const void* payload, std::size_t payload_len,
              double timeout_s, const GilHooks& gil);
    // Reserves the next slot (waits like send) and returns its payload address; nullptr on
    // timeout. publish_loan writes the header and publishes; end_loan (via the ledger) without
    // publish leaves the slot marked as being written (its old message is gone either way).
    std::uint8_t* loan(const void* hdr, std::size_t hdr_len, std::size_t payload_len, double timeout_s,
                       const GilHooks& gil, std::uint64_t& id);
    void publish_loan(std::uint64_t id);
    // Active subscriber records whose process is alive (frees those of dead processes).
    std::uint32_t subscriber_count();
    std::uint64_t published() const { return head_; }

    // Subscriber: waits for the next message and validates its header; false on timeout.
    // Raises ShmMessagesLost when the next message was overwritten (the cursor moved past it).
    bool next(TopicMsg& msg, double timeout_s, const GilHooks& gil);
    // Copies the payload of msg (from next()) to dst and consumes it; ShmMessagesLost if it was
    // overwritten during the copy (dst then holds garbage; the cursor moved on).
    void consume(const TopicMsg& msg, void* dst, const GilHooks& gil);
    // Pins msg as a view and consumes it; returns the view id (release it through ledger()).
    // ShmMessagesLost if it was overwritten before the pin took hold.
    std::uint64_t take_view(const TopicMsg& msg);
    std::uint64_t lost() const { return lost_; }
    std::uint64_t cursor() const { return cursor_; }
    const std::shared_ptr<TopicLedger>& ledger() const { return ledger_; }
    // How fills of the publisher's loans by fastcopy.copy store (see Ring::write_mode, channel.h).
    const std::shared_ptr<policy::StoreModeLearner>& write_mode() const { return write_mode_; }
    // Marks the topic unusable (later calls raise ShmCorrupted with this reason).
    void mark_broken(const std::string& why) { broken_ = why; }

private:
    Topic() = default;
    std::uint8_t* word(std::size_t off) const { return base_ + off; }
    std::uint8_t* record(std::uint32_t i) const { return base_ + kHeaderBytes + std::size_t(i) * kTopicSubBytes; }
    std::uint8_t* slot(std::uint64_t seq) const {
        return base_ + geo_.slots_offset() + (seq % geo_.slots) * geo_.slot_stride();
    }
    void check_usable(bool want_publisher);
    void check_header();
    [[noreturn]] void corrupt(const std::string& why);
    // Publisher: true when nothing holds the slot of message k back (frees dead records).
    bool slot_free(std::uint64_t k, bool floors_only, bool check_liveness);
    // Waits until the slot of head_ may be written and marks it; false on timeout.
    bool acquire_slot(double deadline, const GilHooks& gil);
    void finish_slot(const void* hdr, std::size_t hdr_len);
    void wake_subscribers();
    void wake_publisher();
    std::uint64_t read_head_checked();
    [[noreturn]] void lose(std::uint64_t c, const char* how);

    std::string name_;
    std::uint8_t* base_ = nullptr;
    std::size_t map_bytes_ = 0;
    TopicGeometry geo_;
    std::shared_ptr<TopicLedger> ledger_;
    std::shared_ptr<policy::StoreModeLearner> write_mode_ = std::make_shared<policy::StoreModeLearner>();
    bool publisher_ = false;
    bool unlinked_ = false;
    std::uint64_t generation_ = 0;
    std::uint32_t pid_ = 0;
    std::uint64_t start_time_ = 0;
    std::uint32_t record_index_ = 0;
    std::uint64_t head_ = 0;     // publisher: authoritative; subscriber: last head seen
    std::uint64_t cursor_ = 0;   // subscriber: next message
    std::uint64_t lost_ = 0;
    std::uint64_t peeked_seq_ = ~std::uint64_t(0);
    std::string broken_;
    std::uint8_t loan_hdr_[kSlotHdrBytes];
    std::size_t loan_hdr_len_ = 0;
    AdaptiveSpin spin_;          // before sleeping in a wait (publisher: for a slot; subscriber: for data)
    bool loan_marked_ = false;   // the slot of head_ is marked 2k+1 (loan, discarded loan, or a timed-out wait)
    std::atomic<bool> busy_{false};
    std::uint64_t busy_generation_ = 0;
    friend struct TopicBusy;
};

// One call at a time on a Topic end: the second thread gets ShmError.
struct TopicBusy {
    Topic& t;
    explicit TopicBusy(Topic& topic) : t(topic) {
        std::uint64_t gen = fork_generation();
        if (t.busy_.exchange(true, std::memory_order_acquire) && t.busy_generation_ == gen)
            throw ShmError("Topic used from two threads at once; a publisher or subscriber is for one thread at a time");
        t.busy_generation_ = gen;
    }
    ~TopicBusy() { t.busy_.store(false, std::memory_order_release); }
};

}  // namespace shm
}  // namespace fastcopy
