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
#include <stdexcept>
#include <string>
#include <sys/types.h>
#include <vector>

#include "core/dispatch.h"
#include "policy/shared_writes.h"

namespace fastcopy {
namespace shm {

// Errors. The Python binding maps them to fastcopy.shm.ChannelError and its subclasses.
struct ShmError : std::runtime_error { using std::runtime_error::runtime_error; };
struct ShmCorrupted : ShmError { using ShmError::ShmError; };
struct ShmPeerDied : ShmError { using ShmError::ShmError; };
struct ShmClosed : ShmError { using ShmError::ShmError; };
struct ShmTimeout : ShmError { using ShmError::ShmError; };
// An operation on a Channel this process already closed (Python: ValueError, like files).
struct ShmUseAfterClose : ShmError { using ShmError::ShmError; };
// A bad name or size given to create/attach (Python: a ChannelError that is also a ValueError).
struct ShmBadArgument : ShmError { using ShmError::ShmError; };
// A signal handler raised while we waited (the Python exception is already set).
struct ShmInterrupted : ShmError { ShmInterrupted() : ShmError("interrupted") {} };
// An OS call failed; err is the errno (Python: OSError subclass from errno).
struct ShmOsError : ShmError {
    int err;
    ShmOsError(int e, const std::string& what) : ShmError(what), err(e) {}
};

// ---- primitives on a 4- or 8-byte aligned word in shared memory -------------------------
std::uint64_t load_acquire_u64(const void* p);
void store_release_u64(void* p, std::uint64_t v);
std::uint32_t load_acquire_u32(const void* p);
void store_release_u32(void* p, std::uint32_t v);
std::uint32_t fetch_add_u32(void* p, std::uint32_t v);
// FUTEX_WAIT (shared) while *word == expected, at most timeout_s seconds (< 0: no limit).
// Returns 0 when woken or the value differed, ETIMEDOUT on timeout, EINTR on a signal.
int futex_wait(void* word, std::uint32_t expected, double timeout_s);
// FUTEX_WAKE (shared); returns how many waiters were woken.
int futex_wake(void* word, int count);
// True unless the process is known to be gone: kill(pid, 0) says ESRCH, /proc says zombie,
// or its start time differs from start_time (pid reused). start_time 0 = not checked.
bool process_alive(std::uint32_t pid, std::uint64_t start_time);
// Start time (clock ticks after boot, /proc/<pid>/stat field 22) of a process; 0 if unknown.
std::uint64_t process_start_time(std::uint32_t pid);
double monotonic_seconds();

// How long a waiter spins before it sleeps on a futex, learnt per waiting end (see the
// comment at kSpinMin in shm_sync.cpp for the rule and the measurements behind it). Used by
// the Channel's waits at the start of a message and by the Topic's publisher and subscribers.
class AdaptiveSpin {
public:
    // Seconds to spin in this wait (0: sleep at once).
    double budget();
    // Spins until ready() or `seconds` passed (from `start`); true when ready() held. With
    // `learn` (a wait of budget() seconds), records the outcome. The caller sleeps when it
    // returns false.
    template <class Ready>
    bool spin(Ready&& ready, double start, double seconds, bool learn) {
        const double until = start + seconds;
        for (unsigned i = 1;; ++i) {
            poll_pause(i);
            if (ready()) {
                if (learn && seconds > 0) caught(monotonic_seconds() - start);
                return true;
            }
            if ((i & 7) == 0 && monotonic_seconds() >= until) break;
        }
        if (learn && seconds > 0) missed();
        return false;
    }
    // The answer came after a sleep, `waited` seconds after the wait started.
    void slept(double waited);
    // One polling round: a short burst of pause instructions at first, then sched_yield().
    static void poll_pause(unsigned round);

private:
    void caught(double waited);
    void missed();
    bool spinning_ = false;
    unsigned failures_ = 0, probes_ = 0;
    double last_wait_s_ = 0;  // seconds the last wait took
};

// ---- segment layout -----------------------------------------------------------------------
constexpr std::uint64_t kMagic = 0x31484353504f4346ull;  // "FCOPSCH1" little-endian
// 2: padding records may end before the end of the ring (page-aligned loans). A version-1
// consumer would call them corrupt, so the two refuse each other at attach instead.
// 3: a streamed send that times out or is interrupted cuts its message (kOffCutAt) instead of
// breaking the channel; a version-2 consumer would read the next message as the rest of it.
constexpr std::uint32_t kVersion = 3;
// One page: the ring starts on a page, so a consumer maps it read-only and the header writable
// (protect_data).
constexpr std::size_t kHeaderBytes = 4096;
constexpr std::size_t kMinCapacity = 64 * 1024;
constexpr std::size_t kMaxCapacity = std::size_t(1) << 40;
constexpr std::uint32_t kMsgMagic = 0x4d534346u;  // "FCSM"
// A padding record: header_len 64, ndim 0, dtype_len 0, seq = the next message's number,
// payload_len = a multiple of 64 such that the record ends at or before the end of the ring;
// the consumer skips it. A loan writes one when its message would wrap, so that a loaned (and
// later viewed) payload is one contiguous piece of the ring, and one before a large payload so
// that it starts on a page boundary (kPageAlignedLoanMin).
constexpr std::uint32_t kPadMagic = 0x50414446u;  // "FDAP"
// Loans from this payload size start their payload on a 4096-byte boundary. The copy that
// fills a loan is fastest when (dst - src) mod 4096 is 0 or at least 512: non-temporal stores
// need it (at 16 MiB on Zen 3 avx2_nt ran 0.17-0.49x avx2 at distances 16-256), and so does
// Zen 3's rep movsb (15-20x slower at 1..31). A numpy array of this size starts 0 or 16 bytes
// past a page (malloc's mmap chunks), so a page-aligned loan gets distance 0 or 4080, where the
// old 64-byte header put it at 48. Measured on the Zen 3 VM (2 vCPUs, fastcopy.copy from a
// np.ones array, medians of 21 interleaved rounds): 16 MiB 840 us page-aligned against
// 1060-1160 us at page offsets 64-256; 1 MiB and 4 MiB alike within noise. The cost is at most
// 4032 bytes of ring per message, 1.5% of a 256 KiB one.
constexpr std::size_t kPageBytes = 4096;
static_assert(kHeaderBytes % kPageBytes == 0, "the ring starts on a page (protect_data)");
constexpr std::size_t kPageAlignedLoanMin = 256 * 1024;
constexpr std::uint32_t kMaxNdim = 64;
constexpr std::uint32_t kMaxDtypeLen = 1024;
// The dtype text of a message header is 1 to kMaxDtypeLen characters of printable ASCII
// (0x20-0x7e): fastcopy.shm escapes every other character of field names, titles and metadata
// when it describes a dtype. Senders check it before anything is written, receivers again.
inline bool dtype_text_ok(const char* s, std::size_t n) {
    if (n == 0 || n > kMaxDtypeLen) return false;
    for (std::size_t i = 0; i < n; ++i)
        if (static_cast<unsigned char>(s[i]) < 0x20 || static_cast<unsigned char>(s[i]) > 0x7e) return false;
    return true;
}
constexpr std::uint64_t kMaxPayload = std::uint64_t(1) << 46;
constexpr std::size_t kAlign = 64;

// Offsets in the header. Hot words written by different processes sit on different
// 128-byte blocks (adjacent-line prefetch pairs lines).
enum Off : std::size_t {
    kOffMagic = 0, kOffVersion = 8, kOffHeaderBytes = 12, kOffCapacity = 16,
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
    // The process that created the segment (pid, start time): `python -m fastcopy shm --clean`
    // removes segments whose creator is gone. Zero in segments made before this field.
    kOffCreatorPid = 1408, kOffCreatorStart = 1416,
    // Nonzero while the consumer waits for a message (spinning or asleep): it will read the
    // next one as soon as it is published (see Ring::wrap_early). Zero in segments whose
    // consumer predates this field, which only means that large loans never wrap early.
    kOffConsAwaiting = 1536,
};
constexpr std::uint32_t kAbandonedByProducer = 1, kAbandonedByConsumer = 2;

struct MsgHeader {          // 32 bytes, at a 64-byte aligned ring position
    std::uint32_t magic;    // kMsgMagic
    std::uint32_t header_len;  // pad64(32 + 8*ndim + dtype_len)
    std::uint64_t payload_len;
    std::uint32_t dtype_len;
    std::uint32_t ndim;
    std::uint64_t seq;      // message number, 0, 1, 2, ... (detects loss/duplication)
};
static_assert(sizeof(MsgHeader) == 32, "MsgHeader layout");

inline std::size_t pad64(std::size_t n) { return (n + kAlign - 1) & ~(kAlign - 1); }

// A message as the consumer sees it after validation of its header.
struct MsgInfo {
    std::uint64_t payload_len = 0;
    std::uint32_t header_len = 0;
    std::string dtype;
    std::uint32_t ndim = 0;
    std::uint64_t shape[kMaxNdim] = {};
};

enum class Role { None, Producer, Consumer };

// The mapping of a segment. Shared by the Ring and by every loaned array and received view,
// so that memory a Python array points into stays mapped until the last such array is gone,
// even after the Channel was closed.
struct Mapping {
    std::uint8_t* base;
    std::size_t bytes;
    Mapping(std::uint8_t* b, std::size_t n) : base(b), bytes(n) {}
    ~Mapping();
};

// A std::mutex that fork() never leaves locked in the child. The slot ledgers below are
// locked by whichever thread releases a view (from the array's destructor) or moves the
// consumer's tail, some of them with the GIL released, so another thread may fork while one
// holds it; the child, where that thread does not exist, would then hang at its first view
// release or claim. Every ForkSafeMutex is registered; a pthread_atfork handler locks them all
// before fork() and unlocks them in both processes after it (shm_sync.cpp). Critical sections
// under it must not wait for the GIL or for another ForkSafeMutex (the forking thread holds
// the GIL while it waits for them).
class ForkSafeMutex : public std::mutex {
public:
    ForkSafeMutex();
    ~ForkSafeMutex();
    ForkSafeMutex(const ForkSafeMutex&) = delete;
    ForkSafeMutex& operator=(const ForkSafeMutex&) = delete;
};

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
    // `release_gil`/`reacquire_gil` callbacks are invoked around blocking waits and large
    // copies (nullptr: never).
    // check_signals (optional) runs with the GIL held while a wait sleeps (on EINTR and every
    // sleep slice); nonzero means a Python exception (e.g. KeyboardInterrupt) is pending and
    // the wait ends with ShmInterrupted.
    struct GilHooks {
        void (*release)(void*);
        void (*acquire)(void*);
        void* ctx;
        int (*check_signals)(void*);
    };
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
    // their speed: policy/shared_writes.h). send() does not use it (see shm::rules()).
    const std::shared_ptr<policy::SharedWriteMode>& write_mode() const { return write_mode_; }

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
    // Producer: writes a padding record of `bytes` (a multiple of 64, not past the ring end) at
    // ring index `at`.
    void put_padding(std::uint64_t at, std::uint64_t bytes);
    // Producer: publishes a padding record of `bytes` at head_ once there is room. False on timeout.
    bool send_padding(std::uint64_t bytes, double deadline, const GilHooks& gil);
    // Waits until pred() or deadline; returns 0 ready, 1 timeout; throws on peer death.
    // kData: `need` bytes published, or (while watch_end_ is set) the producer cut the
    // message being read; kSpace: `need` bytes free; kCutSkipped: the consumer acknowledged
    // the cut at `need`.
    enum WaitFor { kData, kSpace, kCutSkipped };
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
    std::shared_ptr<policy::SharedWriteMode> write_mode_ = std::make_shared<policy::SharedWriteMode>();
    std::uint8_t loan_hdr_[4096];         // the header of the outstanding loan, written again at publish
    std::size_t loan_hdr_len_ = 0;
    std::uint64_t loan_total_ = 0;
    std::uint64_t loan_wrap_pad_ = 0, loan_gap_pad_ = 0;  // padding published before the loan
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

// The GIL around a wait or a copy, through a Ring::GilHooks. `already_released`: the caller
// released it already (in the middle of a message); the guard may take it briefly to run
// signal handlers and leaves it released.
struct GilGuard {
    const Ring::GilHooks& h;
    bool released = false;
    bool borrowed = false;
    explicit GilGuard(const Ring::GilHooks& hooks, bool already_released = false)
        : h(hooks), released(already_released && hooks.release), borrowed(already_released && hooks.release) {}
    void release() {
        if (!released && h.release) { h.release(h.ctx); released = true; }
    }
    void acquire() {
        if (released) { h.acquire(h.ctx); released = false; }
    }
    ~GilGuard() {
        if (borrowed) release();
        else acquire();
    }
};

// ShmError unless `name` can name a segment in /dev/shm; `kind` ("channel", "topic") is
// named in the message.
void check_segment_name(const std::string& name, const char* kind);
// MAP_POPULATE for segments up to 256 MiB (see shm_sync.cpp), 0 above.
int populate_flag(std::uint64_t bytes);
// Sets the protection of the message data of a segment mapped at `base` (`map_bytes` long):
// the bytes from `data_offset` (page-aligned) to the end become read-only (a consumer's or a
// subscriber's mapping: a write through a view, e.g. with ctypes, faults in the writing process
// instead of changing what the other processes read) or writable again (a producer's). The
// control words before data_offset stay writable. On a system whose pages are larger than the
// 4096 bytes the layouts align to, the data stays writable. ShmOsError when mprotect fails.
void protect_data(std::uint8_t* base, std::size_t data_offset, std::size_t map_bytes, bool read_only,
                  const std::string& name);

std::uint64_t fork_generation();
// Names this process created: removed from /dev/shm if SIGTERM or SIGHUP (default action) ends
// it; keep_on_fatal_signal() forgets one (it was unlinked).
void remove_on_fatal_signal(const std::string& name);
void keep_on_fatal_signal(const std::string& name);
// How long waits spin before sleeping: the most an adaptive wait at the start of a message
// spins (0: never; default 5 ms), and the fixed spin in the middle of a streamed message.
void set_spin(double start_s, double mid_message_s);

// The size and time rules of Channel and Topic, with the values this process runs with, for
// fastcopy.info(): what each rule does and the measurement behind it.
struct ShmRule {
    const char* name;   // "page_aligned_loan_bytes", ...
    double value;       // bytes or seconds, as `unit` says
    const char* unit;   // "bytes" or "seconds"
    const char* rule;   // what happens at and above the value
    const char* why;    // the measurement behind it
};
std::vector<ShmRule> rules();

}  // namespace shm
}  // namespace fastcopy
