// Cached or streaming stores, decided by timing the copies themselves as they run, for two
// kinds of copy whose best store mode no profile can know in advance:
//
// - Writes into shared memory that another process reads (a loan of a Channel or a Topic,
//   filled by fastcopy.copy; kSharedWriteRule). send() does not use it: see shm::rules(),
//   "timed_write_bytes". How fast such a write runs depends on where the reader's CPU is,
//   which changes while a program runs. A ring slot is reused, so each write goes to lines the
//   reader has read; with cached stores every line is first fetched for ownership from the
//   reader's cache. While the two CPUs are close, cached stores win; while they are far apart,
//   cached stores run 6-18x slower and streaming stores about as fast as before; flushing the
//   lines on the reader's side or zeroing them first does not help (evidence:
//   policy-shared-writes-placement).
// - Private copies without overlap from the profile's nt.learn_from (kPrivateCopyRule), those
//   its NT rule streams as well as those it does not (smaller than its threshold, or at a page
//   distance its guard excludes); a size class starts in the mode the rule gives its first
//   copy. Whether a copy finds its buffers in the last-level cache decides the winner: a
//   program that copies the same buffers again and again (hot) runs cached stores 2-3x faster
//   than streaming ones below the threshold and about 1.3x faster just above it, a program
//   streaming through more data than the cache holds (cold) runs streaming stores 1.1-1.3x
//   faster (evidence: policy-private-store-modes).
//
// The rule: for each size class (from kMinBytes), keep a measured rate of each mode (the last
// write's, or a running mean: rate_weight; the class's first write stands only until the mode's
// next one, since it often goes into fresh memory and pays its page faults: evidence:
// store-modes-first-write);
// use the mode with the better one; a mode whose rate is unknown or stale is tried (for
// a few writes, the last one timed) after `explore_every` writes, a number that grows (explore_min to explore_max, by
// explore_growth) each time the trial loses and resets when a mode switches. A switch needs a margin, so two modes
// within noise of each other do not alternate, and the current mode must be slow
// slow_to_leave times in a row: one write delayed by an interrupt or a preemption does not
// switch (evidence: policy-shared-writes-margins). Pure logic: the caller times the writes,
// tests drive it with synthetic timings.
#pragma once
#include <cstddef>
#include <cstdint>
#include <atomic>
#include <string>

