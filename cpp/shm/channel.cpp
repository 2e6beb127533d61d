// The Channel's ring: its segment, role claims, header checks, slot ledger, cuts and waits.
// channel_io.cpp has the message paths (send, peek, consume, loans, views). See channel.h for
// the layout and the rules; docs/shm.md for the user view.
#include "shm/channel.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <mutex>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

namespace fastcopy {
namespace shm {

namespace {

// Roles held by Ring objects of this process, per segment (device and inode of the file).
// The header records one pid per role, which cannot tell two Channel objects of one process
// apart: this list refuses a second producer (or consumer) object in the same process, whose
// sends would otherwise overwrite the other's messages while both return normally. Held
// during a claim, so two objects cannot both claim. A claim locks its ledger (a
// ForkSafeMutex) under it, so fork() takes it first (hold_over_fork_first).
struct RoleClaim {
    std::uint64_t dev, ino;
    Role role;
    const Ring* owner;
    std::uint64_t generation;  // fork generation of the claim; older entries are a parent's
};
std::mutex g_claims_mutex;
std::vector<RoleClaim> g_claims;
struct ClaimsOverFork {
    ClaimsOverFork() { hold_over_fork_first(g_claims_mutex); }
} g_claims_over_fork;

void forget_claims_of(const Ring* ring) {
    std::lock_guard<std::mutex> lock(g_claims_mutex);
    g_claims.erase(std::remove_if(g_claims.begin(), g_claims.end(),
                                  [&](const RoleClaim& c) { return c.owner == ring; }),
                   g_claims.end());
}

std::string pid_words(std::uint32_t pid) { return "pid " + std::to_string(pid); }

// Why the header of a channel segment of `size` bytes has the wrong capacity ("" if right).
std::string capacity_error(const std::uint8_t* header, std::uint64_t size) {
    const std::uint64_t cap = load_acquire_u64(header + kOffCapacity);
    if (cap != size - kHeaderBytes || cap % kAlign != 0 || cap < kMinCapacity)
        return "capacity " + std::to_string(cap) + " does not match the segment size " + std::to_string(size);
    return "";
}

}  // namespace

// ---- segment ----------------------------------------------------------------------------
Ring* Ring::create(const std::string& name, std::size_t capacity) {
    check_segment_name(name, "channel");
    if (capacity < kMinCapacity || capacity > kMaxCapacity)
        throw ShmBadArgument("capacity " + std::to_string(capacity) + " is out of range: use " +
                       std::to_string(kMinCapacity) + " (64 KiB) to " + std::to_string(kMaxCapacity) + " (1 TiB) bytes");
    capacity = pad64(capacity);
    const std::size_t total = kHeaderBytes + capacity;
    const MappedSegment seg = create_segment(name, total, kChannelSegment, [&](std::uint8_t* base) {
        store_release_u64(base + kOffCapacity, capacity);
    });
    Ring* r = new Ring();
    r->name_ = name;
    r->base_ = seg.base;
    r->ledger_ = std::make_shared<SlotLedger>();
    r->ledger_->mapping = std::make_shared<Mapping>(seg.base, total, seg.fd);
    r->map_bytes_ = total;
    r->cap_ = capacity;
    r->creator_ = true;
    r->dev_ = seg.dev;
    r->ino_ = seg.ino;
    return r;
}

Ring* Ring::attach(const std::string& name) {
    check_segment_name(name, "channel");
    const MappedSegment seg = open_segment(name, kHeaderBytes + kMinCapacity, kHeaderBytes + kMaxCapacity,
                                           kChannelSegment, capacity_error);
    const std::uint64_t size = seg.bytes;
    std::uint8_t* b = seg.base;
    std::string why = check_prefix(b, kChannelSegment);
    if (why.empty()) why = capacity_error(b, size);
    if (!why.empty()) {
        release_segment(seg);
        throw ShmCorrupted("shared memory segment '" + name + "': " + why);
    }
    const std::uint64_t cap = load_acquire_u64(b + kOffCapacity);
    Ring* r = new Ring();
    r->name_ = name;
    r->base_ = b;
    r->ledger_ = std::make_shared<SlotLedger>();
    r->ledger_->mapping = std::make_shared<Mapping>(b, size, seg.fd);
    r->map_bytes_ = size;
    r->cap_ = cap;
    r->dev_ = seg.dev;
    r->ino_ = seg.ino;
    return r;
}

Ring::~Ring() {
    try {
        busy_.store(false);
        close();
    } catch (...) {
    }
}

void Ring::close() {
    if (!base_) return;
    // A flag set before a fork by a thread the child does not have is stale (see BusyGuard).
    if (busy_.load(std::memory_order_acquire) && busy_generation_ == fork_generation())
        throw ShmError("cannot close a Channel while another thread is using it");
    if (role_ != Role::None && claim_generation_ == fork_generation()) {
        std::size_t pid_off = role_ == Role::Producer ? kOffProdPid : kOffConsPid;
        std::size_t closed_off = role_ == Role::Producer ? kOffProdClosed : kOffConsClosed;
        if (load_acquire_u32(word(pid_off)) == pid_) {
            store_release_u32(word(closed_off), 1);
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            wake_all(kOffDataFutex);
            wake_all(kOffSpaceFutex);
        }
    }
    forget_claims_of(this);
    {
        // Unmapped now unless loaned arrays or views still point into the segment; then the
        // last of them unmaps it (SlotLedger::settle_locked).
        std::lock_guard<std::mutex> lock(ledger_->mu);
        ledger_->open = false;
        ledger_->settle_locked();
    }
    base_ = nullptr;
}

bool Ring::unlink() {
    if (unlinked_) return false;
    unlinked_ = true;
    return unlink_segment(name_);
}

void Ring::broken(const std::string& why) {
    broken_ = why;
    broken_corrupt_ = true;
    throw ShmCorrupted(why);
}

void Ring::claim(Role want) {
    if (!base_) throw ShmUseAfterClose("operation on a closed Channel");
    if (!broken_.empty()) {
        if (broken_corrupt_) throw ShmCorrupted("channel is broken: " + broken_);
        throw ShmError("channel is broken: " + broken_);
    }
    std::uint64_t gen = fork_generation();
    if (role_ != Role::None && claim_generation_ == gen) {
        if (role_ != want)
            throw ShmError(std::string("this Channel end is the ") + (role_ == Role::Producer ? "producer" : "consumer") +
                           " (a Channel carries messages one way; use a second Channel for replies)");
        return;
    }
    // First use in this process (or first use after a fork): claim the role in the header,
    // after checking that the header is still a channel's.
    role_ = Role::None;
    check_header();
    // The consumer reads the ring through a read-only mapping; an end that produces (also the
    // same object after a fork, where it consumed before) writes it.
    protect_data(base_, kHeaderBytes, map_bytes_, want == Role::Consumer, name_);
    const char* what = want == Role::Producer ? "producer" : "consumer";
    std::size_t pid_off = want == Role::Producer ? kOffProdPid : kOffConsPid;
    std::size_t closed_off = want == Role::Producer ? kOffProdClosed : kOffConsClosed;
    std::size_t start_off = want == Role::Producer ? kOffProdStart : kOffConsStart;
    std::uint32_t me = static_cast<std::uint32_t>(::getpid());
    std::lock_guard<std::mutex> lock(g_claims_mutex);
    for (const RoleClaim& c : g_claims) {
        if (c.dev == dev_ && c.ino == ino_ && c.role == want && c.generation == gen && c.owner != this)
            throw ShmError(std::string("channel '") + name_ + "' already has a " + what + " (" + pid_words(me) +
                           ", another Channel object of this process); a Channel has one producer and one "
                           "consumer");
    }
    for (int attempt = 0;; ++attempt) {
        std::uint32_t cur = load_acquire_u32(word(pid_off));
        if (cur == me) break;  // this process holds the role, and no other object of it does
        bool take = cur == 0 || load_acquire_u32(word(closed_off)) != 0;
        if (!take) {
            if (!process_alive(cur, load_acquire_u64(word(start_off))))
                throw ShmPeerDied(std::string("the previous ") + what + " (" + pid_words(cur) +
                                  ") died; the stream state is unknown, create a new channel");
            throw ShmError(std::string("channel '") + name_ + "' already has a " + what + " (" + pid_words(cur) +
                           "); a Channel has one producer and one consumer");
        }
        if (__atomic_compare_exchange_n(reinterpret_cast<std::uint32_t*>(word(pid_off)), &cur, me, false,
                                        __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            break;
        if (attempt > 100) throw ShmError(std::string("could not claim the ") + what + " role");
    }
    store_release_u64(word(start_off), process_start_time(me));
    store_release_u32(word(closed_off), 0);
    pid_ = me;
    claim_generation_ = gen;
    std::uint64_t h = load_acquire_u64(word(kOffHead));
    std::uint64_t t = load_acquire_u64(word(kOffTail));
    // The consumer follows a skip from its tail only when it reads the head next.
    const std::uint64_t t_after = after_skip(t, h);
    if (h - t_after > cap_)
        broken("channel header is corrupt: head " + std::to_string(h) + " and tail " + std::to_string(t) +
               " are more than the capacity " + std::to_string(cap_) + " apart");
    head_ = h;
    tail_ = want == Role::Producer ? t_after : t;
    skip_from_ = load_acquire_u64(word(kOffSkipFrom));
    {
        std::lock_guard<std::mutex> ledger_lock(ledger_->mu);
        if (want == Role::Consumer) {
            // Views held by an earlier claim (a parent's, before a fork) no longer hold the tail.
            for (auto& v : ledger_->held) v.released = true;
            ledger_->held.clear();
            ledger_->generation = gen;
            ledger_->read_pos = t;
            ledger_->published_tail = t;
        } else {
            ledger_->loan_id = 0;
        }
    }
    seq_ = load_acquire_u64(word(want == Role::Producer ? kOffProdSeq : kOffConsSeq));
    if (want == Role::Producer) {
        // A cut by an earlier producer (another process, or this one before a fork) that the
        // consumer has not skipped yet is still in flight (see cut_message).
        const std::uint64_t cut = load_acquire_u64(word(kOffCutAt));
        cut_at_ = cut != 0 && load_acquire_u64(word(kOffCutAck)) != cut ? cut : 0;
    }
    peeked_ = false;
    role_ = want;
    g_claims.erase(std::remove_if(g_claims.begin(), g_claims.end(),
                                  [&](const RoleClaim& c) { return c.owner == this || c.generation != gen; }),
                   g_claims.end());
    g_claims.push_back(RoleClaim{dev_, ino_, want, this, gen});
}

void Ring::check_header() {
    std::uint64_t magic = load_acquire_u64(word(kOffMagic));
    std::uint32_t version = load_acquire_u32(word(kOffVersion));
    std::uint32_t hb = load_acquire_u32(word(kOffHeaderBytes));
    std::uint64_t cap = load_acquire_u64(word(kOffCapacity));
    if (magic != kMagic || version != kVersion || hb != kHeaderBytes || cap != cap_)
        broken("channel header is corrupt: magic, version or capacity changed after attach");
    if (role_ == Role::Producer) {
        std::uint64_t h = load_acquire_u64(word(kOffHead));
        if (h != head_) broken("channel header is corrupt: head index changed by someone other than the producer");
    } else if (role_ == Role::Consumer) {
        // The tail in the header is the start of the oldest view held (SlotLedger), which
        // another thread may move when it drops a view: compare under the ledger's lock.
        std::uint64_t expected;
        std::uint64_t t;
        {
            std::lock_guard<std::mutex> lock(ledger_->mu);
            t = load_acquire_u64(word(kOffTail));
            expected = ledger_->published_tail;
        }
        if (t != expected) broken("channel header is corrupt: tail index changed by someone other than the consumer");
    }
}

std::uint64_t Ring::after_skip(std::uint64_t t, std::uint64_t h) const {
    if (h == t || t % cap_ == 0 || load_acquire_u64(word(kOffSkipFrom)) != t) return t;
    return t + (cap_ - t % cap_);
}

void Ring::skip_to_lap_start() {
    skip_from_ = head_;
    store_release_u64(word(kOffSkipFrom), head_);
    head_ += cap_ - head_ % cap_;
    tail_ = head_;  // the consumer's tail, once it follows
}

void Ring::follow_skip(std::uint64_t h) {
    if (h == tail_ || tail_ % cap_ == 0 || load_acquire_u64(word(kOffSkipFrom)) != tail_) return;
    tail_ += cap_ - tail_ % cap_;
    if (head_ < tail_) head_ = tail_;
    publish_tail(tail_);
}

std::uint64_t Ring::read_tail_checked() {
    std::uint64_t t = load_acquire_u64(word(kOffTail));
    if (t == skip_from_ && t % cap_ != 0) t += cap_ - t % cap_;  // the consumer has not followed the skip yet
    if (head_ - t > cap_ || t - tail_ > cap_)  // unsigned: catches t > head_ and t < tail_
        broken("channel header is corrupt: tail index " + std::to_string(t) + " is outside [" +
               std::to_string(tail_) + ", " + std::to_string(head_) + "]");
    tail_ = t;
    return t;
}

std::uint64_t Ring::read_head_checked() {
    std::uint64_t h = load_acquire_u64(word(kOffHead));
    follow_skip(h);
    if (h - tail_ > cap_ || h - head_ > cap_)  // catches h < tail_, h < head_, h > tail_ + cap
        broken("channel header is corrupt: head index " + std::to_string(h) + " is outside [" +
               std::to_string(std::max(head_, tail_)) + ", " + std::to_string(tail_ + cap_) + "]");
    head_ = h;
    return h;
}

void Ring::publish_head(std::uint64_t h) {
    store_release_u64(word(kOffHead), h);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(reinterpret_cast<std::uint32_t*>(word(kOffConsWaiting)), __ATOMIC_RELAXED)) {
        fetch_add_u32(word(kOffDataFutex), 1);
        futex_wake(word(kOffDataFutex), 1);
    }
}

void Ring::publish_tail(std::uint64_t t) { ledger_->consumer_advanced(t); }

// ---- slots held by Python arrays (views, loans) -------------------------------------------
void SlotLedger::consumer_advanced(std::uint64_t t) {
    std::lock_guard<std::mutex> lock(mu);
    read_pos = t;
    settle_locked();
}

void SlotLedger::settle_locked() {
    while (!held.empty() && held.front().released) held.pop_front();
    if (!open) {
        if (held.empty() && loan_id == 0) mapping.reset();
        return;
    }
    if (generation != fork_generation() || !mapping) return;  // a forked child's copy: not the consumer
    std::uint64_t t = held.empty() ? read_pos : held.front().start;
    if (t == published_tail) return;
    published_tail = t;
    std::uint8_t* b = mapping->base;
    store_release_u64(b + kOffTail, t);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(reinterpret_cast<std::uint32_t*>(b + kOffProdWaiting), __ATOMIC_RELAXED)) {
        fetch_add_u32(b + kOffSpaceFutex, 1);
        futex_wake(b + kOffSpaceFutex, 1);
    }
}

void SlotLedger::release_view(std::uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& v : held)
        if (v.id == id) v.released = true;
    settle_locked();
}

void SlotLedger::end_loan(std::uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    if (loan_id == id) loan_id = 0;
    settle_locked();
}

std::uint64_t SlotLedger::held_bytes() {
    std::lock_guard<std::mutex> lock(mu);
    std::uint64_t n = 0;
    for (const auto& v : held)
        if (!v.released) n += v.end - v.start;
    return n;
}

std::uint64_t SlotLedger::held_views() {
    std::lock_guard<std::mutex> lock(mu);
    std::uint64_t n = 0;
    for (const auto& v : held) n += v.released ? 0 : 1;
    return n;
}

void Ring::copy_in(std::uint64_t pos, const void* src, std::size_t n) {
    std::size_t off = static_cast<std::size_t>(pos % cap_);
    std::size_t first = std::min(n, cap_ - off);
    const auto* s = static_cast<const std::uint8_t*>(src);
    if (first) copy_bytes(data() + off, s, first, Region::ToShared);
    if (n > first) copy_bytes(data(), s + first, n - first, Region::ToShared);
}

void Ring::copy_out(std::uint64_t pos, void* dst, std::size_t n, std::size_t whole) {
    // A message leaves the ring in pieces; the policy decides non-temporal stores on the
    // whole message (`whole`), since the destination is that large.
    std::size_t off = static_cast<std::size_t>(pos % cap_);
    std::size_t first = std::min(n, cap_ - off);
    auto* d = static_cast<std::uint8_t*>(dst);
    if (first) copy_bytes_piece(d, data() + off, first, whole, Region::FromShared);
    if (n > first) copy_bytes_piece(d + first, data(), n - first, whole, Region::FromShared);
}

// Wakes every waiter on the futex word at `futex_off` (after a full fence by the caller):
// changes the word first, so a waiter about to sleep on the old value does not.
void Ring::wake_all(std::size_t futex_off) { futex_wake_all(word(futex_off)); }

// Gives up the message in transfer: this end is broken, and the header says so, so the peer
// gets a ChannelError naming the cause instead of waiting for the rest or reading a torn
// message as corrupt.
void Ring::abandon_message(const std::string& why) {
    broken_ = why;
    broken_corrupt_ = false;
    std::uint32_t code = role_ == Role::Producer ? kAbandonedByProducer : kAbandonedByConsumer;
    std::uint32_t none = 0;  // the first end to give up names the cause
    __atomic_compare_exchange_n(reinterpret_cast<std::uint32_t*>(word(kOffAbandoned)), &none, code, false,
                                __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    wake_all(kOffDataFutex);
    wake_all(kOffSpaceFutex);
}

// A streamed send that times out or is interrupted by a signal (KeyboardInterrupt) in the
// middle of its message cuts the message instead of breaking the channel: the send raises, so
// the message was never reported sent, and the consumer skips what was written of it.
// - The producer stores the cut, the ring position where it stopped (head_, 64-aligned:
//   streamed chunks are multiples of 64 bytes, see stream_chunk), before it publishes anything
//   past it; its next message starts there.
// - A consumer reading the cut message (between its start and its end) sees the cut as soon as
//   it reads a head past it, and skips to it (skip_to_cut), acknowledging it in kOffCutAck. The
//   producer cuts only while it waits for room, so the consumer has data to read then and finds
//   the cut between two chunks; the wake-up covers a consumer that read the last chunk just
//   before the cut and went to wait.
// - Positions only grow, so a cut lies inside exactly one message, and an old cut lies at or
//   before the start of every later one.
// - One cut in flight: before another streamed message (which could be cut in turn) the
//   producer waits until the consumer acknowledged the last cut (wait_cut_skipped); otherwise a
//   consumer still in the first cut message could take the second cut for its own.
void Ring::cut_message() {
    cut_at_ = head_;
    store_release_u64(word(kOffCutAt), cut_at_);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    wake_all(kOffDataFutex);
}

bool Ring::wait_cut_skipped(double deadline, const GilHooks& hooks, bool gil_released) {
    if (load_acquire_u64(word(kOffCutAck)) != cut_at_ &&
        wait(kCutSkipped, cut_at_, deadline, hooks, kSpinStart, gil_released) != 0)
        return false;
    cut_at_ = 0;
    return true;
}

std::uint64_t Ring::cut_in(std::uint64_t start, std::uint64_t end) const {
    if (end - start <= cap_) return 0;  // only messages larger than the ring are streamed, and cut
    const std::uint64_t at = load_acquire_u64(word(kOffCutAt));
    return at > start && at < end ? at : 0;
}

void Ring::skip_to_cut(std::uint64_t at) {
    read_head_checked();  // the producer published up to the cut before it stored the cut
    if (at % kAlign != 0 || at < tail_ || at > head_)
        broken("channel header is corrupt: the producer's cut position " + std::to_string(at) + " is outside [" +
               std::to_string(tail_) + ", " + std::to_string(head_) + "] or not at a message boundary");
    tail_ = at;
    ++cut_messages_;
    store_release_u64(word(kOffCutAck), at);
    publish_tail(tail_);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    wake_all(kOffSpaceFutex);  // a producer may wait for the acknowledgement
}

std::uint64_t Ring::stream_chunk() const {
    return std::min<std::uint64_t>(kPublishChunk, cap_ / 4) & ~std::uint64_t(kAlign - 1);
}

void Ring::give_up_partial() {
    if (!partial_.active) return;
    partial_.active = false;
    abandon_message("a recv could not keep the part of a message it had received (out of memory)");
}

void Ring::check_abandoned() {
    std::uint32_t code = load_acquire_u32(word(kOffAbandoned));
    if (code == 0) return;
    broken_ = code == kAbandonedByProducer
                  ? "the producer gave up a message half-sent (interrupted, timed out or failed); the channel is "
                    "unusable, create a new one"
                  : "the consumer gave up a message half-received (interrupted, timed out or failed); the channel "
                    "is unusable, create a new one";
    broken_corrupt_ = false;
    throw ShmError(broken_);
}

int Ring::wait(WaitFor what, std::uint64_t need, double deadline, const GilHooks& hooks, double spin_s,
               bool gil_released) {
    auto ready = [&]() -> bool {
        if (what == kData) {
            const std::uint64_t h = read_head_checked();  // may move tail_ (follow_skip)
            return h - tail_ >= need || (watch_end_ && cut_in(watch_start_, watch_end_));
        }
        if (what == kCutSkipped) return load_acquire_u64(word(kOffCutAck)) == need;
        return cap_ - (head_ - read_tail_checked()) >= need;
    };
    if (ready()) return 0;
    // A waiting consumer says so: it reads the next message as soon as it is published.
    struct AwaitingFlag {
        void* f;
        AwaitingFlag(void* flag) : f(flag) { if (f) __atomic_store_n(static_cast<std::uint32_t*>(f), 1u, __ATOMIC_RELAXED); }
        ~AwaitingFlag() { if (f) __atomic_store_n(static_cast<std::uint32_t*>(f), 0u, __ATOMIC_RELAXED); }
    } awaiting{what == kData ? word(kOffConsAwaiting) : nullptr};
    // Spin briefly: a peer running on another core answers within microseconds. At the start
    // of a message (spin_s < 0) the spin is adaptive: see AdaptiveSpin (spin.h).
    const bool adaptive = spin_s < 0;
    const double start = monotonic_seconds();
    if (spin_.spin(ready, start, std::min(deadline - start, adaptive ? spin_.budget() : spin_s), adaptive))
        return 0;
    auto ready_after_sleep = [&]() {
        if (adaptive) spin_.slept(monotonic_seconds() - start);
        return 0;
    };
    const bool data_wait = what == kData;
    void* fut = word(data_wait ? kOffDataFutex : kOffSpaceFutex);
    void* flag = word(data_wait ? kOffConsWaiting : kOffProdWaiting);
    std::size_t peer_pid_off = data_wait ? kOffProdPid : kOffConsPid;
    std::size_t peer_start_off = data_wait ? kOffProdStart : kOffConsStart;
    std::size_t peer_closed_off = data_wait ? kOffProdClosed : kOffConsClosed;
    const char* peer = data_wait ? "producer" : "consumer";
    GilGuard gil(hooks, gil_released);
    gil.release();
    struct FlagReset {
        void* f;
        ~FlagReset() { __atomic_store_n(static_cast<std::uint32_t*>(f), 0u, __ATOMIC_SEQ_CST); }
    } reset{flag};
    double last_check = monotonic_seconds();
    for (;;) {
        std::uint32_t v = load_acquire_u32(fut);
        __atomic_store_n(static_cast<std::uint32_t*>(flag), 1u, __ATOMIC_SEQ_CST);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        check_header();
        if (ready()) return ready_after_sleep();
        check_abandoned();
        if (load_acquire_u32(word(peer_closed_off)) != 0) {
            if (ready()) return ready_after_sleep();
            throw ShmClosed(std::string("the ") + peer + " closed the channel" +
                            (data_wait ? "" : "; this message would never be read"));
        }
        double now = monotonic_seconds();
        if (now >= deadline) return 1;
        if (now - last_check >= kLivenessSlice) {
            last_check = now;
            std::uint32_t pid = load_acquire_u32(word(peer_pid_off));
            if (!process_alive(pid, load_acquire_u64(word(peer_start_off)))) {
                if (ready()) return ready_after_sleep();
                throw ShmPeerDied(std::string("the ") + peer + " (" + pid_words(pid) + ") died" +
                                  (data_wait ? " before sending the next message (or in the middle of one)"
                                             : " without reading"));
            }
        }
        double slice = std::min(deadline - now, kLivenessSlice);
        gil.check_signals_after(futex_wait(fut, v, slice));
    }
}


}  // namespace shm
}  // namespace fastcopy
