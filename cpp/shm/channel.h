// Shared-memory single-producer single-consumer ring (fastcopy.shm.Channel), without Python.
//
// Layout of a segment (/dev/shm/<name>): a 4096-byte header, then `capacity` bytes of ring.
// The consumer maps the ring read-only and the header writable (it writes only header words:
// tail, cut acknowledgement, its sequence number, futex and waiting words); the producer maps
// both writable.
// The ring is a byte stream of messages; each message is a 64-byte-aligned record:
//   MsgHeader (32 B) | shape (ndim x u64) | dtype string | pad to 64 | payload | pad to 64.
// head (bytes ever written) is written only by the producer, tail (bytes ever consumed) only
// by the consumer; both are monotonic u64 and published with release stores / read with
// acquire loads, so the bytes a peer sees behind an index are complete.
//
// Everything read from the segment is untrusted: magic, version, capacity, indices and every
// message field are checked before any copy (ShmCorrupted otherwise). Positions are always
// reduced modulo the capacity this process validated at attach, so no access leaves the
// mapping whatever the header says.
//
// Blocking: spin briefly, then FUTEX_WAIT (shared, not _PRIVATE) on a 32-bit word with a
// timeout slice; the waker only issues FUTEX_WAKE when the sleeper flagged itself as
// sleeping. While sleeping the waiter checks the peer's liveness (pid + start time from the
// header) so a dead peer is reported (ShmPeerDied), never waited on forever.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "core/dispatch.h"
#include "policy/store_modes.h"
#include "shm/errors.h"
#include "shm/os.h"
#include "shm/rules.h"
#include "shm/segment.h"
#include "shm/spin.h"
#include "shm/wire.h"