namespace fastcopy {
namespace policy {

struct StoreModeRule {
    unsigned explore_min;        // writes before the first trial of the other mode
    unsigned explore_max;        // the trial interval grows up to this
    unsigned explore_growth;     // the factor by which it grows after each lost trial
    // Copies a trial runs in the other mode, the last one judged: of streaming stores, of
    // cached stores.
    unsigned streaming_trial_copies;
    unsigned cached_trial_copies;
    // While cached stores run more than this many times the streaming rate last measured, a
    // due trial of streaming stores counts as lost without running (up to explore_max, where it
    // runs): noise cannot close such a gap, and a streamed trial costs more than its own copies
    // (it evicts the destination). Trials of cached stores always run: they cost little where
    // streaming wins, and a cached rate measured early (fresh memory) may be far too low.
    double trial_within;
    // A trial of streaming stores is judged against the judge_after-th cached copy after it,
    // not against the cached rate so far (0: at once). Cached copies right after an allocation
    // or after streamed ones run slow for a copy or more; one timed next to the trial sees what
    // the program's copies see now.
    unsigned judge_after;
    double to_streaming_margin;  // how much faster streaming stores must run to take over
    double to_cached_margin;     // how much faster cached stores must run to take over
    unsigned slow_to_leave;      // slow writes of the current mode in a row that switch it
    double rate_weight;          // the weight of a write in its mode's rate (1: the last write alone)
    // Size classes, each learning on its own: from kMinBytes, each class spans this many
    // doublings of the size, and the last of `classes` takes every larger size.
    unsigned octaves_per_class;
    unsigned classes;            // 1..kMaxClasses
    // The longest interval between trials while a class runs mode 0 (cached stores; for the
    // split rule, the caller alone), when shorter than explore_max (0: explore_max). A rule whose
    // mode 0 cannot see the other mode get faster without trying it keeps this short.
    unsigned explore_max_while_cached = 0;
    // The writes before the first trial of a class that starts in mode 1 (streaming stores; for
    // the split rule, split) or switches to it, when longer than explore_min (0: explore_min).
    unsigned explore_first_while_streaming = 0;
};

// Loan fills. Cached stores are preferred: streaming ones also cost the reader, who then
// reads the data from memory instead of a cache, and the writer's timings cannot see that.
// With equal margins both ways the mode alternates on noise and the run moves less than with
// cached stores alone (evidence: policy-shared-writes-margins).
constexpr StoreModeRule kSharedWriteRule = {
    8,     // explore_min
    1024,  // explore_max
    2,     // explore_growth
    1,     // streaming_trial_copies
    1,     // cached_trial_copies
    1e9,   // trial_within: always
    0,     // judge_after
    2.0,   // to_streaming_margin
    1.25,  // to_cached_margin
    2,     // slow_to_leave
    1.0,   // rate_weight
    2,     // octaves_per_class: 256 KiB-1 MiB, 1-4 MiB,
    3,     // classes:           4 MiB and more
};

// Private copies; the figures behind each part are in the evidence (evidence:
// policy-private-store-modes). At 4 MiB and more one copy takes long enough that single timings are steady and small
// margins do not alternate on noise.
// - The first trial comes after the second copy (the first one's rate alone starts none), so a
//   cold workload streams from its ninth copy.
// - A class that starts streaming (the NT rule streams its first copy) waits 16 copies for its
//   first trial of cached stores, as long as after a lost trial: the rule's threshold already
//   says where cached stores lose, and in a cold loop a trial costs four copies at 0.65-0.8x the
//   streaming rate (evidence: private-first-cached-trial). So does a class that has just
//   switched to streaming stores: the switch itself says the loop runs cold, and a trial right
//   after it cost four cold copies at the start of every cold loop of 4-16 MiB (evidence:
//   private-cached-trial-after-switch).
// - A trial of streaming stores is two copies, the second one timed; a trial of cached stores
//   four, the fourth timed: after streamed copies, which evict the destination, a hot loop's
//   cached copies take three copies to run at the loop's rate again (evidence:
//   store-modes-first-write).
// - A trial of streaming stores is judged against the fourth cached copy after it, not the
//   cached rate so far: on fresh memory the first cached copies run several times slower than
//   the same loop a few copies later, and right after streamed ones they run slower too.
// - The cached rate is a running mean (each copy weighs 1/4): in a program that copies the
//   same buffers between other work, the first copies after the other work run slow, the next
//   ones fast, and two slow copies must not hand over to streaming stores.
// - A lost trial waits 8 times longer for the next, and trials of streaming stores wait (up to
//   every 1024 copies) while cached ones run more than 1.5x faster: each streamed trial costs
//   the hot loop the copies after it as well. A loop turning cold needs no trial to be seen:
//   its cached copies fall below the streaming rate already measured.
// - One size class per doubling: which mode wins depends on the size against the last-level
//   cache.
constexpr StoreModeRule kPrivateCopyRule = {
    2,     // explore_min
    1024,  // explore_max
    8,     // explore_growth
    2,     // streaming_trial_copies
    4,     // cached_trial_copies
    1.5,   // trial_within
    4,     // judge_after
    1.05,  // to_streaming_margin
    1.05,  // to_cached_margin
    2,     // slow_to_leave
    0.25,  // rate_weight
    1,     // octaves_per_class: 256-512 KiB, ..., 32-64 MiB,
    9,     // classes:           64 MiB and more
    0,     // explore_max_while_cached: explore_max
    16,    // explore_first_while_streaming
};

class StoreModeLearner {
public:
    explicit StoreModeLearner(const StoreModeRule& rule = kSharedWriteRule) : rule_(rule) {
        for (ClassState& c : cls_) c.explore_every = rule.explore_min;
    }
    // Smaller writes are not timed and always use cached stores: the effect needs many lines
    // in flight, and a clock read (~20 ns) would cost more than it could save.
    static constexpr std::size_t kMinBytes = 256 << 10;
    // Rates differ with size (cache fit), so each size class (the rule's) learns its own.
    static constexpr int kMaxClasses = 9;

