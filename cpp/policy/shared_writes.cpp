// The store-mode rule for writes into shared memory: see shared_writes.h.
#include "shared_writes.h"

#include <algorithm>
#include <thread>

namespace fastcopy {
namespace policy {

int SharedWriteMode::class_of(std::size_t n) {
    if (n < kMinBytes) return -1;
    if (n < (std::size_t(1) << 20)) return 0;
    if (n < (std::size_t(4) << 20)) return 1;
    return 2;
}

bool SharedWriteMode::streaming(std::size_t n) {
    const int c = class_of(n);
    if (c < 0) return false;
    TryLock lock(busy_);
    if (!lock.held()) return false;
    ClassState& s = cls_[c];
    if (!s.trial && ++s.since_trial >= s.explore_every) {
        s.trial = true;
        s.since_trial = 0;
    }
    return s.trial ? !s.current_streaming : s.current_streaming;
}

void SharedWriteMode::record(std::size_t n, bool streaming, double seconds) {
    const int c = class_of(n);
    if (c < 0 || !(seconds > 0)) return;
    TryLock lock(busy_);
    if (!lock.held()) return;
    ClassState& s = cls_[c];
    const double rate = double(n) / seconds;
    const int mode = streaming ? 1 : 0, current = s.current_streaming ? 1 : 0;
    s.rate[mode] = rate;
    ++s.writes[mode];
    // The factor by which the other mode must beat this one to take over.
    auto margin_to = [](int to_mode) { return to_mode == 1 ? kToStreamingMargin : kToCachedMargin; };
    if (mode != current) {
        // A trial of the other mode (or a write decided before a switch): take over if it
        // is clearly faster, else try again later.
        s.trial = false;
        if (rate > margin_to(mode) * s.rate[current]) {
            s.current_streaming = streaming;
            s.slow_streak = 0;
            s.explore_every = kExploreMin;
            ++s.switches;
        } else {
            s.explore_every = std::min(kExploreMax, s.explore_every * 2);
        }
        return;
    }
    // The current mode got slower than the other mode's last rate, kSlowWritesToLeave times
    // in a row: switch (the other's rate may be stale; if so, its writes show it and switch back).
    if (!(s.rate[1 - mode] > margin_to(1 - mode) * rate)) {
        s.slow_streak = 0;
        return;
    }
    if (++s.slow_streak >= kSlowWritesToLeave) {
        s.slow_streak = 0;
        s.current_streaming = !s.current_streaming;
        s.explore_every = kExploreMin;
        s.since_trial = 0;
        ++s.switches;
    }
}

SharedWriteMode::ClassState SharedWriteMode::state(int cls) const {
    // A reader (info, tests) waits a little: holders keep the flag for a few steps only. A
    // flag that stays taken (inherited set across fork()) gives the figures as they are.
    const int c = std::max(0, std::min(kClasses - 1, cls));
    for (int tries = 0; tries < 100000; ++tries) {
        TryLock lock(busy_);
        if (lock.held()) return cls_[c];
        std::this_thread::yield();
    }
    return cls_[c];
}

const char* SharedWriteMode::class_name(int cls) {
    static const char* const names[kClasses] = {"256 KiB-1 MiB", "1-4 MiB", "4 MiB and more"};
    return names[std::max(0, std::min(kClasses - 1, cls))];
}

}  // namespace policy
}  // namespace fastcopy