namespace fastcopy {
namespace shm {

// ---- segment layout -----------------------------------------------------------------------
// A segment is a 4096-byte header (segment.h's prefix, then the words below) and `capacity`
// bytes of ring from the next page.
constexpr std::uint64_t kMagic = 0x31484353504f4346ull;  // "FCOPSCH1" little-endian
// 2: padding records may end before the end of the ring (page-aligned loans). A version-1
// consumer would call them corrupt, so the two refuse each other at attach instead.
// 3: a streamed send that times out or is interrupted cuts its message (kOffCutAt) instead of
// breaking the channel; a version-2 consumer would read the next message as the rest of it.
// 4: in an empty ring the producer skips to the start of the ring (kOffSkipFrom); a version-3
// consumer would read the bytes at the skipped position as a message.
constexpr std::uint32_t kVersion = 4;
constexpr SegmentKind kChannelSegment{"channel", kMagic, kVersion};
constexpr std::size_t kMinCapacity = 64 * 1024;
constexpr std::size_t kMaxCapacity = std::size_t(1) << 40;
// Padding records (wire.h's kPadMagic): a loan writes one when its message would wrap, so that
// a loaned (and later viewed) payload is one contiguous piece of the ring, and one before a
// payload of kPageAlignedLoanMin bytes or more so that it starts on a page boundary; send()
// writes one when its message would wrap and the ring has room for both.
// Page-aligned loans: the copy that fills a loan is fastest when (dst - src) mod 4096 is 0 or
// at least 512 (non-temporal stores and some CPUs' rep movsb need it). A numpy array of this
// size starts 0 or 16 bytes past a page (malloc's mmap chunks), so a page-aligned loan gets
// distance 0 or 4080. The cost is at most 4032 bytes of ring per message, 1.5% of a 256 KiB
// one. evidence: shm-page-aligned-loans

// Offsets in the header. Hot words written by different processes sit on different
// 128-byte blocks (adjacent-line prefetch pairs lines).
enum Off : std::size_t {
    kOffMagic = kSegMagic, kOffVersion = kSegVersion, kOffHeaderBytes = kSegHeaderBytes, kOffCapacity = 16,
    kOffProdPid = 128, kOffProdClosed = 132, kOffProdStart = 136, kOffProdSeq = 144,
    kOffConsPid = 256, kOffConsClosed = 260, kOffConsStart = 264, kOffConsSeq = 272,
    kOffHead = 512, kOffTail = 640,
    kOffDataFutex = 768, kOffConsWaiting = 896,
    kOffSpaceFutex = 1024, kOffProdWaiting = 1152,
    // Nonzero once an end gave up a message in the middle for good (kAbandonedBy*: an error
    // other than a timeout or a signal stopped it, or a consumer had no memory to keep the part
    // it received): the channel is unusable and the peer says why. Written by either end, only
    // ever from 0.
    kOffAbandoned = 1280,
    // Where the producer cut the last message it gave up half-sent (a ring position, 64-aligned;
    // 0: none yet), and the last cut the consumer has skipped to: see Ring::cut_message. Both
    // change only at a cut, so the line the consumer reads them from stays in its cache (not
    // beside kOffProdSeq, which the producer writes with every message).
    kOffCutAt = 1288, kOffCutAck = 1296,
    // The last ring position the producer skipped from to the start of the ring (the next
    // multiple of the capacity; 0: none yet): see Ring::skip_to_lap_start. Written by the
    // producer, only while the ring is empty, before it publishes a head past it.
    kOffSkipFrom = 1304,
    kOffCreatorPid = kSegCreatorPid, kOffCreatorStart = kSegCreatorStart,
    // Nonzero while the consumer waits for a message (spinning or asleep): it will read the
    // next one as soon as it is published (see Ring::wrap_early). Zero in segments whose
    // consumer predates this field, which only means that large loans never wrap early.
    kOffConsAwaiting = 1536,
};
constexpr std::uint32_t kAbandonedByProducer = 1, kAbandonedByConsumer = 2;
static_assert(outside_prefix(kOffCapacity, 8) && outside_prefix(kOffProdPid, 24) && outside_prefix(kOffConsPid, 24) &&
                  outside_prefix(kOffHead, 8) && outside_prefix(kOffTail, 8) && outside_prefix(kOffDataFutex, 4) &&
                  outside_prefix(kOffConsWaiting, 4) && outside_prefix(kOffSpaceFutex, 4) &&
                  outside_prefix(kOffProdWaiting, 4) && outside_prefix(kOffAbandoned, 4) &&
                  outside_prefix(kOffCutAt, 24) && outside_prefix(kOffConsAwaiting, 4),
              "the channel's own header words lie outside the segment prefix");

enum class Role { None, Producer, Consumer };

// The slots of the ring that Python arrays hold: received views (consumer) and the loan
// (producer). Shared between the Ring and the slot objects (the arrays' bases), which
// release their slot from their destructor: on any thread holding the GIL, possibly after
// the Ring was closed or destroyed, possibly at interpreter exit. Everything here is under mu.
//
// Views: the ring is FIFO, so the tail index the producer sees (published_tail) is the start
// of the oldest view still held, or the consumer's read position when none is held; a view
// released out of order frees its bytes once every older view is released too.
struct SlotLedger {
    ForkSafeMutex mu;
    std::shared_ptr<Mapping> mapping;   // reset when closed and no slot is held
    bool open = true;                   // false once the Ring is closed
    std::uint64_t generation = 0;       // fork generation of the consumer claim
    struct Held { std::uint64_t id, start, end; bool released; };
    std::deque<Held> held;              // views, oldest first
    std::uint64_t next_id = 1;
    std::uint64_t read_pos = 0;         // consumer: bytes read (views included)
    std::uint64_t published_tail = 0;   // consumer: the tail index in the header
    std::uint64_t loan_id = 0;          // producer: the outstanding loan (0: none)

    // The consumer moved its read position to t: publish the new tail (locks mu).
    void consumer_advanced(std::uint64_t t);
    void release_view(std::uint64_t id);   // a view's base object is gone (locks mu)
    void end_loan(std::uint64_t id);       // a loan's base object is gone (locks mu)
    std::uint64_t held_bytes();
    std::uint64_t held_views();
    std::shared_ptr<Mapping> mapping_ref() {
        std::lock_guard<std::mutex> lock(mu);
        return mapping;
    }
    // With mu held: pops released views, publishes the tail when it moved, and unmaps when
    // the Ring is closed and nothing is held.
    void settle_locked();
};

// One process's view of a channel segment. One call at a time: a second thread calling in
// while another is inside (e.g. blocked in send) gets ShmError instead of a data race.
class Ring {
public:
    // Creates /dev/shm/<name> exclusively (EEXIST -> ShmError) and initialises the header.
    static Ring* create(const std::string& name, std::size_t capacity);
    // Opens and validates an existing segment.
    static Ring* attach(const std::string& name);
    ~Ring();

