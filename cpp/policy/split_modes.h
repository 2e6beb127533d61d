// Split or alone, decided by timing the copies themselves as they run: for private copies the
// profile splits across the thread pool (from parallel.threshold, below nt.learn_from).
//
// What the pool gains depends on where the host runs the pool's CPUs, which changes while a
// program runs. While the caller's and the worker's CPUs share a cache, a copy of 384 KiB
// runs about 1.6x faster split; while the host has moved them apart (a cache-line round trip
// of 300 ns instead of 60) the worker fetches every line across the machine and the same copy
// runs 0.6x as fast as the caller alone. At 1 MiB the far case costs 0.9x; from 4 MiB the
// pool still wins there (evidence: policy-private-split). No threshold can be right in both
// states; timed copies see which one holds now.
//
// The engine is the store-mode learner's (store_modes.h): two modes per size class, each
// with a measured rate, trials of the other mode, margins against noise. Here its mode 0 is
// "the caller alone" and mode 1 "split across the pool"; SplitLearner names them so.
#pragma once
#include <cstddef>
#include <string>

#include "policy/store_modes.h"

namespace fastcopy {
namespace policy {

// The rule, in the engine's terms (mode 1 = split, mode 0 = alone); the figures behind each
// part are in the evidence (evidence: policy-private-split).
// - A trial of the caller alone every 8 copies at first, 4x less often after each lost trial,
//   up to every 1024: while splitting wins (1.6x) that costs a fraction of a percent, and a
//   split class needs no trial to see splitting get slower (its own copies show it).
// - A trial of splitting while the caller runs alone at least every 256 copies: nothing else
//   shows the host moving the CPUs back together. With trials growing to every 1024 copies a
//   size class stayed alone through whole points of the held-out check while splitting ran
//   1.6x faster; every 64 cost 9 % of the time of 384 KiB copies while the CPUs stayed apart
//   (eight split copies at 0.6x, and the slow first alone copy after them, in every 64).
// - A trial of the caller alone is two copies, the second timed: the first copy after split
//   ones finds half the destination in the worker's cache (17 us against 8 at 384 KiB).
// - A trial of splitting is eight copies, the last timed, and is judged against the second
//   alone copy after it: during alone copies the worker goes to sleep, and the first split
//   copies run at the alone rate while it wakes.
// - A switch needs 1.1x: the two states differ by 1.6x either way, noise by a few percent.
// - The current mode leaves when its rate (a running mean, each copy weighing 1/4) stays below
//   the other's for 4 copies in a row: the first copies of a stream split after alone ones run
//   at the alone rate while the worker wakes, and must not hand over.
constexpr StoreModeRule kPrivateSplitRule = {
    8,     // explore_min
    1024,  // explore_max
    4,     // explore_growth
    8,     // trial copies of splitting (the engine's streaming_trial_copies)
    2,     // trial copies of the caller alone (cached_trial_copies)
    1e9,   // trial_within: trials always run
    2,     // judge_after
    1.1,   // margin to split (to_streaming_margin)
    1.1,   // margin to alone (to_cached_margin)
    4,     // slow_to_leave
    0.25,  // rate_weight
    1,     // octaves_per_class: 256-512 KiB, ..., 32-64 MiB,
    9,     // classes:           64 MiB and more
    256,   // explore_max_while_cached: while alone
};

class SplitLearner {
public:
    SplitLearner() : modes_(kPrivateSplitRule) {}
    // Smaller copies are not timed (a clock read would cost too much against the copy) and
    // split as the profile says.
    static constexpr std::size_t kMinBytes = StoreModeLearner::kMinBytes;

    // Whether the next copy of n bytes splits across the pool (each size class starts split:
    // the profile's choice). Call record() after it.
    bool split(std::size_t n) { return n < kMinBytes || modes_.streaming(n, true); }
    // A copy of n bytes, split or alone, took `seconds`.
    void record(std::size_t n, bool split, double seconds) { modes_.record(n, split, seconds); }
    // Whether copies of n bytes split outside trials now. Changes nothing.
    bool settled_split(std::size_t n) const { return n < kMinBytes || modes_.settled_streaming(n, true); }

    struct ClassState {
        bool split = true;           // the class's current mode
        double alone_rate = 0.0;     // bytes/s, 0: unknown
        double split_rate = 0.0;
        unsigned long long alone_copies = 0, split_copies = 0, switches = 0;
    };
    ClassState state(int cls) const {
        const StoreModeLearner::ClassState s = modes_.state(cls);
        return {s.started ? s.current_streaming : true, s.rate[0], s.rate[1], s.writes[0], s.writes[1], s.switches};
    }
    void reset() { modes_.reset(); }
    int classes() const { return modes_.classes(); }
    std::string class_name(int cls) const { return modes_.class_name(cls); }
    const StoreModeRule& rule() const { return modes_.rule(); }

private:
    StoreModeLearner modes_;
};

}  // namespace policy
}  // namespace fastcopy