    // Whether the next write of n bytes uses streaming stores. Call record() after it. A size
    // class starts in the mode its first write gives as `start_streaming` (where a static rule
    // streams, the learning starts from streaming stores).
    bool streaming(std::size_t n, bool start_streaming = false);
    // A write of n bytes in mode `streaming` took `seconds`.
    void record(std::size_t n, bool streaming, double seconds);
    // The mode writes of n bytes run in outside trials: the class's current mode, or
    // `start_streaming` before its first write. Changes nothing (it reads state()): the mode
    // the dispatch check reports auto's copies ran in.
    bool settled_streaming(std::size_t n, bool start_streaming = false) const;

    struct ClassState {
        double rate[2] = {0.0, 0.0};   // bytes/s: [cached, streaming] (rate_weight); 0: unknown
        // The mode's rate comes from the class's first write alone. That write often goes into
        // fresh memory, and its page faults make it run several times slower than the mode
        // does: no trial starts (it would be judged against that rate), and the mode's next
        // write replaces the rate instead of moving it.
        bool first_write_rate[2] = {false, false};
        bool current_streaming = false;
        bool started = false;           // the first write chose current_streaming (start_streaming)
        bool trial = false;             // the next record() is a trial of the other mode
        unsigned trial_left = 0;        // copies of the trial still to run
        double pending_rate = 0.0;      // a streaming trial's rate awaiting the cached copies after it
        unsigned pending_skip = 0;      // cached copies still to pass before judging it
        unsigned since_trial = 0;
        unsigned explore_every = 0;    // writes between trials (rule().explore_min to explore_max)
        unsigned slow_streak = 0;      // consecutive writes of the current mode slower than the other's rate
        std::uint64_t writes[2] = {0, 0};
        std::uint64_t switches = 0;
    };
    ClassState state(int cls) const;
    // Forgets every measurement (tests start from a known state).
    void reset();
    const StoreModeRule& rule() const { return rule_; }
    int classes() const { return static_cast<int>(rule_.classes); }
    int class_of(std::size_t n) const;  // -1 below kMinBytes
    std::string class_name(int cls) const;  // "256 KiB-1 MiB", "1-4 MiB", "4 MiB and more"

private:
    // Guards cls_. Never waited for: a call that finds it taken (another thread of the
    // process in the middle of a call, or one that was when this process was forked, which
    // would leave a mutex locked for ever in the child) uses start_streaming (the static
    // rule's mode) and records nothing.
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
    // Moves the mode's rate towards a write (rate_weight); the first write sets it.
    void fold_rate(ClassState& s, int mode, double rate) const;
    // The longest trial interval while the class runs `streaming` (explore_max_while_cached).
    unsigned explore_cap(bool streaming) const;
    // The trial interval of a class that starts in or switches to `streaming`: explore_min, or
    // explore_first_while_streaming for streaming stores.
    unsigned first_explore(bool streaming) const;
    // Makes `streaming` the mode, trials starting again from first_explore(streaming).
    void switch_to(ClassState& s, bool streaming) const;
    // A trial ends: the tried mode takes over when it won, else the next trial waits longer.
    void end_trial(ClassState& s, bool tried_streaming, bool won) const;

    StoreModeRule rule_;
    mutable std::atomic<bool> busy_{false};
    ClassState cls_[kMaxClasses];
};

}  // namespace policy
}  // namespace fastcopy