    const std::string& name() const { return name_; }
    std::size_t capacity() const { return cap_; }
    bool closed() const { return base_ == nullptr; }
    void close();                 // marks our role closed (wakes the peer) and unmaps
    bool unlink();                // shm_unlink; false if it was already gone

    // Producer side. The message is the header bytes hdr[0:hdr_len] (a MsgHeader, whose seq
    // field send() fills in, then shape and dtype) followed by payload.
    // Messages with pad64(hdr_len)+pad64(payload_len) <= capacity are written atomically
    // (all or nothing). Larger ones stream through the ring in chunks; a timeout or a signal in
    // the middle cuts the message (ShmTimeout or ShmInterrupted: the consumer skips what was
    // written of it, the channel goes on), any other error breaks the channel (later calls
    // raise ShmError).
    // Returns false on timeout before anything was written (channel still usable).
    // The GilHooks release the GIL around blocking waits and large copies (spin.h).
    using GilHooks = shm::GilHooks;
    bool send(void* hdr, std::size_t hdr_len, const void* payload, std::size_t payload_len,
              double timeout_s, const GilHooks& gil);

    // Consumer side, step 1: wait for the next message header and validate it. Returns false
    // on timeout (nothing consumed). Does not consume anything.
    bool peek(MsgInfo& info, double timeout_s, const GilHooks& gil);
    // Step 2: consume the message peeked, copying its payload into dst (info.payload_len
    // bytes). Waits for streamed parts with the same deadline rules as send. Returns false
    // when the producer cut the message (dst then holds part of it, and the consumer is at
    // the next message: peek again). A timeout or a signal half way keeps the place (see
    // resuming()); any other error half way gives the message up (the channel is broken).
    bool consume(const MsgInfo& info, void* dst, double timeout_s, const GilHooks& gil);
    // Consumer: messages the producer cut that this end skipped (see cut_message).
    std::uint64_t cut_messages() const { return cut_messages_; }
    // Consumer: a consume() that timed out or was interrupted (ShmTimeout, ShmInterrupted) in
    // the middle of a streamed message keeps its place: the next peek() returns that message
    // again, resuming() is true, and consume() goes on from where it stopped. The caller then
    // puts the first partial_bytes() bytes it already received into dst itself.
    bool resuming() const { return partial_.active; }
    std::uint64_t partial_bytes() const {
        return partial_.active ? std::min<std::uint64_t>(partial_.done, partial_.info.payload_len) : 0;
    }
    // Consumer: gives up the message being resumed (the caller could not keep its first bytes):
    // the channel is broken, as when a consumer fails in the middle of a message.
    void give_up_partial();
    // Bytes published and not yet consumed (consumer view; 0 for other roles).
    std::uint64_t pending_bytes();

    // Zero copy, consumer: after peek(), takes the message as a view instead of copying it.
    // Waits (same deadline rules) until the whole message is published; returns its payload
    // address in the ring and the view id (release it through ledger()), or nullptr with
    // timed_out=true on timeout (nothing consumed, the channel still usable), or nullptr with
    // timed_out=false when the message is not one contiguous piece of the ring (it wraps or is
    // larger than the ring): then the caller consumes it with consume() as usual.
    const std::uint8_t* take_view(const MsgInfo& info, double timeout_s, const GilHooks& gil,
                                  std::uint64_t& id, bool& timed_out);
    // Zero copy, producer: reserves a contiguous slot for the message with header
    // hdr[0:hdr_len] and payload_len bytes (hdr_len + pad64(payload_len) <= capacity), waiting
    // for room like send(). Returns the payload address and the loan id, or nullptr on timeout.
    // One loan at a time; send() while a loan is outstanding raises ShmError.
    std::uint8_t* loan(const void* hdr, std::size_t hdr_len, std::size_t payload_len, double timeout_s,
                       const GilHooks& gil, std::uint64_t& id);
    // Sends the loan `id` (the payload is already in place). ShmError if it is not the
    // outstanding loan; ShmClosed if the consumer closed (the loan ends, nothing is sent).
    void publish_loan(std::uint64_t id);
    const std::shared_ptr<SlotLedger>& ledger() const { return ledger_; }
    // How fills of this end's loans by fastcopy.copy store (cached or streaming, learned from
    // their speed: policy/store_modes.h). send() does not use it (see shm::rules()).
    const std::shared_ptr<policy::StoreModeLearner>& write_mode() const { return write_mode_; }

