// Writes into shared memory that another process reads (a loan of a Channel or a Topic,
// filled by fastcopy.copy): cached or streaming stores, decided by measuring the writes
// themselves as they run. send() does not use it: see shm::rules(), "timed_write_bytes".
//
// Why measure: how fast such a write runs depends on where the reader's CPU is, which no
// profile can know and which changes while a program runs. A ring slot is reused, so each
// write goes to lines the reader has read; with cached stores every line is first fetched
// for ownership from the reader's cache. While the two CPUs are close, cached stores win;
// while they are far apart, cached stores run 6-18x slower and streaming stores about as fast
// as before; flushing the lines on the reader's side or zeroing them first does not help
// (evidence: policy-shared-writes-placement).
//
// The rule: for each size class (from kMinBytes), keep the last measured rate of each mode;
// use the mode with the better one; a mode whose rate is unknown or stale is tried once
// after `explore_every` writes, a number that doubles (kExploreMin to kExploreMax) each time
// the trial loses and resets when a mode switches. A switch needs a margin (2x towards
// streaming stores, 1.25x back), so two modes within noise of each other do not alternate,
// and the current mode must be slow kSlowWritesToLeave times in a row: one write delayed by an
// interrupt or a preemption does not switch (evidence: policy-shared-writes-margins). Pure
// logic: the caller times the writes, tests drive it with synthetic timings.
#pragma once
#include <cstddef>
#include <cstdint>
#include <atomic>

namespace fastcopy {
namespace policy {

class SharedWriteMode {
public:
    // Smaller writes are not timed and always use cached stores: the effect needs many lines
    // in flight, and a clock read (~20 ns) would cost more than it could save.
    static constexpr std::size_t kMinBytes = 256 << 10;
    // Size classes: [256 KiB, 1 MiB), [1 MiB, 4 MiB), [4 MiB, ...): rates differ with size
    // (cache fit), so each class learns its own.
    static constexpr int kClasses = 3;
    static constexpr unsigned kExploreMin = 8;
    static constexpr unsigned kExploreMax = 1024;
    // How much faster the other mode must be to take over. Cached stores are preferred:
    // streaming ones also cost the reader, who then reads the data from memory instead of a
    // cache, and the writer's timings cannot see that. With equal margins both ways the mode
    // alternates on noise and the run moves less than with cached stores alone
    // (evidence: policy-shared-writes-margins).
    static constexpr double kToStreamingMargin = 2.0;
    static constexpr double kToCachedMargin = 1.25;
    static constexpr unsigned kSlowWritesToLeave = 2;

    // Whether the next write of n bytes uses streaming stores. Call record() after it.
    bool streaming(std::size_t n);
    // A write of n bytes in mode `streaming` took `seconds`.
    void record(std::size_t n, bool streaming, double seconds);

    struct ClassState {
        double rate[2] = {0.0, 0.0};   // bytes/s, last measured: [cached, streaming]; 0: unknown
        bool current_streaming = false;
        bool trial = false;             // the next record() is a trial of the other mode
        unsigned since_trial = 0;
        unsigned explore_every = kExploreMin;
        unsigned slow_streak = 0;      // consecutive writes of the current mode slower than the other's rate
        std::uint64_t writes[2] = {0, 0};
        std::uint64_t switches = 0;
    };
    ClassState state(int cls) const;
    static int class_of(std::size_t n);  // -1 below kMinBytes
    static const char* class_name(int cls);  // "256 KiB-1 MiB", "1-4 MiB", "4 MiB and more"

private:
    // Guards cls_. Never waited for: a call that finds it taken (another thread of the
    // process in the middle of a call, or one that was when this process was forked, which
    // would leave a mutex locked for ever in the child) uses cached stores and records nothing.
    class TryLock {
    public:
        explicit TryLock(std::atomic<bool>& flag) : flag_(flag), held_(!flag.exchange(true, std::memory_order_acquire)) {}
        ~TryLock() {
            if (held_) flag_.store(false, std::memory_order_release);
        }
        bool held() const { return held_; }
    private:
        std::atomic<bool>& flag_;
        bool held_;
    };
    mutable std::atomic<bool> busy_{false};
    ClassState cls_[kClasses];
};

}  // namespace policy
}  // namespace fastcopy