    // Marks the channel unusable (later calls raise ShmError with this reason).
    void mark_broken(const std::string& why) { broken_ = why; broken_corrupt_ = true; }
    Role role() const { return role_; }
    std::uint64_t messages_done() const { return seq_; }

private:
    Ring() = default;
    void claim(Role want);
    void check_header();              // magic/version/capacity/own index unchanged
    std::uint8_t* word(std::size_t off) const { return base_ + off; }
    std::uint8_t* data() const { return base_ + kHeaderBytes; }
    void copy_in(std::uint64_t pos, const void* src, std::size_t n);   // into the ring
    void copy_out(std::uint64_t pos, void* dst, std::size_t n, std::size_t whole);  // out of the ring; whole = message size
    std::uint64_t read_tail_checked();
    std::uint64_t read_head_checked();
    void publish_head(std::uint64_t h);
    void publish_tail(std::uint64_t t);
    // Producer: waits until `need` bytes are free; false on timeout.
    bool wait_space(std::uint64_t need, double deadline, const GilHooks& gil);
    // Producer: where a loan of hdr_len + payload_len (`total` bytes in the ring) goes: sets
    // loan_wrap_pad_ (padding to the end of the ring when the message would wrap) and
    // loan_gap_pad_ (padding before the header, so that a payload of kPageAlignedLoanMin bytes
    // or more starts on a page, when the ring has room for that), which publish_loan() writes
    // with the message; then waits for room for all of it. False on timeout.
    bool place_loan(std::size_t hdr_len, std::size_t payload_len, std::uint64_t total, double deadline,
                    const GilHooks& gil);
    // Whether a large loan (`large`) at ring position `pos` goes to the start of the ring
    // instead, where it needs `need_at_start` bytes (see the .cpp).
    bool wrap_early(std::uint64_t pos, std::uint64_t need_at_start, bool large);
    // Producer, in an empty ring (the consumer's tail at head_): goes to the start of the ring
    // without a padding record. The stretch to the ring's end holds no message: kOffSkipFrom
    // says where it starts, and the consumer, at that position with a head past it, jumps to the
    // start (follow_skip). A message that fits the ring but not in one piece where the head is,
    // with no room for a padding record as well, goes this way, so it is always one piece, and
    // it reserves nothing in the ring while it waits for the ring to empty.
    void skip_to_lap_start();
    // Consumer: follows the producer's skip from tail_ when it published a head (h) past it.
    void follow_skip(std::uint64_t h);
    // The tail index `t` as the producer counts it: the start of the next lap when the consumer
    // has not followed the skip from t yet.
    std::uint64_t after_skip(std::uint64_t t, std::uint64_t h) const;
    // Producer: writes a padding record of `bytes` (a multiple of 64, not past the ring end) at
    // ring index `at`.
    void put_padding(std::uint64_t at, std::uint64_t bytes);
    // Waits until pred() or deadline; returns 0 ready, 1 timeout; throws on peer death.
    // kData: `need` bytes published, or (while watch_end_ is set) the producer cut the
    // message being read; kSpace: `need` bytes free; kCutSkipped: the consumer acknowledged
    // the cut at `need`.
    enum WaitFor { kData, kSpace, kCutSkipped };
    static constexpr double kSpinStart = -1.0;  // wait()'s spin_s: adaptive (AdaptiveSpin)
    // gil_released: the caller released the GIL already (mid-message); the wait may take it
    // briefly to run signal handlers and leaves it released.
    int wait(WaitFor what, std::uint64_t need, double deadline, const GilHooks& gil, double spin_s,
             bool gil_released = false);
    void wake_all(std::size_t futex_off);
    void abandon_message(const std::string& why);
    void check_abandoned();  // ShmError when an end gave up a message half-way
    // Producer: gives up the streamed message being written at head_ (see the .cpp).
    void cut_message();
    // Producer: waits until the consumer skipped to the last cut (before a streamed message,
    // which could be cut in turn). False on timeout.
    bool wait_cut_skipped(double deadline, const GilHooks& gil, bool gil_released);
    // Consumer: the position where the producer cut the message [start, end), or 0 when it
    // did not cut it.
    std::uint64_t cut_in(std::uint64_t start, std::uint64_t end) const;
    // Consumer: skips to the cut at `at` (validated) and acknowledges it.
    void skip_to_cut(std::uint64_t at);
    // Streamed messages move in chunks of this many bytes (a multiple of 64, so that a cut
    // lies on a message boundary).
    std::uint64_t stream_chunk() const;
    [[noreturn]] void broken(const std::string& why);

    std::string name_;
    std::uint8_t* base_ = nullptr;
    std::shared_ptr<SlotLedger> ledger_;  // holds the mapping; see SlotLedger
    std::shared_ptr<policy::StoreModeLearner> write_mode_ = std::make_shared<policy::StoreModeLearner>();
    std::uint8_t loan_hdr_[4096];         // the header of the outstanding loan, written again at publish
    std::size_t loan_hdr_len_ = 0;
    std::uint64_t loan_total_ = 0;
    std::uint64_t loan_wrap_pad_ = 0, loan_gap_pad_ = 0;  // padding published before the loan
    bool loan_skip_ = false;              // the loan skips to the start of the ring instead of loan_wrap_pad_
    std::uint64_t skip_from_ = 0;         // producer: the last skip (kOffSkipFrom)
    std::size_t map_bytes_ = 0;
    std::size_t cap_ = 0;
    bool creator_ = false;
    std::uint64_t dev_ = 0, ino_ = 0;     // identity of the segment's file (role claims per process)
    bool unlinked_ = false;
    Role role_ = Role::None;
    std::uint64_t claim_generation_ = 0;  // fork generation when the role was claimed
    std::uint32_t pid_ = 0;
    std::uint64_t head_ = 0, tail_ = 0;   // our copies: own index authoritative, peer's cached
    std::uint64_t seq_ = 0;
    std::uint64_t cut_at_ = 0;            // producer: the last cut, until the consumer skipped to it
    std::uint64_t cut_messages_ = 0;      // consumer: cuts skipped
    std::uint64_t watch_start_ = 0, watch_end_ = 0;  // consumer: the message being read (cuts end a wait)
    struct Partial {                      // consumer: see resuming()
        bool active = false;
        MsgInfo info;
        std::uint64_t done = 0, start = 0, end = 0;  // body bytes consumed; the message's ring span
    } partial_;
    std::string broken_;
    bool broken_corrupt_ = false;         // broken_ came from failed validation
    std::uint32_t peeked_hdr_ = 0;        // header_len of the message peek() validated
    std::uint64_t peeked_payload_ = 0;
    bool peeked_ = false;
    AdaptiveSpin spin_;                   // at the start of a message (see wait())
    std::atomic<bool> busy_{false};
    std::uint64_t busy_generation_ = 0;   // fork generation when busy_ was set
    friend struct BusyGuard;
};

// One call at a time on a Ring (see Ring): the second thread gets ShmError.
struct BusyGuard {
    Ring& r;
    explicit BusyGuard(Ring& ring) : r(ring) {
        std::uint64_t gen = fork_generation();
        // A fork while another thread was inside leaves busy_ set in the child, where that
        // thread does not exist: then the flag is stale and we take it.
        if (r.busy_.exchange(true, std::memory_order_acquire) && r.busy_generation_ == gen)
            throw ShmError("Channel used from two threads at once; a Channel end is for one thread at a time");
        r.busy_generation_ = gen;
    }
    ~BusyGuard() { r.busy_.store(false, std::memory_order_release); }
};

}  // namespace shm
}  // namespace fastcopy
